"""GPU placement: which node, and which GPUs on it, a pod should get.

Pure functions over plain data. Two strategies:

* ``binpack`` (default) - consolidation. The primary criterion is the growth of node
  fragmentation for the workload mix (the FGD idea of Weng et al., ATC'23): the idle GPU milli
  that the task types seen cannot use. For fractional and GPU-less pods, which are what strand
  CPU, memory and per-GPU remainders, half the growth of the packing loss is added: the idle GPU
  milli that repeated tasks of a type could not fill (``node_packing_loss``). For whole-GPU pods,
  which strand whole GPUs instead, the growth of the set loss is added: the whole idle GPUs that
  do not make up a full set for a multi-GPU type (``node_set_loss``; taking one GPU of an idle
  8-GPU node leaves 7 that no 8-GPU pod can use and one 4-GPU set). Ties - common, e.g.
  between identical idle nodes - are broken towards best fit: whole-GPU pods go where the fewest
  whole free GPUs remain (keeping large blocks of whole GPUs together elsewhere), fractional pods
  go onto the GPU with the least free share left, and finally onto the node with the least idle
  GPU milli.
* ``spread`` - least allocated: the node (and GPU) with the most free GPU capacity left.

``score_nodes`` turns the ranking into the 0..10 scores the kube-scheduler extender protocol uses;
``placement_cost`` exposes the exact ranking so the simulator can choose the top node without the
rounding loss of integer scores.

Inputs are built in one place for the extender and the simulator, so both rank the same numbers:
``placement_demand`` (a pod's GPUs with its CPU milli and memory MiB, count 0 for a pod without
GPUs), ``node_supply`` (a node's free GPU shares, and its CPU and memory capacity minus what the
pods placed there take), ``host_cpu_milli`` / ``host_memory_mib`` (Kubernetes cores and bytes in
those units: a request rounds up, a capacity down) and ``rounded_mix`` (the workload mix from the
counts of the pods seen).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal, cast

from contract.names import GPU_MILLI
from extender.memo import MISSING, ShapeMemo, remembered

MAX_NODE_SCORE = 10
# Fragmentation deltas are sums of float-weighted integers; round before comparing so equal
# placements tie exactly instead of differing in the last bits.
_COST_DIGITS = 6
# Weight of packing-loss growth beside fragmentation growth, for fractional and GPU-less pods.
_PACKING_LOSS_WEIGHT = 0.5
# Weight of set-loss growth beside fragmentation growth, for whole-GPU pods.
_SET_LOSS_WEIGHT = 1.0
# Bound on memoised placement costs per mix (a few MB); cleared wholesale when reached.
_COST_CACHE_LIMIT = 50_000
# Bound on memoised node measures per mix (~20 MB); cleared wholesale when reached.
_MEASURE_CACHE_LIMIT = 200_000

Strategy = Literal["binpack", "spread"]
Cost = tuple[float, ...]


@dataclass(frozen=True)
class NodeGpus:
    """Supply picture of one node, GPU dimension first.

    CPU and memory are optional: ``0`` means "not tracked" unless ``host_tracked`` is set, in
    which case the values are exact (so an exhausted node can be described).
    """

    name: str
    model: str
    free_milli: tuple[int, ...]
    cpu_free_milli: int = 0
    memory_free_mib: int = 0
    host_tracked: bool = False

    @cached_property
    def whole_free(self) -> int:
        """GPUs with nothing allocated on them."""
        return sum(1 for free in self.free_milli if free == GPU_MILLI)

    @cached_property
    def shape(self) -> str:
        """All that placement reads of the node but its name, GPU order aside: nodes of one shape
        rank alike, so costs are memoised by it. Kept on the object, as callers reuse nodes.

        A string (the repr of those fields) rather than a tuple because a string caches its hash,
        and the extender looks shapes up several times per node per request.
        """
        return repr(
            (
                self.model,
                sorted(self.free_milli),
                self.cpu_free_milli,
                self.memory_free_mib,
                self.host_tracked,
            )
        )


# Node name -> its topology domain (a rack, a switch, a block): what the gang planners know of
# topology, one map for all three - the filter's gang admission (`extender.verbs.admit_gang`, from
# `PictureConfig.domains` through `GpuInventory.domains`), reclaim's gang plans
# (`ClusterSnapshot.domains`) and the simulator's (`tessera.simulate.cluster.Cluster`). Empty by
# default: no rule reads domains yet; a node missing from the map is in no domain.
DomainMap = Mapping[str, str]
NO_DOMAINS: DomainMap = {}  # (a Mapping: read-only; a dict, so a config holding it pickles)


def domain_shape(node: NodeGpus, domains: DomainMap) -> str:
    """What a memo that merges nodes of one shape keys a node by: its shape, and its domain when
    it has one. Same-shaped nodes are interchangeable only within a domain (a gang kept in one
    domain must not take a verdict learnt in another); a node in no domain is keyed by its shape
    alone, so without a map every memo is keyed as before."""
    domain = domains.get(node.name)
    return node.shape if domain is None else repr((domain, node.shape))


@dataclass(frozen=True)
class GpuDemand:
    """What one pod needs: ``count`` GPUs of ``milli`` thousandths each.

    ``milli < 1000`` only with ``count == 1`` (a fraction of one GPU); ``count == 0`` is a pod
    without GPUs, which still matters for fragmentation through CPU and memory.
    """

    count: int
    milli: int = GPU_MILLI
    models: frozenset[str] = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"GPU count must be >= 0, got {self.count}")
        if not 1 <= self.milli <= GPU_MILLI:
            raise ValueError(f"per-GPU milli must be in 1..1000, got {self.milli}")
        if self.count > 1 and self.milli != GPU_MILLI:
            raise ValueError("a fraction of a GPU is only allowed with count == 1")

    @property
    def total_milli(self) -> int:
        return self.count * self.milli


@dataclass(frozen=True)
class _TaskClass:
    """Task types of the mix that share one GPU shape; host needs are kept per type."""

    count: int
    milli: int
    models: frozenset[str]
    host_needs: tuple[tuple[int, int, float], ...]  # (cpu milli, memory MiB, weight)
    weight: float
    # The largest needs: a node that can give these can give every type of the class (fast path).
    max_cpu_milli: int
    max_memory_mib: int


@dataclass(frozen=True)
class WorkloadMix:
    """Popularity of task types (FGD's target workload); weights need not sum to 1."""

    demands: tuple[tuple[GpuDemand, float], ...]

    @cached_property
    def _classes(self) -> tuple[tuple[_TaskClass, ...], float]:
        # Grouping by GPU shape lets the GPU half of the fragmentation test run once per shape.
        grouped: dict[tuple[int, int, frozenset[str]], list[tuple[int, int, float]]] = {}
        total = 0.0
        for demand, weight in self.demands:
            if weight <= 0:
                continue
            total += weight
            shape = (demand.count, demand.milli, demand.models)
            grouped.setdefault(shape, []).append((demand.cpu_milli, demand.memory_mib, weight))
        classes = tuple(
            _TaskClass(
                count,
                milli,
                models,
                tuple(needs),
                sum(w for _, _, w in needs),
                max(cpu for cpu, _, _ in needs),
                max(memory for _, memory, _ in needs),
            )
            for (count, milli, models), needs in grouped.items()
        )
        return classes, total

    @cached_property
    def _cost_cache(self) -> ShapeMemo[tuple[GpuDemand, Strategy], Cost | None]:
        """placement_cost's memo by demand, strategy and node shape, shared by equal mixes
        (callers often rebuild the same mix)."""
        cache = _COST_CACHES.pop(self, None)
        if cache is None:
            cache = ShapeMemo(_COST_CACHE_LIMIT)
            while len(_COST_CACHES) >= _COST_CACHE_MIXES:
                del _COST_CACHES[next(iter(_COST_CACHES))]
        _COST_CACHES[self] = cache  # most recently used last
        return cache

    @cached_property
    def _measure_cache(self) -> dict[tuple[str, str], float]:
        """node_fragmentation / node_packing_loss by node shape: candidate placements of many pods
        lead to the same few node states, and both measures walk every task type."""
        return {}


# Memoised placement costs of the last few mixes, by value.
_COST_CACHES: dict[WorkloadMix, ShapeMemo[tuple[GpuDemand, Strategy], Cost | None]] = {}
_COST_CACHE_MIXES = 4


def _host_fits(node: NodeGpus, cpu_milli: int, memory_mib: int) -> bool:
    cpu_ok = not (node.host_tracked or node.cpu_free_milli > 0) or cpu_milli <= node.cpu_free_milli
    mem_ok = not (node.host_tracked or node.memory_free_mib > 0) or memory_mib <= node.memory_free_mib
    return cpu_ok and mem_ok


def _host_ok_weight(node: NodeGpus, cls: _TaskClass) -> float:
    """Popularity of the task types of ``cls`` whose CPU and memory the node can still give."""
    if _host_fits(node, cls.max_cpu_milli, cls.max_memory_mib):
        return cls.weight
    return sum(weight for cpu, memory, weight in cls.host_needs if _host_fits(node, cpu, memory))


def fits(node: NodeGpus, demand: GpuDemand) -> bool:
    # On the filter hot path for every candidate node: the common cases avoid sorting.
    if demand.models and node.model not in demand.models:
        return False
    if not _host_fits(node, demand.cpu_milli, demand.memory_mib):
        return False
    if demand.count <= 1:
        return demand.count == 0 or max(node.free_milli, default=0) >= demand.milli
    return sum(1 for free in node.free_milli if free >= demand.milli) >= demand.count


def _memoised(
    kind: str, compute: Callable[[NodeGpus, WorkloadMix], float]
) -> Callable[[NodeGpus, WorkloadMix], float]:
    def measure(node: NodeGpus, mix: WorkloadMix) -> float:
        return remembered(
            mix._measure_cache, (kind, node.shape), _MEASURE_CACHE_LIMIT, lambda: compute(node, mix)
        )

    measure.__doc__ = compute.__doc__
    return measure


def _node_fragmentation(node: NodeGpus, mix: WorkloadMix) -> float:
    """Expected idle GPU milli on ``node`` that a task drawn from ``mix`` could not use.

    For one task type: all idle milli if the type does not fit the node at all (model, CPU,
    memory or GPUs); otherwise the idle milli of GPUs whose free share is below the type's
    per-GPU request. The node's value is the popularity-weighted mean over the types.
    """
    classes, total_weight = mix._classes
    if total_weight == 0:
        return 0.0
    ordered = sorted(node.free_milli)
    idle = sum(ordered)
    if idle == 0:
        return 0.0
    prefix = [0]
    for free in ordered:
        prefix.append(prefix[-1] + free)
    expected = 0.0
    for cls in classes:
        if cls.models and node.model not in cls.models:
            expected += cls.weight * idle
            continue
        if cls.count == 0:
            unusable = 0  # no per-GPU request, so no GPU is too small for it
        else:
            first_big_enough = bisect_left(ordered, cls.milli)
            if len(ordered) - first_big_enough < cls.count:
                expected += cls.weight * idle
                continue
            unusable = prefix[first_big_enough]
        host_ok_weight = _host_ok_weight(node, cls)
        expected += host_ok_weight * unusable + (cls.weight - host_ok_weight) * idle
    return expected / total_weight


def _node_packing_loss(node: NodeGpus, mix: WorkloadMix) -> float:
    """Expected idle GPU milli that tasks of one type from ``mix``, repeated, could not fill.

    ``node_fragmentation`` asks whether one more task of a type fits; this asks how many would:
    n = the fewest of the tasks the free GPU shares hold (per GPU, free // request; whole-GPU
    types in sets of ``count`` idle GPUs), the tasks the free CPU holds and those the free memory
    holds. The type loses the idle milli beyond n x its GPU request - CPU or memory running out
    before the GPUs do, and per-GPU remainders. GPU-less types lose everything when they do not
    fit the host and nothing otherwise; types of another GPU model lose everything.
    """
    classes, total_weight = mix._classes
    idle = sum(node.free_milli)
    if total_weight == 0 or idle == 0:
        return 0.0
    cpu_tracked = node.host_tracked or node.cpu_free_milli > 0
    memory_tracked = node.host_tracked or node.memory_free_mib > 0
    expected = 0.0
    for cls in classes:
        if cls.models and node.model not in cls.models:
            expected += cls.weight * idle
            continue
        if cls.count == 0:
            host_ok_weight = _host_ok_weight(node, cls)
            expected += (cls.weight - host_ok_weight) * idle
            continue
        gpu_tasks = sum(free // cls.milli for free in node.free_milli) // cls.count
        if (not cpu_tracked or node.cpu_free_milli >= gpu_tasks * cls.max_cpu_milli) and (
            not memory_tracked or node.memory_free_mib >= gpu_tasks * cls.max_memory_mib
        ):  # the host holds as many of every type as the GPUs do
            expected += cls.weight * (idle - gpu_tasks * cls.count * cls.milli)
            continue
        for cpu, memory, weight in cls.host_needs:
            tasks = gpu_tasks
            if cpu_tracked and cpu:
                tasks = min(tasks, node.cpu_free_milli // cpu)
            if memory_tracked and memory:
                tasks = min(tasks, node.memory_free_mib // memory)
            expected += weight * (idle - tasks * cls.count * cls.milli)
    return expected / total_weight


def _node_set_loss(node: NodeGpus, mix: WorkloadMix) -> float:
    """Expected whole idle GPUs (in milli) on ``node`` that do not make up a full set for a
    multi-GPU type drawn from ``mix``.

    For a type of ``count`` >= 2 whole GPUs: the fully free GPUs left over once they are grouped
    in sets of ``count`` (free mod count). Single-GPU, fractional and GPU-less types lose nothing
    here, nor do types of another GPU model (fragmentation already counts all of the node's idle
    milli for them). This is ``node_packing_loss`` narrowed to whole GPUs and multi-GPU types,
    without the host: a whole-GPU pod's choice between an idle node and one already broken is a
    question of the sets it leaves, and CPU or memory are rarely what a whole GPU strands
    (counting only the types the host can still serve waited more on the timeline replay).
    """
    classes, total_weight = mix._classes
    if total_weight == 0:
        return 0.0
    whole = node.whole_free
    if whole == 0:
        return 0.0
    expected = 0.0
    for cls in classes:
        if cls.count < 2 or (cls.models and node.model not in cls.models):
            continue
        expected += cls.weight * (whole % cls.count) * GPU_MILLI
    return expected / total_weight


node_fragmentation = _memoised("fragmentation", _node_fragmentation)
node_packing_loss = _memoised("packing loss", _node_packing_loss)
node_set_loss = _memoised("set loss", _node_set_loss)


def _after(node: NodeGpus, demand: GpuDemand, gpus: Sequence[int]) -> NodeGpus:
    free = list(node.free_milli)
    for index in gpus:
        free[index] -= demand.milli
    # Host resources are only debited in an exact picture; a loose one (0 = not tracked) could
    # otherwise reach 0 and silently turn into "not tracked".
    debit = node.host_tracked
    return NodeGpus(
        name=node.name,
        model=node.model,
        free_milli=tuple(free),
        cpu_free_milli=node.cpu_free_milli - demand.cpu_milli if debit else node.cpu_free_milli,
        memory_free_mib=node.memory_free_mib - demand.memory_mib if debit else node.memory_free_mib,
        host_tracked=node.host_tracked,
    )


def _candidate_choices(node: NodeGpus, demand: GpuDemand) -> list[tuple[int, ...]]:
    """GPU index sets worth comparing: GPUs with equal free share are interchangeable."""
    if demand.count == 0:
        return [()]
    usable = [i for i, free in enumerate(node.free_milli) if free >= demand.milli]
    if demand.count > 1 or demand.milli == GPU_MILLI:
        # Whole GPUs: every usable GPU is fully free, so any ``count`` of them are equivalent.
        return [tuple(usable[: demand.count])] if len(usable) >= demand.count else []
    seen: set[int] = set()
    choices: list[tuple[int, ...]] = []
    for index in usable:
        if node.free_milli[index] not in seen:
            seen.add(node.free_milli[index])
            choices.append((index,))
    return choices


def _consolidation_loss(node: NodeGpus, demand: GpuDemand, mix: WorkloadMix) -> float:
    """What binpack minimises the growth of when placing ``demand``.

    Fragmentation for every pod. Fractional and GPU-less pods are also the ones that strand CPU,
    memory and per-GPU remainders, so for them the packing loss counts too (at half weight:
    chosen among 0, 0.5 and 1 on the shared traces). Whole-GPU pods strand whole GPUs out of
    multi-GPU sets, so for them the set loss counts (at weight 1: chosen among 0, 0.5, 1 and 2 on
    the timeline replay of docs/simulator.md; the whole packing loss, or its host-bound part
    alone, did worse there).
    """
    loss = node_fragmentation(node, mix)
    if demand.count == 0 or demand.milli < GPU_MILLI:
        loss += _PACKING_LOSS_WEIGHT * node_packing_loss(node, mix)
    else:
        loss += _SET_LOSS_WEIGHT * node_set_loss(node, mix)
    return loss


def _binpack_cost(
    node: NodeGpus,
    after: NodeGpus,
    gpus: Sequence[int],
    demand: GpuDemand,
    mix: WorkloadMix,
    loss_before: float,
) -> Cost:
    growth = round(_consolidation_loss(after, demand, mix) - loss_before, _COST_DIGITS)
    if demand.count == 0:
        tie = float(sum(node.free_milli))
    elif demand.milli == GPU_MILLI:
        tie = float(after.whole_free)
    else:
        tie = float(after.free_milli[gpus[0]])
    return (growth, tie, float(sum(after.free_milli)))


def _spread_cost(node: NodeGpus, after: NodeGpus, gpus: Sequence[int]) -> Cost:
    capacity = GPU_MILLI * len(node.free_milli)
    free_share = sum(after.free_milli) / capacity if capacity else 0.0
    emptiest_left = -float(min((after.free_milli[i] for i in gpus), default=0))
    return (-round(free_share, _COST_DIGITS), emptiest_left)


def _best_choice(
    node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy
) -> tuple[Cost, tuple[int, ...]] | None:
    if not fits(node, demand):
        return None
    loss_before = _consolidation_loss(node, demand, mix) if strategy == "binpack" else 0.0
    best: tuple[Cost, tuple[int, ...]] | None = None
    for gpus in _candidate_choices(node, demand):
        after = _after(node, demand, gpus)
        cost = (
            _binpack_cost(node, after, gpus, demand, mix, loss_before)
            if strategy == "binpack"
            else _spread_cost(node, after, gpus)
        )
        if best is None or cost < best[0]:
            best = (cost, gpus)
    return best


def choose_gpus(
    node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy = "binpack"
) -> tuple[int, ...] | None:
    """GPU indexes on ``node`` for ``demand``, or None when it does not fit."""
    best = _best_choice(node, demand, mix, strategy)
    return None if best is None else best[1]


def placement_cost(
    node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy = "binpack"
) -> Cost | None:
    """Exact rank of ``node`` for ``demand`` (lower is better), or None when it does not fit.

    Memoised per mix: in a large cluster most nodes are in one of a few states (idle, full,
    one pod on it...), so a prioritize call over thousands of nodes is mostly dictionary hits.
    """
    return _cost_in(mix._cost_cache.table((demand, strategy)), node, demand, mix, strategy)


def _cost_in(
    costs: dict[str, Cost | None], node: NodeGpus, demand: GpuDemand, mix: WorkloadMix, strategy: Strategy
) -> Cost | None:
    """`placement_cost` with the demand's table of the mix's memo at hand (a lookup per node kind)."""
    found = costs.get(node.shape, MISSING)
    if found is not MISSING:
        return cast(Cost | None, found)
    best = _best_choice(node, demand, mix, strategy)
    return mix._cost_cache.put(costs, node.shape, None if best is None else best[0])


def _rank_scores(costs: set[Cost]) -> dict[Cost, int]:
    """0..10 per distinct cost: the best gets 10, the worst 0, evenly by rank between."""
    distinct = sorted(costs)
    if len(distinct) <= 1:
        return dict.fromkeys(distinct, MAX_NODE_SCORE)
    last = len(distinct) - 1
    return {cost: round(MAX_NODE_SCORE * (last - i) / last) for i, cost in enumerate(distinct)}


def scores_from_costs(costs: dict[str, Cost]) -> dict[str, int]:
    """Map costs to 0..10: the best distinct cost gets 10, the worst 0, evenly by rank between."""
    score_of = _rank_scores(set(costs.values()))
    return {name: score_of[cost] for name, cost in costs.items()}


def score_nodes(
    nodes: Sequence[NodeGpus], demand: GpuDemand, mix: WorkloadMix, strategy: Strategy = "binpack"
) -> dict[str, int]:
    """0..10 per node name; nodes where the demand does not fit get 0."""
    # Most nodes of a large cluster repeat a few shapes: rank each shape once per call and map
    # the scores back, so the per-node work is a few lookups.
    score_of_shape = score_kinds({node.shape: node for node in nodes}, demand, mix, strategy)
    return {node.name: score_of_shape[node.shape] for node in nodes}


def score_kinds(
    supply_of_kind: Mapping[str, NodeGpus],
    demand: GpuDemand,
    mix: WorkloadMix,
    strategy: Strategy = "binpack",
) -> dict[str, int]:
    """`score_nodes` by kinds of nodes (nodes alike to placement, one supply standing for each):
    0..10 per kind, 0 where the demand does not fit."""
    costs = mix._cost_cache.table((demand, strategy))  # placement_cost's memo, fetched once
    cost_of = {kind: _cost_in(costs, node, demand, mix, strategy) for kind, node in supply_of_kind.items()}
    score_of = _rank_scores({cost for cost in cost_of.values() if cost is not None})
    return {kind: 0 if cost is None else score_of[cost] for kind, cost in cost_of.items()}


_MIB = 1 << 20
# Float noise of parsed quantities (0.1 cores is 100.00000000000001 milli) is not a milli more.
_UNIT_NOISE = 1e-6


def host_cpu_milli(cores: float, *, request: bool = True) -> int:
    """CPU cores in milli-CPU: a request rounds up, a capacity (``request=False``) down."""
    milli = cores * 1000
    return math.ceil(milli - _UNIT_NOISE) if request else math.floor(milli + _UNIT_NOISE)


def host_memory_mib(memory_bytes: float, *, request: bool = True) -> int:
    """Bytes in MiB: a request rounds up, a capacity (``request=False``) down."""
    mib = memory_bytes / _MIB
    return math.ceil(mib - _UNIT_NOISE) if request else math.floor(mib + _UNIT_NOISE)


def placement_demand(gpus: GpuDemand | None, cpu_milli: int, memory_mib: int) -> GpuDemand:
    """What placement ranks for one pod: its GPUs (None: it has none) with its CPU and memory."""
    if gpus is None:
        return GpuDemand(count=0, cpu_milli=cpu_milli, memory_mib=memory_mib)
    return replace(gpus, cpu_milli=cpu_milli, memory_mib=memory_mib)


def node_supply(
    name: str,
    model: str,
    gpu_free: Sequence[int],
    host: tuple[int, int] | None,
    placed: Iterable[GpuDemand] = (),
) -> NodeGpus:
    """A node as placement sees it: GPUs' free shares, and - when ``host`` gives its CPU milli
    and memory MiB - those minus the CPU and memory of the pods ``placed`` there (exact, so a
    full node reads as full). ``host`` None: CPU and memory are not tracked (left to the
    scheduler's own resource fit)."""
    if host is None:
        return NodeGpus(name=name, model=model, free_milli=tuple(gpu_free))
    cpu, memory = host
    for demand in placed:
        cpu -= demand.cpu_milli
        memory -= demand.memory_mib
    return NodeGpus(
        name=name,
        model=model,
        free_milli=tuple(gpu_free),
        cpu_free_milli=cpu,
        memory_free_mib=memory,
        host_tracked=True,
    )


def rounded_mix(counts: Mapping[GpuDemand, int]) -> WorkloadMix:
    """The workload mix of the pods seen, each demand weighted by its count rounded to two
    significant digits: one pod more or less in a large cluster then leaves the mix - and the
    placement memo, which is kept per mix - unchanged. Demands are in a fixed order, so equal
    counts give equal mixes however they were gathered."""
    ordered = sorted(counts.items(), key=lambda item: _demand_order(item[0]))
    return WorkloadMix(demands=tuple((d, float(f"{n:.2g}")) for d, n in ordered if n > 0))


def _demand_order(demand: GpuDemand) -> tuple[int, int, tuple[str, ...], int, int]:
    return (demand.count, demand.milli, tuple(sorted(demand.models)), demand.cpu_milli, demand.memory_mib)


def mix_from_demands(demands: Sequence[GpuDemand]) -> WorkloadMix:
    """A mix weighting each distinct demand by how often it occurs."""
    counts: dict[GpuDemand, int] = {}
    for demand in demands:
        counts[demand] = counts.get(demand, 0) + 1
    return WorkloadMix(demands=tuple((d, float(n)) for d, n in counts.items()))


__all__ = [
    "GPU_MILLI",
    "MAX_NODE_SCORE",
    "Cost",
    "GpuDemand",
    "NodeGpus",
    "Strategy",
    "WorkloadMix",
    "choose_gpus",
    "fits",
    "host_cpu_milli",
    "host_memory_mib",
    "mix_from_demands",
    "node_fragmentation",
    "node_packing_loss",
    "node_set_loss",
    "node_supply",
    "placement_cost",
    "placement_demand",
    "rounded_mix",
    "score_nodes",
    "scores_from_costs",
]
