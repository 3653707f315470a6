"""The cluster benchmarks run as shipped: ``python -m bench --smoke --only NAME --no-kai`` (one
to two nodes, one round, each on a fresh local control plane of its own) must finish and print
its table with every contender's ratio to the plain kube-scheduler, so a benchmark that stops
working fails ``make test`` instead of a release. The in-process ones are in
tests/unit/test_bench_smoke.py.

KAI Scheduler races only in its own smoke below, when ``hack/build-kai.sh`` built it; without a
build that test is skipped with the reason and the command that builds it. The figures are not
checked (they depend on the machine); the rows, the ratios and the counts the sizes fix are.
"""

from __future__ import annotations

import re

import pytest

from bench.__main__ import ON_A_CLUSTER
from bench.__main__ import main as bench_main
from bench.kai import find_kai, skip_reason
from tessera.simulate.trace import default_trace_dir

RATIO = r"\d+\.\d+x"

# (--only NAME, what its output must hold), at the smoke's sizes.
CASES = [
    # 2 nodes (16 GPUs), 16 pods; plain, Tessera and the do-nothing extender, each against plain
    # and against the floor (the do-nothing extender's own row 1.00x), then Tessera / floor.
    (
        "e2e",
        rf"plain kube-scheduler\s+2\s+16\s+16(\s+\S+){{7}}\s+1\.00x\s+{RATIO}\n"
        rf"kube-scheduler \+ Tessera\s+2\s+16\s+16(\s+\S+){{7}}\s+{RATIO}\s+{RATIO}\n"
        rf"kube-scheduler \+ do-nothing extender\s+2\s+16\s+16(\s+\S+){{7}}\s+{RATIO}\s+1\.00x\n"
        rf"Tessera / floor: {RATIO}",
    ),
    # 1 node (8 GPUs): B's fair share is 4; Tessera's time against plain's.
    ("reaction", rf"plain kube-scheduler\s+8\s+4[\s\S]*kube-scheduler \+ Tessera\s+8\s+4.*{RATIO}"),
    # A fills 8 GPUs, B needs 4: the baseline's preemption on classic GPUs evicts exactly 4 (it
    # hung here when its pods could land on the DRA nodes), Tessera's reclaim 4; then churn.
    (
        "reclaim",
        rf"priority preemption \(classic GPUs\)\s+8\s+4(\s+\S+){{3}}\s+4 / 4 = 1\.00.*1\.00x\n"
        rf"kube-scheduler \+ Tessera reclaim \(DRA claims\)\s+8\s+4(\s+\S+){{3}}"
        rf"\s+\d+ / 4 = \d\.\d\d.*{RATIO}"
        r"[\s\S]*churn: 3 queues",
    ),
    # 6 trace nodes: the cluster beside the simulator, in points.
    ("packing", r"end to end - simulated as deployed: [+-]\d+\.\d\d points"),
    # 5 nodes (40 GPUs) filled with 40 jobs by each; plain and the do-nothing extender cannot
    # free a DRA-claimed GPU in their 5 s, Tessera reclaims one GPU per sample (evicting one);
    # Tessera's fill against the floor's; then churn from a cluster the base fills, with the
    # work lost and the lost GPU-s per eviction.
    (
        "scale",
        rf"plain kube-scheduler\s+5\s+40(\s+\S+){{3}}\s+1\.00x\s+not in 5\s+-\s+-\s+-(\s+\S+){{3}}\s+1\.00x\n"
        rf"kube-scheduler \+ Tessera\s+5\s+40(\s+\S+){{3}}\s+{RATIO}\s+\d+\.\d\s+\d+\.\d\s+-\s+1\.00"
        rf"(\s+\S+){{3}}\s+{RATIO}\n"
        rf"kube-scheduler \+ do-nothing extender\s+5\s+40(\s+\S+){{3}}\s+{RATIO}\s+not in 5\s+-\s+-\s+-"
        rf"(\s+\S+){{3}}\s+{RATIO}\n"
        rf"Tessera / floor, fill: {RATIO}"
        r"[\s\S]*churn: 3 queues.*from every GPU held by a borrower[\s\S]*\d+ \(\d+\.\d%\)\s+\d+\.\d",
    ),
    # 2 nodes in 2 racks, 3 gangs of 2-6 GPUs preferring a rack: each started in one of them or
    # both (racks per gang 1.00-2.00), with the count of those over both while one held them;
    # no KAI, so no ratio, and the line says so.
    (
        "topology_live",
        r"kube-scheduler \+ Tessera, preferred rack\s+3 / 3\s+[12]\.\d\d\s+[12]\s+[12]\.\d\d"
        r"(\s+\d+\.\d){2}\s+\d+\s+\d+\s+\d+\n"
        r"Tessera / KAI racks per gang: not measured \(KAI did not race\)",
    ),
    # 1 node: 16 halves made, 8 ended, so each of the 8 GPUs is half used; the whole-GPU pod runs
    # after one move (a half packed beside another) and the 8 halves are bound again; no KAI.
    (
        "fragmented",
        r"kube-scheduler \+ Tessera\s+8\s+8\s+1\s+\d+\.\d\s+1 / 1\s+1\s+8\s+-\n"
        r"Tessera / KAI, time to run: not measured \(KAI did not race\)",
    ),
]


