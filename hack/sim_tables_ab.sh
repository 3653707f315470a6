#!/usr/bin/env bash
# The queue simulator's tables of a base commit and of this tree, compared byte for byte: the proof
# that a refactor changed no behaviour the simulator can see (issue 27). Every example in
# tessera/simulate/examples/ with its own settings, and the option variants docs/queues.md quotes
# (termination 30 s, a whole-owed wait, history off, no topology asks, another seed); each run's
# printed table and its CSVs (queues, timeline, evictions) are compared. The queue replays print
# no wall-clock time, so equal code gives equal bytes.
#
#   hack/sim_tables_ab.sh BASE [OUT]    # e.g. hack/sim_tables_ab.sh 9db5c20
#   QUICK=1 hack/sim_tables_ab.sh BASE  # without the churn replays (minutes each on 2 cores)
#
# The base is checked out as a temporary worktree under OUT (default: a new temp directory),
# sharing this tree's .venv, and removed at the end. Exit status 0: identical; 1: a difference
# (diff's report names the files); 2: a usage error or a replay that failed.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 BASE_COMMIT [OUT_DIR]" >&2
  exit 2
fi
root=$(git rev-parse --show-toplevel)
base=$(git -C "$root" rev-parse --verify "$1^{commit}")
out=${2:-$(mktemp -d)}
mkdir -p "$out"
python=$root/.venv/bin/python

base_tree=$out/base-tree
git -C "$root" worktree add --detach "$base_tree" "$base" >/dev/null
trap 'git -C "$root" worktree remove --force "$base_tree"' EXIT

cases=()
for workload in "$root"/tessera/simulate/examples/*.yaml; do
  name=$(basename "$workload" .yaml)
  [[ -n ${QUICK:-} && $name == churn* ]] && continue
  cases+=("$name|$name|")
done
for name in fractions mixed newcomer backlog urgent fractional-shares churn; do
  [[ -n ${QUICK:-} && $name == churn* ]] && continue
  cases+=("$name-term30|$name|--termination-delay 30")
done
cases+=("newcomer-wait20|newcomer|--whole-owed-wait-s 20")
cases+=("history-week-off|history-week|--history off")
cases+=("topology-racks-noasks|topology-racks|--no-topology-asks")
[[ -z ${QUICK:-} ]] && cases+=("churn-seed1|churn|--seed 1")

replay_all() {  # side tree: every case, the printed table in <case>.txt, the CSVs in <case>/
  local side=$1 tree=$2 entry label workload options
  mkdir -p "$out/$side"
  for entry in "${cases[@]}"; do
    IFS='|' read -r label workload options <<<"$entry"
    # (Run from the tree, so `-m tessera` imports that tree's code; options split on purpose.)
    # shellcheck disable=SC2086
    if ! (cd "$tree" && "$python" -m tessera simulate queues "tessera/simulate/examples/$workload.yaml" \
      $options --no-plots --out "$out/$side/$label" >"$out/$side/$label.txt" 2>&1); then
      echo "$side: $label failed (see $out/$side/$label.txt)" >&2
      exit 2
    fi
    # The output folder is named in the table's last line: the same for both sides.
    sed -i "s#$out/$side/#OUT/#g" "$out/$side/$label.txt"
  done
}

replay_all base "$base_tree"
replay_all tree "$root"
files=$(find "$out/tree" -type f | wc -l)
if diff -r "$out/base" "$out/tree"; then
  echo "identical: ${#cases[@]} replays, $files files (tables and CSVs), base $(git -C "$root" rev-parse --short "$base") and this tree ($out)"
else
  echo "the tables differ (above): base $(git -C "$root" rev-parse --short "$base"), this tree ($out)" >&2
  exit 1
fi
