"""Benchmark: what 1000 queues add to a scheduling cycle, in process, against two flat queues.

A cycle is benchmark 1's (`bench.hotpath`) without HTTP: a new pending pod's filter request is
decoded and decided (`extender.verbs.decide_filter`, whose fair-share admission reads the queue
view), the admitted pod reserved as the server does, then the prioritize request decoded and
decided. The same requests run against the picture with its pods in two flat queues (the
baseline) and in the 900 leaves of 10 x 9 x 10 queues, built in the same run. Each cycle's
reservation moves one queue's totals, so the next filter's view is brought up to date: it is
timed apart (`view ms`, included in `filter ms`). CPU time (`time.process_time`), which a busy
machine moves least.

    python -m bench.queuecycle [--nodes 500,5000] [--pods 20000] [--cycles 400]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from extender.picture.cluster import ClusterPicture
from extender.server import RESERVATION_TTL_S
from extender.verbs import decide_filter, decide_priorities
from extender.wire import ExtenderArgs, decode
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import Payloads
from .picture import build_picture, load_picture, queue_tree

WARM_UP_CYCLES = 5


@dataclass(frozen=True)
class CycleCost:
    """CPU time per cycle, ms."""

    total: float
    view: float
    filter: float
    prioritize: float


def run_cycle(picture: ClusterPicture, body: bytes, spent: list[float]) -> None:
    """One filter (with the server's release and reservation) and one prioritize; adds the CPU
    time of the view, the filter and the prioritize to `spent`."""
    started = time.process_time()
    args = decode(ExtenderArgs, body)
    picture.release(args.pod.key)
    picture.fairness()
    viewed = time.process_time()
    decision = decide_filter(picture, args)
    if decision.reserve:
        picture.reserve(args.pod.key, args.Pod, RESERVATION_TTL_S)
    filtered = time.process_time()
    decide_priorities(picture, decode(ExtenderArgs, body))
    done = time.process_time()
    spent[0] += viewed - started
    spent[1] += filtered - started
    spent[2] += done - filtered


def measure(nodes: int, pods: int, tree: bool, cycles: int) -> CycleCost:
    picture = load_picture(build_picture(nodes, pods, tree=queue_tree() if tree else None))
    payloads = Payloads(nodes, "names", tree)
    bodies = [payloads.body(cycle) for cycle in range(cycles + WARM_UP_CYCLES)]
    for body in bodies[cycles:]:
        run_cycle(picture, body, [0.0, 0.0, 0.0])
    spent = [0.0, 0.0, 0.0]
    gc.collect()
    for body in bodies[:cycles]:
        run_cycle(picture, body, spent)
    view, filter_, prioritize = (seconds * 1000 / cycles for seconds in spent)
    return CycleCost(filter_ + prioritize, view, filter_, prioritize)


def run_queuecycle(node_counts: Sequence[int], pods: int, cycles: int) -> list[list[str]]:
    rows = []
    for nodes in node_counts:
        flat = measure(nodes, pods, False, cycles)
        tree = measure(nodes, pods, True, cycles)
        for queues, cost in (("2 flat", flat), ("1000 in 3 levels", tree)):
            rows.append(
                [
                    str(nodes),
                    queues,
                    str(cycles),
                    f"{cost.total:.3f}",
                    f"{cost.view:.3f}",
                    f"{cost.filter:.3f}",
                    f"{cost.prioritize:.3f}",
                    f"{cost.total / flat.total:.2f}x",
                ]
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queuecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,5000", help="comma-separated node counts (all candidates)")
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes, 400 pods, 10 cycles)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.smoke:
        args.nodes, args.pods, args.cycles = "50", 400, 10
    node_counts = [int(n) for n in args.nodes.split(",")]
    print("\nCPU ms per cycle (filter + prioritize of a new pending pod, node names), in process")
    headers = ["nodes", "queues", "cycles", "cpu ms", "view ms", "filter ms", "prio ms", "cpu / flat"]
    print(format_table(headers, run_queuecycle(node_counts, args.pods, args.cycles)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
