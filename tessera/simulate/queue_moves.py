"""Consolidation in the queue simulator: the extender's consolidation loop after its reclaim loop.

The extender runs one loop: reclaim plans first, then the consolidation planner
(``extender.policy.consolidation.plan_moves``) over the same waiting pods (``ClusterPicture``'s
waiting list: admitted GPU pods in the scheduler's order) for those reclaim did not serve. Here a
cycle of the queue simulator's reclaim loop (``queues._Replay._reclaim``) is followed by one
consolidation cycle on the simulated cluster as it is after reclaim's plans were carried out and
the scheduler's pass ran (the extender hands the planner reclaim's plans instead, to apply on its
fork: the same cluster). The planner sees every running GPU pod as movable (the trace says nothing
of owners: each pod is taken to belong to a controller that recreates it), the holds and kept
rests that reclaim made (nothing lands there), and the queues' fairness (it serves no pod that
admission would refuse, ``consolidation_refusal``).

**Rules and budget**, as the plain timeline's (``timeline``): the extender's rules (a mover has run
300 s, 2 moves per pod, 4 per cycle) and at most B moves per 100 pods started so far. Only the
first waiting pod of each (queue, request) is handed to the planner: a second one alike would
search the same nodes again; it is served in a later cycle.

**A plan carried out**: its movers leave their GPUs, the waiting pod starts on the GPUs the filter
chooses on the node made room on, then each mover (largest first) restarts on the GPUs the filter
chooses on the node the planner landed it on. A moved pod *restarts*: its run so far is lost
(its GPUs x the time it had run, counted apart from reclaim's evictions) and it runs its whole
duration again. It is no eviction in reclaim's sense (no restart protection, no ping-pong).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from contract.names import GPU_MILLI
from extender.policy.consolidation import ConsolidationRules, plan_moves
from extender.policy.fairness import FairnessSnapshot
from extender.policy.placement import GpuDemand, choose_gpus
from extender.policy.reclaim import PendingPod

if TYPE_CHECKING:
    from .queues import _Pod, _Replay


@dataclass(frozen=True)
class QueueMoves:
    """Consolidation in a queue replay: the move budget (moves per 100 pods started) and rules."""

    moves_per_100_pods: float
    rules: ConsolidationRules = field(default_factory=ConsolidationRules)

    def __post_init__(self) -> None:
        if self.moves_per_100_pods < 0:
            raise ValueError("the move budget cannot be negative")


@dataclass
class QueueMoveStats:
    moves: int = 0  # pods moved
    pods_served: int = 0  # waiting pods started by a plan
    lost_gpu_s: float = 0.0  # the movers' runs cut short (each restarts)
    cycles: int = 0  # planner calls


class QueueConsolidator:
    """The consolidation loop of one queue replay (module docstring)."""

    def __init__(self, replay: _Replay, settings: QueueMoves) -> None:
        if replay.minimums:
            raise ValueError("consolidation in the queue simulator serves lone pods: no gangs")
        self.replay = replay
        self.settings = settings
        self.stats = QueueMoveStats()
        self.started = 0  # pods started for the first time (the budget's count)

    def allowed(self) -> int:
        """Moves the budget allows now."""
        budget = math.floor(self.settings.moves_per_100_pods * self.started / 100 + 1e-9)
        return max(0, budget - self.stats.moves)

    def cycle(self, fairness: FairnessSnapshot, now: float) -> bool:
        """One consolidation cycle at `now`; True when it moved pods."""
        replay = self.replay
        budget = self.allowed()
        if budget <= 0:
            return False
        pending = self._first_of_each(replay._pending(fairness))
        if not pending:
            return False
        snapshot = replay._snapshot(fairness, now, movable=True)
        rules = replace(
            self.settings.rules,
            max_moves_per_cycle=min(budget, self.settings.rules.max_moves_per_cycle),
        )
        self.stats.cycles += 1
        plans = plan_moves(snapshot, pending, now, rules)
        for chosen in plans:
            if chosen.pod is None or chosen.members:
                raise AssertionError("a consolidation plan in the queue replay serves one waiting pod")
            movers = [replay.pods[int(move.pod.key)] for move in chosen.moves]
            targets = [replay.node_index[move.to_node] for move in chosen.moves]
            for mover in movers:
                self.stats.lost_gpu_s += mover.demand.total_milli / GPU_MILLI * (now - mover.started)
                mover.runs += 1  # its finish event is void
                replay._free(mover)
                replay._wait(mover, now)
            served = replay.pods[int(chosen.pod.key)]
            replay.holds.pop(served.index, None)  # what reclaim held for it is no longer needed
            self._start(served, replay.node_index[chosen.node], now)
            for mover, target in zip(movers, targets, strict=True):
                self._start(mover, target, now)
            self.stats.moves += len(movers)
            self.stats.pods_served += 1
        return bool(plans)

    def _first_of_each(self, pending: list[PendingPod]) -> list[PendingPod]:
        """The first waiting pod of each (queue, request), at most the rules' `max_pending`."""
        first: dict[tuple[str, GpuDemand], PendingPod] = {}
        for waiting in pending:
            first.setdefault((waiting.queue, waiting.demand), waiting)
            if len(first) == self.settings.rules.max_pending:
                break
        return list(first.values())

    def _start(self, pod: _Pod, index: int, now: float) -> None:
        """Start `pod` on node `index` with the filter's GPU choice, as the planner's fork did."""
        cluster = self.replay.cluster
        gpus = choose_gpus(cluster.node_gpus(index), pod.demand, cluster.mix)
        if gpus is None:
            raise AssertionError(f"the planner placed pod {pod.key} on node {index}, where it does not fit")
        cluster.place(index, pod.demand, gpus)
        self.replay._start(pod, now, (index, tuple(gpus)))
