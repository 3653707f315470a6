"""The reclaim loop: the executor of `extender.policy.reclaim`'s plans.

About every second, while this replica is the active one: take a snapshot of the picture, plan
(pure, on a fork), hold the GPUs each plan frees for the pods it serves, then evict the victims of
every plan through the Eviction API - all at once, a bounded number of calls in flight, each with
a short timeout (`evictions.evict_all`), so a slow API costs the cycle about one timeout, not one
per victim; PodDisruptionBudgets hold: a blocked eviction is reported on the pods, never bypassed,
and its plan's holds are let go. A hold names the devices the plan frees (node, GPU indexes, the
share of each), for the pod it was made for and for those riding on what it freed
(`Plan.holds`), until each binds or its hold expires. The filter keeps exactly those shares from
other pods and passes a held pod only its hold's node, and the next cycles' planning forks place
held pods there. Events name the queues and the numbers on every victim and on the served pod;
counts go to metrics and to the Queue status.

The holds are made before the first eviction, as consolidation's are: a victim can be gone in
well under a second (a kubelet that ends it at once), and its controller's replacement is
filtered at once; a hold made only after the cycle's evictions and events (one API call each, a
second or more on a busy machine) left that replacement the GPU freed for a waiting gang, which
then no longer fit and, its members held for, was not planned for again before the holds
expired.

A cycle plans only when a waiting GPU pod is one kube-scheduler tried and could not place
(`ClusterPicture.unplaced_waiting`), or a follow-up has work of its own (moved pods to check,
nodes to empty): pods not tried yet - a backlog of new pods the scheduler is working through -
may all fit, and planning for them would walk every waiting pod each second for nothing (steps
of tens of milliseconds, every second, that the scheduler's serial cycle waited behind while 800
new pods were placed; docs/benchmarks.md, section 2). A cycle that plans plans as before, for
every waiting pod.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
from extender.controllers.periodic import PeriodicPass
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.picture.demands import pod_created
from extender.policy.drf import gpu_amounts
from extender.policy.fairness import EPSILON
from extender.policy.reclaim import (
    Budget,
    FitIndex,
    PendingPod,
    Plan,
    Rules,
    lost_holds,
    plan,
    protected_restarts,
    spent_victims,
)
from extender.policy.snapshot import ClusterSnapshot, RunningPod
from extender.policy.workloads import JOB_INDEX_ANNOTATION
from extender.rule_flags import RuleFlags

log = logging.getLogger(__name__)


class FollowUp(Protocol):
    """Another goal of the same cycle (consolidation), run after reclaim on the cycle's snapshot
    and waiting pods, with the reclaim plans carried out."""

    def has_own_work(self) -> bool:
        """Whether it has work even when no waiting pod is one the scheduler gave up on (the
        cycle then plans)."""
        ...

    async def run_once(
        self, snapshot: ClusterSnapshot, waiting: Sequence[PendingPod], served: Sequence[Plan]
    ) -> object: ...


# How long the loop remembers the controllers of the pods it evicted (rule 8 spares their pods
# that started since): longer than a replacement pod plausibly waits to start again.
REMEMBER_EVICTIONS_S = 3600.0


def lost_gpu_seconds(victim: RunningPod, now: float) -> float:
    """The work an eviction throws away: the GPUs the victim holds times how long it has run (0
    for a start time not known or in the future)."""
    return victim.gpus_held * max(0.0, now - victim.started) if victim.started > 0 else 0.0


def owner_uid(pod: Mapping[str, object]) -> str:
    """The uid of the pod's controller ('' for a pod no controller recreates)."""
    return str(controller_of(pod).get("uid", ""))


def completion_index(pod: Mapping[str, object]) -> str:
    """An Indexed Job's completion index of the pod ('' for a pod without one): its replacement
    after an eviction carries the same index."""
    return str(mapping(meta(pod).get("annotations")).get(JOB_INDEX_ANNOTATION, ""))


@dataclass
class _Unclaimed:
    """An evicted pod whose replacement has not been seen yet."""

    key: str
    index: str  # its completion index ('' for none): a replacement must carry the same
    evicted: float  # epoch s: its replacement is created after
    count: int  # its evictions, with those of the pods it replaced


