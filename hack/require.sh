#!/usr/bin/env bash
# Checks that a tool the build needs is present and new enough, and says what to do when not.
#   hack/require.sh python [INTERPRETER]   the version pyproject.toml's requires-python names
#   hack/require.sh go                     the version hack/k8s/go.mod's `go` line names
# The minimums are read from those files, so they are stated once. Exit 1 with one line on stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

fail() { printf '[make] %s\n' "$*" >&2; exit 1; }

# at_least HAVE WANT: true when dotted version HAVE >= WANT (compared field by field, numerically).
at_least() {
  local IFS=.
  local -a have=($1) want=($2)
  local i
  for ((i = 0; i < ${#want[@]}; i++)); do
    local h=${have[i]:-0} w=${want[i]:-0}
    ((10#$h > 10#$w)) && return 0
    ((10#$h < 10#$w)) && return 1
  done
  return 0
}

case "${1:-}" in
  python)
    interpreter=${2:-python3}
    want=$(sed -n 's/^requires-python *= *">= *\([0-9.]*\)".*/\1/p' "$root/pyproject.toml")
    [[ -n $want ]] || fail "cannot read requires-python from pyproject.toml"
    command -v "$interpreter" >/dev/null \
      || fail "Python >= $want is needed and '$interpreter' is not on PATH; install it, or run make PYTHON=/path/to/python3.X"
    have=$("$interpreter" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) \
      || fail "'$interpreter' does not run as Python; Python >= $want is needed (make PYTHON=/path/to/python3.X)"
    at_least "$have" "$want" \
      || fail "Python >= $want is needed; '$interpreter' is $have; run make PYTHON=/path/to/python3.X"
    "$interpreter" -c 'import venv, ensurepip' 2>/dev/null \
      || fail "'$interpreter' ($have) lacks the venv module (on Debian/Ubuntu: apt-get install python3-venv)"
    ;;
  go)
    want=$(awk '$1 == "go" {print $2; exit}' "$here/k8s/go.mod")
    [[ -n $want ]] || fail "cannot read the go version from hack/k8s/go.mod"
    command -v go >/dev/null \
      || fail "Go >= $want is needed to build the control-plane binaries once (https://go.dev/dl/), and 'go' is not on PATH"
    have=$(go env GOVERSION 2>/dev/null) || fail "'go env GOVERSION' fails; Go >= $want is needed (https://go.dev/dl/)"
    have=${have#go}
    release=${have%%[!0-9.]*}  # go1.26rc1 -> 1.26
    # A pre-release comes before its release (go1.26rc1 < 1.26.0), so it must be newer than WANT.
    if [[ $release == "$have" ]]; then
      at_least "$release" "$want"
    else
      ! at_least "$want" "$release"
    fi || fail "Go >= $want is needed to build the control-plane binaries; 'go' is $have (https://go.dev/dl/)"
    ;;
  *)
    fail "usage: hack/require.sh python [INTERPRETER] | go"
    ;;
esac