def test_every_cluster_benchmark_has_a_smoke_case() -> None:
    assert {name for name, _ in CASES} == set(ON_A_CLUSTER)


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
def test_each_cluster_benchmark_runs_its_smoke_and_prints_its_ratios(
    name: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if name == "packing" and default_trace_dir() is None:
        pytest.skip("the shared Alibaba trace is not checked out (shared/traces)")
    assert bench_main(["--smoke", "--only", name, "--no-kai"]) == 0
    out = capsys.readouterr().out
    assert re.search(expected, out), out


# (--only NAME, what KAI's rows must hold) in the smokes KAI races in, when it was built.
KAI_CASES = [
    # Its parts that need no build (pin, configuration) are tests/unit/test_bench_smoke.py's.
    (
        "reclaim",
        [
            rf"KAI Scheduler, {variant} \(DRA claims\)\s+8\s+4.*{RATIO}"
            for variant in ("default actions", "no consolidation")
        ],
    ),
    # 5 nodes: KAI fills the 40 GPUs with jobs and reclaims one GPU for B per sample, as Tessera does.
    ("scale", [rf"KAI Scheduler, default actions\s+5\s+40(\s+\S+){{3}}\s+{RATIO}"]),
    # KAI with its Topology and a PodGroup per gang starts the same 3 gangs; then the ratio line.
    (
        "topology_live",
        [
            r"KAI Scheduler \S+, preferred rack\s+3 / 3\s+[12]\.\d\d",
            rf"Tessera / KAI racks per gang: {RATIO} \(every gang each started\)",
        ],
    ),
    # KAI lays out the same 8 halves (its reservation pods answered by the device plugin
    # stand-in, which refuses none); whether its consolidation frees a GPU in 60 s is the figure.
    (
        "fragmented",
        [
            r"KAI Scheduler \S+\s+8\s+8\s+1\s+(\d+\.\d|not in 60)\s+[01] / 1\s+\d+\s+\d+\s+0\n",
            rf"Tessera / KAI, time to run: ({RATIO}|not measured \(one of them did not run)",
        ],
    ),
]


@pytest.mark.parametrize(("name", "expected"), KAI_CASES, ids=[name for name, _ in KAI_CASES])
def test_kai_races_in_its_smokes(name: str, expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    if find_kai() is None:
        pytest.skip(skip_reason())
    assert bench_main(["--smoke", "--only", name]) == 0
    out = capsys.readouterr().out
    for pattern in expected:
        assert re.search(pattern, out), out