@dataclass
class ReplicaEvictions:
    """Rule 14's counts live: how often each replica was evicted. An evicted pod is deleted and its
    controller creates another (a ReplicaSet's or Job's pods under new names, a StatefulSet's under
    the same), so the count of an evicted pod waits, under its controller, for the first pod of
    that controller created after the eviction - of the same completion index for an Indexed Job -
    which inherits it (`replica_of` names the pod it replaces). A pod without a controller does not
    come back, and its count goes with it."""

    counts: dict[str, int] = field(default_factory=dict)  # pod key -> evictions of its replica
    replica_of: dict[str, str] = field(default_factory=dict)  # replacement -> the evicted pod
    _unclaimed: dict[str, list[_Unclaimed]] = field(default_factory=dict)  # by owner uid

    def evicted(self, key: str, pod: Mapping[str, object], at: float) -> None:
        """`pod` (`key`) was evicted at `at` (epoch s)."""
        count = self.counts.pop(key, 0) + 1
        self.replica_of.pop(key, None)
        owner = owner_uid(pod)
        if owner:
            self._unclaimed.setdefault(owner, []).append(_Unclaimed(key, completion_index(pod), at, count))

    def follow(self, pods: Mapping[str, Mapping[str, object]], now: float) -> None:
        """Hand the counts waiting under a controller to its pods created after the eviction, in
        creation order; forget the counts of pods gone, and those no replacement claimed within
        `REMEMBER_EVICTIONS_S`."""
        self.counts = {key: n for key, n in self.counts.items() if key in pods}
        self.replica_of = {key: was for key, was in self.replica_of.items() if key in self.counts}
        self._unclaimed = {
            owner: kept
            for owner, waiting in self._unclaimed.items()
            for kept in ([u for u in waiting if now - u.evicted < REMEMBER_EVICTIONS_S],)
            if kept
        }
        if not self._unclaimed:
            return
        newcomers = sorted(
            (pod_created(obj), key, owner, obj)
            for key, obj in pods.items()
            if key not in self.counts
            for owner in (owner_uid(obj),)
            if owner in self._unclaimed
        )
        for created, key, owner, obj in newcomers:
            waiting, index = self._unclaimed[owner], completion_index(obj)
            found = next((u for u in waiting if u.index == index and u.evicted <= created), None)
            if found is None:
                continue
            waiting.remove(found)
            self.counts[key], self.replica_of[key] = found.count, found.key
        self._unclaimed = {owner: waiting for owner, waiting in self._unclaimed.items() if waiting}


@dataclass(frozen=True)
class ReclaimOptions:
    interval_s: float = 1.0
    # A pod kube-scheduler gave up on wakes the loop at once, but passes start at least this far
    # apart (a burst of unschedulable pods costs one pass per gap, not one per pod).
    min_gap_s: float = 0.1
    # How long freed GPUs are kept for the served pod: the victims' graceful termination plus a
    # scheduling cycle. A bind releases the hold earlier.
    hold_s: float = 90.0
    max_evictions_per_cycle: int = 16
    # A victim whose eviction a PodDisruptionBudget refused is left alone this long.
    blocked_retry_s: float = 30.0
    # A pod restarted after an eviction is no victim for this long after its restart (rule 8 of
    # extender.policy.reclaim).
    recent_victim_s: float = 60.0
    # The waits before a queue reclaims and the victim rules (rules 9, 13, 14 and 15), as flagged.
    rule_flags: RuleFlags = field(default_factory=RuleFlags)
    evictions: EvictionLimits = field(default_factory=EvictionLimits)  # calls in flight, timeout


@dataclass
class ReclaimCounts:
    """Totals the Queue status reports: pods evicted for a queue, and from it."""

    reclaimed_for: Counter[str] = field(default_factory=Counter)
    evicted_from: Counter[str] = field(default_factory=Counter)
    # Queues with a plan whose hold is still open (Reclaiming condition).
    reclaiming: set[str] = field(default_factory=set)


