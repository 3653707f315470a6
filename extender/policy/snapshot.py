"""A cluster snapshot the planners read and fork: pure data, no I/O.

The live picture hands out a `ClusterSnapshot`: every GPU node's free share per GPU, the pods
running there with the GPUs they hold, and the queues' fairness snapshot. A planner asking
"what if" forks it and applies hypothetical evictions and placements to the fork - with the same
placement code the filter uses - then reads fits, free capacity and queue usage from the fork.
The snapshot it came from, and the live picture, are untouched: a fork copies the two maps it
changes (nodes, running pods) and shares every immutable value in them.

An eviction frees the pod's GPUs and moves its fairness vector from the queue's `allocated` to
its `requested` (a controller recreates an evicted pod, so its queue still wants it); fair shares,
which depend on allocated plus requested, stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from contract.names import GPU_MILLI
from extender.policy.fairness import FairnessSnapshot, QueueUsage, Resources
from extender.policy.placement import GpuDemand, NodeGpus, Strategy, WorkloadMix, choose_gpus, fits


@dataclass(frozen=True)
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
    # Owned by a controller that recreates it elsewhere when it is evicted, and not opted out:
    # consolidation may move it (extender.policy.consolidation).
    movable: bool = False


def _shift(usage: QueueUsage, amounts: Resources, sign: float) -> QueueUsage:
    """Move `amounts` from requested to allocated (sign 1) or back (sign -1)."""
    allocated, requested = dict(usage.allocated), dict(usage.requested)
    for resource, amount in amounts.items():
        allocated[resource] = allocated.get(resource, 0.0) + sign * amount
        requested[resource] = max(0.0, requested.get(resource, 0.0) - sign * amount)
    return QueueUsage(allocated={r: a for r, a in allocated.items() if a > 1e-9}, requested=requested)


class ClusterSnapshot:
    def __init__(
        self,
        nodes: Mapping[str, NodeGpus],
        running: Mapping[str, RunningPod],
        fairness: FairnessSnapshot,
        mix: WorkloadMix,
        gpu_memory: Mapping[str, int] | None = None,
    ) -> None:
        self.nodes = dict(nodes)
        self.running = dict(running)
        # Bytes of memory of each node's GPUs, which sizes a fraction there (shared, read-only).
        self.gpu_memory: Mapping[str, int] = gpu_memory if gpu_memory is not None else {}
        self._usage = dict(fairness.usage)
        self._base = fairness
        self.mix = mix
        self._fairness: FairnessSnapshot | None = fairness

    def fork(self) -> ClusterSnapshot:
        return ClusterSnapshot(self.nodes, self.running, self.fairness, self.mix, self.gpu_memory)

    @property
    def fairness(self) -> FairnessSnapshot:
        """Fairness with the usage of this (possibly forked and changed) snapshot, shares as they were."""
        if self._fairness is None:
            base = self._base
            self._fairness = FairnessSnapshot(base.specs, dict(self._usage), base.capacity, base.fair_shares)
        return self._fairness

    def pods_on(self, node: str) -> list[RunningPod]:
        return [pod for pod in self.running.values() if pod.node == node]

    def evict(self, key: str) -> RunningPod:
        """Take a running pod off its node: its GPUs come free, its queue waits for it again."""
        pod = self.running.pop(key)
        node = self.nodes[pod.node]
        free = list(node.free_milli)
        for index, milli in pod.gpus:
            free[index] = min(GPU_MILLI, free[index] + milli)
        self.nodes[pod.node] = _with_free(node, free)
        self._move(pod.queue, pod.resources, -1.0)
        return pod

    def fitting_nodes(self, demand: GpuDemand, candidates: Iterable[str] | None = None) -> list[str]:
        names = self.nodes if candidates is None else candidates
        return [name for name in names if name in self.nodes and fits(self.nodes[name], demand)]

    def place(
        self,
        pod: RunningPod,
        demand: GpuDemand,
        node: str,
        strategy: Strategy = "binpack",
    ) -> RunningPod | None:
        """Put a pod on `node` with the filter's GPU choice; None (and no change) when it does not fit."""
        supply = self.nodes.get(node)
        if supply is None:
            return None
        occupied = occupy(supply, demand, self.mix, strategy)
        if occupied is None:
            return None
        self.nodes[node], chosen = occupied
        placed = replace(
            pod, node=node, gpus=tuple((index, demand.milli) for index in chosen), terminating=False
        )
        self.running[pod.key] = placed
        self._move(pod.queue, pod.resources, 1.0)
        return placed

    def _move(self, queue: str, amounts: Resources, sign: float) -> None:
        usage = self._usage.get(queue, QueueUsage(allocated={}, requested={}))
        self._usage[queue] = _shift(usage, amounts, sign)
        self._fairness = None


def occupy(
    node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy = "binpack"
) -> tuple[NodeGpus, tuple[int, ...]] | None:
    """The node after `demand` takes the GPUs the filter would choose, and which; None: no fit."""
    chosen = choose_gpus(node, demand, mix, strategy)
    if chosen is None:
        return None
    free = list(node.free_milli)
    for index in chosen:
        free[index] -= demand.milli
    return _with_free(node, free), chosen


def _with_free(node: NodeGpus, free: list[int]) -> NodeGpus:
    return NodeGpus(
        name=node.name,
        model=node.model,
        free_milli=tuple(free),
        cpu_free_milli=node.cpu_free_milli,
        memory_free_mib=node.memory_free_mib,
        host_tracked=node.host_tracked,
    )
