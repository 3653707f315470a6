"""Placement policies compared by the simulator.

Each policy ranks a node *state* for a pod (lower cost is better, ``None`` = does not fit) and
picks the GPUs on the chosen node. Ties between equally ranked nodes are broken at random by the
replay (seeded), as kube-scheduler does between equal scores.

* ``k8s-spread`` - what a stock kube-scheduler does with GPUs as a counted resource: the
  LeastAllocated score (mean free share of CPU, memory and GPU after placement), devices handed
  out in index order.
* ``random`` - any node that fits, any GPUs that fit.
* ``bestfit`` - the node left with the least free GPU and CPU share; the fullest GPU that fits.
* ``fgd`` - Fragmentation Gradient Descent (Weng et al., ATC'23) from the paper's definition: the
  node and GPU whose placement grows node fragmentation for the workload mix the least, every
  GPU that fits tried, no tie-break beyond the random one. Node fragmentation is the shared
  ``node_fragmentation`` (the metric itself; the unit tests check it against a literal
  transcription of the definition).
* ``tessera`` / ``tessera-spread`` - ``extender.policy.placement``, the code the extender serves.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contract.names import GPU_MILLI
from extender.policy.placement import (
    Cost,
    GpuDemand,
    NodeGpus,
    Strategy,
    WorkloadMix,
    choose_gpus,
    fits,
    node_fragmentation,
    placement_cost,
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
    shape = state.shape
    cpu = (state.cpu_free_milli - demand.cpu_milli) / shape.cpu_milli if shape.cpu_milli else 0.0
    return (_gpu_share_after(state, demand) + cpu,)


def _fgd_options(node: NodeGpus, demand: GpuDemand, mix: WorkloadMix) -> list[tuple[float, tuple[int, ...]]]:
    """(fragmentation growth, GPUs) for every way to place ``demand`` on ``node``."""
    before = node_fragmentation(node, mix)
    usable = _usable_gpus(node, demand)
    if demand.count == 0:
        choices: list[tuple[int, ...]] = [()]
    elif demand.milli == GPU_MILLI:
        choices = [tuple(usable[: demand.count])]
    else:
        choices = [(i,) for i in usable]
    options = []
    for gpus in choices:
        free = list(node.free_milli)
        for gpu in gpus:
            free[gpu] -= demand.milli
        after = NodeGpus(
            node.name,
            node.model,
            tuple(free),
            node.cpu_free_milli - demand.cpu_milli,
            node.memory_free_mib - demand.memory_mib,
            host_tracked=True,
        )
        options.append((round(node_fragmentation(after, mix) - before, 6), gpus))
    return options


GpuPicker = Callable[[NodeGpus, GpuDemand, random.Random], tuple[int, ...]]


@dataclass(frozen=True)
class Policy:
    name: str
    mix: WorkloadMix

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
class FgdPolicy(Policy):
    def cost(self, state: NodeState, demand: GpuDemand) -> Cost | None:
        node = state.as_node_gpus()
        if not fits(node, demand):
            return None
        return (min(growth for growth, _ in _fgd_options(node, demand, self.mix)),)

    def gpus(self, node: NodeGpus, demand: GpuDemand, rng: random.Random) -> tuple[int, ...]:
        return min(_fgd_options(node, demand, self.mix), key=lambda option: option[0])[1]


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


POLICY_NAMES = ("k8s-spread", "random", "bestfit", "fgd", "tessera", "tessera-spread")
DEFAULT_POLICIES = ("k8s-spread", "random", "bestfit", "fgd", "tessera")


def make_policy(name: str, mix: WorkloadMix) -> Policy:
    if name == "k8s-spread":
        return ScoredPolicy(name, mix, _least_allocated_cost, _lowest_index_gpus)
    if name == "random":
        return ScoredPolicy(name, mix, _constant, _random_gpus)
    if name == "bestfit":
        return ScoredPolicy(name, mix, _best_fit_cost, _fullest_gpus)
    if name == "fgd":
        return FgdPolicy(name, mix)
    if name in ("tessera", "tessera-spread"):
        return TesseraPolicy(name, mix, "spread" if name == "tessera-spread" else "binpack")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def policy_names(spec: Sequence[str]) -> list[str]:
    unknown = [name for name in spec if name not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}")
    return list(spec)