class ReclaimLoop:
    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        metrics: ExtenderMetrics,
        options: ReclaimOptions | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        history_moves: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self.api = api
        self.picture = picture
        self.metrics = metrics
        self.options = options or ReclaimOptions()
        self.is_leader = is_leader
        # The queues whose shares fair share over time moves now (rule 9's wait never opens for
        # them).
        self.history_moves = history_moves
        self.counts = ReclaimCounts()
        self._starved_since: dict[str, float] = {}
        self.follow_ups: list[FollowUp] = []
        self._blocked: dict[str, float] = {}  # pod key -> monotonic time it may be tried again
        # Victims evicted, until their hold's end (monotonic): gone, whether the picture shows
        # them terminating yet or not, when the loop looks for lost holds.
        self._going: dict[str, float] = {}
        # The controllers (owner uid) of pods evicted in the last hour -> when (epoch s, as pods'
        # start times): their pods started since are spared for a while (`protected_restarts`).
        self._evicted_owners: dict[str, float] = {}
        # How often each replica was evicted (rule 14: a pod evicted too often is no victim).
        self.spent_victims = ReplicaEvictions()
        self.fits = FitIndex()  # where waiting pods fit, looked at again only where nodes changed
        self._loop = PeriodicPass(
            "reclaim",
            self.options.interval_s,
            lambda: self.is_leader() and picture.ready(),
            self.run_once,
            min_gap_s=self.options.min_gap_s,
        )

    def start(self) -> None:
        self.picture.unplaced_listeners.append(self._loop.wake)
        self._loop.start()

    async def stop(self) -> None:
        if self._loop.wake in self.picture.unplaced_listeners:
            self.picture.unplaced_listeners.remove(self._loop.wake)
        await self._loop.stop()

    def rules(self) -> Rules:
        specs = self.picture.fairness().specs
        return self.options.rule_flags.applied_to(
            Rules(
                reclaim_min_runtime_s={s.name: s.reclaim_min_runtime_s for s in specs},
                preempt_min_runtime_s={s.name: s.preempt_min_runtime_s for s in specs},
                max_evictions=self.options.max_evictions_per_cycle,
                recent_victim_s=self.options.recent_victim_s,
                history_moves=self.history_moves(),
            )
        )

    async def run_once(self) -> list[Plan]:
        """One cycle: plan on a snapshot, then evict and hold. Returns the plans carried out
        (none, without planning, when no waiting pod is one the scheduler gave up on and no
        follow-up has work of its own)."""
        self._track_starvation()
        if not self.picture.unplaced_waiting() and not any(f.has_own_work() for f in self.follow_ups):
            self.metrics.reclaim_skipped.inc()
            return []
        started = time.perf_counter()
        snapshot = self.picture.snapshot()
        await self._let_go_of_lost(snapshot)
        self._spare_blocked(snapshot)
        rules = self.rules()
        now = time.time()
        self._spare_restarts(snapshot, now, rules)
        self._spare_spent(snapshot, now, rules)
        waiting = self.picture.waiting_pods()
        work = Budget(rules.max_trials)
        plans = plan(snapshot, waiting, now, rules, work, self.fits)
        self.metrics.reclaim_cycle.observe(time.perf_counter() - started)
        report_cut_off(self.metrics, "reclaim", work)
        done = await self.carry_out(plans, now)
        self.counts.reclaiming = {
            q for q in self.counts.reclaiming | {p.pod.queue for p in done} if self._holds_for(q)
        }
        for follow_up in self.follow_ups:
            await follow_up.run_once(snapshot, waiting, done)
        return done

    async def _let_go_of_lost(self, snapshot: ClusterSnapshot) -> None:
        """Let go of the holds another pod took (rule 12, `lost_holds`), before the waiting pods
        are listed: their pods are planned again this cycle. The victims this loop evicted count
        as gone although the picture may not show them terminating yet."""
        now = time.monotonic()
        self._going = {
            key: until for key, until in self._going.items() if until > now and key in snapshot.running
        }
        for lost in lost_holds(snapshot, self._going.keys()):
            self.picture.release_hold(lost.key)
            self.metrics.holds_lost.inc()
            if lost.for_queue:
                continue
            devices = ", ".join(f"GPU {gpu}" for gpu, _ in lost.gpus)
            text = (
                f"the GPUs held for this pod on node {lost.node} ({devices}) were taken by a pod "
                "they were not held for; reclaim plans for it again"
            )
            log.info("hold lost for %s: %s", lost.key, text)
            await pod_event(self.api, lost.key, uid_of(self.picture, lost.key), "HoldLost", text, "Normal")

    def _spare_blocked(self, snapshot: ClusterSnapshot) -> None:
        """Victims a budget blocked recently are no candidates this cycle (the block is reported
        once, not every second)."""
        now = time.monotonic()
        self._blocked = {key: until for key, until in self._blocked.items() if until > now}
        snapshot.spare(self._blocked.keys())

    def _spare_restarts(self, snapshot: ClusterSnapshot, now: float, rules: Rules) -> None:
        """Pods that restarted after an eviction (their controller's pod was evicted before they
        started) are no victims for `recent_victim_s` after their start: rule 8."""
        self._evicted_owners = {
            owner: at for owner, at in self._evicted_owners.items() if now - at < REMEMBER_EVICTIONS_S
        }
        if not self._evicted_owners:
            return
        pods = self.picture.kind("Pod")

        def evicted_at(pod: RunningPod) -> float | None:
            obj = pods.get(pod.key)
            return None if obj is None else self._evicted_owners.get(owner_uid(obj))

        snapshot.spare(protected_restarts(snapshot.running.values(), evicted_at, now, rules))

    def _spare_spent(self, snapshot: ClusterSnapshot, now: float, rules: Rules) -> None:
        """Pods whose replica was evicted `max_victim_evictions` times already are no victims
        again: rule 14 (nothing to do with the budget off)."""
        if rules.max_victim_evictions <= 0:
            return
        counts = self.spent_victims
        counts.follow(self.picture.kind("Pod"), now)
        snapshot.spare(
            spent_victims(snapshot.running.values(), lambda pod: counts.counts.get(pod.key, 0), rules)
        )

    def _holds_for(self, queue: str) -> bool:
        pods = self.picture.kind("Pod")
        for on_node in self.picture.holds().values():
            for key in on_node:
                pod = pods.get(key)
                if pod is not None and self.picture.demand(pod).queue == queue:
                    return True
        return False

    async def carry_out(self, plans: Sequence[Plan], planned_at: float | None = None) -> list[Plan]:
        """Hold what every plan frees, evict the victims of every plan at once (`evict_all`: a
        slow Eviction API costs the cycle about one timeout, not one per victim), then settle
        each plan by its victims' outcomes. Returns the plans carried out (none of their
        victims blocked). `planned_at` (epoch s, default now): when the plans were made, what
        the work lost is counted to."""
        planned_at = time.time() if planned_at is None else planned_at
        # Read now: an evicted pod may leave the picture before its event is written.
        uids = {
            key: uid_of(self.picture, key)
            for chosen in plans
            for key in (chosen.pod.key, *(e.pod.key for e in chosen.evictions))
        }
        victims = [e.pod.key for chosen in plans for e in chosen.evictions]
        pods = self.picture.kind("Pod")
        owners = {key: owner_uid(pods[key]) for key in victims if key in pods}
        for chosen in plans:  # before the first eviction: nothing else lands on what it frees
            self._hold(chosen)
        outcomes = await evict_all(self.api, victims, self.options.evictions)
        evicted = time.time()
        for key, owner in owners.items():
            if owner and outcomes.get(key) == "evicted":
                self._evicted_owners[owner] = evicted
        for key in victims:
            if key in pods and outcomes.get(key) == "evicted":
                self.spent_victims.evicted(key, pods[key], evicted)
        until = time.monotonic() + self.options.hold_s
        self._going.update({key: until for key in victims if outcomes.get(key) in ("evicted", "timed_out")})
        return [chosen for chosen in plans if await self._settle(chosen, outcomes, uids, planned_at)]

    async def _settle(
        self,
        chosen: Plan,
        outcomes: Mapping[str, EvictionOutcome],
        uids: Mapping[str, str | None],
        planned_at: float,
    ) -> bool:
        """Count and report a plan's evictions; let its holds go when a PodDisruptionBudget
        blocked one of its victims. Whether it was carried out."""
        served = chosen.pod
        self.metrics.plans.labels(chosen.goal, served.queue).inc()
        blocked = []
        for eviction in chosen.evictions:
            victim = eviction.pod
            outcome = outcomes[victim.key]
            self.metrics.evictions.labels(chosen.goal, victim.queue, outcome).inc()
            if outcome == "blocked":
                self._blocked[victim.key] = time.monotonic() + self.options.blocked_retry_s
                blocked.append(victim.key)
                await pod_event(
                    self.api,
                    victim.key,
                    uids[victim.key],
                    "EvictionBlocked",
                    self._blocked_text(chosen, [victim.key]),
                    "Warning",
                )
            elif outcome == "evicted":
                self.counts.evicted_from[victim.queue] += 1
                self.metrics.lost_work.labels(victim.queue).inc(lost_gpu_seconds(victim, planned_at))
                self.counts.reclaimed_for[served.queue] += chosen.goal != "preempt"
                reason = "Preempted" if chosen.goal == "preempt" else "Reclaimed"
                await pod_event(self.api, victim.key, uids[victim.key], reason, eviction.message, "Normal")
        if blocked:
            for held in (*chosen.holds, *chosen.rests):  # what the others freed goes to anyone
                self.picture.release_hold(held.key)
            text = self._blocked_text(chosen, blocked)
            await pod_event(self.api, served.key, uids[served.key], "EvictionBlocked", text, "Warning")
            return False
        victims = ", ".join(e.pod.key for e in chosen.evictions)
        riders = [held.key for held in chosen.holds if held.key != served.key]
        await pod_event(
            self.api,
            served.key,
            uids[served.key],
            "PreemptionPlanned" if chosen.goal == "preempt" else "ReclaimPlanned",
            f"evicted {len(chosen.evictions)} pod(s) ({chosen.gpus_evicted:.3g} GPUs for "
            f"{chosen.gpus_needed:.3g} needed) on node {chosen.node} for this pod of queue "
            f"'{served.queue}': {victims}; the GPUs are held for it for {self.options.hold_s:.0f}s"
            + (f" (shared with {', '.join(riders)})" if riders else ""),
            "Normal",
        )
        for rider in riders:
            await pod_event(
                self.api,
                rider,
                uid_of(self.picture, rider),
                "ReclaimPlanned",
                f"GPUs freed on node {chosen.node} for pod {served.key} ({chosen.gpus_evicted:.3g} GPUs for "
                f"{chosen.gpus_needed:.3g} needed) are held for this pod too for {self.options.hold_s:.0f}s",
                "Normal",
            )
        log.info(
            "%s for %s on %s: evicted %s (%.3g GPUs for %.3g)",
            chosen.goal,
            served.key,
            chosen.node,
            victims,
            chosen.gpus_evicted,
            chosen.gpus_needed,
        )
        return True

    def _hold(self, chosen: Plan) -> None:
        """Keep what the plan frees for the pods it serves: the served pod's, then those riding on it."""
        for held in chosen.holds:
            self.picture.hold(
                held.key,
                held.node,
                held.demand,
                self.options.hold_s,
                owner=held.workload,  # a gang's: any of its members may take it
                gpus=held.gpus,  # the very devices freed: only these are kept from other pods
            )
        for rest in chosen.rests:  # the rest of a GPU its pods share: for its queue's next fractions
            self.picture.hold(
                rest.key, rest.node, rest.demand, self.options.hold_s, gpus=rest.gpus, queue=rest.queue
            )

    def _blocked_text(self, chosen: Plan, blocked: Sequence[str]) -> str:
        return (
            f"{chosen.goal}: evicting {', '.join(blocked)} for {chosen.pod.key} is blocked by a "
            "PodDisruptionBudget; not bypassed (not tried again for "
            f"{self.options.blocked_retry_s:.0f}s)"
        )

    def _track_starvation(self) -> None:
        """Time from a queue falling below its fair share with GPU pods waiting to holding it."""
        view = self.picture.fairness()
        now = time.monotonic()
        for queue in view.tree.specs:
            usage = view.usage.get(queue)
            wanted = gpu_amounts(usage.requested) if usage is not None else {}
            starved = any(
                view.tree.subtree(queue, "allocated", r)
                < view.fair_shares.get(queue, {}).get(r, 0.0) - EPSILON
                for r in wanted
            )
            if starved:
                self._starved_since.setdefault(queue, now)
            elif queue in self._starved_since:
                self.metrics.time_to_fair_share.labels(queue).observe(now - self._starved_since.pop(queue))
