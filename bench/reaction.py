"""Benchmark 3: how fast a second queue reaches its fair share of a saturated cluster.

Two queues with equal GPU quotas (Queue CRD, ``manifests/crds/queues.yaml``). Queue A submits
twice as many single-GPU pods as the cluster has GPUs and fills it; then queue B submits as many
pods as there are GPUs, and A's running pods finish at a fixed rate (force-deleted, like jobs
completing: there is no reclaim or preemption yet). The clock runs from B's submission until B
holds its fair share (``extender.policy.fairness.compute_fair_shares`` over the queues' quotas
and demands: half the GPUs here). Baseline: the plain kube-scheduler, which hands freed GPUs to
pending pods by priority and age, so A's older backlog goes first. Both runs use the same nodes,
queues, rates and client QPS (see ``bench.e2e``); the extender runs only during its own run.
KAI Scheduler races too when ``hack/build-kai.sh`` built it (``bench.kai``: the two queues
mirrored as KAI Queues, its processes running only during its rounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from contract.names import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from extender.kubeapi import request
from extender.policy.fairness import FairShareInputs, QueueSpec, QueueUsage, compute_fair_shares
from extender.queues import queue_object
from tessera.simulate.report import format_table

from .e2e import (
    CLIENT_BURST,
    CLIENT_QPS,
    GPUS_PER_NODE,
    SLICE_LAYOUT,
    BenchCluster,
    BoundPods,
    Rounds,
    bench_cluster,
    bench_parser,
    compare,
    seconds_list,
    watching,
)
from .kai import DEFAULT_ACTIONS

log = logging.getLogger(__name__)

QUEUE_A = "bench-queue-a"
QUEUE_B = "bench-queue-b"
QUEUES_PATH = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
SMOKE_RATE = 8.0


# -- pure helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReactionRun:
    """One scheduler's run: seconds from B's submission until B held ``target`` GPUs, and how many
    of A's pods had finished by then."""

    scheduler: str
    target: int
    seconds: float
    finished_a: int
    held_a: int
    held_b: int


@dataclass(frozen=True)
class ReactionResult(Rounds[ReactionRun]):
    nodes: int
    a_pods: int
    b_pods: int
    finish_rate: float

    @property
    def ratio(self) -> float:
        """Plain time over Tessera time: how many times sooner B gets its share with the extender."""
        return self.plain.seconds / self.tessera.seconds if self.tessera.seconds > 0 else 0.0


def fair_share_of_b(gpus: int, a_pods: int, b_pods: int) -> int:
    """B's fair share (whole GPUs) right after it submits: equal quotas, A holding every GPU."""
    quota = {"gpu": gpus / 2}
    queues = [QueueSpec(QUEUE_A, quota=quota), QueueSpec(QUEUE_B, quota=quota)]
    usage = {
        QUEUE_A: QueueUsage(allocated={"gpu": gpus}, requested={"gpu": a_pods - gpus}),
        QUEUE_B: QueueUsage(allocated={}, requested={"gpu": b_pods}),
    }
    return int(compute_fair_shares(FairShareInputs(queues, usage, {"gpu": gpus}))[QUEUE_B]["gpu"] + 1e-9)


def vs_plain(plain: ReactionRun, run: ReactionRun) -> str:
    """How many times sooner (or later) than the plain scheduler `run` got B its share."""
    if plain.seconds >= run.seconds:
        return f"{plain.seconds / run.seconds:.2f}x faster" if run.seconds > 0 else "-"
    return f"{run.seconds / plain.seconds:.2f}x slower"


def reaction_table(result: ReactionResult) -> str:
    headers = [
        "scheduler",
        "GPUs",
        "B fair share",
        "B reached it after s",
        "each round s",
        "A pods finished by then",
        "A / B holding then",
        "vs plain",
    ]
    rows = [
        [
            label,
            str(result.nodes * GPUS_PER_NODE),
            str(run.target),
            f"{run.seconds:.1f}",
            seconds_list(r.seconds for r in runs),
            str(run.finished_a),
            f"{run.held_a} / {run.held_b}",
            ratio,
        ]
        for label, run, runs, ratio in (
            ("plain kube-scheduler", result.plain, result.plain_runs, "1.00x"),
            (
                "kube-scheduler + Tessera",
                result.tessera,
                result.tessera_runs,
                vs_plain(result.plain, result.tessera),
            ),
            *((label, run, runs, vs_plain(result.plain, run)) for label, (run, runs) in result.kai.items()),
        )
    ]
    note = (
        f"queue A: {result.a_pods} pods, queue B: {result.b_pods} pods, equal GPU quotas; "
        f"A's running pods finish at {result.finish_rate:g}/s; "
        f"client QPS/burst {CLIENT_QPS}/{CLIENT_BURST} (KAI: its operator's); DRA slices: {SLICE_LAYOUT}"
    )
    return f"{format_table(headers, rows)}\n{note}"


# -- the run -----------------------------------------------------------------------------------


