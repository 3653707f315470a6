"""Benchmark: one planning cycle on a large picture, in process (no HTTP, no API).

The picture: `nodes` nodes x 8 GPUs, the GPUs held by queue team-a (which borrowed team-b's
half; `pods` pods leave a few GPUs free, scattered), each pod owned by a ReplicaSet (so
consolidation may move it), and `waiting` pods of team-b asking for a whole node's 8 GPUs, which
fit nowhere until reclaim frees a node. A cycle is what the reclaim loop does each second:
`picture.snapshot()`, `picture.waiting_pods()` and `extender.policy.reclaim.plan` (a fork, the
evictions of at most 16 pods per cycle); with consolidation (on by default in the extender), also
`extender.policy.consolidation.plan_moves` on the same snapshot after reclaim's plans - with
where demands fit (`FitIndex`) and consolidation's `NodeRooms` kept from one cycle to the next,
as the reclaim and consolidation executors keep them. The baseline measured in the same run is
the snapshot alone (what any planner must pay to read the picture).

    python -m bench.planning [--nodes 5000] [--pods 50000] [--cycles 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from bench import SMOKE_HELP
from bench.picture import (
    DEVICE_CLASS,
    GPUS_PER_NODE,
    NAMESPACE,
    QUEUES,
    build_picture,
    load_picture,
    pod_object,
)
from extender.policy.consolidation import ConsolidationRules, NodeRooms, plan_moves
from extender.policy.reclaim import FitIndex, Rules, plan


def _timed(action: Callable[[], object], cycles: int) -> tuple[list[float], list[float]]:
    """Milliseconds per call: wall clock, and the process's CPU (what the call itself costs, which
    a busy neighbour on a shared machine stretches the wall clock beyond)."""
    wall, cpu = [], []
    for _ in range(cycles):
        started, started_cpu = time.perf_counter(), time.process_time()
        action()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    return wall, cpu


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planning", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    # Enough pods that every GPU is held (a third of the GPUs hold two halves): about 53,400.
    parser.add_argument("--pods", type=int, default=54_000)
    parser.add_argument("--waiting", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=15)
    parser.add_argument(
        "--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes, 540 pods: every GPU held, 2 cycles)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.pods, args.waiting, args.cycles = 50, 540, 5, 2
    built = build_picture(args.nodes, args.pods, fill=1.0, borrower=QUEUES[0])
    exactly = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": GPUS_PER_NODE}
    built.objects["ResourceClaimTemplate"].append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "eight-gpu", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
        }
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "bench",
        "uid": "uid-rs",
        "controller": True,
    }
    for pod in built.objects["Pod"]:
        pod["metadata"]["ownerReferences"] = [owner]
    built.objects["Pod"].extend(
        pod_object(f"waiting-{i:04d}", QUEUES[1], None, template="eight-gpu") for i in range(args.waiting)
    )
    picture = load_picture(built)
    now = time.time()
    rules = Rules()
    waiting_count = len(picture.waiting_pods())

    moves = ConsolidationRules()
    # Kept from one cycle to the next, as the reclaim and consolidation executors keep them.
    fits, rooms = FitIndex(), NodeRooms()

    def cycle() -> int:
        return len(plan(picture.snapshot(), picture.waiting_pods(), now, rules, fit_index=fits))

    def with_consolidation() -> int:
        snapshot, waiting = picture.snapshot(), picture.waiting_pods()
        served = plan(snapshot, waiting, now, rules, fit_index=fits)
        return len(served) + len(plan_moves(snapshot, waiting, now, moves, served, rooms=rooms))

    plans = cycle()
    with_consolidation()
    snapshot_ms = _timed(picture.snapshot, args.cycles)
    cycle_ms = _timed(cycle, args.cycles)
    both_ms = _timed(with_consolidation, args.cycles)
    print(
        f"\n[7] planning: {args.nodes} nodes x 8 GPUs, {len(built.objects['Pod'])} pods "
        f"({waiting_count} of {args.waiting} waiting pods admissible), {plans} plans per cycle, "
        f"{args.cycles} cycles"
    )
    print("what                              p50 ms   p99 ms   CPU p50 ms   CPU p99 ms")
    rows = (
        ("snapshot (baseline)", snapshot_ms),
        ("planning cycle (reclaim)", cycle_ms),
        ("... and consolidation", both_ms),
    )
    for what, (wall, cpu) in rows:
        print(
            f"{what:<33} {statistics.median(wall):7.1f}  {_p99(wall):7.1f}"
            f"  {statistics.median(cpu):11.1f}  {_p99(cpu):11.1f}"
        )
    ratio = statistics.median(cycle_ms[0]) / statistics.median(snapshot_ms[0])
    print(f"cycle / snapshot (p50): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
