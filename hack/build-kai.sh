#!/usr/bin/env bash
# Builds KAI Scheduler's components (scheduler, binder, podgrouper, podgroupcontroller,
# queuecontroller) at the commit pinned in hack/kai/pin.env, for the KAI contender of the
# benchmarks (bench/kai.py). Not part of `make test`.
#
# Where the source comes from:
#   KAI_SRC=/path/to/tree   a source tree of KAI (its go.mod must name $KAI_MODULE); when it is a
#                           git checkout, its HEAD must be $KAI_REVISION
#   KAI_SRC=/path/to/git    a bare git directory (a fetched repository): $KAI_REVISION is extracted
#                           from it with `git archive` into the build directory's src/
#   unset                   the go command fetches $KAI_MODULE@$KAI_REVISION through the module
#                           proxy (which refuses this module at the time of writing: 403)
# The module's dependencies come through the module proxy in every case. Nothing of KAI is kept in
# this repository.
#
# Next to the binaries: the chart's CRDs (copied; they are plain YAML) and its PriorityClasses
# rendered by `helm template` with the chart's default values (they are Helm templates at the pin),
# the source tree's path in `source` (the configuration test in tests/unit/bench reads the
# operator's defaults there), and the version in `version`. Everything lands in a cache directory
# keyed by the commit, outside the checkout, so a fresh clone reuses it; a second run with
# everything present does nothing. Prints that directory (bin/, crds/, priorityclasses/, source,
# version) as its last line. TESSERA_GO_PARALLEL (default 1) is the go command's -p.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=kai/pin.env
source "$here/kai/pin.env"
cache_root=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
kai_dir="$cache_root/kai-$KAI_REVISION"
components=(scheduler binder podgrouper podgroupcontroller queuecontroller)
chart=deployments/kai-scheduler

log() { printf '[build-kai] %s\n' "$*" >&2; }
die() {
  log "$*"
  log "the benchmarks run without the KAI contender until this succeeds"
  exit 1
}

complete() {
  local name
  for name in "${components[@]}"; do [[ -x "$kai_dir/bin/$name" ]] || return 1; done
  [[ -s "$kai_dir/version" && -s "$kai_dir/source" ]] &&
    compgen -G "$kai_dir/crds/*.yaml" >/dev/null &&
    compgen -G "$kai_dir/priorityclasses/*.yaml" >/dev/null
}

if complete; then
  log "KAI $(cat "$kai_dir/version"): cached"
  echo "$kai_dir"
  exit 0
fi
mkdir -p "$kai_dir/bin" "$kai_dir/crds" "$kai_dir/priorityclasses"

# -- the source tree: $src, and $version as the build records it
if [[ -n "${KAI_SRC:-}" ]]; then
  # A directory without go.mod that git reads as a repository is a fetched (bare) one.
  if [[ ! -e "$KAI_SRC/go.mod" ]] && git --git-dir="$KAI_SRC" rev-parse --git-dir >/dev/null 2>&1; then
    commit=$(git --git-dir="$KAI_SRC" rev-parse --verify --quiet "$KAI_REVISION^{commit}") ||
      die "the repository $KAI_SRC has no commit $KAI_REVISION (a newer snapshot may lack it)"
    src="$kai_dir/src"
    if [[ ! -s "$src/go.mod" ]]; then
      log "extracting $commit from $KAI_SRC into $src"
      rm -rf "$src.tmp" && mkdir -p "$src.tmp"
      git --git-dir="$KAI_SRC" archive "$commit" | tar -x -C "$src.tmp"
      rm -rf "$src" && mv "$src.tmp" "$src"
    fi
  else
    src=$(cd "$KAI_SRC" && pwd)
    # Only a checkout of its own (not a tree that happens to lie inside another repository).
    if [[ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" == "$src" ]]; then
      commit=$(git -C "$src" rev-parse HEAD)
      [[ "$commit" == "$KAI_REVISION"* ]] ||
        die "the checkout $src is at $commit, not at the pinned $KAI_REVISION"
    else
      commit="$KAI_REVISION (a tree without git: its revision is taken on trust)"
    fi
  fi
  module=$(sed -n 's/^module[[:space:]]\{1,\}//p' "$src/go.mod")
  [[ "$module" == "$KAI_MODULE" ]] || die "$src/go.mod names module $module, not $KAI_MODULE"
  version="$KAI_REVISION (source tree, commit $commit)"
else
  log "fetching $KAI_MODULE@$KAI_REVISION through the module proxy"
  if ! info=$(go mod download -json "$KAI_MODULE@$KAI_REVISION"); then
    log "the go command could not fetch $KAI_MODULE@$KAI_REVISION:"
    printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",*$/  \1/p' >&2
    die "give a source tree or a fetched repository instead: KAI_SRC=/path bash $0"
  fi
  field() { printf '%s\n' "$info" | sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",*\$/\1/p"; }
  src=$(field Dir)
  version=$(field Version)
fi

echo "$src" >"$kai_dir/source"  # early: the configuration test reads the tree even if a build fails

# -- helm, for the PriorityClasses (the one the dev tooling caches, else the one on the PATH)
helm=${TESSERA_HELM:-}
if [[ -z "$helm" ]]; then
  helm=$(compgen -G "$cache_root/k8s-*/bin/helm" | head -n 1 || true)
  helm=${helm:-$(command -v helm || true)}
fi
[[ -x "$helm" ]] || die "no helm binary (set TESSERA_HELM, or run hack/build-k8s.sh, which caches one)"

export CGO_ENABLED=0
# One compile at a time keeps peak memory low on the 2-core machines.
export GOFLAGS="${GOFLAGS:-} -p=${TESSERA_GO_PARALLEL:-1}"
for name in "${components[@]}"; do
  if [[ -x "$kai_dir/bin/$name" ]]; then
    log "$name: cached"
    continue
  fi
  log "$name: building ./cmd/$name of $src (the first one takes minutes)"
  start=$SECONDS
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$kai_dir/bin/$name.tmp" "./cmd/$name")
  mv "$kai_dir/bin/$name.tmp" "$kai_dir/bin/$name"
  log "$name: built in $((SECONDS - start))s, $(du -h "$kai_dir/bin/$name" | cut -f1)"
done

cp "$src/$chart"/crds/*.yaml "$kai_dir/crds/"
chmod -R u+w "$kai_dir/crds"
# Each template rendered alone with the chart's values.yaml; one that renders to nothing (its
# `enabled` default off) leaves no file.
rm -f "$kai_dir/priorityclasses"/*.yaml
for template in "$src/$chart"/templates/priorityclasses/*.yaml; do
  base=$(basename "$template")
  if ! rendered=$("$helm" template kai "$src/$chart" --show-only "templates/priorityclasses/$base" 2>&1); then
    grep -q 'could not find template' <<<"$rendered" || die "helm template failed on $base: $rendered"
    rendered=""
  fi
  if grep -q '^kind: PriorityClass' <<<"$rendered"; then
    printf '%s\n' "$rendered" >"$kai_dir/priorityclasses/$base"
  fi
done
compgen -G "$kai_dir/priorityclasses/*.yaml" >/dev/null || die "the chart rendered no PriorityClass"
echo "$version" >"$kai_dir/version"
echo "$kai_dir"
