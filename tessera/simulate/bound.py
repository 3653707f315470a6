"""How far moves could take a packing replay: where the idle GPU capacity sits at its end, and an
upper bound on the GPU allocation any sequence of moves could reach with the pods that arrived.

At the end of a replay (``replay_packing``) every pod has either been placed or skipped, and the
experiment never deletes a pod, so a move - an eviction and a new placement - only shifts free
capacity around: the placed pods all stay placed, and a skipped pod can be placed only where moves
make room. What GPU allocation could that reach at best? Two counting arguments each give a bound
that holds whatever the moves and wherever the pods land (``allocation_bound``); the bound is the
smaller of the two, and of the cluster's capacity and the arrived GPU milli.

**Gaps beside large fractions** (``gap_bound``). Take a threshold θ in 1..500. A pod asking for
more than 1000 - θ milli per GPU (call it *large*; θ <= 500 makes it more than half a GPU) has a
GPU to itself among large pods, and the rest of that GPU, its *gap* 1000 - m < θ, can hold only
pods asking for less than θ. So with G the sum of the gaps of the large pods placed and T the GPU
milli of all pods asking for less than θ (placed or skipped), the GPUs of large pods hold at most
their large pods plus min(G, T), every other GPU at most 1000, and the allocation is at most
1000 x GPUs - G + min(G, T) = 1000 x GPUs - max(0, G - T). Adding a skipped large pod only adds a
gap (it takes a GPU of 1000 and brings m + at most its gap of small pods), so G counts the large
pods placed only. The bound is the lowest over θ. What it relaxes: it ignores GPU models, nodes,
CPU and memory altogether, and lets the small pods fill the gaps as a liquid (any split, any
node); so it holds for moves of any kind, also between GPU models.

**Host capacity** (``host_bound``). The placed pods keep their CPU and memory wherever they move
(GPU-less pods too), so skipped pods can use at most the cluster's free CPU, and its free memory.
The most GPU milli skipped pods can bring within the free CPU is a fractional knapsack (greedy by
GPU milli per CPU milli, the last pod taken in part): an upper bound on the whole-pod choice;
likewise for memory; the host bound is the allocation plus the smaller of the two. What it relaxes:
nodes (the free CPU and memory are pooled over the cluster), GPUs, models, and pods cut in parts.

**Before any policy differs** (``placed_prefix_capping``). The gaps G only grow as pods are placed,
and every pod placed early stays placed, so the first pods of the arrival order already cap what
any replay that placed them all can reach, whatever it moves afterwards; the replay records the
pods that arrived before the first one that fit no node (all placed, before any move could
happen), and the shortest prefix of the arrivals that caps the bound below a target says from
what arrival on the target is lost for every policy that places each pod while it fits.

The **idle breakdown** (``idle_breakdown``) says where the free GPU milli of the end state is:
whole free GPUs, and among them those on nodes whose free CPU or memory is below what every
skipped pod their GPUs would fit needs (*host-short*); and *slivers* (free milli of GPUs partly
used), with those smaller than the smallest per-GPU request of any skipped pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contract.names import GPU_MILLI
from extender.policy.placement import GpuDemand

from .cluster import Cluster

_HALF = GPU_MILLI // 2


@dataclass(frozen=True)
class GapBound:
    milli: int  # 1000 x GPUs - max(0, gaps - small)
    theta: int  # the threshold that gave it (0: no threshold bounds below the capacity)
    gaps_milli: int  # G: gaps beside the placed pods of more than 1000 - theta per GPU
    small_milli: int  # T: GPU milli of the arrived pods of less than theta per GPU


def gap_bound(gpus: int, placed: Sequence[GpuDemand], arrived: Sequence[GpuDemand]) -> GapBound:
    """The gap bound of the module docstring over every threshold θ in 1..500 (`arrived`: placed
    and skipped pods)."""
    capacity = GPU_MILLI * gpus
    best = GapBound(capacity, 0, 0, 0)
    # Only thresholds just above a gap matter: between two gap sizes G stays put while T grows.
    gaps_of = sorted({GPU_MILLI - d.milli for d in placed if d.count and GPU_MILLI - d.milli < _HALF})
    for gap in gaps_of:
        theta = gap + 1
        gaps = sum(d.count * (GPU_MILLI - d.milli) for d in placed if d.count and d.milli > GPU_MILLI - theta)
        small = sum(d.total_milli for d in arrived if d.count and d.milli < theta)
        bound = capacity - max(0, gaps - small)
        if bound < best.milli:
            best = GapBound(bound, theta, gaps, small)
    return best


def placed_prefix_capping(gpus: int, arrived: Sequence[GpuDemand], target_milli: int) -> int | None:
    """The fewest first pods of `arrived` (in arrival order) whose placement alone caps the gap
    bound below `target_milli`: a replay that placed all of them (as every policy does while the
    cluster has room) ends below the target whatever it moves later; None when no prefix does.
    The gaps only grow with the prefix, so a bisection finds it."""
    if gap_bound(gpus, arrived, arrived).milli >= target_milli:
        return None
    low, high = 0, len(arrived)
    while low < high:
        middle = (low + high) // 2
        if gap_bound(gpus, arrived[:middle], arrived).milli < target_milli:
            high = middle
        else:
            low = middle + 1
    return low


def knapsack_milli(skipped: Sequence[GpuDemand], free: int, use: str) -> int:
    """Most GPU milli of `skipped` pods within `free` CPU milli (`use` = "cpu") or memory MiB
    ("memory"), pods taken in part (the fractional knapsack, an upper bound), rounded down."""
    items = [(d.total_milli, d.cpu_milli if use == "cpu" else d.memory_mib) for d in skipped if d.count]
    total = sum(milli for milli, need in items if need <= 0)
    left = free
    for milli, need in sorted((i for i in items if i[1] > 0), key=lambda i: i[0] / i[1], reverse=True):
        if need <= left:
            total, left = total + milli, left - need
        else:
            return total + milli * left // need
    return total


@dataclass(frozen=True)
class IdleBreakdown:
    """Where the free GPU milli of an end state is (module docstring)."""

    idle_milli: int
    whole_milli: int  # on GPUs with nothing on them
    whole_host_short_milli: int  # of those, on nodes no skipped pod fits by CPU or memory
    sliver_milli: int  # on GPUs partly used
    sliver_below_smallest_milli: int  # of those, on GPUs with less free than any skipped pod asks


def _fits_gpus(demand: GpuDemand, model: str, free: Sequence[int]) -> bool:
    allowed = not demand.models or model in demand.models
    return allowed and sum(1 for share in free if share >= demand.milli) >= demand.count


def idle_breakdown(cluster: Cluster, skipped: Sequence[GpuDemand]) -> IdleBreakdown:
    gpu_pods = [d for d in skipped if d.count]
    smallest = min((d.milli for d in gpu_pods), default=GPU_MILLI + 1)
    whole = short = sliver = below = 0
    for index, node in enumerate(cluster.nodes):
        free = cluster.free[index]
        idle_whole = GPU_MILLI * sum(1 for share in free if share == GPU_MILLI)
        partial = [share for share in free if 0 < share < GPU_MILLI]
        whole += idle_whole
        sliver += sum(partial)
        below += sum(share for share in partial if share < smallest)
        if idle_whole and not any(
            _fits_gpus(d, node.model, free)
            and d.cpu_milli <= cluster.cpu_free[index]
            and d.memory_mib <= cluster.memory_free[index]
            for d in gpu_pods
        ):
            short += idle_whole
    return IdleBreakdown(whole + sliver, whole, short, sliver, below)


@dataclass(frozen=True)
class AllocationBound:
    """An end state, where its idle GPU milli is, and the most GPU milli moves could place."""

    capacity_milli: int
    allocated_milli: int
    arrived_milli: int
    idle: IdleBreakdown
    gaps: GapBound  # with the gaps of the pods placed at the end
    early_gaps: GapBound  # with the gaps of the early pods only: holds for any moves after them
    early_milli: int  # GPU milli of the early pods (the arrival when the first pod fit no node)
    host_milli: int  # allocated + the smaller knapsack of skipped pods within free CPU or memory

    @property
    def milli(self) -> int:
        return min(self.capacity_milli, self.arrived_milli, self.gaps.milli, self.host_milli)

    def pct(self, milli: int) -> float:
        return 100.0 * milli / self.capacity_milli


def allocation_bound(
    cluster: Cluster, placed: Sequence[GpuDemand], skipped: Sequence[GpuDemand], early: Sequence[GpuDemand]
) -> AllocationBound:
    """The bounds of the module docstring for the end state `cluster`, where the pods `placed` run
    and the pods `skipped` were not placed; `early`: the pods that arrived before the first one that
    fit no node as it came (the replay placed them all, before any move)."""
    gpus = sum(node.gpus for node in cluster.nodes)
    host = min(
        knapsack_milli(skipped, sum(cluster.cpu_free), "cpu"),
        knapsack_milli(skipped, sum(cluster.memory_free), "memory"),
    )
    return AllocationBound(
        capacity_milli=cluster.capacity_milli,
        allocated_milli=cluster.allocated_milli,
        arrived_milli=sum(d.total_milli for d in (*placed, *skipped)),
        idle=idle_breakdown(cluster, skipped),
        gaps=gap_bound(gpus, placed, [*placed, *skipped]),
        early_gaps=gap_bound(gpus, early, [*placed, *skipped]),
        early_milli=sum(d.total_milli for d in early),
        host_milli=cluster.allocated_milli + host,
    )
