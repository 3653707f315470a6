"""Consolidation in the packing replay: moving placed pods so a pod that fits nowhere fits, within
a move budget.

The replay places each arriving pod where its policy ranks best, or skips it when it fits no node
(``packing``). With consolidation, a pod that fits nowhere is first handed to the extender's own
planner, ``extender.policy.consolidation.plan_moves``, on a ``ClusterSnapshot`` of the simulated
cluster (every node's free GPU milli, CPU and memory; every placed GPU pod with the GPUs it holds).
When the planner finds moves - placed pods that, evicted and placed again elsewhere by the
filter's ranking, leave room for the pod - they are carried out on the simulated cluster exactly as
planned: the movers leave their GPUs, the waiting pod takes the GPUs the filter chooses on the node
made room on, then each mover (largest first) takes the GPUs the filter chooses on the node the
planner landed it on. The cluster then holds what the planner's fork held.

**Budget.** ``moves_per_100_pods`` = B allows, before a pod is served, at most
``floor(B x placed / 100) - moves so far`` moves, ``placed`` counting the pods placed before it.
So at every point of the replay, moves <= B% of the pods placed, and B = 0 never moves (the
replay is then the plain one). Within that, at most ``moves_per_pod`` moves serve one pod (the
planner's ``max_moves_per_pod``; 1 unless asked, the extender's default is 2): on the trace's 1213
nodes, nearly full, a search of pairs of movers that finds nothing spends the planner's whole work
budget (64 trials: pairs whose movers each fit elsewhere, but only one after the other), about
three times the cost of a search of single movers, for each of the thousands of pods that fit
nowhere.

**Movability.** The trace says nothing about owners, so every placed GPU pod is taken to belong to
a controller that recreates it (a mover in the planner's sense: movable, preemptible, not
terminating). Time in the replay is the pod's arrival number, and the minimum runtime is 0: a pod
may move as soon as it is placed, and again later. The trace's pods are never deleted, so moves
are the only way GPUs come free.

**In the timeline replay** (``timeline``) pods also leave (``released``), time is the trace's in
seconds, the rules are the extender's (minimum runtime 300 s, 2 moves per pod, 4 per cycle), and
``serve_waiting`` runs one cycle of the planner over the waiting pods in the scheduler's order,
as the extender's loop does, within the same budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from extender.policy.consolidation import ConsolidationRules, MovePlan, plan_moves
from extender.policy.fairness import FairnessSnapshot, QueueSpec
from extender.policy.placement import GpuDemand, choose_gpus
from extender.policy.reclaim import PendingPod
from extender.policy.snapshot import ClusterSnapshot, RunningPod

from .cluster import Cluster

QUEUE = "trace"  # one queue without limits: admission refuses no trace pod
_FAIRNESS = FairnessSnapshot.build([QueueSpec(QUEUE)], {}, {})


@dataclass
class MoveStats:
    moves: int = 0  # pods moved
    moved_milli: int = 0  # GPU milli those pods held
    pods_served: int = 0  # pods placed thanks to moves
    plans_tried: int = 0  # pods that fit nowhere while the budget allowed a move
    # The smallest budget (moves per 100 placed pods) that would have made every plan of the replay
    # with the same bounds: any budget from it up to the replay's makes the same moves.
    same_from_budget: float = 0.0


def consolidation_rules(moves_per_pod: int) -> ConsolidationRules:
    """The planner's rules in a replay: no minimum runtime, at most `moves_per_pod` moves for one
    pod (the rest as the extender's defaults, the work budget included)."""
    if moves_per_pod < 1:
        raise ValueError("a pod is served by at least one move")
    return ConsolidationRules(min_runtime_s=0.0, max_moves_per_pod=moves_per_pod)


@dataclass
class Consolidator:
    """The placed pods of one replay, as the planner sees them, and the move budget spent."""

    cluster: Cluster
    moves_per_100_pods: float
    rules: ConsolidationRules = field(default_factory=lambda: consolidation_rules(1))
    stats: MoveStats = field(default_factory=MoveStats)
    _running: dict[str, RunningPod] = field(default_factory=dict)
    _where: dict[str, tuple[int, GpuDemand, tuple[int, ...]]] = field(default_factory=dict)
    _by_node: dict[str, set[str]] = field(default_factory=dict)
    _index: dict[str, int] = field(default_factory=dict)
    # Demands the planner found no moves for since the cluster last changed: it would find none
    # again (it is deterministic, and neither the pods nor the budget changed).
    _hopeless: set[GpuDemand] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.moves_per_100_pods < 0:
            raise ValueError("the move budget cannot be negative")
        self._index = {node.name: i for i, node in enumerate(self.cluster.nodes)}

    def allowed(self, placed: int) -> int:
        """Moves the budget allows now, with `placed` pods placed so far."""
        return max(0, math.floor(self.moves_per_100_pods * placed / 100 + 1e-9) - self.stats.moves)

    def placed(self, key: str, index: int, demand: GpuDemand, gpus: Sequence[int], now: float) -> None:
        """Record a pod the replay placed (GPU-less pods are no mover and are not recorded)."""
        self._hopeless.clear()
        if not demand.count:
            return
        node = self.cluster.nodes[index].name
        self._where[key] = (index, demand, tuple(gpus))
        self._running[key] = RunningPod(
            key,
            QUEUE,
            node,
            tuple((gpu, demand.milli) for gpu in gpus),
            started=now,
            cpu_milli=demand.cpu_milli,
            memory_mib=demand.memory_mib,
            movable=True,
        )
        self._by_node.setdefault(node, set()).add(key)

    def where(self, key: str) -> tuple[int, tuple[int, ...]]:
        """The node index and GPUs a recorded pod holds now."""
        index, _, gpus = self._where[key]
        return index, gpus

    def released(self, key: str) -> None:
        """Forget a pod that left the cluster (a timeline pod finished; the caller frees its GPUs)."""
        self._hopeless.clear()
        if self._where.pop(key, None) is None:
            return
        self._by_node[self._running.pop(key).node].discard(key)

    def serve_waiting(
        self, waiting: Sequence[PendingPod], placed: int, now: float
    ) -> list[tuple[str, tuple[str, ...]]]:
        """One consolidation cycle over `waiting` pods (the scheduler's order) as the extender runs
        it: a single ``plan_moves`` call, at most the rules' moves per cycle and what the budget
        allows; the plans are carried out. Returns (pod served, pods moved for it) per plan."""
        budget = self.allowed(placed)
        if budget <= 0 or not waiting:
            return []
        rules = replace(self.rules, max_moves_per_cycle=min(budget, self.rules.max_moves_per_cycle))
        self.stats.plans_tried += 1
        served = []
        for plan in plan_moves(self._snapshot(), waiting, now, rules):
            if plan.pod is None:
                raise AssertionError("a consolidation plan serves a waiting pod")
            self._carry_out(plan, plan.pod.key, plan.pod.demand, now)
            served.append((plan.pod.key, tuple(move.pod.key for move in plan.moves)))
        return served

    def serve(self, key: str, demand: GpuDemand, placed: int, now: float) -> bool:
        """Try to make room for a pod that fits no node; True when it was placed (after moves)."""
        budget = self.allowed(placed)
        if budget <= 0 or demand in self._hopeless:
            return False
        self.stats.plans_tried += 1
        # A smaller budget B' plans alike while it allows as many of the moves this plan may make:
        # floor(B' x placed / 100) - moves >= min(budget, moves per pod).
        needed = 100.0 * (self.stats.moves + min(budget, self.rules.max_moves_per_pod)) / placed
        self.stats.same_from_budget = max(self.stats.same_from_budget, needed)
        rules = ConsolidationRules(
            min_runtime_s=self.rules.min_runtime_s,
            max_moves_per_pod=min(budget, self.rules.max_moves_per_pod),
            max_moves_per_cycle=budget,
            max_candidates=self.rules.max_candidates,
            max_pending=1,
        )
        plans = plan_moves(self._snapshot(), [PendingPod(key, QUEUE, demand, {}, created=now)], now, rules)
        if not plans:
            self._hopeless.add(demand)
            return False
        self._carry_out(plans[0], key, demand, now)
        return True

    def _snapshot(self) -> ClusterSnapshot:
        cluster = self.cluster
        nodes = {node.name: cluster.node_gpus(i) for i, node in enumerate(cluster.nodes)}
        return ClusterSnapshot(nodes, self._running, _FAIRNESS, cluster.mix, pods_by_node=self._by_node)

    def _take(self, key: str, demand: GpuDemand, node: str, now: float) -> None:
        """Place a pod on `node` with the filter's GPU choice, as the planner's fork did."""
        index = self._index[node]
        gpus = choose_gpus(self.cluster.node_gpus(index), demand, self.cluster.mix)
        if gpus is None:
            raise AssertionError(f"the planner placed {key} on {node}, where it no longer fits")
        self.cluster.place(index, demand, gpus)
        self.placed(key, index, demand, gpus, now)

    def _carry_out(self, chosen: MovePlan, key: str, demand: GpuDemand, now: float) -> None:
        movers: list[tuple[str, GpuDemand, str]] = []
        for move in chosen.moves:  # the planner's order: largest mover first
            index, moved, gpus = self._where.pop(move.pod.key)
            self.cluster.release(index, moved, gpus)
            del self._running[move.pod.key]
            self._by_node[move.pod.node].discard(move.pod.key)
            movers.append((move.pod.key, moved, move.to_node))
            self.stats.moves += 1
            self.stats.moved_milli += moved.total_milli
        self._take(key, demand, chosen.node, now)
        for mover, moved, node in movers:
            self._take(mover, moved, node, now)
        self.stats.pods_served += 1
