"""The deployed path, modelled: where kube-scheduler with Tessera's extender puts a pod.

The ``tessera`` policy of the replay is the placement code alone: the node with the best exact
cost, Tessera's GPU choice, the whole trace as the workload mix. In a cluster the same code
decides through four more steps, each modelled here from the upstream source (v1.37.2):

1. **The mix** is what the extender's ledger holds: every pod seen so far (placed, or pending
   because it fits nowhere), weighted by count rounded to two digits (``rounded_mix``); the pod
   being placed is in it, since it exists before it is scheduled.
2. **The extender's score** is ``score_nodes`` over the nodes that pass the filters: 0..10 by rank
   of distinct cost, which kube-scheduler multiplies by the extender's weight and by 10
   (MaxNodeScore / MaxExtenderPriority).
3. **The profile's own scoring plugins** add their scores times their weights. On nodes that differ
   only in resources (no taints, affinities, spread constraints or images, as in the trace) the
   ones that vary are ``NodeResourcesFit`` (LeastAllocated over CPU and memory, weight 1 each:
   per resource ``(allocatable - requested) x 100 / allocatable`` in integers, then their mean,
   with the pod's requests of 0 counted as kube-scheduler's non-zero defaults, 100m and 200 MiB;
   pods already on the node count as requested, which differs only for the trace's one pod
   without memory) and
   ``NodeResourcesBalancedAllocation`` (``50 + (50 + balance after - balance before) / 2``, a
   balance being ``int((1 - |cpu fraction - memory fraction| / 2) x 100)`` of the requested
   share). ``DynamicResources`` scores only prioritized-list claims, which the trace has none of.
   The node with the highest total wins; ties go to any of them with equal chance (the
   scheduler's random tie-break), not to a fixed node order.
4. **The device** is the DRA allocator's choice: the first device, in the published order, with
   enough capacity left (the structured allocator walks pools, slices and devices in order and
   takes the first that fits), so a fraction goes on the lowest-index GPU that holds it and whole
   GPUs are the lowest-index idle ones. ``device_choice="tessera"`` measures what giving Tessera
   that choice (``choose_gpus``) would add.

Every node is scored (the shipped profile sets ``percentageOfNodesToScore: 100``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from extender.policy.placement import (
    Cost,
    GpuDemand,
    WorkloadMix,
    choose_gpus,
    placement_cost,
    rounded_mix,
    scores_from_costs,
)

from .cluster import Cluster, NodeState

_MAX_NODE_SCORE = 100  # kube-scheduler's plugin score range
_EXTENDER_SCALE = 10  # MaxNodeScore / MaxExtenderPriority
_DEFAULT_CPU_MILLI = 100  # kube-scheduler's non-zero defaults for a request left at 0
_DEFAULT_MEMORY_MIB = 200
_UNKNOWN: Cost = (float("nan"),)

DeviceChoice = Literal["first-fit", "tessera"]
DEVICE_CHOICES: tuple[DeviceChoice, ...] = ("first-fit", "tessera")


@dataclass(frozen=True)
class SchedulerProfile:
    """The scoring a kube-scheduler profile adds to the extender's (weight 0: plugin disabled)."""

    extender_weight: int
    least_allocated_weight: int
    balanced_allocation_weight: int

    def describe(self) -> str:
        plugins = [
            f"{name} x{weight}"
            for name, weight in (
                ("LeastAllocated", self.least_allocated_weight),
                ("BalancedAllocation", self.balanced_allocation_weight),
            )
            if weight
        ]
        return f"extender x{self.extender_weight}" + "".join(f" + {plugin}" for plugin in plugins)


# kube-scheduler's default profile with the extender at the weight the chart used to ship.
STOCK_PROFILE = SchedulerProfile(extender_weight=5, least_allocated_weight=1, balanced_allocation_weight=1)
# The chart's profile (charts/tessera, manifests, make up): the plugins that fight packing disabled
# for scoring, so the extender's ranking decides among nodes that differ only in resources.
SHIPPED_PROFILE = SchedulerProfile(extender_weight=5, least_allocated_weight=0, balanced_allocation_weight=0)


def least_allocated_score(state: NodeState, demand: GpuDemand) -> int:
    """NodeResourcesFit's LeastAllocated score of the node after the pod (CPU and memory, weight 1)."""
    shape = state.shape
    scores = []
    for allocatable, free, asked, default in (
        (shape.cpu_milli, state.cpu_free_milli, demand.cpu_milli, _DEFAULT_CPU_MILLI),
        (shape.memory_mib, state.memory_free_mib, demand.memory_mib, _DEFAULT_MEMORY_MIB),
    ):
        if allocatable == 0:
            continue
        requested = allocatable - free + (asked or default)
        scores.append(
            0 if requested > allocatable else (allocatable - requested) * _MAX_NODE_SCORE // allocatable
        )
    return sum(scores) // len(scores) if scores else 0


