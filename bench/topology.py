"""Benchmark: what a required topology level costs the filter, in process, against the same gang
without one.

The picture is `bench.picture`'s (`nodes` nodes x 8 GPUs, half of them held), its nodes labelled
into racks of 16 by the well-known zone label (the default topology's outermost level). Two gangs
of 8 one-GPU pods wait, alike but for the ask: `plain` asks nothing, `racked` requires one zone.
Two filter calls on every node are timed for each (CPU time, `time.process_time`):

- `admit`: the first member's filter, which plans the whole gang (`plan_gang`; with the ask,
  `extender.policy.topology.plan_in_domain` over every rack) - decided again each round, as no
  reservation is made;
- `member`: another member's filter once the gang is reserved (with the ask, the nodes outside the
  gang's rack fail node by node after the per-kind verdicts).

The ratio is the racked gang's over the plain one's, same run, same picture; `gang / plain` weighs
the calls as a gang makes them: one admitting filter and 7 members' (`GANG` - 1).

    python -m bench.topology [--nodes 5000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

from contract.names import MIN_MEMBERS_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION, WORKLOAD_LABEL
from extender.picture.cluster import ClusterPicture
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs, decode
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .picture import QUEUES, build_picture, load_picture, pod_object

RACK_SIZE = 16
GANG = 8
ZONE = "topology.kubernetes.io/zone"


def _gang(picture: ClusterPicture, name: str, ask: dict[str, str]) -> list[bytes]:
    """The gang's pending pods, added to the picture; each one's filter request on every node."""
    names = sorted(picture.kind("Node"))
    bodies = []
    for index in range(GANG):
        pod = pod_object(f"{name}-{index}", QUEUES[0], None, template="one-gpu")
        pod["metadata"]["labels"][WORKLOAD_LABEL] = name
        pod["metadata"]["annotations"] = {MIN_MEMBERS_ANNOTATION: str(GANG), **ask}
        picture.apply("Pod", "ADDED", pod)
        bodies.append(json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())
    return bodies


def _cpu_ms(picture: ClusterPicture, body: bytes, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.process_time()
        decide_filter(picture, decode(ExtenderArgs, body))
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def run(nodes: int, rounds: int) -> list[list[str]]:
    built = build_picture(nodes, nodes * 4, fill=0.5)
    for index, node in enumerate(built.objects["Node"]):
        node["metadata"].setdefault("labels", {})[ZONE] = f"rack-{index // RACK_SIZE:04d}"
    picture = load_picture(built)
    rows = []
    timings: dict[str, dict[str, float]] = {}
    for name, ask in (("plain", {}), ("racked", {TOPOLOGY_REQUIRED_ANNOTATION: "zone"})):
        bodies = _gang(picture, name, ask)
        admit_ms = _cpu_ms(picture, bodies[0], rounds)
        decision = decide_filter(picture, decode(ExtenderArgs, bodies[0]))
        if decision.gang is None:
            raise RuntimeError(f"gang {name} was not admitted: {decision.message}")
        picture.reserve_gang(decision.gang)
        member_ms = _cpu_ms(picture, bodies[1], rounds)
        timings[name] = {"admit": admit_ms, "member": member_ms}
        where = decision.gang.domain or "-"
        rows.append([str(nodes), name, where, f"{admit_ms:.2f}", f"{member_ms:.2f}"])
    for row, name in zip(rows, ("plain", "racked"), strict=True):
        row += [f"{timings[name][call] / timings['plain'][call]:.2f}x" for call in ("admit", "member")]
        row.append(f"{_per_gang(timings[name]) / _per_gang(timings['plain']):.2f}x")
    return rows


def _per_gang(timing: dict[str, float]) -> float:
    """CPU ms of a gang's filters: one admitting, the other members' once it is reserved."""
    return timing["admit"] + (GANG - 1) * timing["member"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topology", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes, 2 rounds)")
    args = parser.parse_args(argv)
    nodes, rounds = (50, 2) if args.smoke else (args.nodes, args.rounds)
    headers = [
        "nodes",
        "gang",
        "domain",
        "admit cpu ms",
        "member cpu ms",
        "admit / plain",
        "member / plain",
        "gang / plain",
    ]
    print(format_table(headers, run(nodes, rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
