"""Every in-process benchmark runs as shipped: ``python -m bench --smoke --only NAME`` (tiny sizes,
one round, a second or a few) must finish and print its table with the ratio to its baseline, so
a benchmark that stops working fails ``make test`` instead of a release. The cluster benchmarks'
smokes are in tests/integration/test_bench_smoke.py.

The figures are not checked (they depend on the machine and mean nothing at these sizes); what is
checked is that each table has its rows and its ratio column filled in.
"""

from __future__ import annotations

import re

import pytest
import yaml

from bench import memory
from bench.__main__ import BENCHMARKS, ON_A_CLUSTER
from bench.__main__ import main as bench_main
from bench.kai import PIN_FILE, read_pin, scheduler_config

RATIO = r"\d+\.\d+x"

# (--only NAME, what its output must hold). Rows as the smoke's sizes make them.
CASES = [
    # 50 nodes, both request modes, each against the do-nothing servers: p50 / floor ... cpu / fast.
    ("hotpath", rf"50\s+400\s+names(\s+\S+){{9}}\s+{RATIO}.*\n50\s+400\s+nodelist(\s+\S+){{9}}\s+{RATIO}"),
    # RSS of the extender holding 50 nodes / 400 pods over the empty process's.
    ("memory", rf"50\s+400\s+\d+\s+\d+\s+\d+\s+{RATIO}"),
    # 1 and 10 claims per request, 20 requests each, against the do-nothing gRPC server.
    # ... then 20 MIG placements against 20 whole GPUs, one per request: the ratio;
    # ... then 12 interrupted claims rolled back claim by claim, and each GPU once: the speed-up.
    (
        "prepare",
        rf"1\s+20(\s+\S+){{4}}\s+{RATIO}[\s\S]*\n10\s+20(\s+\S+){{4}}\s+{RATIO}"
        rf"[\s\S]*\nwhole H100\s+20(\s+\S+){{2}}\s+1\.0x"
        rf"[\s\S]*\n1g\.10gb placement\s+20(\s+\S+){{2}}\s+{RATIO}"
        rf"[\s\S]*\(before\)\s+12\s+\S+\s+\d+\s+1\.0x\n[^\n]*once\s+12\s+\S+\s+\d+\s+{RATIO}",
    ),
    # 2 x 2 x 3 queues (18) and 50 siblings: against the quadratic water-filling, then updates.
    (
        "fairshare",
        rf"3 levels\s+18(\s+\S+){{2}}\s+{RATIO}[\s\S]*siblings, contended\s+50(\s+\S+){{2}}\s+{RATIO}",
    ),
    # Every GPU of 50 nodes held, 5 waiting 8-GPU pods: at least one plan, then the ratio.
    ("planning", rf"[1-9]\d* plans per cycle[\s\S]*cycle / snapshot \(p50\): {RATIO}"),
    # 50 nodes, one sender of 4 reviews of 256 KiB: flooded over quiet filter p99, in each arrangement.
    ("webhookflood", rf"process(\s+\S+){{4}}\s+{RATIO}[\s\S]*\nshared(\s+\S+){{4}}\s+{RATIO}"),
    # No baseline ratio here: the codecs side by side, a time in every column but orjson's.
    ("codec", r"50\s+names\s+\d+(\s+(\d+\.\d{3}|-)){8}\n50\s+nodelist"),
    # Two flat queues, then 1000 in three levels over them.
    (
        "queuecycle",
        rf"50\s+2 flat\s+10(\s+\S+){{4}}\s+1\.00x\n50\s+1000 in 3 levels\s+10(\s+\S+){{4}}\s+{RATIO}",
    ),
    # A gang of 8 without an ask, then one requiring a zone (racks of 16): admit, member and
    # per-gang ratios, with nothing changed between admitting calls, then with the supplies and
    # then the domains moved.
    (
        "topology",
        "".join(
            rf"50\s+{case}\s+plain\s+-(\s+\S+){{2}}\s+1\.00x\s+1\.00x\s+1\.00x\n"
            rf"50\s+{case}\s+racked\s+\S+(\s+\S+){{2}}\s+{RATIO}\s+{RATIO}\s+{RATIO}\n?"
            for case in ("repeated", "supply moved", "domains moved")
        ),
    ),
    # Seed 0's gangs with a preferred rack and without: the p95 ratio, the mean waits and racks
    # spanned, then the worst seed's ratio.
    (
        "topologywaits",
        rf"\n0\s+6(\s+\S+){{2}}\s+{RATIO}(\s+\d+){{2}}(\s+\d+\.\d+){{2}}\nworst\s+seed 0\s+{RATIO}",
    ),
    # 1000 queues, fair share over time off, then on (with the cost of an update).
    ("history", rf"50\s+1000\s+off\s+10\s+\S+\s+-\s+1\.00x\n50\s+1000\s+on\s+10\s+\S+\s+\S+\s+{RATIO}"),
    # Seed 0's drawn week, history off and under the k rule without a min runtime: the nightly
    # team's %, the evictions; then the worst seed's distance from 50, the seeds within 2.5 points.
    (
        "history_weeks",
        r"\n0\s+\S+\s+\d+x\d+\s+\d+\s+\d+\s+\d+\.\d\s+\d+\.\d\s+\d+\n"
        r"worst \|% - 50\|\s+\d+\.\d\s+\d+\.\d\s+\d+\nwithin 2\.5 points\s+\d/1\s+\d/1",
    ),
]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
def test_each_in_process_benchmark_runs_its_smoke_and_prints_its_ratio(
    name: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main(["--smoke", "--only", name]) == 0
    out = capsys.readouterr().out
    assert re.search(expected, out), out


def test_every_benchmark_has_a_smoke_test() -> None:
    # The in-process ones here, the cluster ones in tests/integration/test_bench_smoke.py (its
    # list is ON_A_CLUSTER): a benchmark added to --only without a smoke case fails here.
    assert {name for name, _ in CASES} == set(BENCHMARKS) - set(ON_A_CLUSTER)


def test_the_memory_breakdown_runs_its_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert memory.main(["--smoke"]) == 0
    assert re.match(r"50 nodes, 400 pods, \d+ objects in the picture", capsys.readouterr().out)


def test_kais_contender_parts_that_need_no_kai_build() -> None:
    # What can run without a KAI build: the pin parsed, the scheduler's configuration file as
    # Kai.start writes it (YAML, read back unchanged, with and without consolidation). Running
    # KAI itself is tests/integration/test_bench_smoke.py's (skipped without a build, saying how
    # to make one).
    pin = read_pin(PIN_FILE.read_text())
    assert set(pin) >= {"KAI_MODULE", "KAI_REVISION"}
    for consolidation in (True, False):
        config = scheduler_config(consolidation)
        assert yaml.safe_load(yaml.safe_dump(config, sort_keys=False)) == config
        assert ("consolidation" in config["actions"].split(", ")) is consolidation