def _balance(cpu_milli: int, memory_mib: int, state: NodeState) -> int:
    shape = state.shape
    fractions = [
        min(1.0, used / allocatable)
        for used, allocatable in ((cpu_milli, shape.cpu_milli), (memory_mib, shape.memory_mib))
        if allocatable
    ]
    spread = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - spread) * _MAX_NODE_SCORE)


def balanced_allocation_score(state: NodeState, demand: GpuDemand) -> int:
    """NodeResourcesBalancedAllocation's score: how much the pod improves the node's CPU/memory balance."""
    shape = state.shape
    cpu_used, memory_used = shape.cpu_milli - state.cpu_free_milli, shape.memory_mib - state.memory_free_mib
    before = _balance(cpu_used, memory_used, state)
    after = _balance(cpu_used + demand.cpu_milli, memory_used + demand.memory_mib, state)
    half = _MAX_NODE_SCORE // 2
    return half + (half + after - before) // 2


def first_fit_gpus(free: tuple[int, ...], demand: GpuDemand) -> tuple[int, ...]:
    """The DRA allocator's devices: the first ``count`` in published order with the share free."""
    if demand.count == 0:
        return ()
    return tuple(i for i, left in enumerate(free) if left >= demand.milli)[: demand.count]


class DeployedPlacer:
    """Places pods as the deployed path does (module docstring); same interface as ``Placer``."""

    def __init__(
        self,
        cluster: Cluster,
        profile: SchedulerProfile,
        rng: random.Random,
        device_choice: DeviceChoice = "first-fit",
    ) -> None:
        self.cluster = cluster
        self.profile = profile
        self.rng = rng
        self.device_choice = device_choice
        self.seen: Counter[GpuDemand] = Counter()
        self.mix: WorkloadMix = WorkloadMix(demands=())
        # Extender costs per demand and state, valid for `self.mix`; plugin scores never change.
        self._costs: dict[GpuDemand, dict[int, Cost | None]] = {}
        self._plugins: dict[GpuDemand, dict[int, int]] = {}

    def _seen(self, demand: GpuDemand) -> None:
        self.seen[demand] += 1
        mix = rounded_mix(self.seen)
        if mix != self.mix:
            self.mix = mix
            self._costs.clear()

    def _plugin_score(self, state_id: int, demand: GpuDemand) -> int:
        scores = self._plugins.setdefault(demand, {})
        score = scores.get(state_id)
        if score is None:
            state, profile = self.cluster.states[state_id], self.profile
            score = scores[state_id] = (
                profile.least_allocated_weight * least_allocated_score(state, demand)
                if profile.least_allocated_weight
                else 0
            ) + (
                profile.balanced_allocation_weight * balanced_allocation_score(state, demand)
                if profile.balanced_allocation_weight
                else 0
            )
        return score

    def arrive(self, demand: GpuDemand) -> list[int]:
        """The pod arrives (joins the mix); the nodes with the scheduler's highest total score for
        it, any of which it may choose (empty: the pod fits nowhere)."""
        self._seen(demand)
        costs = self._costs.setdefault(demand, {})
        states = self.cluster.states
        fitting: dict[int, Cost] = {}
        for state_id, _ in self.cluster.groups():
            cost = costs.get(state_id, _UNKNOWN)
            if cost is _UNKNOWN:
                cost = costs[state_id] = placement_cost(states[state_id].as_node_gpus(), demand, self.mix)
            if cost is not None:
                fitting[state_id] = cost
        if not fitting:
            return []
        ranks = scores_from_costs({str(state_id): cost for state_id, cost in fitting.items()})
        weight = self.profile.extender_weight * _EXTENDER_SCALE
        totals = {
            state_id: weight * ranks[str(state_id)] + self._plugin_score(state_id, demand)
            for state_id in fitting
        }
        best = max(totals.values())
        return [
            index
            for state_id, total in totals.items()
            if total == best
            for index in self.cluster.members[state_id]
        ]

    def devices(self, index: int, demand: GpuDemand) -> tuple[int, ...]:
        """The GPUs the pod gets on node ``index``."""
        if self.device_choice == "tessera":
            return choose_gpus(self.cluster.node_gpus(index), demand, self.mix) or ()
        return first_fit_gpus(tuple(self.cluster.free[index]), demand)

    def place(self, demand: GpuDemand) -> tuple[int, tuple[int, ...]] | None:
        """The pod arrives and goes to one of the best nodes, drawn at random; None: it fits nowhere."""
        tied = self.arrive(demand)
        if not tied:
            return None
        index = tied[self.rng.randrange(len(tied))]
        gpus = self.devices(index, demand)
        self.cluster.place(index, demand, gpus)
        return index, gpus


__all__ = [
    "DEVICE_CHOICES",
    "SHIPPED_PROFILE",
    "STOCK_PROFILE",
    "DeployedPlacer",
    "DeviceChoice",
    "SchedulerProfile",
    "balanced_allocation_score",
    "first_fit_gpus",
    "least_allocated_score",
]
