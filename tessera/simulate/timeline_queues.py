"""Queues with reclaim in the timeline replay: the trace's pods split into queues, admitted and
reclaimed by the extender's own rules.

**The rule.** With N queues ``q0`` .. ``q{N-1}``, a pod goes to queue ``crc32(name) mod N`` (its
trace name, UTF-8; CRC-32 because it is the same on every machine and run, unlike Python's salted
``hash``). The trace has no user, job or team column - its ``qos`` is a service class with two big,
unequal groups (LS 57%, BE 42% of the pods) - so the name's hash spreads the pods evenly and
independently of their size and arrival. Every queue has over-quota weight 1 and an equal part of
the cluster's GPUs as its GPU quota (the remainder of the division one GPU each to the first
queues), so the quotas sum to the cluster; no limits, and a Queue's defaults for the rest (no
minimum runtime before reclaim). Every pod has priority 0 and is preemptible (the trace has no
priorities).

**The replay.** The pods the timeline replays (``timeline.timed_pods``: those that ran in the
trace, at the same load, arrivals and run times; those fitting no node of the empty sampled cluster
left out, as there) on the same nodes in the same per-seed order become a ``queues.QueueWorkload``
of one-pod jobs, replayed by ``queues.run_queue_workload`` - the queue simulator, which runs the
extender's admission (``extender.policy.admission``) in kube-scheduler's passes and its reclaim loop
(``extender.policy.reclaim.plan``) every second. An evicted pod terminates at once and waits again
at the head of its queue (its original creation time); its runtime starts over, and the work it had
done is lost: its GPUs x how long it had run. Placement is the named policy through the queue
simulator's ``Placer``, scored against the trace's whole mix with ties to the first node in the
seed's order, as the plain timeline places. ``tessera+moves`` is Tessera's placement with the
extender's consolidation loop after each reclaim cycle (``queue_moves``), with the plain
timeline's rules and move budget; a moved pod restarts too, its lost run counted apart.

**Reported per queue** (``queues.QueueSummary``), over the whole run (first arrival to the last
pod's end): GPU-hours used and the GPU-hours of its fair share (its share integrated over time; a
share follows demand, so a queue wanting nothing deserves nothing then), time below its share
(while a waiting pod of it would have kept it within its share), wait p95 (nearest rank; a pod's
waits summed, those after an eviction too) and the longest wait, GPU-hours of waiting (waits x
GPUs asked), evictions of its pods and the work they lost; and,
because one starved queue hides in a mean, the worst queue for each figure.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from contract.names import GPU_MILLI
from extender.policy.consolidation import ConsolidationRules
from extender.policy.placement import fits
from extender.queues import parse_queue

from .cluster import Cluster
from .packing import workload_mix
from .queue_moves import QueueMoves
from .queues import MIB, JobModel, QueueRunResult, QueueWorkload, run_queue_workload
from .timeline import (
    DEFAULT_MOVE_BUDGET,
    DEFAULT_RULES,
    MOVES,
    TIMELINE_POLICIES,
    TimedPod,
    node_order,
    timed_pods,
)
from .trace import SimNode, SimPod


def queue_of(name: str, queues: int) -> str:
    """The queue of the pod named `name` among `queues` queues (module docstring)."""
    return f"q{zlib.crc32(name.encode()) % queues}"


def equal_quotas(gpus: int, queues: int) -> list[int]:
    """GPU quotas of `queues` equal queues summing to `gpus`: the remainder one each to the first."""
    if queues < 1:
        raise ValueError("at least one queue is needed")
    return [gpus // queues + (1 if i < gpus % queues else 0) for i in range(queues)]


def queue_workload(nodes: Sequence[SimNode], pods: Sequence[TimedPod], queues: int) -> QueueWorkload:
    """The queue workload of the timed `pods` on `nodes` (in replay order) split into `queues`."""
    specs = tuple(
        parse_queue({"metadata": {"name": f"q{i}"}, "spec": {"resources": {"gpu": {"quota": quota}}}})
        for i, quota in enumerate(equal_quotas(sum(node.gpus for node in nodes), queues))
    )
    jobs = tuple(
        JobModel(
            name=pod.name,
            queue=queue_of(pod.name, queues),
            arrival=pod.arrival_s,
            duration=pod.run_s,
            gpus=pod.demand.count,
            gpuMilli=pod.demand.milli if pod.demand.count == 1 else GPU_MILLI,
            cpu=pod.demand.cpu_milli / 1000,
            memory=float(pod.demand.memory_mib * MIB),
            models=sorted(pod.demand.models),
        )
        for pod in pods
    )
    return QueueWorkload(f"timeline-{queues}-queues", 0, tuple(nodes), specs, jobs)


@dataclass
class TimelineQueuesResult:
    policy: str
    load: float
    seed: int
    queues: int
    gpus: int
    pods: int  # replayed
    never_fit: int  # fit no node of the empty cluster
    run: QueueRunResult  # per queue in ``run.queues``; the moves in ``run.moves``
    seconds: float = 0.0  # wall clock of the replay

    @property
    def work_gpu_s(self) -> float:
        """GPU-seconds held over the run (lost work included)."""
        return self.run.gpu_s_used

    @property
    def moves(self) -> int:
        return self.run.moves.moves if self.run.moves is not None else 0

    @property
    def move_lost_pct(self) -> float:
        """Work lost to moves (the movers' runs cut short), % of the GPU-seconds held."""
        lost = self.run.moves.lost_gpu_s if self.run.moves is not None else 0.0
        return 100.0 * lost / self.work_gpu_s if self.work_gpu_s else 0.0


def replay_timeline_queues(
    nodes: Sequence[SimNode],
    pods: Sequence[SimPod],
    policy: str,
    *,
    queues: int,
    seed: int = 0,
    load: float = 1.0,
    max_pods: int | None = None,
    move_budget: float = DEFAULT_MOVE_BUDGET,
    rules: ConsolidationRules = DEFAULT_RULES,
) -> TimelineQueuesResult:
    """One queue replay of the trace's `pods` on `nodes` (already sampled); `max_pods`: only the
    first that many pods by arrival, as ``timeline.replay_timeline``; `move_budget` and `rules`:
    the consolidation of ``tessera+moves``, as there."""
    if policy not in TIMELINE_POLICIES:
        raise ValueError(f"unknown timeline policy {policy!r}; choose from {', '.join(TIMELINE_POLICIES)}")
    started = time.perf_counter()
    timed = timed_pods(pods, load)[0][:max_pods]
    ordered = node_order(nodes, seed)
    mix = workload_mix(pods)
    cluster = Cluster(ordered, mix)
    empty = [cluster.node_gpus(i) for i in range(len(ordered))]
    fitting = {demand: any(fits(node, demand) for node in empty) for demand in {pod.demand for pod in timed}}
    kept = [pod for pod in timed if fitting[pod.demand]]
    # Placement as in the plain timeline: scored against the trace's whole mix, ties to the first
    # node in the seed's order; so one queue replays exactly what the plain timeline does.
    moves = QueueMoves(move_budget, rules) if policy == MOVES else None
    run = run_queue_workload(
        queue_workload(ordered, kept, queues),
        "tessera" if policy == MOVES else policy,
        seed,
        mix=mix,
        tie_break="first",
        moves=moves,
    )
    return TimelineQueuesResult(
        policy,
        load,
        seed,
        queues,
        sum(node.gpus for node in nodes),
        len(kept),
        len(timed) - len(kept),
        run,
        time.perf_counter() - started,
    )
