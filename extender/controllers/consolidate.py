"""The consolidation executor: carries out `extender.policy.consolidation`'s move plans.

It runs in the reclaim loop's cycle, after reclaim (one planner, several goals): on the cycle's
snapshot and waiting pods, with reclaim's plans of the cycle applied, it plans moves for the
waiting pods reclaim did not serve - and, when asked for (`drain_nodes`) and nothing waits, moves
to empty whole GPU nodes for a node autoscaler to remove. For each plan:

1. hold the slot being freed - for the served pod (the filter shows other pods the node minus the
   hold), or the whole emptied node - so the movers' successors cannot land back in it;
2. evict the movers through the Eviction API, every plan's at once (`evictions.evict_all`: a
   bounded number of calls in flight, each with a short timeout): a PodDisruptionBudget that
   blocks one, a failure or no answer in time is reported on the mover and the served pod, the
   plan is dropped and its hold released (a budget is never bypassed);
3. afterwards, check that each mover was re-placed: its controller's new pod (same controller,
   created after the eviction) bound to a node within `replace_timeout_s`; counted and reported
   either way.

Events: `Moved` on each mover, `ConsolidationPlanned` on the served pod, `MoveBlocked` on both when
a budget blocks, `MovedPodReplaced` on a successor, `MovedPodNotReplaced` on the served pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes_asyncio.client import ApiClient

from contract.kube import controller_of, mapping, meta
from extender.controllers.evictions import (
    EvictionLimits,
    EvictionOutcome,
    evict_all,
    pod_event,
    report_cut_off,
    uid_of,
)
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.picture.demands import pod_created
from extender.policy.consolidation import ConsolidationRules, MovePlan, NodeRooms, plan_drain, plan_moves
from extender.policy.placement import GpuDemand
from extender.policy.reclaim import Budget, PendingPod, Plan
from extender.policy.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)

# Hold key of an emptied node: not a pod key (a namespace name has no dots), so no pod binds it.
DRAIN_HOLD_PREFIX = "tessera.dev/drain/"


@dataclass(frozen=True)
class ConsolidationOptions:
    min_runtime_s: float = 300.0  # a pod has run this long before it may be moved
    max_moves_per_pod: int = 2
    max_moves_per_cycle: int = 4
    hold_s: float = 90.0  # the freed slot is kept this long for the served pod (a bind ends it)
    replace_timeout_s: float = 120.0  # a mover's successor is bound within this, or reported
    drain_nodes: int = 0  # scale-down: GPU nodes emptied per cycle while nothing waits; 0 = off
    drain_hold_s: float = 600.0  # an emptied node is kept empty this long (for the autoscaler)
    blocked_retry_s: float = 60.0  # a pod whose move a budget blocked is not tried again sooner
    evictions: EvictionLimits = field(default_factory=EvictionLimits)  # calls in flight, timeout


@dataclass(frozen=True)
class _Moved:
    """A mover evicted, waiting for its controller's new pod to be bound."""

    key: str
    uid: str
    owner_uid: str
    evicted_at: float  # seconds since the epoch (creation timestamps are in whole seconds)
    deadline: float  # monotonic
    target: str  # what it moved for, in words: a pod, or a node emptied
    served: str  # the key of the pod it moved for ('' for a node emptied)