async def _finish_a(
    bench: BenchCluster, namespace: str, tracker: BoundPods, rate: float, finished: list[str]
) -> None:
    """Deletes one of A's bound pods every 1/rate seconds, the longest-bound (lowest name) first."""
    while True:
        running = sorted(
            name for name, queue in tracker.bound.items() if queue == QUEUE_A and name not in finished
        )
        if running:
            finished.append(running[0])
            await bench.delete_pod(namespace, running[0])
        await asyncio.sleep(1.0 / rate)


async def _react(
    bench: BenchCluster, namespace: str, scheduler: str, a_pods: int, b_pods: int, rate: float, timeout: float
) -> ReactionRun:
    gpus = len(bench.nodes) * GPUS_PER_NODE
    target = fair_share_of_b(gpus, a_pods, b_pods)
    async with watching(bench.api, namespace) as tracker:
        await bench.submit(namespace, scheduler, [f"a-{index:05d}" for index in range(a_pods)], QUEUE_A)
        await tracker.wait_for(
            lambda t: t.per_queue().get(QUEUE_A, 0) >= gpus, timeout, "queue A to fill the cluster"
        )
        started = time.monotonic()
        await bench.submit(namespace, scheduler, [f"b-{index:05d}" for index in range(b_pods)], QUEUE_B)
        finished: list[str] = []
        finisher = asyncio.create_task(_finish_a(bench, namespace, tracker, rate, finished))
        try:
            reached = await tracker.wait_for(
                lambda t: t.per_queue().get(QUEUE_B, 0) >= target, timeout, f"queue B to hold {target} GPUs"
            )
        finally:
            finisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await finisher
        held = tracker.per_queue()
    run = ReactionRun(
        scheduler, target, reached - started, len(finished), held.get(QUEUE_A, 0), held.get(QUEUE_B, 0)
    )
    log.info(
        "%s: queue B held %d GPUs after %.1fs, %d of A's pods finished",
        scheduler,
        target,
        run.seconds,
        run.finished_a,
    )
    return run


async def run_reaction_async(
    nodes: int,
    a_pods: int | None = None,
    rate: float = 4.0,
    rounds: int = 1,
    timeout: float = 300.0,
    kai: bool = True,
) -> ReactionResult:
    gpus = nodes * GPUS_PER_NODE
    a_pods, b_pods = a_pods or 2 * gpus, gpus
    if a_pods <= gpus:
        raise ValueError(f"queue A needs more than the {gpus} GPUs in pods to saturate the cluster")
    async with bench_cluster(nodes) as bench:
        queues = [QueueSpec(name, quota={"gpu": gpus // 2}) for name in (QUEUE_A, QUEUE_B)]
        for queue in queues:
            body = queue_object(queue.name, {"resources": {"gpu": {"quota": queue.quota["gpu"]}}})
            await request(bench.api, "POST", QUEUES_PATH, body=body)
        variants = [DEFAULT_ACTIONS] if kai and await bench.enable_kai(queues) else []
        plain, tessera, kai_runs, _ = await compare(
            bench,
            lambda namespace, scheduler: _react(bench, namespace, scheduler, a_pods, b_pods, rate, timeout),
            rounds,
            variants,
        )
    return ReactionResult(
        plain, tessera, nodes=nodes, a_pods=a_pods, b_pods=b_pods, finish_rate=rate, kai_runs=kai_runs
    )


def run_reaction(
    nodes: int = 4,
    a_pods: int | None = None,
    rate: float = 4.0,
    rounds: int = 1,
    timeout: float = 300.0,
    kai: bool = True,
) -> ReactionResult:
    """Benchmark 3 on a fresh local control plane (started and stopped here); queue A submits
    ``a_pods`` (default twice the GPUs), queue B as many pods as there are GPUs. With several
    ``rounds`` the figures are those of the median round of each scheduler; KAI races too when
    hack/build-kai.sh built it (and ``kai``)."""
    return asyncio.run(run_reaction_async(nodes, a_pods, rate, rounds, timeout, kai))


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.reaction",
        __doc__,
        full="a larger cluster: 32 nodes (256 GPUs)",
        nodes="default 4",
        pods="queue A's pods; default twice the GPUs",
        smoke=f"1 node, A's pods finishing {SMOKE_RATE:g} per second",
    )
    parser.add_argument("--rate", type=float, default=4.0, help="A's pods finishing per second (default 4)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.smoke:
        args.nodes, args.rate, args.rounds = 1, SMOKE_RATE, 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    nodes = args.nodes or (32 if args.full else 4)
    result = run_reaction(nodes, args.pods, args.rate, args.rounds, kai=not args.no_kai)
    print(f"\n[3] fairness reaction on the local control plane: {nodes} nodes x {GPUS_PER_NODE} GPUs")
    print(reaction_table(result))
    print(
        json.dumps(
            {
                "plain_s": round(result.plain.seconds, 2),
                "tessera_s": round(result.tessera.seconds, 2),
                "ratio": round(result.ratio, 2),
                **{f"kai_s ({label})": round(run.seconds, 2) for label, (run, _) in result.kai.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
