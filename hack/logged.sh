#!/usr/bin/env bash
# Runs a build step with its output in a log file, so `make` prints one line per step:
#   hack/logged.sh LOG SHOW COMMAND [ARGS...]
# Everything COMMAND writes (stdout and stderr: Go's `go: downloading` lines, pip's and
# setuptools' banners) goes to LOG, which holds the last run only; only lines matching the extended regex SHOW ('' for none)
# are echoed. When COMMAND fails, the last 40 lines of LOG and its path are printed, and its exit
# status is returned.
set -uo pipefail

log=$1 show=$2
shift 2
mkdir -p "$(dirname "$log")"
printf '# %s: %s\n' "$(date -u +%FT%TZ)" "$*" >"$log"
if [[ -n $show ]]; then
  "$@" 2>&1 | tee -a "$log" | { grep --line-buffered -E "$show" || true; }
  status=${PIPESTATUS[0]}
else
  "$@" >>"$log" 2>&1
  status=$?
fi
if ((status != 0)); then
  printf '[make] failed (exit %d): %s\n[make] the last lines of %s:\n' "$status" "$*" "$log" >&2
  tail -n 40 "$log" >&2
fi
exit "$status"
