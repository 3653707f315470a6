#!/usr/bin/env bash
# Builds KAI Scheduler's components (scheduler, binder, podgrouper, podgroupcontroller,
# queuecontroller) from its Go module at the commit pinned in hack/kai/pin.env, for the KAI
# contender of the benchmarks (bench/kai.py). Not part of `make test`.
#
# The module is fetched by the go command into the module cache and built there with its own
# go.mod and go.sum (nothing of KAI is kept in this repository). Its CRDs and PriorityClasses are
# copied from the module's deployment files next to the binaries, where the benchmarks install them
# from. Everything lands in a cache directory keyed by the commit, outside the checkout, so a fresh
# clone reuses it; a second run with everything present does nothing.
# Prints the directory (bin/, crds/, priorityclasses/, version) as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=kai/pin.env
source "$here/kai/pin.env"
cache_root=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
kai_dir="$cache_root/kai-$KAI_REVISION"
components=(scheduler binder podgrouper podgroupcontroller queuecontroller)

log() { printf '[build-kai] %s\n' "$*" >&2; }

complete() {
  local name
  for name in "${components[@]}"; do [[ -x "$kai_dir/bin/$name" ]] || return 1; done
  [[ -s "$kai_dir/version" ]] && compgen -G "$kai_dir/crds/*.yaml" >/dev/null
}

if complete; then
  log "KAI $(cat "$kai_dir/version"): cached"
  echo "$kai_dir"
  exit 0
fi

log "fetching $KAI_MODULE@$KAI_REVISION into the module cache"
if ! info=$(go mod download -json "$KAI_MODULE@$KAI_REVISION"); then
  log "the go command could not fetch $KAI_MODULE@$KAI_REVISION:"
  printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",*$/  \1/p' >&2
  log "the benchmarks run without the KAI contender until this succeeds"
  exit 1
fi
field() { printf '%s\n' "$info" | sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",*\$/\1/p"; }
src=$(field Dir)
version=$(field Version)
mkdir -p "$kai_dir/bin" "$kai_dir/crds" "$kai_dir/priorityclasses"

export CGO_ENABLED=0
# One compile at a time keeps peak memory low on the 2-core machines.
export GOFLAGS="${GOFLAGS:-} -p=${TESSERA_GO_PARALLEL:-1}"
for name in "${components[@]}"; do
  if [[ -x "$kai_dir/bin/$name" ]]; then
    log "$name: cached"
    continue
  fi
  log "$name: building $KAI_MODULE/cmd/$name@$version (the first one takes minutes)"
  start=$SECONDS
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$kai_dir/bin/$name.tmp" "./cmd/$name")
  mv "$kai_dir/bin/$name.tmp" "$kai_dir/bin/$name"
  log "$name: built in $((SECONDS - start))s, $(du -h "$kai_dir/bin/$name" | cut -f1)"
done
cp "$src"/deployments/kai-scheduler/crds/*.yaml "$kai_dir/crds/"
cp "$src"/deployments/kai-scheduler/templates/priorityclasses/*.yaml "$kai_dir/priorityclasses/"
chmod -R u+w "$kai_dir/crds" "$kai_dir/priorityclasses"
echo "$version" >"$kai_dir/version"
echo "$kai_dir"
