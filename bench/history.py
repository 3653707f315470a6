"""Benchmark: the filter's cost with fair share over time on, at 1000 queues, against it off.

The cycle is ``bench.queuecycle``'s (a new pending pod's filter, its reservation, the prioritize;
in process, CPU time) on the picture with its pods in the 900 leaves of 10 x 9 x 10 queues. With
history on, every queue has an hour of decayed usage (``extender.policy.history``) and the
accounting divides under its weight adjustment, as the extender's history controller leaves it
between two updates; the factors are in the kept shares' division terms, so a cycle pays nothing
for them. What a new adjustment costs - once per update period (60 s), the record of every
queue's usage, the new factors and the first view's division again - is timed apart (``update
ms``). Off and on are measured in the same run, taking turns (``ROUNDS`` each, the median).

    python -m bench.history [--nodes 500] [--pods 20000] [--cycles 400]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence

from extender.picture.cluster import ClusterPicture
from extender.policy.history import FairShareHistory, HistoryParams
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import Payloads
from .picture import build_picture, load_picture, queue_tree
from .queuecycle import WARM_UP_CYCLES, run_cycle

ROUNDS = 3
HOUR_S = 3600.0


def with_history(picture: ClusterPicture) -> float:
    """An hour of every queue's usage recorded, the adjustment handed to the accounting and the
    view divided under it, as one update of the history controller; its CPU ms."""
    rule = FairShareHistory(HistoryParams(enabled=True, half_life_s=HOUR_S))
    view = picture.fairness()
    rule.record(0.0, view.tree, view.capacity, {})
    started = time.process_time()
    view = picture.fairness()
    rule.record(HOUR_S, view.tree, view.capacity, {})
    adjustment = rule.adjustment(HOUR_S, view.tree, view.capacity)
    if adjustment is None or not adjustment.factors:
        raise AssertionError("the history adjusted no queue's weight: nothing would be measured")
    picture.adjust_weights(adjustment)
    picture.fairness()
    return (time.process_time() - started) * 1000


def cycle_ms(picture: ClusterPicture, bodies: Sequence[bytes]) -> float:
    """CPU ms of a filter + prioritize cycle, the mean over `bodies` after a warm-up."""
    for body in bodies[:WARM_UP_CYCLES]:
        run_cycle(picture, body, [0.0, 0.0, 0.0])
    spent = [0.0, 0.0, 0.0]
    gc.collect()
    for body in bodies[WARM_UP_CYCLES:]:
        run_cycle(picture, body, spent)
    return spent[1] * 1000 / (len(bodies) - WARM_UP_CYCLES)


def run_history(nodes: int, pods: int, cycles: int) -> list[list[str]]:
    pictures = {
        "off": load_picture(build_picture(nodes, pods, tree=queue_tree())),
        "on": load_picture(build_picture(nodes, pods, tree=queue_tree())),
    }
    update_ms = with_history(pictures["on"])
    payloads = Payloads(nodes, "names", True)
    filter_ms: dict[str, list[float]] = {"off": [], "on": []}
    for round_ in range(ROUNDS):
        first = round_ * (cycles + WARM_UP_CYCLES)
        bodies = [payloads.body(first + cycle) for cycle in range(cycles + WARM_UP_CYCLES)]
        for mode, picture in pictures.items():
            filter_ms[mode].append(cycle_ms(picture, bodies))
    off, on = (statistics.median(filter_ms[mode]) for mode in ("off", "on"))
    return [
        [str(nodes), "1000", "off", str(cycles), f"{off:.3f}", "-", "1.00x"],
        [str(nodes), "1000", "on", str(cycles), f"{on:.3f}", f"{update_ms:.1f}", f"{on / off:.2f}x"],
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500, help="nodes (all candidates)")
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=400, help="cycles per round")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes, 400 pods, 10 cycles)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.smoke:
        args.nodes, args.pods, args.cycles = 50, 400, 10
    print("\nfilter CPU ms per cycle, 1000 queues in 3 levels, fair share over time off and on (in process)")
    headers = ["nodes", "queues", "history", "cycles", "filter ms", "update ms", "filter / off"]
    print(format_table(headers, run_history(args.nodes, args.pods, args.cycles)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
