"""A cluster snapshot the planners read and fork: pure data, no I/O.

The live picture hands out a `ClusterSnapshot`: every GPU node's free share per GPU, the pods
running there with the GPUs they hold, and the queues' fairness snapshot. A planner asking
"what if" forks it and applies hypothetical evictions and placements to the fork - with the same
placement code the filter uses - then reads fits, free capacity and queue usage from the fork.
The snapshot it came from, and the live picture, are untouched: a fork copies the two maps it
changes (nodes, running pods) and shares every immutable value in them.

What a caller keeps from one snapshot to the next (the live picture does) is handed in rather
than found by a pass over every pod: the nodes of possible victims per queue (`victim_nodes`),
the movers per node (`movers`), the terminating pods, the gangs' minimums. A fork corrects them
with its own changes.

An eviction frees the pod's GPUs and moves its fairness vector from the queue's `allocated` to
its `requested` (a controller recreates an evicted pod, so its queue still wants it), and out of
its `non_preemptible` use when the pod is not preemptible; a placement the other way (a pod placed
in the fork counts as its `preemptible` says: the planners' arriving pods, never victims, count as
non-preemptible). Fair shares, which depend on allocated plus requested, stay as they were.

GPUs held for a pod still to bind (`HeldGpus`: a reclaim plan freed them for it) are handed in
with the snapshot, naming the devices; a planner's fork places each held pod on exactly those GPUs
(`place` with `gpus`), so no later plan gives them to another pod or frees more for the same one.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import is_not
from typing import TypeVar

from contract.names import GPU_MILLI
from extender.policy.fairness import FairnessSnapshot, QueueUsage, Resources
from extender.policy.placement import (
    NO_DOMAINS,
    DomainMap,
    GpuDemand,
    NodeGpus,
    Strategy,
    WorkloadMix,
    choose_gpus,
    fits,
)

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class RunningPod:
    """A pod holding GPUs on a node, as the planners see it."""

    key: str
    queue: str
    node: str
    gpus: tuple[tuple[int, int], ...]  # (GPU index on the node, thousandths held)
    resources: Resources = field(default_factory=dict)  # its fairness vector
    priority: int = 0
    preemptible: bool = True
    started: float = 0.0  # seconds since the epoch
    terminating: bool = False  # already being deleted: its GPUs are as good as free
    # What it takes of the node's CPU and memory; given back on eviction where the node tracks them.
    cpu_milli: int = 0
    memory_mib: int = 0
    # Owned by a controller that recreates it elsewhere when it is evicted, and not opted out:
    # consolidation may move it (extender.policy.consolidation).
    movable: bool = False
    # Its workload when that is a gang (extender.policy.workloads; "" for a pod alone): evicting
    # a member below the workload's minimum breaks it, so planners take the whole gang or none.
    workload: str = ""
    part: str = ""  # its part of the workload, when the workload has parts (subgroups)
    # GPUs it holds (a half: 0.5), summed once: planners rank pods by it every cycle. (A field set
    # at creation: the class has slots, for memory, so it cannot cache a property.)
    gpus_held: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus_held", sum(milli for _, milli in self.gpus) / GPU_MILLI)


@dataclass(frozen=True)
class HeldGpus:
    """GPUs kept on a node for a pod that is still to bind: a plan freed them for it (reclaim).

    The devices are named - each GPU's index and the thousandths kept there - so the pod is placed
    exactly where they were freed, and only those shares are kept from other pods (a half-GPU pod
    holds half of one GPU, never "some half somewhere on the node")."""

    key: str  # the pod it is held for
    queue: str
    node: str
    gpus: tuple[tuple[int, int], ...]  # (GPU index on the node, thousandths kept)
    # Its fairness vector as far as its queue still counts it waiting (empty when the queue
    # counts it allocated already, e.g. admitted by a filter whose bind is still to come): what
    # placing it moves to `allocated`.
    resources: Resources = field(default_factory=dict)
    workload: str = ""  # a gang's: any of its waiting members may take it
    # The CPU and memory kept with the GPUs, where the node tracks them: what the pod needs there,
    # for a plan that freed CPU or memory for it (reclaim's rule 10: keeping only GPUs would let
    # another pod take them back); 0 for a plan that freed GPUs.
    cpu_milli: int = 0
    memory_mib: int = 0
    # The rest of a GPU a plan freed for a fraction of `queue`: kept for the queue's next
    # fractions, any pod of it (`key` names the queue and the device, no pod).
    for_queue: bool = False

    @property
    def demand(self) -> GpuDemand:
        """What is kept, as a demand (a fraction: one GPU's share), with its CPU and memory."""
        return GpuDemand(
            len(self.gpus),
            max((milli for _, milli in self.gpus), default=GPU_MILLI),
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
        )


def can_be_victim(pod: RunningPod) -> bool:
    """Preemptible, not already terminating, holding GPUs: a pod a planner may evict at all."""
    return pod.preemptible and not pod.terminating and bool(pod.gpus)


def could_move(pod: RunningPod) -> bool:
    """`movable` (a controller recreates it) and a possible victim: a pod consolidation may move
    once it has run long enough (extender.policy.consolidation, rule 2)."""
    return pod.movable and can_be_victim(pod)


def mover_order(pod: RunningPod) -> tuple[float, int, float, str]:
    """The order consolidation tries movers in: fewest GPUs, lowest priority, newest first."""
    return (pod.gpus_held, pod.priority, -pod.started, pod.key)


def keep_movers(movers: dict[str, tuple[RunningPod, ...]], pod: RunningPod, sign: int) -> None:
    """Add (sign 1) or take off (-1) `pod` in the movers per node (`could_move`), each node's in
    `mover_order`; a node's tuple is replaced, never changed, so a snapshot may share it (nodes
    left without movers are dropped)."""
    if not could_move(pod):
        return
    on_node = movers.get(pod.node, ())
    if sign > 0:
        kept = list(on_node)
        insort(kept, pod, key=mover_order)
        movers[pod.node] = tuple(kept)
        return
    kept = [other for other in on_node if other.key != pod.key]
    if kept:
        movers[pod.node] = tuple(kept)
    else:
        movers.pop(pod.node, None)


def without(node: NodeGpus, gone: Iterable[RunningPod]) -> NodeGpus:
    """`node` with these of its pods off it: their GPUs' shares (and CPU and memory, where the
    node tracks them) free again."""
    free = list(node.free_milli)
    cpu_milli = memory_mib = 0
    for pod in gone:
        for index, milli in pod.gpus:
            free[index] = min(GPU_MILLI, free[index] + milli)
        cpu_milli += pod.cpu_milli
        memory_mib += pod.memory_mib
    return _with_free(node, free, cpu_milli, memory_mib)


def changed_keys(before: Mapping[str, object], after: Mapping[str, object]) -> set[str]:
    """The keys whose value in `after` is not the very object it was in `before`, those added and
    those gone included. Compared in C when both have the same keys in the same order (the live
    picture's snapshots do, while no node comes or goes), else by a pass over the keys."""
    if not before:
        return set(after)
    if len(before) == len(after) and list(before) == list(after):
        return set(compress(after, map(is_not, before.values(), after.values())))
    return {
        key for key in before.keys() | after.keys() if before.get(key, _GONE) is not after.get(key, _GONE)
    }


_GONE = object()


def count_victims(counts: dict[str, dict[str, int]], pod: RunningPod, sign: int) -> None:
    """Add (sign 1) or take off (-1) `pod` in per-queue, per-node counts of possible victims
    (nodes whose count reaches 0 are dropped)."""
    if not can_be_victim(pod):
        return
    per_node = counts.setdefault(pod.queue, {})
    count = per_node.get(pod.node, 0) + sign
    if count > 0:
        per_node[pod.node] = count
    else:
        per_node.pop(pod.node, None)
        if not per_node:
            del counts[pod.queue]


def _shift(usage: QueueUsage, amounts: Resources, sign: float, preemptible: bool) -> QueueUsage:
    """Move `amounts` from requested to allocated (sign 1) or back (sign -1); a pod that is not
    preemptible moves its non-preemptible use with them."""
    allocated, requested = dict(usage.allocated), dict(usage.requested)
    guaranteed = dict(usage.non_preemptible)
    for resource, amount in amounts.items():
        allocated[resource] = allocated.get(resource, 0.0) + sign * amount
        requested[resource] = max(0.0, requested.get(resource, 0.0) - sign * amount)
        if not preemptible:
            guaranteed[resource] = guaranteed.get(resource, 0.0) + sign * amount
    return QueueUsage(
        allocated={r: a for r, a in allocated.items() if a > 1e-9},
        requested=requested,
        non_preemptible={r: a for r, a in guaranteed.items() if a > 1e-9},
    )


class _Layered(Mapping[str, V]):
    """A read view of `base` with this fork's changes on top (None in `changes`: removed)."""

    def __init__(self, base: Mapping[str, V], changes: dict[str, V | None]) -> None:
        self.base, self.changes = base, changes

    def __getitem__(self, key: str) -> V:
        if key in self.changes:
            value = self.changes[key]
            if value is None:
                raise KeyError(key)
            return value
        return self.base[key]

    def __contains__(self, key: object) -> bool:
        if key in self.changes:
            return self.changes[key] is not None
        return key in self.base

    def __iter__(self) -> Iterator[str]:
        changes = self.changes
        if not changes:
            return iter(self.base)
        return self._merged(changes)

    def _merged(self, changes: dict[str, V | None]) -> Iterator[str]:
        yield from (key for key in self.base if key not in changes or changes[key] is not None)
        yield from (key for key, value in changes.items() if value is not None and key not in self.base)

    def get(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        # Mapping.get goes through __getitem__ and an exception per miss; the planners ask often.
        changes = self.changes
        if key in changes:
            value = changes[key]
            return default if value is None else value
        return self.base.get(key, default)

    def values(self) -> ValuesView[V]:
        # Without changes, the base's own view: planners walk every running pod once per cycle.
        return self.base.values() if not self.changes else super().values()

    def items(self) -> ItemsView[str, V]:
        return self.base.items() if not self.changes else super().items()

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ClusterSnapshot:
    """The picture at one moment. A fork shares the (never changed) base maps of the snapshot it
    came from and keeps only its own changes, so forking costs the size of those changes."""

    def __init__(
        self,
        nodes: Mapping[str, NodeGpus],
        running: Mapping[str, RunningPod],
        fairness: FairnessSnapshot,
        mix: WorkloadMix,
        gpu_memory: Mapping[str, int] | None = None,
        pods_by_node: Mapping[str, Iterable[str]] | None = None,
        minimums: Mapping[str, int] | None = None,
        terminating: Iterable[str] | None = None,
        victims: Mapping[str, Mapping[str, int]] | None = None,
        movers: Mapping[str, tuple[RunningPod, ...]] | None = None,
        holds: Iterable[HeldGpus] = (),
        domains: DomainMap = NO_DOMAINS,
        part_minimums: Mapping[str, Mapping[str, int]] | None = None,
        unaccounted: Mapping[str, tuple[tuple[int, int], ...]] | None = None,
    ) -> None:
        self._node_changes: dict[str, NodeGpus | None] = {}
        self._pod_changes: dict[str, RunningPod | None] = {}
        self.nodes: Mapping[str, NodeGpus] = _Layered(nodes, self._node_changes)
        self.running: Mapping[str, RunningPod] = _Layered(running, self._pod_changes)
        # Bytes of memory of each node's GPUs, which sizes a fraction there (shared, read-only).
        self.gpu_memory: Mapping[str, int] = gpu_memory if gpu_memory is not None else {}
        self._usage = dict(fairness.usage)
        self._base = fairness
        self.mix = mix
        self._fairness: FairnessSnapshot | None = fairness
        self._index = _NodeIndex(running, pods_by_node)
        # Keys of the running pods already terminating, when the caller knows them (else found
        # by a pass over the pods on first use); forks share them.
        self._terminating: frozenset[str] | None = None if terminating is None else frozenset(terminating)
        # Minimum member count of each gang workload of the running pods (shared, read-only).
        self.minimums: Mapping[str, int] = minimums if minimums is not None else {}
        # Of the gangs with parts (subgroups): workload -> part -> its minimum (shared, read-only).
        self.part_minimums: Mapping[str, Mapping[str, int]] = (
            part_minimums if part_minimums is not None else {}
        )
        self._gangs: dict[str, tuple[str, ...]] | None = None  # workload -> base member keys
        # Per queue, per node, how many base running pods could be victims (`can_be_victim`),
        # when the caller keeps them (else counted by a pass on first use); forks share them.
        self._victims: Mapping[str, Mapping[str, int]] | None = victims
        # Per node, the base running pods that could be moved (`could_move`) in `mover_order`,
        # when the caller keeps them (else sorted out by a pass on first use); forks share them.
        self._movers: Mapping[str, tuple[RunningPod, ...]] | None = movers
        # GPUs held for pods still to bind, by pod key (shared, read-only): not placed in this
        # snapshot; a planning fork places them (extender.policy.reclaim.planning_fork).
        self.holds: Mapping[str, HeldGpus] = {hold.key: hold for hold in holds}
        # Node -> its topology domain, for gang plans (shared, read-only; `DomainMap`).
        self.domains = domains
        # Node -> (GPU index, thousandths) held by claims of no pod on the node: allocated before
        # their pod's bind is seen, or left by a pod gone (shared, read-only; where the caller
        # knows them: the picture tells them for nodes with holds).
        self.unaccounted: Mapping[str, tuple[tuple[int, int], ...]] = unaccounted or {}

    def members(self, workload: str) -> list[RunningPod]:
        """The running members of a gang workload in this snapshot, terminating ones aside."""
        if self._gangs is None:
            gangs: dict[str, list[str]] = {}
            assert isinstance(self.running, _Layered)
            for key, pod in self.running.base.items():  # the base: the same for every fork
                if pod.workload:
                    gangs.setdefault(pod.workload, []).append(key)
            self._gangs = {w: tuple(keys) for w, keys in gangs.items()}
        running = self.running
        return [
            running[key]
            for key in self._gangs.get(workload, ())
            if key in running and not running[key].terminating
        ]

    def elastic(self, pod: RunningPod) -> bool:
        """A member its workload can lose and still run: one of those beyond its minimum - of a
        workload with parts, beyond its part's minimum (a part not stated has none): 1 leader and
        5 workers of "leader=1,workers=4": each worker is elastic, the leader is not."""
        if not pod.workload:
            return False
        parts = self.part_minimums.get(pod.workload)
        if parts:
            minimum = parts.get(pod.part)
            mine = sum(1 for member in self.members(pod.workload) if member.part == pod.part)
            return minimum is None or mine > minimum
        return len(self.members(pod.workload)) > self.minimums.get(pod.workload, 1)

    def unit_of(self, pod: RunningPod) -> list[RunningPod]:
        """What evicting `pod` takes: the pod, or - a gang member at its minimum - the whole gang."""
        if not pod.workload or self.elastic(pod):
            return [pod]
        return self.members(pod.workload) or [pod]

    def adopt(self, child: ClusterSnapshot) -> None:
        """Take the changes of a fork of this snapshot as its own (what was tried there holds)."""
        self._node_changes.update(child._node_changes)
        self._pod_changes.update(child._pod_changes)
        self._usage = dict(child._usage)
        self._fairness = None

    def fork(self) -> ClusterSnapshot:
        child = ClusterSnapshot.__new__(ClusterSnapshot)
        child._node_changes = dict(self._node_changes)
        child._pod_changes = dict(self._pod_changes)
        assert isinstance(self.nodes, _Layered) and isinstance(self.running, _Layered)
        child.nodes = _Layered(self.nodes.base, child._node_changes)
        child.running = _Layered(self.running.base, child._pod_changes)
        child.gpu_memory = self.gpu_memory
        child._base, child.mix, child._index = self._base, self.mix, self._index
        child._terminating = self._terminating
        child._usage = dict(self._usage)
        child._fairness = self._fairness
        child.minimums = self.minimums
        child.part_minimums = self.part_minimums
        child._gangs = self._gangs  # members in the base; `members` leaves out what a fork evicted
        child._victims = self._victims
        child._movers = self._movers
        child.holds = self.holds
        child.domains = self.domains
        child.unaccounted = self.unaccounted
        return child

    @property
    def fairness(self) -> FairnessSnapshot:
        """Fairness with the usage of this (possibly forked and changed) snapshot, shares as they were."""
        if self._fairness is None:
            self._fairness = self._base.with_usage(dict(self._usage))
        return self._fairness

    def terminating(self) -> list[str]:
        """Running pods already being deleted (their GPUs are coming free)."""
        running = self.running
        if self._terminating is None:
            self._terminating = frozenset(key for key, pod in running.items() if pod.terminating)
        return [key for key in self._terminating if key in running and running[key].terminating]

    def victim_nodes(self) -> dict[str, set[str]]:
        """Per queue, the nodes where this snapshot runs pods of it that could be victims
        (`can_be_victim`): the base's counts, corrected by this fork's changes (not a pass over
        every running pod)."""
        assert isinstance(self.running, _Layered)
        base = self.running.base
        if self._victims is None:
            counted: dict[str, dict[str, int]] = {}
            for pod in base.values():
                count_victims(counted, pod, 1)
            self._victims = counted
        victims = self._victims
        change: dict[tuple[str, str], int] = {}  # (queue, node) -> victims this fork added (< 0: took)
        for key, pod in self._pod_changes.items():
            for moved, sign in ((base.get(key), -1), (pod, 1)):
                if moved is not None and can_be_victim(moved):
                    at = (moved.queue, moved.node)
                    change[at] = change.get(at, 0) + sign
        nodes = {queue: set(per_node) for queue, per_node in victims.items()}
        for (queue, node), added in change.items():
            if victims.get(queue, {}).get(node, 0) + added > 0:
                nodes.setdefault(queue, set()).add(node)
            elif queue in nodes:
                nodes[queue].discard(node)
        return {queue: names for queue, names in nodes.items() if names}

    @property
    def base_nodes(self) -> Mapping[str, NodeGpus]:
        """The nodes as the snapshot was taken, without any fork's changes (shared, read-only)."""
        assert isinstance(self.nodes, _Layered)
        return self.nodes.base

    def movers(self) -> Mapping[str, tuple[RunningPod, ...]]:
        """Per node, the base running pods that could be moved (`could_move`), in `mover_order`:
        kept by the caller, or sorted out by one pass shared by every fork. Without this fork's
        changes (`movers_on` has them)."""
        if self._movers is None:
            assert isinstance(self.running, _Layered)
            movers: dict[str, list[RunningPod]] = {}
            for pod in self.running.base.values():
                if could_move(pod):
                    movers.setdefault(pod.node, []).append(pod)
            self._movers = {node: tuple(sorted(pods, key=mover_order)) for node, pods in movers.items()}
        return self._movers

    def movers_on(self, node: str) -> tuple[RunningPod, ...]:
        """The pods on `node` that could be moved in this fork, in `mover_order`: the base's,
        corrected by this fork's changes."""
        base, changes = self.movers().get(node, ()), self._pod_changes
        if not changes:
            return base
        kept = [pod for pod in base if pod.key not in changes]
        added = [pod for pod in changes.values() if pod is not None and pod.node == node and could_move(pod)]
        if not added and len(kept) == len(base):
            return base
        return tuple(sorted([*kept, *added], key=mover_order))

    def changed_nodes(self) -> set[str]:
        """Nodes whose GPUs or pods this fork changed (a pod's node before and after)."""
        assert isinstance(self.running, _Layered)
        base, nodes = self.running.base, set(self._node_changes)
        for key, pod in self._pod_changes.items():
            before = base.get(key)
            if before is not None:
                nodes.add(before.node)
            if pod is not None:
                nodes.add(pod.node)
        return nodes

    def pods_on(self, node: str) -> list[RunningPod]:
        running = self.running
        pods = [running[key] for key in self._index.keys_on(node) if key in running]
        pods = [pod for pod in pods if pod.node == node]
        listed = {pod.key for pod in pods}
        pods.extend(
            pod
            for key, pod in self._pod_changes.items()
            if pod is not None and pod.node == node and key not in listed
        )
        return pods

    def spare(self, keys: Iterable[str]) -> None:
        """Running pods that no plan of this snapshot may evict (e.g. a budget blocked them)."""
        running = self.running
        for key in keys:
            if key in running:
                self._pod_changes[key] = replace(running[key], preemptible=False)

    def evict(self, key: str) -> RunningPod:
        """Take a running pod off its node: its GPUs come free, its queue waits for it again."""
        pod = self.running[key]
        self._pod_changes[key] = None
        node = self.nodes.get(pod.node)
        if node is not None:  # (none: its node's GPUs went from the picture; nothing comes free)
            self._node_changes[pod.node] = _with_freed(node, pod.gpus, pod.cpu_milli, pod.memory_mib)
        self._move(pod.queue, pod.resources, -1.0, pod.preemptible)
        return pod

    def free_unaccounted(self) -> None:
        """Count the shares no pod of their node holds (`unaccounted`) as free."""
        for name, shares in self.unaccounted.items():
            node = self.nodes.get(name)
            if node is not None:
                self._node_changes[name] = _with_freed(node, shares)

    def fits_without(self, node: str, demand: GpuDemand, gone: Iterable[RunningPod]) -> bool:
        """Would `demand` fit on `node` with these of its pods off it? (cheap: no fork)"""
        return fits(without(self.nodes[node], gone), demand)

    def fitting_nodes(self, demand: GpuDemand, candidates: Iterable[str] | None = None) -> list[str]:
        names = self.nodes if candidates is None else candidates
        nodes = self.nodes
        return [name for name in names if name in nodes and fits(nodes[name], demand)]

    def place(
        self,
        pod: RunningPod,
        demand: GpuDemand,
        node: str,
        strategy: Strategy = "binpack",
        gpus: tuple[int, ...] | None = None,
    ) -> RunningPod | None:
        """Put a pod on `node` with the filter's GPU choice, or on exactly `gpus` (GPUs held for
        it); None (and no change) when it does not fit there."""
        supply = self.nodes.get(node)
        if supply is None:
            return None
        occupied = occupy(supply, demand, self.mix, strategy) if gpus is None else take(supply, demand, gpus)
        if occupied is None:
            return None
        self._node_changes[node], chosen = occupied
        placed = replace(
            pod,
            node=node,
            gpus=tuple((index, demand.milli) for index in chosen),
            terminating=False,
            cpu_milli=demand.cpu_milli,
            memory_mib=demand.memory_mib,
        )
        self._pod_changes[pod.key] = placed
        self._move(pod.queue, pod.resources, 1.0, pod.preemptible)
        return placed

    def _move(self, queue: str, amounts: Resources, sign: float, preemptible: bool) -> None:
        usage = self._usage.get(queue, QueueUsage(allocated={}, requested={}))
        self._usage[queue] = _shift(usage, amounts, sign, preemptible)
        self._fairness = None


class _NodeIndex:
    """Pod keys per node of a snapshot's base running pods, built once, on first use, for all
    its forks."""

    def __init__(
        self, running: Mapping[str, RunningPod], pods_by_node: Mapping[str, Iterable[str]] | None
    ) -> None:
        self._running = running
        # The live picture keeps this index anyway (it may list pods that hold no GPU: they are
        # not in `running` and are skipped).
        self._by_node: Mapping[str, Iterable[str]] | None = pods_by_node

    def keys_on(self, node: str) -> Iterable[str]:
        if self._by_node is None:
            by_node: dict[str, list[str]] = {}
            for key, pod in self._running.items():
                by_node.setdefault(pod.node, []).append(key)
            self._by_node = by_node
        return self._by_node.get(node, ())


def occupy(
    node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy = "binpack"
) -> tuple[NodeGpus, tuple[int, ...]] | None:
    """The node after `demand` takes the GPUs the filter would choose (and its CPU and memory,
    where the node tracks them), and which GPUs; None: no fit."""
    chosen = choose_gpus(node, demand, mix, strategy)
    return None if chosen is None else take(node, demand, chosen)


def take(node: NodeGpus, demand: GpuDemand, gpus: tuple[int, ...]) -> tuple[NodeGpus, tuple[int, ...]] | None:
    """The node after `demand` takes these GPUs (and its CPU and memory, where the node tracks
    them), and the GPUs; None when they are not `demand.count` GPUs of the node each with the
    demand's share free, or the node lacks the CPU or memory."""
    free = list(node.free_milli)
    if len(set(gpus)) != demand.count or any(not 0 <= index < len(free) for index in gpus):
        return None
    host = GpuDemand(0, cpu_milli=demand.cpu_milli, memory_mib=demand.memory_mib)
    if any(free[index] < demand.milli for index in gpus) or not fits(node, host):
        return None
    for index in gpus:
        free[index] -= demand.milli
    return _with_free(node, free, -demand.cpu_milli, -demand.memory_mib), gpus


def _with_freed(
    node: NodeGpus, shares: Iterable[tuple[int, int]], cpu_milli: int = 0, memory_mib: int = 0
) -> NodeGpus:
    """`node` with the (GPU index, thousandths) `shares` free again, each GPU at most whole, and
    `cpu_milli` and `memory_mib` more free (`_with_free`)."""
    free = list(node.free_milli)
    for index, milli in shares:
        if index < len(free):
            free[index] = min(GPU_MILLI, free[index] + milli)
    return _with_free(node, free, cpu_milli, memory_mib)


def _with_free(node: NodeGpus, free: list[int], cpu_milli: int = 0, memory_mib: int = 0) -> NodeGpus:
    """`node` with GPUs' free shares `free`, and - only where it tracks CPU and memory (nodes
    that report allocatable CPU and memory do) - `cpu_milli` and `memory_mib` more of them free
    (negative: taken)."""
    tracked = node.host_tracked
    return NodeGpus(
        name=node.name,
        model=node.model,
        free_milli=tuple(free),
        cpu_free_milli=node.cpu_free_milli + (cpu_milli if tracked else 0),
        memory_free_mib=node.memory_free_mib + (memory_mib if tracked else 0),
        host_tracked=tracked,
    )
