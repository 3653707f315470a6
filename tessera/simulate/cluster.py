"""The simulated cluster: per-node free GPU milli, CPU and memory, grouped by identical state.

Placement policies only look at a node's state, never its name, so nodes in the same state get
the same verdict (a node's topology domain is part of its state: nodes of two domains never
share one). Grouping them lets a replay evaluate each distinct state once per pod (and
memoise the verdict until the state disappears) instead of every node, which is what keeps a
replay of the full trace to seconds per policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from contract.names import GPU_MILLI
from extender.policy.placement import (
    NO_DOMAINS,
    DomainMap,
    GpuDemand,
    NodeGpus,
    WorkloadMix,
    node_fragmentation,
    node_supply,
)

from .trace import SimNode


@dataclass(frozen=True)
class NodeShape:
    """Capacity of a node and its topology domain ("": none); nodes of the same shape are
    interchangeable when equally used (so nodes of two domains never are)."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    domain: str = ""


@dataclass(frozen=True)
class NodeState:
    shape: NodeShape
    free_sorted: tuple[int, ...]  # per-GPU free milli, ascending (GPU order does not matter to policies)
    cpu_free_milli: int
    memory_free_mib: int

    def as_node_gpus(self, name: str = "", free: Sequence[int] | None = None) -> NodeGpus:
        """The node as placement sees it, built as the extender builds a live node's."""
        host = (self.cpu_free_milli, self.memory_free_mib)
        return node_supply(name, self.shape.model, free if free is not None else self.free_sorted, host)


class Cluster:
    """Mutable cluster picture for one replay."""

    def __init__(self, nodes: Sequence[SimNode], mix: WorkloadMix, domains: DomainMap = NO_DOMAINS) -> None:
        self.nodes = list(nodes)
        # Node -> its topology domain (`extender.policy.placement.DomainMap`): part of each
        # node's state, so the states a gang's members are placed by keep domains apart.
        self.domains = domains
        self.mix = mix
        self.capacity_milli = GPU_MILLI * sum(node.gpus for node in nodes)
        self.allocated_milli = 0
        self.free: list[list[int]] = [[GPU_MILLI] * node.gpus for node in nodes]
        self.cpu_free = [node.cpu_milli for node in nodes]
        self.memory_free = [node.memory_mib for node in nodes]
        self._shapes = [
            NodeShape(n.model, n.gpus, n.cpu_milli, n.memory_mib, domains.get(n.name, "")) for n in nodes
        ]
        self._state_ids: dict[NodeState, int] = {}
        self.states: list[NodeState] = []
        self.members: dict[int, dict[int, None]] = {}  # state id -> node indexes (ordered set)
        self._node_state: list[int] = []
        self._frag_of_state: dict[int, float] = {}
        self.fragmentation_milli = 0.0
        for index in range(len(nodes)):
            state_id = self._intern(index)
            self._node_state.append(state_id)
            self.members.setdefault(state_id, {})[index] = None
            self.fragmentation_milli += self._frag(state_id)

    def _intern(self, index: int) -> int:
        state = NodeState(
            self._shapes[index],
            tuple(sorted(self.free[index])),
            self.cpu_free[index],
            self.memory_free[index],
        )
        state_id = self._state_ids.get(state)
        if state_id is None:
            state_id = len(self.states)
            self._state_ids[state] = state_id
            self.states.append(state)
        return state_id

    def _frag(self, state_id: int) -> float:
        value = self._frag_of_state.get(state_id)
        if value is None:
            value = node_fragmentation(self.states[state_id].as_node_gpus(), self.mix)
            self._frag_of_state[state_id] = value
        return value

    def groups(self) -> Iterator[tuple[int, dict[int, None]]]:
        """(state id, node indexes) for every state some node is in."""
        return iter(self.members.items())

    def state_id(self, index: int) -> int:
        """The id (in ``states``) of the state node ``index`` is in now."""
        return self._node_state[index]

    def node_gpus(self, index: int) -> NodeGpus:
        return self.states[self._node_state[index]].as_node_gpus(self.nodes[index].name, self.free[index])

    def place(self, index: int, demand: GpuDemand, gpus: Sequence[int]) -> None:
        free = self.free[index]
        if len(set(gpus)) != demand.count:
            raise ValueError(f"{len(gpus)} GPUs chosen for a {demand.count}-GPU pod")
        short = [gpu for gpu in gpus if free[gpu] < demand.milli]
        if short:
            raise ValueError(f"GPU(s) {short} of {self.nodes[index].name} lack {demand.milli} free milli")
        self._apply(index, demand, gpus, -1)

    def release(self, index: int, demand: GpuDemand, gpus: Sequence[int]) -> None:
        """Give back what ``place`` took (queue workloads and timeline pods finish; packing replays never
        call this)."""
        self._apply(index, demand, gpus, +1)

    def _apply(self, index: int, demand: GpuDemand, gpus: Sequence[int], sign: int) -> None:
        for gpu in gpus:
            self.free[index][gpu] += sign * demand.milli
        self.cpu_free[index] += sign * demand.cpu_milli
        self.memory_free[index] += sign * demand.memory_mib
        self.allocated_milli -= sign * demand.total_milli
        old = self._node_state[index]
        del self.members[old][index]
        if not self.members[old]:
            del self.members[old]
        new = self._intern(index)
        self._node_state[index] = new
        self.members.setdefault(new, {})[index] = None
        self.fragmentation_milli += self._frag(new) - self._frag(old)

    def live_states(self) -> set[int]:
        return set(self.members)