class Consolidator:
    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        metrics: ExtenderMetrics,
        options: ConsolidationOptions | None = None,
    ) -> None:
        self.api = api
        self.picture = picture
        self.metrics = metrics
        self.options = options or ConsolidationOptions()
        self.rules = ConsolidationRules(
            min_runtime_s=self.options.min_runtime_s,
            max_moves_per_pod=self.options.max_moves_per_pod,
            max_moves_per_cycle=self.options.max_moves_per_cycle,
        )
        self.moved: list[_Moved] = []  # awaiting their successors
        self._successors: set[str] = set()  # pod uids already matched to a move
        self._blocked: dict[str, float] = {}  # pod key -> monotonic time its move may be retried
        self.rooms = NodeRooms()  # what planning found on each node, looked at again where it changed

    def has_own_work(self) -> bool:
        """Moved pods whose successors are still to be found, or nodes to empty while nothing waits."""
        return bool(self.moved) or self.options.drain_nodes > 0

    async def run_once(
        self, snapshot: ClusterSnapshot, waiting: Sequence[PendingPod], served: Sequence[Plan]
    ) -> list[MovePlan]:
        """One cycle after reclaim's: check earlier moves, plan, carry out. Returns the plans done."""
        await self._check_replaced()
        started = time.perf_counter()
        now = time.time()
        draining = self.draining_nodes()
        pinned = self._pinned()
        work = Budget(self.rules.max_trials)
        plans = plan_moves(snapshot, waiting, now, self.rules, served, draining, pinned, work, self.rooms)
        report_cut_off(self.metrics, "consolidate", work)
        if self.options.drain_nodes and not waiting and not served and not plans:
            work = Budget(self.rules.max_trials)
            plans = plan_drain(snapshot, now, self.rules, self.options.drain_nodes, draining, pinned, work)
            report_cut_off(self.metrics, "drain", work)
        self.metrics.consolidation_cycle.observe(time.perf_counter() - started)
        return await self.carry_out(plans)

    def _pinned(self) -> frozenset[str]:
        """Pods whose move was blocked lately: not tried again until their retry time."""
        now = time.monotonic()
        self._blocked = {key: until for key, until in self._blocked.items() if until > now}
        return frozenset(self._blocked)

    def draining_nodes(self) -> frozenset[str]:
        """Nodes being emptied: held whole, neither emptied again nor a destination of moves."""
        now = time.monotonic()
        return frozenset(
            node
            for node, on_node in self.picture.holds().items()
            if any(key.startswith(DRAIN_HOLD_PREFIX) and hold.expires > now for key, hold in on_node.items())
        )

    def _hold(self, chosen: MovePlan) -> list[str]:
        """Hold what the plan frees; the holds' keys."""
        if chosen.members:  # a domain freed for a gang: each member's GPUs, for any of its members
            for member, node in chosen.members:
                demand = member.demand_on(self.picture.gpu_memory.get(node, 0))
                self.picture.hold(member.key, node, demand, self.options.hold_s, owner=member.workload)
            return [member.key for member, _ in chosen.members]
        if chosen.pod is not None:
            demand = chosen.pod.demand_on(self.picture.gpu_memory.get(chosen.node, 0))
            self.picture.hold(chosen.pod.key, chosen.node, demand, self.options.hold_s)
            return [chosen.pod.key]
        key = DRAIN_HOLD_PREFIX + chosen.node
        gpus = len(self.picture.node_gpus(chosen.node).free_milli)
        self.picture.hold(key, chosen.node, GpuDemand(gpus), self.options.drain_hold_s)
        return [key]

    async def carry_out(self, plans: Sequence[MovePlan]) -> list[MovePlan]:
        """Hold what each plan frees, evict every plan's movers at once (`evict_all`), then settle
        each plan by its movers' outcomes. Returns the plans carried out."""
        # Held before the first eviction: nothing else lands in the slots while the movers go.
        holds = [self._hold(chosen) for chosen in plans]
        # Read now: an evicted pod may leave the picture before its move is recorded.
        pods = {m.pod.key: self.picture.kind("Pod").get(m.pod.key) or {} for p in plans for m in p.moves}
        outcomes = await evict_all(self.api, list(pods), self.options.evictions)
        return [
            chosen
            for chosen, hold_keys in zip(plans, holds, strict=True)
            if await self._settle(chosen, hold_keys, outcomes, pods)
        ]

    async def _settle(
        self,
        chosen: MovePlan,
        hold_keys: Sequence[str],
        outcomes: Mapping[str, EvictionOutcome],
        mover_pods: Mapping[str, Mapping[str, Any]],
    ) -> bool:
        """Record a plan's moves; drop it (and its hold) when a mover was not evicted - blocked
        by a PodDisruptionBudget, failed, or no answer in time. Whether it was carried out."""
        target = chosen.pod.key if chosen.pod is not None else f"node {chosen.node}"
        if chosen.members:
            target = f"gang {chosen.members[0][0].workload} in {chosen.domain}"
        refusals = []
        for move in chosen.moves:
            outcome = outcomes[move.pod.key]
            self.metrics.moves.labels(chosen.goal, outcome).inc()
            if outcome in ("blocked", "failed", "timed_out"):
                why = {
                    "blocked": "is blocked by a PodDisruptionBudget; not bypassed",
                    "failed": "failed",
                    "timed_out": f"got no answer within {self.options.evictions.timeout_s:.3g}s",
                }[outcome]
                text = (
                    f"{chosen.goal}: moving {move.pod.key} for {target} {why}; the plan is dropped "
                    f"and this pod not tried again for {self.options.blocked_retry_s:.0f}s"
                )
                await self._event(move.pod.key, "MoveBlocked", text, "Warning")
                self._blocked[move.pod.key] = time.monotonic() + self.options.blocked_retry_s
                refusals.append((outcome, text))
                log.warning("%s", text)
            elif outcome == "evicted":
                pod = mover_pods[move.pod.key]
                await self._event(move.pod.key, "Moved", move.message, "Normal")
                self.moved.append(
                    _Moved(
                        move.pod.key,
                        str(meta(pod).get("uid", "")),
                        str(controller_of(pod).get("uid", "")),
                        time.time(),
                        time.monotonic() + self.options.replace_timeout_s,
                        target,
                        chosen.pod.key if chosen.pod is not None else "",
                    )
                )
        if refusals:
            if chosen.pod is not None:
                await self._event(chosen.pod.key, "MoveBlocked", "; ".join(t for _, t in refusals), "Warning")
            for key in hold_keys:
                self.picture.release_hold(key)
            blocked = any(outcome == "blocked" for outcome, _ in refusals)
            self.metrics.move_plans.labels(chosen.goal, "blocked" if blocked else "failed").inc()
            return False
        self.metrics.move_plans.labels(chosen.goal, "carried_out").inc()
        self.metrics.gpus_freed.labels(chosen.goal).inc(chosen.gpus_freed)
        movers = ", ".join(f"{m.pod.key} (to fit on {m.to_node})" for m in chosen.moves)
        if chosen.pod is not None:
            fits = f"so this pod fits on node {chosen.node}"
            if chosen.members:
                fits = f"so the {len(chosen.members)} waiting pods of its gang fit in {chosen.domain}"
            await pod_event(
                self.api,
                chosen.pod.key,
                uid_of(self.picture, chosen.pod.key),
                "ConsolidationPlanned",
                f"moved {len(chosen.moves)} pod(s) ({chosen.gpus_moved:.3g} GPUs) {fits}: {movers}; "
                f"the GPUs are held for {'them' if chosen.members else 'it'} for {self.options.hold_s:.0f}s",
                "Normal",
            )
        log.info(
            "%s for %s: moved %s (%.3g GPUs freed on %s)",
            chosen.goal,
            target,
            movers,
            chosen.gpus_freed,
            chosen.node,
        )
        return True

    async def _check_replaced(self) -> None:
        """Match moved pods with their controllers' new, bound pods; report those past the timeout."""
        if not self.moved:
            return
        successors: dict[str, list[tuple[float, str, str]]] = {}  # owner uid -> (created, uid, key)
        moved_uids = {m.uid for m in self.moved}
        for key, pod in self.picture.kind("Pod").items():
            uid, owner = str(meta(pod).get("uid", "")), str(controller_of(pod).get("uid", ""))
            bound = mapping(pod.get("spec")).get("nodeName")
            if owner and bound and uid not in moved_uids and uid not in self._successors:
                successors.setdefault(owner, []).append((pod_created(pod), uid, key))
        for group in successors.values():
            group.sort()
        still: list[_Moved] = []
        now = time.monotonic()
        for moved in self.moved:
            # Creation timestamps are whole seconds: a successor of the same second counts.
            candidates = [s for s in successors.get(moved.owner_uid, ()) if s[0] >= int(moved.evicted_at)]
            if candidates:
                _, uid, key = candidates[0]
                successors[moved.owner_uid].remove(candidates[0])
                self._successors.add(uid)
                await self._replaced(moved, key)
            elif now > moved.deadline:
                self.metrics.replacements.labels("not_replaced").inc()
                text = (
                    f"pod {moved.key}, moved for {moved.target}, has no successor bound to a node "
                    f"{self.options.replace_timeout_s:.0f}s after the move"
                )
                log.warning("%s", text)
                if moved.served:
                    await self._event(moved.served, "MovedPodNotReplaced", text, "Warning")
            else:
                still.append(moved)
        self.moved = still
        if not still:
            self._successors.clear()

    async def _event(self, key: str, reason: str, message: str, kind: Literal["Normal", "Warning"]) -> None:
        await pod_event(self.api, key, uid_of(self.picture, key), reason, message, kind)

    async def _replaced(self, moved: _Moved, successor: str) -> None:
        pod = self.picture.kind("Pod").get(successor) or {}
        node = mapping(pod.get("spec")).get("nodeName")
        seconds = max(0.0, time.time() - moved.evicted_at)
        self.metrics.replacements.labels("replaced").inc()
        self.metrics.replace_seconds.observe(seconds)
        text = (
            f"replaces pod {moved.key}, moved for {moved.target}: bound to node {node} "
            f"{seconds:.1f}s after the move"
        )
        await self._event(successor, "MovedPodReplaced", text, "Normal")
        log.info("%s %s", successor, text)
