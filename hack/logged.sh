#!/usr/bin/env bash
# Runs a build step with its output in a log file, so `make` prints one line per step:
#   hack/logged.sh LOG SHOW COMMAND [ARGS...]
# Everything COMMAND writes (stdout and stderr: Go's `go: downloading` lines, pip's and
# setuptools' banners) goes to LOG, which holds the last run only; only lines matching the extended regex SHOW ('' for none)
# are echoed. When COMMAND fails, that is said, with the last 40 lines of LOG and its path when
# some of LOG was not shown; its exit status is returned.
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
  printf '[make] failed (exit %d): %s\n' "$status" "$*" >&2
  # The log's tail, unless every line of it was shown already (a [make] message saying why).
  if [[ -n $show ]]; then
    hidden=$(tail -n +2 "$log" | grep -cvE "$show" || true)
  else
    hidden=$(($(wc -l <"$log") - 1))
  fi
  if ((hidden > 0)); then
    printf '[make] the last lines of %s:\n' "$log" >&2
    tail -n 40 "$log" >&2
  fi
fi
exit "$status"
