"""Placement policies compared by the simulator.

Each policy ranks a node *state* for a pod (lower cost is better, ``None`` = does not fit) and
picks the GPUs on the chosen node. The replay breaks ties between equally ranked nodes (see
``packing.Placer``).

* ``k8s-spread`` - what a stock kube-scheduler does with GPUs as a counted resource: the
  LeastAllocated score (mean free share of CPU, memory and GPU after placement), devices handed
  out in index order.
* ``random``, ``bestfit``, ``fgd`` - the FGD paper's baselines as its public simulator scores
  them, integer scores included (``baselines``): a random fitting node; the node left with the
  least weighted CPU + GPU; Fragmentation Gradient Descent over the typical task types.
* ``tessera`` / ``tessera-spread`` - ``extender.policy.placement``, the code the extender serves,
  alone: the best node by exact cost, Tessera's GPU choice ("policy alone").
* ``tessera-deployed`` - the same code as a cluster runs it: kube-scheduler's scores and tie-break,
  the DRA allocator's device choice, the extender's mix (``deployed``; "as deployed").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from contract.names import GPU_MILLI
from extender.policy.placement import (
    Cost,
    GpuDemand,
    NodeGpus,
    Strategy,
    WorkloadMix,
    choose_gpus,
    fits,
    placement_cost,
)

from .baselines import (
    TypicalTasks,
    best_fit_score,
    paper_fragmentation,
    sigmoid_score,
    typical_tasks,
    whole_gpus_after,
)
from .cluster import NodeState


def _usable_gpus(node: NodeGpus, demand: GpuDemand) -> list[int]:
    return [i for i, free in enumerate(node.free_milli) if free >= demand.milli] if demand.count else []


def _lowest_index_gpus(node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
    return tuple(_usable_gpus(node, demand)[: demand.count])


def _random_gpus(node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
    return tuple(sorted(rng.sample(_usable_gpus(node, demand), demand.count)))


def _fullest_gpus(node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
    usable = sorted(_usable_gpus(node, demand), key=lambda i: (node.free_milli[i], i))
    return tuple(sorted(usable[: demand.count]))


def _gpu_share_after(state: NodeState, demand: GpuDemand) -> float:
    capacity = GPU_MILLI * state.shape.gpus
    return (sum(state.free_sorted) - demand.total_milli) / capacity if capacity else 0.0


def _least_allocated_cost(state: NodeState, demand: GpuDemand) -> Cost:
    shape = state.shape
    cpu = (state.cpu_free_milli - demand.cpu_milli) / shape.cpu_milli if shape.cpu_milli else 0.0
    memory = (state.memory_free_mib - demand.memory_mib) / shape.memory_mib if shape.memory_mib else 0.0
    return (-(cpu + memory + _gpu_share_after(state, demand)) / 3,)


def _best_fit_cost(state: NodeState, demand: GpuDemand) -> Cost:
    return (-best_fit_score(state.cpu_free_milli, sum(state.free_sorted), demand),)


GpuPicker = Callable[[NodeGpus, GpuDemand, random.Random], tuple[int, ...]]


@dataclass(frozen=True)
class Policy:
    name: str
    mix: WorkloadMix
    uniform_ties: ClassVar[bool] = False  # True: any fitting node equally likely, ignoring the tie rule

    def cost(self, state: NodeState, demand: GpuDemand) -> Cost | None:
        raise NotImplementedError

    def gpus(self, node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
        raise NotImplementedError


@dataclass(frozen=True)
class ScoredPolicy(Policy):
    """A baseline defined by a node score over the state plus a GPU picking rule."""

    score: Callable[[NodeState, GpuDemand], Cost]
    picker: GpuPicker

    def cost(self, state: NodeState, demand: GpuDemand) -> Cost | None:
        return self.score(state, demand) if fits(state.as_node_gpus(), demand) else None

    def gpus(self, node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
        return self.picker(node, demand, rng)


@dataclass(frozen=True)
class RandomPolicy(ScoredPolicy):
    """Every fitting node equally likely, whatever the replay's tie rule."""

    uniform_ties: ClassVar[bool] = True


