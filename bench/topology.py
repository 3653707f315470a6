"""Benchmark: what a required topology level costs the filter, in process, against the same gang
without one.

The picture is `bench.picture`'s (`nodes` nodes x 8 GPUs, half of them held), its nodes labelled
into racks of 16 by the well-known zone label (the default topology's outermost level), with a
third gang reserved already (its GPUs held, as a busy cluster has some). Two gangs of 8 one-GPU
pods wait, alike but for the ask: `plain` asks nothing, `racked` requires one zone. Two filter
calls on every node are timed for each (CPU time, `time.process_time`), the two gangs' calls
taking turns, so both see the same picture and the same load:

- `admit`: the first member's filter, which plans the whole gang (`plan_gang`; with the ask,
  `extender.policy.topology.plan_in_domain` over every rack) - decided again each round, as no
  reservation is made. Two cases: `repeated`, nothing changes between calls (the racked plan is
  the one `DomainChoices` kept); `moved`, one node is relabelled into another rack and back
  between calls, so the topology version and that node's supply move and every racked plan is
  made anew (the honest worst case: a cluster where nodes change between a gang's tries);
- `member`: another member's filter once both gangs are reserved (with the ask, the nodes
  outside the gang's rack fail node by node after the per-kind verdicts).

The ratio is the racked gang's over the plain one's, same run, same picture; `gang / plain` weighs
the calls as a gang makes them: one admitting filter and 7 members' (`GANG` - 1).

    python -m bench.topology [--nodes 5000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from contract.names import MIN_MEMBERS_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION, WORKLOAD_LABEL
from extender.picture.cluster import ClusterPicture
from extender.picture.gangs import GangReservation
from extender.policy.placement import GpuDemand
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs, decode
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .picture import QUEUES, build_picture, load_picture, pod_object

RACK_SIZE = 16
GANG = 8
ZONE = "topology.kubernetes.io/zone"
MOVER = "bench/mover"  # the pod GPUs are held for between calls (`_holding`)
ASKS = {"plain": {}, "racked": {TOPOLOGY_REQUIRED_ANNOTATION: "zone"}}


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


# What changes in the picture between two timed calls.
Between = Callable[[], None]


def _cpu_ms(
    picture: ClusterPicture, bodies: dict[str, bytes], rounds: int, between: Between
) -> dict[str, float]:
    """The median CPU ms of each body's filter, the bodies taking turns; `between` runs before
    each call, untimed."""
    times: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):
        for name, body in bodies.items():
            between()
            started = time.process_time()
            decide_filter(picture, decode(ExtenderArgs, body))
            times[name].append((time.process_time() - started) * 1000)
    return {name: statistics.median(spent) for name, spent in times.items()}


def _nothing() -> None:
    """Nothing changes between calls."""


def _holding(picture: ClusterPicture) -> Between:
    """Between calls, a GPU is held for some other pod on the next node in turn (and let go on
    the last one): two nodes' supplies change each time (as when reclaim holds GPUs, or pods bind
    or end), so no call finds the plan its gang's last call made."""
    nodes = itertools.cycle(sorted(picture.kind("Node")))

    def move_the_hold() -> None:
        picture.hold(MOVER, next(nodes), GpuDemand(1), ttl_s=3600)  # (lets go of the last one)

    return move_the_hold


def _relabelling(picture: ClusterPicture, node: Mapping[str, Any]) -> Between:
    """Between calls, `node` moves into a rack of its own and back: each move changes its domain
    (the topology version) and its Node (its supply read anew)."""
    node = copy.deepcopy(node)
    home = node["metadata"]["labels"][ZONE]
    versions = itertools.count(10**9)

    def relabel() -> None:
        labels = node["metadata"]["labels"]
        labels[ZONE] = "rack-away" if labels[ZONE] == home else home
        node["metadata"]["resourceVersion"] = str(next(versions))
        picture.apply("Node", "MODIFIED", copy.deepcopy(node))

    return relabel


def _admit(picture: ClusterPicture, name: str, body: bytes) -> GangReservation:
    decision = decide_filter(picture, decode(ExtenderArgs, body))
    if decision.gang is None:
        raise RuntimeError(f"gang {name} was not admitted: {decision.message}")
    return decision.gang


def run(nodes: int, rounds: int) -> list[list[str]]:
    built = build_picture(nodes, nodes * 4, fill=0.5)
    for index, node in enumerate(built.objects["Node"]):
        node["metadata"].setdefault("labels", {})[ZONE] = f"rack-{index // RACK_SIZE:04d}"
    picture = load_picture(built)
    other = _gang(picture, "other", {})
    picture.reserve_gang(_admit(picture, "other", other[0]))
    gangs = {name: _gang(picture, name, ask) for name, ask in ASKS.items()}
    admitting = {name: bodies[0] for name, bodies in gangs.items()}
    admit = {
        "repeated": _cpu_ms(picture, admitting, rounds, _nothing),
        "supply moved": _cpu_ms(picture, admitting, rounds, _holding(picture)),
        "domains moved": _cpu_ms(
            picture, admitting, rounds, _relabelling(picture, built.objects["Node"][-1])
        ),
    }
    domains = {}
    for name, bodies in gangs.items():
        reservation = _admit(picture, name, bodies[0])
        domains[name] = reservation.domain or "-"
        picture.reserve_gang(reservation)
    member = _cpu_ms(picture, {name: bodies[1] for name, bodies in gangs.items()}, rounds, _nothing)
    rows = []
    for case, admit_ms in admit.items():
        for name in ASKS:
            timing = {"admit": admit_ms[name], "member": member[name]}
            plain = {"admit": admit_ms["plain"], "member": member["plain"]}
            rows.append(
                [str(nodes), case, name, domains[name], f"{timing['admit']:.2f}", f"{timing['member']:.2f}"]
                + [f"{timing[call] / plain[call]:.2f}x" for call in ("admit", "member")]
                + [f"{_per_gang(timing) / _per_gang(plain):.2f}x"]
            )
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
        "admit case",
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
