"""Packing replay, measured the way the trace README (and the FGD paper) defines it.

Pods arrive in trace order and are never deleted; each goes to the node its policy ranks best
(a pod that fits nowhere is skipped) until the GPU milli of arrived pods reaches the target share
of the cluster's GPU capacity (130% by default). When the trace runs out first - the default
trace asks for only ~98% of its cluster - pods are drawn from it at random with replacement
(seeded), which inflates the workload while keeping its mix.

Metrics, all in % of the cluster's GPU milli (1000 x GPUs):
arrival (GPU milli of arrived pods), allocation (of placed pods), fragmentation (sum over nodes
of the expected idle milli the workload mix cannot use, ``node_fragmentation``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from extender.policy.placement import Cost, GpuDemand, WorkloadMix, mix_from_demands

from .cluster import Cluster
from .policies import Policy, make_policy
from .trace import SimNode, SimPod

ProgressCallback = Callable[[str, float], None]


@dataclass(frozen=True)
class PackingPoint:
    arrival_pct: float
    allocation_pct: float
    fragmentation_pct: float


@dataclass
class PackingResult:
    policy: str
    seed: int = 0
    arrival_pct: float = 0.0
    allocation_pct: float = 0.0
    fragmentation_pct: float = 0.0
    pods_arrived: int = 0
    pods_placed: int = 0
    pods_skipped: int = 0
    seconds: float = 0.0
    curve: list[PackingPoint] = field(default_factory=list)

    @property
    def unallocated_pct(self) -> float:
        return 100.0 - self.allocation_pct


def workload_mix(pods: Sequence[SimPod]) -> WorkloadMix:
    """The trace's task types weighted by popularity: FGD's target workload."""
    return mix_from_demands([pod.demand for pod in pods])


def arrivals(pods: Sequence[SimPod], rng: random.Random) -> Iterator[SimPod]:
    """The trace in order, then random draws from it for as long as the caller wants more."""
    yield from pods
    while True:
        yield rng.choice(pods)


class Placer:
    """Runs one policy over a cluster, memoising its verdict per (node state, demand)."""

    def __init__(self, cluster: Cluster, policy: Policy, rng: random.Random) -> None:
        self.cluster = cluster
        self.policy = policy
        self.rng = rng
        self._demand_ids: dict[GpuDemand, int] = {}
        # state id -> demand id -> cost; dropped when no node is in that state any more
        self._costs: dict[int, dict[int, Cost | None]] = {}

    def _cost(self, state_id: int, demand: GpuDemand, demand_id: int) -> Cost | None:
        per_state = self._costs.setdefault(state_id, {})
        if demand_id in per_state:
            return per_state[demand_id]
        cost = self.policy.cost(self.cluster.states[state_id], demand)
        per_state[demand_id] = cost
        return cost

    def place(self, demand: GpuDemand) -> tuple[int, tuple[int, ...]] | None:
        """Put ``demand`` where the policy ranks best; (node index, GPUs), or None if it fits nowhere."""
        demand_id = self._demand_ids.setdefault(demand, len(self._demand_ids))
        best: Cost | None = None
        tied: list[dict[int, None]] = []
        for state_id, members in self.cluster.groups():
            cost = self._cost(state_id, demand, demand_id)
            if cost is None:
                continue
            if best is None or cost < best:
                best, tied = cost, [members]
            elif cost == best:
                tied.append(members)
        if best is None:
            return None
        pick = self.rng.randrange(sum(len(members) for members in tied))
        for members in tied:
            if pick < len(members):
                index = sorted(members)[pick]
                break
            pick -= len(members)
        gpus = self.policy.gpus(self.cluster.node_gpus(index), demand, self.rng)
        self.cluster.place(index, demand, gpus)
        return index, gpus

    def forget_gone_states(self) -> None:
        live = self.cluster.live_states()
        for state_id in [s for s in self._costs if s not in live]:
            del self._costs[state_id]


def replay_packing(
    nodes: Sequence[SimNode],
    pods: Sequence[SimPod],
    policy_name: str,
    *,
    seed: int = 0,
    target_arrival_pct: float = 130.0,
    mix: WorkloadMix | None = None,
    progress: ProgressCallback | None = None,
    curve_step_pct: float = 1.0,
) -> PackingResult:
    if not any(pod.gpu_milli for pod in pods):
        raise ValueError("the workload has no GPU pods, so arrival can never reach the target")
    started = time.perf_counter()
    mix = mix or workload_mix(pods)
    cluster = Cluster(nodes, mix)
    rng = random.Random(seed)
    replay = Placer(cluster, make_policy(policy_name, mix), rng)
    result = PackingResult(policy=policy_name, seed=seed)
    capacity = cluster.capacity_milli
    arrived_milli = 0
    next_point = 0.0
    for pod in arrivals(pods, random.Random(seed + 1)):
        arrival_pct = 100.0 * (arrived_milli + pod.gpu_milli) / capacity
        if arrival_pct > target_arrival_pct:
            break
        arrived_milli += pod.gpu_milli
        result.pods_arrived += 1
        if replay.place(pod.demand) is not None:
            result.pods_placed += 1
        else:
            result.pods_skipped += 1
        if arrival_pct >= next_point:
            result.curve.append(
                PackingPoint(
                    arrival_pct,
                    100.0 * cluster.allocated_milli / capacity,
                    100.0 * cluster.fragmentation_milli / capacity,
                )
            )
            next_point += curve_step_pct
            replay.forget_gone_states()
            if progress is not None:
                progress(f"{policy_name} seed {seed}", arrival_pct / target_arrival_pct)
    result.arrival_pct = 100.0 * arrived_milli / capacity
    result.allocation_pct = 100.0 * cluster.allocated_milli / capacity
    result.fragmentation_pct = 100.0 * cluster.fragmentation_milli / capacity
    result.curve.append(PackingPoint(result.arrival_pct, result.allocation_pct, result.fragmentation_pct))
    result.seconds = time.perf_counter() - started
    return result