@dataclass(frozen=True)
class FgdPolicy(Policy):
    """FGD with the paper simulator's integer sigmoid score (``baselines``)."""

    tasks: TypicalTasks
    # (model, sorted free milli, free CPU) -> fragmentation; grows with the distinct states seen.
    _memo: dict[tuple[str, tuple[int, ...], int], float] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def _fragmentation(self, model: str, free: Sequence[int], cpu_free_milli: int) -> float:
        key = (model, tuple(sorted(free)), cpu_free_milli)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = paper_fragmentation(model, key[1], cpu_free_milli, self.tasks)
        return value

    def _scores(self, model: str, free: Sequence[int], cpu_free_milli: int, demand: GpuDemand) -> list[int]:
        """Score per GPU a fraction could take (-1 where it does not fit), or [node score]."""
        before = self._fragmentation(model, free, cpu_free_milli)
        cpu_after = cpu_free_milli - demand.cpu_milli
        if demand.count == 1 and demand.milli < GPU_MILLI:
            by_free: dict[int, int] = {}
            for milli in set(free):
                if milli >= demand.milli:
                    after = list(free)
                    after[after.index(milli)] -= demand.milli
                    by_free[milli] = sigmoid_score(before, self._fragmentation(model, after, cpu_after))
            return [by_free.get(milli, -1) for milli in free]
        after_whole = whole_gpus_after(free, demand)
        return [sigmoid_score(before, self._fragmentation(model, after_whole, cpu_after))]

    def cost(self, state: NodeState, demand: GpuDemand) -> Cost | None:
        if not fits(state.as_node_gpus(), demand):
            return None
        return (-max(self._scores(state.shape.model, state.free_sorted, state.cpu_free_milli, demand)),)

    def gpus(self, node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
        if demand.count == 1 and demand.milli < GPU_MILLI:
            scores = self._scores(node.model, node.free_milli, node.cpu_free_milli, demand)
            return (scores.index(max(scores)),)  # the lowest device index among the best
        return _lowest_index_gpus(node, demand, rng)


@dataclass(frozen=True)
class TesseraPolicy(Policy):
    strategy: Strategy = "binpack"

    def cost(self, state: NodeState, demand: GpuDemand) -> Cost | None:
        return placement_cost(state.as_node_gpus(), demand, self.mix, self.strategy)

    def gpus(self, node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
        chosen = choose_gpus(node, demand, self.mix, self.strategy)
        if chosen is None:
            raise ValueError(f"{demand} does not fit {node.name}, yet its state was ranked as fitting")
        return chosen


def _constant(state: NodeState, demand: GpuDemand) -> Cost:
    return ()


# The deployed path (kube-scheduler + extender + DRA allocator), placed by deployed.DeployedPlacer.
DEPLOYED = "tessera-deployed"
POLICY_NAMES = ("k8s-spread", "random", "bestfit", "fgd", "tessera", "tessera-spread", DEPLOYED)
DEFAULT_POLICIES = ("k8s-spread", "random", "bestfit", "fgd", "tessera", DEPLOYED)


def make_policy(name: str, mix: WorkloadMix) -> Policy:
    if name == "k8s-spread":
        return ScoredPolicy(name, mix, _least_allocated_cost, _lowest_index_gpus)
    if name == "random":
        return RandomPolicy(name, mix, _constant, _random_gpus)
    if name == "bestfit":
        return ScoredPolicy(name, mix, _best_fit_cost, _fullest_gpus)
    if name == "fgd":
        return FgdPolicy(name, mix, typical_tasks(mix.demands))
    if name in ("tessera", "tessera-spread"):
        return TesseraPolicy(name, mix, "spread" if name == "tessera-spread" else "binpack")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def policy_names(spec: Sequence[str]) -> list[str]:
    unknown = [name for name in spec if name not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}")
    return list(spec)
