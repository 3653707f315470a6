"""Timeline replay: the Alibaba trace over time, with arrivals, departures and waiting.

The packing replay (``packing``) never deletes a pod. Here every pod of the trace arrives at its
``creation_time`` and, once placed, runs for its recorded run time ``deletion_time -
scheduled_time``; then it leaves and its GPUs come free. Pods the trace never scheduled (no
``scheduled_time``: they were deleted while pending) have no run time and are left out, as are
pods that fit no node of the empty cluster (counted as *never fit*).

**Load.** ``load`` = L divides every arrival time (relative to the first) by L: the gaps between
arrivals shrink L-fold, run times stay, so L x as much work arrives per second.

**Cluster share.** The trace's pods are a sample of the cluster's workload: at 1.0x they never
hold more than about 1% of its 6212 GPUs at once (docs/simulator.md, "Timeline"), so on the whole
cluster no pod ever waits. ``cluster_share`` = s keeps about s of the nodes, a systematic sample
of the nodes sorted by (GPU model, GPUs per node, CPU, memory, name) - every model and node size in
proportion, the same nodes for every seed and policy - so the trace's load meets a cluster its size.

**Scheduling.** Events in time order; at equal times departures first, then pods coming of age
for moves, then arrivals. An arriving pod goes where its policy ranks best (``packing.Placer``,
the memoised verdicts per node state reused through the whole replay). A pod that fits nowhere
waits. Waiting pods are kept in the scheduler's order: first in, first out by arrival (the trace
has no priorities). When a pod leaves, the waiting pods are tried in that order and each that now
fits starts (a later, smaller pod may start while an earlier one still waits, as kube-scheduler's
queue does). Only the nodes that gained room need checking: every other node already refused
every waiting pod, and placements only take room away.

**Moves** (``tessera+moves``, Tessera's placement). Whenever something changed while GPU pods
wait - a pod arrived and waits, a pod left, a running pod reached the minimum runtime, or the
last cycle moved pods - one consolidation cycle runs (a pod started elsewhere only takes room and
makes no mover, so it cannot make a plan appear): the extender's planner
(``extender.policy.consolidation.plan_moves``, through ``moves.Consolidator``) over the waiting
GPU pods in the scheduler's order, the first of each distinct request only (a second pod of the
same request would search the same nodes again; it is served in a later cycle), at most
``max_pending`` of them, with the extender's rules (``min_runtime_s`` 300, 2 moves per pod, 4 per
cycle) and the packing replay's budget: at most B moves per 100 pods started so far. The plans
are carried out; a moved pod *restarts* on its new GPUs - its work so far is lost (counted as
GPU-seconds: its GPUs x the time it had run) and it runs its whole run time again.

**Reported** (``TimelineResult``): GPU allocation averaged over time from the first to the last
arrival, and over the time while a GPU pod waits; *stranded* GPU-seconds - idle GPU capacity
integrated over the time while some waiting GPU pod would fit after moves, meaning its GPU milli
is at most the idle GPU milli on the nodes it fits when they are empty (GPU count and model, CPU
and memory capacity: a relaxation, as if moves could gather all of that idle capacity on one of
them); waits (start - arrival) by pod
size, percentiles by nearest rank; GPU-hours of waiting (wait x GPUs asked); moves and the work
they cost; and, as an outside reference, the trace's own recorded waits (``scheduled_time -
creation_time``) of the same pods.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contract.names import GPU_MILLI
from extender.policy.consolidation import ConsolidationRules
from extender.policy.placement import GpuDemand, WorkloadMix, fits
from extender.policy.reclaim import PendingPod

from .cluster import Cluster
from .moves import QUEUE, Consolidator
from .packing import Placer, workload_mix
from .policies import make_policy
from .trace import SimNode, SimPod

MOVES = "tessera+moves"
TIMELINE_POLICIES = ("random", "bestfit", "fgd", "tessera", MOVES)
SIZE_CLASSES = ("cpu", "fraction", "1", "2-4", "8")
DEFAULT_LOADS = (1.0, 1.5, 2.0, 3.0)
DEFAULT_MOVE_BUDGET = 5.0  # moves per 100 pods started
# The extender's defaults (extender/__main__.py): minimum runtime, moves per pod and per cycle.
DEFAULT_RULES = ConsolidationRules(min_runtime_s=300.0, max_moves_per_pod=2, max_moves_per_cycle=4)
CURVE_POINTS = 400

_DEPART, _OF_AGE, _ARRIVE = 0, 1, 2  # event kinds, in the order they run at equal times


def size_class(demand: GpuDemand) -> str:
    """The pod size a wait is reported under: GPU-less, a fraction, 1, 2-4 or more (8) GPUs."""
    if not demand.count:
        return "cpu"
    if demand.count == 1:
        return "fraction" if demand.milli < GPU_MILLI else "1"
    return "2-4" if demand.count <= 4 else "8"


@dataclass(frozen=True)
class TimedPod:
    name: str
    demand: GpuDemand
    arrival_s: float  # (creation_time - first creation_time) / load
    run_s: float  # deletion_time - scheduled_time
    recorded_wait_s: float  # scheduled_time - creation_time: what the production scheduler took


def timed_pods(pods: Sequence[SimPod], load: float) -> tuple[list[TimedPod], int]:
    """The pods that ran in the trace, in arrival order at `load`; and how many never ran."""
    if load <= 0:
        raise ValueError("the load factor must be positive")
    ran = [
        pod
        for pod in pods
        if pod.creation_time is not None and pod.scheduled_time is not None and pod.deletion_time is not None
    ]
    if not ran:
        raise ValueError("no pod has creation_time, scheduled_time and deletion_time: nothing to replay")
    first = min(pod.creation_time or 0 for pod in ran)
    timed = [
        TimedPod(
            pod.name,
            pod.demand,
            ((pod.creation_time or 0) - first) / load,
            max(0, (pod.deletion_time or 0) - (pod.scheduled_time or 0)),
            max(0, (pod.scheduled_time or 0) - (pod.creation_time or 0)),
        )
        for pod in ran
    ]
    timed.sort(key=lambda pod: pod.arrival_s)  # stable: file order among equal times
    return timed, len(pods) - len(ran)


def sample_nodes(nodes: Sequence[SimNode], share: float) -> list[SimNode]:
    """About `share` of the nodes, every shape in proportion (module docstring)."""
    if not 0 < share <= 1:
        raise ValueError("the cluster share must be in (0, 1]")
    ordered = sorted(nodes, key=lambda n: (n.model, n.gpus, n.cpu_milli, n.memory_mib, n.name))
    # Node j is kept when the running count round(j x share) steps up at it.
    kept = [
        node
        for j, node in enumerate(ordered)
        if math.floor((j + 1) * share + 0.5) > math.floor(j * share + 0.5)
    ]
    if not kept:
        raise ValueError(f"a share of {share:g} of {len(nodes)} nodes keeps none")
    return kept


def node_order(nodes: Sequence[SimNode], seed: int) -> list[SimNode]:
    """The nodes in the replay's order for `seed`: ties between equally ranked nodes go by it, as
    in the packing replay."""
    ordered = sorted(nodes, key=lambda node: node.name)
    random.Random(f"nodes:{seed}").shuffle(ordered)
    return ordered


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest rank: the smallest value with at least `pct` % of the values at or below it."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class TimelinePoint:
    time_s: float
    allocation_pct: float
    waiting: int  # pods waiting


@dataclass
class TimelineResult:
    policy: str
    load: float
    seed: int
    gpus: int
    pods: int = 0  # replayed (ran in the trace and fit the empty cluster)
    never_ran: int = 0  # no scheduled_time in the trace
    never_fit: int = 0  # fit no node of the empty cluster
    span_s: float = 0.0  # first to last arrival
    end_s: float = 0.0  # when the last waiting pod started
    allocation_pct: float = 0.0  # time-averaged over the arrival span
    allocation_waiting_pct: float = math.nan  # time-averaged while a GPU pod waits
    waiting_s: float = 0.0  # time while a GPU pod waits
    stranded_gpu_s: float = 0.0
    waits: dict[str, list[float]] = field(default_factory=dict)  # size class -> waits (s)
    recorded_waits: dict[str, list[float]] = field(default_factory=dict)
    wait_gpu_hours: float = 0.0
    # Per size class: a percentile of one class can move while its GPU-hours stay (docs/simulator.md,
    # "Why the fractions' p95 rises with moves").
    wait_gpu_hours_by_size: dict[str, float] = field(default_factory=dict)
    work_gpu_s: float = 0.0  # GPU-seconds of the replayed pods' run times
    moves: int = 0
    lost_gpu_s: float = 0.0  # work lost to moves (each mover restarts)
    pods_served_by_moves: int = 0
    seconds: float = 0.0  # wall clock of the replay
    curve: list[TimelinePoint] = field(default_factory=list)

    def wait(self, size: str, pct: float) -> float:
        return percentile(self.waits.get(size, []), pct)

    def multi_gpu_waits(self) -> list[float]:
        return self.waits.get("2-4", []) + self.waits.get("8", [])

    @property
    def lost_work_pct(self) -> float:
        return 100.0 * self.lost_gpu_s / self.work_gpu_s if self.work_gpu_s else 0.0


@dataclass
class _Running:
    pod: TimedPod
    index: int
    gpus: tuple[int, ...]
    started_s: float
    incarnation: int  # departure events of earlier incarnations (before a move) are stale


class Timeline:
    """One replay of one policy at one load (module docstring)."""

    def __init__(
        self,
        nodes: Sequence[SimNode],
        pods: Sequence[TimedPod],
        policy: str,
        *,
        seed: int = 0,
        load: float = 1.0,
        mix: WorkloadMix | None = None,
        move_budget: float = DEFAULT_MOVE_BUDGET,
        rules: ConsolidationRules = DEFAULT_RULES,
    ) -> None:
        if policy not in TIMELINE_POLICIES:
            raise ValueError(
                f"unknown timeline policy {policy!r}; choose from {', '.join(TIMELINE_POLICIES)}"
            )
        mix = mix or workload_mix([SimPod(pod.name, pod.demand) for pod in pods])
        ordered = node_order(nodes, seed)
        self.cluster = Cluster(ordered, mix)
        base = "tessera" if policy == MOVES else policy
        self.placer = Placer(self.cluster, make_policy(base, mix), random.Random(f"policy:{seed}"), "first")
        self.consolidator = Consolidator(self.cluster, move_budget, rules) if policy == MOVES else None
        self.result = TimelineResult(policy, load, seed, sum(node.gpus for node in nodes))
        self._empty = [self.cluster.node_gpus(i) for i in range(len(ordered))]
        self._homes_of: dict[GpuDemand, list[int]] = {}
        self.pods = [pod for pod in pods if self._homes(pod.demand)]
        self.result.never_fit = len(pods) - len(self.pods)
        self.result.pods = len(self.pods)
        self._events: list[tuple[float, int, int, str, int]] = []  # (time, kind, seq, pod, incarnation)
        self._seq = 0
        self.waiting: dict[str, TimedPod] = {}  # arrival order
        self._waiting_gpu: Counter[GpuDemand] = Counter()  # demands of the waiting GPU pods
        self.running: dict[str, _Running] = {}
        self._incarnations: Counter[str] = Counter()
        self._started = 0
        self._now = 0.0
        self._changed = True  # since the last consolidation cycle that found nothing
        self._areas = [0.0, 0.0, 0.0]  # allocated milli x s over the span; while waiting; stranded milli x s

    def _push(self, at: float, kind: int, key: str, incarnation: int = 0) -> None:
        heapq.heappush(self._events, (at, kind, self._seq, key, incarnation))
        self._seq += 1

    def run(self) -> TimelineResult:
        started = time.perf_counter()
        result = self.result
        by_name = {pod.name: pod for pod in self.pods}
        for pod in self.pods:
            self._push(pod.arrival_s, _ARRIVE, pod.name)
            result.recorded_waits.setdefault(size_class(pod.demand), []).append(pod.recorded_wait_s)
            result.work_gpu_s += pod.demand.total_milli / GPU_MILLI * pod.run_s
        result.span_s = self.pods[-1].arrival_s if self.pods else 0.0
        step = result.span_s / CURVE_POINTS if result.span_s else math.inf
        next_point = 0.0
        while self._events and (self.waiting or self._arrivals_left()):
            at, kind, _, key, incarnation = heapq.heappop(self._events)
            self._advance(at)
            while at >= next_point and next_point <= result.span_s:
                self._sample(next_point)
                next_point += step
            if kind == _ARRIVE:
                self._arrive(by_name[key])
            elif kind == _DEPART:
                running = self.running.get(key)
                if running is None or running.incarnation != incarnation:
                    continue  # moved since: this departure belonged to the run that was cut short
                self._depart(running)
            else:
                self._changed = True  # a running pod may be moved from now on
            self._consolidate()
        result.end_s = self._now
        area, waiting_area, stranded = self._areas
        result.allocation_pct = (
            100.0 * area / (self.cluster.capacity_milli * result.span_s) if result.span_s else 0.0
        )
        if result.waiting_s:
            result.allocation_waiting_pct = (
                100.0 * waiting_area / (self.cluster.capacity_milli * result.waiting_s)
            )
        result.stranded_gpu_s = stranded / GPU_MILLI
        if self.consolidator is not None:
            stats = self.consolidator.stats
            result.moves, result.pods_served_by_moves = stats.moves, stats.pods_served
        result.seconds = time.perf_counter() - started
        return result

    def _arrivals_left(self) -> bool:
        return self._started + len(self.waiting) < len(self.pods)

    def _sample(self, at: float) -> None:
        allocation = 100.0 * self.cluster.allocated_milli / self.cluster.capacity_milli
        self.result.curve.append(TimelinePoint(at, allocation, len(self.waiting)))

    def _advance(self, at: float) -> None:
        """Integrate the cluster's state from the last event to `at`."""
        elapsed = at - self._now
        if elapsed <= 0:
            return
        allocated = self.cluster.allocated_milli
        within_span = max(0.0, min(at, self.result.span_s) - self._now)
        self._areas[0] += allocated * within_span
        if self._waiting_gpu:
            self.result.waiting_s += elapsed
            self._areas[1] += allocated * elapsed
            if self._would_fit_after_moves():
                self._areas[2] += (self.cluster.capacity_milli - allocated) * elapsed
        self._now = at

    def _would_fit_after_moves(self) -> bool:
        cluster = self.cluster
        for demand in self._waiting_gpu:
            idle = sum(sum(cluster.free[index]) for index in self._homes(demand))
            if demand.total_milli <= idle:
                return True
        return False

    def _homes(self, demand: GpuDemand) -> list[int]:
        """The nodes `demand` fits when they are empty (its GPU count, model, CPU and memory)."""
        homes = self._homes_of.get(demand)
        if homes is None:
            homes = self._homes_of[demand] = [i for i, empty in enumerate(self._empty) if fits(empty, demand)]
        return homes

    def _start(self, pod: TimedPod, index: int, gpus: tuple[int, ...], waited_s: float | None) -> None:
        """`pod` starts on node `index` (`waited_s` None: a mover restarting, not a first start)."""
        self._incarnations[pod.name] += 1
        incarnation = self._incarnations[pod.name]
        self.running[pod.name] = _Running(pod, index, gpus, self._now, incarnation)
        self._push(self._now + pod.run_s, _DEPART, pod.name, incarnation)
        if self.consolidator is not None and pod.demand.count:
            self._push(self._now + self.consolidator.rules.min_runtime_s, _OF_AGE, pod.name)
        if waited_s is None:
            return
        self._started += 1
        size = size_class(pod.demand)
        self.result.waits.setdefault(size, []).append(waited_s)
        gpu_hours = waited_s * pod.demand.total_milli / GPU_MILLI / 3600
        self.result.wait_gpu_hours += gpu_hours
        by_size = self.result.wait_gpu_hours_by_size
        by_size[size] = by_size.get(size, 0.0) + gpu_hours

    def _place(self, pod: TimedPod) -> bool:
        placement = self.placer.place(pod.demand)
        if placement is None:
            return False
        index, gpus = placement
        if self.consolidator is not None:
            self.consolidator.placed(pod.name, index, pod.demand, gpus, self._now)
        self._start(pod, index, tuple(gpus), self._now - pod.arrival_s)
        return True

    def _arrive(self, pod: TimedPod) -> None:
        if not self._place(pod):
            self.waiting[pod.name] = pod
            if pod.demand.count:
                self._waiting_gpu[pod.demand] += 1
            self._changed = True

    def _unwait(self, pod: TimedPod) -> None:
        del self.waiting[pod.name]
        if pod.demand.count:
            self._waiting_gpu[pod.demand] -= 1
            if not self._waiting_gpu[pod.demand]:
                del self._waiting_gpu[pod.demand]

    def _depart(self, running: _Running) -> None:
        del self.running[running.pod.name]
        self.cluster.release(running.index, running.pod.demand, running.gpus)
        if self.consolidator is not None:
            self.consolidator.released(running.pod.name)
        self._changed = True
        self._retry_waiting({running.index})

    def _retry_waiting(self, gained_room: Iterable[int]) -> None:
        """Start the waiting pods that fit now, in the scheduler's order; only the nodes that gained
        room can take one (module docstring)."""
        nodes = list(gained_room)
        refused: set[GpuDemand] = set()  # room only shrinks during the pass: refused stays refused
        for pod in list(self.waiting.values()):
            if pod.demand in refused:
                continue
            if not any(self.placer.fits_node(pod.demand, index) for index in nodes):
                refused.add(pod.demand)
                continue
            self._unwait(pod)
            if not self._place(pod):
                raise AssertionError(f"{pod.name} fit node(s) {nodes} but the policy placed it nowhere")

    def _consolidate(self) -> None:
        """One consolidation cycle, unless it would find what the last fruitless one found: since
        then only pods started (room taken, no new mover) and the budget still allows a move."""
        consolidator = self.consolidator
        if consolidator is None or not self._waiting_gpu or not self._changed:
            return
        if consolidator.allowed(self._started) <= 0:
            return  # the budget allows no move; try again once more pods started
        first_of_each: dict[GpuDemand, TimedPod] = {}
        for pod in self.waiting.values():
            if pod.demand.count and pod.demand not in first_of_each:
                first_of_each[pod.demand] = pod
                if len(first_of_each) == consolidator.rules.max_pending:
                    break
        pending = [
            PendingPod(p.name, QUEUE, p.demand, {}, created=p.arrival_s) for p in first_of_each.values()
        ]
        served = consolidator.serve_waiting(pending, self._started, self._now)
        self._changed = bool(served)  # served: the cycle's move limit may have left more to serve
        if not served:
            return
        touched: set[int] = set()
        for key, moved in served:
            pod = self.waiting[key]
            self._unwait(pod)
            index, gpus = consolidator.where(key)
            self._start(pod, index, gpus, self._now - pod.arrival_s)
            for mover_key in moved:
                mover = self.running.pop(mover_key)
                self.result.lost_gpu_s += (
                    mover.pod.demand.total_milli / GPU_MILLI * (self._now - mover.started_s)
                )
                touched.add(mover.index)
                new_index, new_gpus = consolidator.where(mover_key)
                self._start(mover.pod, new_index, new_gpus, None)
        self._retry_waiting(touched)


def replay_timeline(
    nodes: Sequence[SimNode],
    pods: Sequence[SimPod],
    policy: str,
    *,
    seed: int = 0,
    load: float = 1.0,
    max_pods: int | None = None,
    move_budget: float = DEFAULT_MOVE_BUDGET,
    rules: ConsolidationRules = DEFAULT_RULES,
) -> TimelineResult:
    """One timeline replay of the trace's `pods` on `nodes` (already sampled); `max_pods`: only the
    first that many pods by arrival (a short replay)."""
    timed, never_ran = timed_pods(pods, load)
    mix = workload_mix(pods)
    timeline = Timeline(
        nodes, timed[:max_pods], policy, seed=seed, load=load, mix=mix, move_budget=move_budget, rules=rules
    )
    result = timeline.run()
    result.never_ran = never_ran
    return result
