#!/usr/bin/env bash
# Builds hack/kind/configcheck (kind's own config loader and validation, at the kind version its
# go.mod pins) into a cache directory keyed by that version; a second run does nothing.
# Prints the path of the binary as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kind_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kind" {print $3; exit}' "$here/configcheck/go.mod")
cache_root=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
bin="$cache_root/kind-configcheck-$kind_version/configcheck"

if [[ ! -x "$bin" ]]; then
  printf '[build-configcheck] building against sigs.k8s.io/kind %s\n' "$kind_version" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$here/configcheck" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
