"""What the extender tells the cluster: Queue status, why pods wait, and nudges when they may go.

The hot path only records decisions in `WaitingPods` (a dict write); `StatusWriter` does the API
calls in the background:

* a refused pod gets an Event and a pod condition (`scheduling.tessera.dev/QueueAdmitted`,
  False, with the reason naming the queue and the numbers); the condition turns True when the
  pod is admitted. A pod of a gang says so: the workload, its minimum, how many are placed, and
  what held the whole gang back; the pod whose filter admitted its gang as a unit gets the
  condition True and a `WorkloadAdmitted` Event with the numbers;
* requeue: kube-scheduler retries a pod an extender rejected only on a cluster event or after
  5 minutes. After every change of the picture the writer re-runs admission for the refused
  pods; one that would now be admitted gets its condition set to True (`QueueHasRoom`). That
  status write is a Pod update event, and it is enough: kube-scheduler v1.37 puts the plugin
  name "Extender" on a pod an extender rejected, registers every event for it
  (pkg/scheduler/framework/runtime/framework.go, defaultEnqueueExtension ->
  UnrollWildCardResource), and its queue's Update (backend/queue/scheduling_queue.go) requeues
  an unschedulable pod on any update that changes its resourceVersion, status included. So the
  extender needs `patch pods/status` only, never `patch pods` (which could change any pod's
  image or command);
* Queue objects get `status` (allocated, requested, fairShare, admitted and waiting workloads,
  conditions) when it changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from kubernetes_asyncio.client import ApiClient

from contract.kube import controller_of
from contract.names import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from extender.admission import is_gated
from extender.events import InvolvedObject, now_rfc3339, post_event, post_pod_event, set_pod_condition
from extender.kubeapi import MERGE_PATCH, KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.policy.fairness import AdmissionDecision
from extender.policy.waiting import as_written, owner_summary, wait_message, wait_reason
from extender.queues import queue_statuses, with_reclaim, with_workloads
from extender.verbs import deferred_everywhere, queue_admission, unschedulable, waiting_decision, why_unplaced

log = logging.getLogger(__name__)

ADMITTED_CONDITION = f"{QUEUE_GROUP}/QueueAdmitted"
# The condition reason of a nudge: the pod was refused, and its queue has room now.
NUDGE_REASON = "QueueHasRoom"
# The reason of the event on a waiting pod's owner that sums its pods up.
OWNER_EVENT = "PodsWaiting"
# One pod is nudged at most this often, so a disagreement between the requeue check and the
# next filter call can never turn into a tight patch loop.
MIN_NUDGE_INTERVAL_S = 1.0
RECHECK_INTERVAL_S = 5.0
# A pod's wait reason whose numbers moved (same code) is written again at most this often.
MIN_REWRITE_S = 30.0


@dataclass
class WaitingPod:
    namespace: str
    name: str
    uid: str
    queue: str
    reason: str
    nudged: bool = False
    last_nudge: float = 0.0  # monotonic time of the last nudge
    # Of a gang's member: its gang's placed members when `reason` was written (None: not known).
    placed: int | None = None
    code: str = ""  # the reason's code (`extender.policy.waiting.WAIT_REASONS`)
    said_at: float = 0.0  # monotonic time `reason` was reported


class PodReport(NamedTuple):
    """A pod condition to write, and whether an Event goes with it."""

    namespace: str
    name: str
    uid: str
    admitted: bool
    reason: str
    post_event: bool
    code: str = ""  # why it waits (`extender.policy.waiting`); "": it does not


@dataclass
class WaitingPods:
    """Pods Tessera holds back, and condition reports still to write (filled by the hot path and
    the gate controller).

    `waiting`: pods its admission refuses (filter or gate), watched for room (the requeue);
    `unplaced`: pods their queue admits that no node fits (fair share 0, waiting for reclaim).
    A pod's report is written when its reason changes; a reason of the same code whose numbers
    moved is written again at most every `MIN_REWRITE_S`, so a queue whose usage moves every
    second costs one write per pod per interval, not per pass."""

    waiting: dict[str, WaitingPod] = field(default_factory=dict)
    unplaced: dict[str, WaitingPod] = field(default_factory=dict)
    reports: dict[str, PodReport] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Callable[[], float] = time.monotonic

    def refused(
        self,
        namespace: str,
        name: str,
        uid: str,
        queue: str,
        reason: str,
        code: str = "",
        moved: bool = False,
    ) -> bool:
        """Admission holds the pod back for `reason`; True when that is reported (now or again).
        `moved`: its gang's placed count moved, said at once (at most once per member bound)."""
        key = f"{namespace}/{name}"
        known = self.waiting.get(key)
        if known is not None and known.reason == reason:
            if known.nudged:
                # The nudge set the condition to True; it waits again (same reason: no new Event).
                # Writing False now also makes the next nudge a real change of the pod.
                known.nudged = False
                self.reports[key] = PodReport(namespace, name, uid, False, reason, False, code)
                self.wake.set()
            return False
        now = self.clock()
        if known is not None and not (known.nudged or moved) and _too_soon(known, code, now):
            return False
        self.unplaced.pop(key, None)
        self.waiting[key] = WaitingPod(namespace, name, uid, queue, reason, code=code, said_at=now)
        self.reports[key] = PodReport(namespace, name, uid, False, reason, True, code)
        self.wake.set()
        return True

    def no_node_fits(self, namespace: str, name: str, uid: str, queue: str, reason: str, code: str) -> None:
        """Its queue admits the pod, no candidate node fits it: why it still waits (`unplaced`)."""
        key = f"{namespace}/{name}"
        self.waiting.pop(key, None)
        known = self.unplaced.get(key)
        now = self.clock()
        if known is not None and (known.reason == reason or _too_soon(known, code, now)):
            return
        self.unplaced[key] = WaitingPod(namespace, name, uid, queue, reason, code=code, said_at=now)
        self.reports[key] = PodReport(namespace, name, uid, True, reason, True, code)
        self.wake.set()

    def admitted_whole(self, namespace: str, name: str, uid: str, reason: str) -> None:
        """The pod's filter admitted its workload's minimum as a unit: condition and Event."""
        key = f"{namespace}/{name}"
        self.waiting.pop(key, None)
        self.unplaced.pop(key, None)
        self.reports[key] = PodReport(namespace, name, uid, True, reason, post_event=True)
        self.wake.set()

    def admitted(self, namespace: str, name: str, uid: str, reason: str) -> None:
        key = f"{namespace}/{name}"
        held_back = self.waiting.pop(key, None) is not None
        if self.unplaced.pop(key, None) is not None or held_back:
            self.reports[key] = PodReport(namespace, name, uid, True, reason, post_event=False)
            self.wake.set()

    def forget(self, key: str) -> None:
        """The pod is gone or placed: nothing to say about it any more."""
        self.waiting.pop(key, None)
        self.unplaced.pop(key, None)


def _too_soon(known: WaitingPod, code: str, now: float) -> bool:
    """The same reason with other numbers, said less than `MIN_REWRITE_S` ago."""
    return known.code == code and now - known.said_at < MIN_REWRITE_S


class ReclaimTotals(Protocol):
    """What the Queue status reports of the reclaim loop (its `ReclaimCounts` meets this): pods
    evicted for each queue and from it, and the queues with a plan whose hold is still open.
    Read through this, so the status writer sits below the controllers that keep the counts."""

    @property
    def reclaimed_for(self) -> Mapping[str, int]: ...

    @property
    def evicted_from(self) -> Mapping[str, int]: ...

    @property
    def reclaiming(self) -> Collection[str]: ...


class StatusWriter:
    """Background writer of pod wait reasons, requeue nudges and Queue status."""

    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        waiting: WaitingPods,
        metrics: ExtenderMetrics,
        queue_status_interval_s: float = 2.0,
        reclaim: ReclaimTotals | None = None,
    ) -> None:
        self.api = api
        self.reclaim = reclaim  # the reclaim loop's counts, reported on each Queue
        self.picture = picture
        self.waiting = waiting
        self.metrics = metrics
        self.queue_status_interval_s = queue_status_interval_s
        self._changed = asyncio.Event()
        self._seeded = False
        self._written: dict[str, dict[str, Any]] = {}
        self._owner_said: dict[str, str] = {}  # owner uid -> the reason its last event summed up
        self._tasks: list[asyncio.Task[None]] = []
        picture.listeners.append(self._changed.set)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(self._report_once, self.waiting.wake), name="pod-reports"),
            asyncio.create_task(self._loop(self._requeue_once, self._changed), name="requeue"),
            asyncio.create_task(self._queue_status_loop(), name="queue-status"),
            asyncio.create_task(self._recheck_loop(), name="requeue-recheck"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.picture.listeners.remove(self._changed.set)

    async def _loop(self, step: Callable[[], Awaitable[None]], trigger: asyncio.Event) -> None:
        while True:
            await trigger.wait()
            trigger.clear()
            try:
                await step()
            except Exception:
                log.exception("status step %s failed", getattr(step, "__name__", step))
                await asyncio.sleep(1.0)

    # ---- pod wait reasons -------------------------------------------------------------------

    async def _report_once(self) -> None:
        reported: list[str] = []
        while self.waiting.reports:
            key, report = self.waiting.reports.popitem()
            namespace, name, uid, admitted, reason, post_event, code = report
            # A wait reason says what would let the pod go, under its own condition reason.
            kind = wait_reason(code).condition if code else ""
            message = wait_message(code, reason) if code else reason
            try:
                await self._write_condition(namespace, name, admitted, message, kind)
                if post_event:
                    event = kind or ("WorkloadAdmitted" if admitted else "WaitingForQueue")
                    await post_pod_event(self.api, namespace, name, uid, event, message)
                reported.append(key)
            except KubeError as exc:
                # A pod deleted meanwhile is normal; anything else is worth a line.
                if exc.status != 404:
                    log.warning("could not report wait reason of %s: %s", key, exc)
        await self._summarise_owners(reported)

    def _said(self, key: str) -> WaitingPod | None:
        """What the pod was last said to wait for (None: it does not wait, or was nudged)."""
        entry = self.waiting.waiting.get(key) or self.waiting.unplaced.get(key)
        return None if entry is None or entry.nudged else entry

    async def _summarise_owners(self, keys: Sequence[str]) -> None:
        """One event on the owner (its controller: a Job, a JobSet's Job, ...) of the pods just
        reported, summing up its pods: posted when the reason most of them wait for changes."""
        pods = self.picture.kind("Pod")
        owners: dict[str, InvolvedObject] = {}
        for key in keys:
            ref = controller_of(pods.get(key) or {})
            if ref.get("uid"):
                namespace = key.partition("/")[0]
                owners[str(ref["uid"])] = InvolvedObject(
                    str(ref.get("apiVersion", "")),
                    str(ref.get("kind", "")),
                    namespace,
                    str(ref.get("name")),
                    str(ref["uid"]),
                )
        if not owners:
            return
        members: dict[str, list[str]] = {uid: [] for uid in owners}
        for key, pod in pods.items():
            uid = str(controller_of(pod).get("uid", ""))
            if uid in members:
                members[uid].append(key)
        for uid, about in owners.items():
            said = [entry for entry in map(self._said, members[uid]) if entry is not None]
            if not said:
                self._owner_said.pop(uid, None)  # none waits: the next wait is news again
                continue
            summary = owner_summary([wait_message(e.code, e.reason) for e in said], len(members[uid]))
            if self._owner_said.get(uid) == summary.reason:
                continue
            self._owner_said[uid] = summary.reason
            try:
                await post_event(self.api, about, OWNER_EVENT, summary.text)
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("could not report wait reasons on %s %s: %s", about.kind, about.name, exc)

    async def _write_condition(
        self, namespace: str, name: str, admitted: bool, reason: str, kind: str = ""
    ) -> None:
        condition = {
            "type": ADMITTED_CONDITION,
            "status": "True" if admitted else "False",
            "reason": kind or ("Admitted" if admitted else "WaitingForQueue"),
            "message": reason,
            "lastTransitionTime": now_rfc3339(),
        }
        await set_pod_condition(self.api, namespace, name, condition)

    # ---- requeue of pods that became eligible -------------------------------------------------

    def seed_from_conditions(self) -> None:
        """After a restart, pick up the pods an earlier instance refused (their condition is False)."""
        for key, pod in self.picture.kind("Pod").items():
            conditions = (pod.get("status") or {}).get("conditions") or []
            refusal = next(
                (c for c in conditions if c.get("type") == ADMITTED_CONDITION and c.get("status") == "False"),
                None,
            )
            if refusal is not None and key not in self.waiting.waiting and self.picture.is_pending(key, pod):
                meta = pod.get("metadata") or {}
                code, reason = as_written(str(refusal.get("reason", "")), str(refusal.get("message", "")))
                self.waiting.waiting[key] = WaitingPod(
                    str(meta.get("namespace")),
                    str(meta.get("name")),
                    str(meta.get("uid", "")),
                    self.picture.demand(pod).queue,
                    reason,
                    code=code,
                    said_at=self.waiting.clock(),
                )

    def eligible_now(self) -> list[WaitingPod]:
        """Refused pods that admission would let through now (not yet nudged); drops stale entries."""
        if not self._seeded and self.picture.ready():
            self.seed_from_conditions()
            self._seeded = True
        if not self.waiting.waiting and not self.waiting.unplaced:
            # Nothing to check: leave the fairness view to be brought up to date by the next
            # request, which then pays once for a burst of watch events.
            return []
        pods = self.picture.kind("Pod")
        for key in list(self.waiting.unplaced):
            pod = pods.get(key)
            if pod is None or not self.picture.is_pending(key, pod):
                self.waiting.forget(key)
        nodes = list(self.picture.kind("Node"))
        sizes = sorted(set(self.picture.gpu_memory.values())) or [0]  # every GPU size, for fractions
        eligible: list[WaitingPod] = []
        gangs: dict[str, AdmissionDecision] = {}  # gang workload -> its decision, judged whole now
        for key, entry in list(self.waiting.waiting.items()):
            pod = pods.get(key)
            if pod is None or not self.picture.is_pending(key, pod):
                del self.waiting.waiting[key]
                continue
            if is_gated(pod):
                continue  # the gate controller lifts its gate when it may go (no nudge needed)
            demand = self.picture.demand(pod)
            if demand.problem:  # an unreadable pod is never eligible
                continue
            context = self.picture.pod_context(key, pod, demand)
            gang = context.gang
            # The filter's decision with every node a candidate: a gang goes whole (its queue and
            # the GPUs must take all it misses), judged once for all its waiting members.
            if not gang.admitted:
                workload = gang.workload.key
                if workload not in gangs:
                    gangs[workload] = queue_admission(self.picture, nodes, context, [0])[0][0]
                entry = self._follow_gang(key, entry, gang.placed, gangs[workload])
                if entry.nudged:
                    continue
                admissible = gangs[workload].admit
            else:
                if entry.nudged:
                    continue
                decisions, _ = queue_admission(
                    self.picture, nodes, context, sizes if demand.fractional else [0]
                )
                # As the filter: admitted, it still leaves the nodes it fits to an owed queue's
                # waiting pod (`extender.policy.deference`); nudged once one is left to it.
                admissible = any(decision.admit for decision in decisions.values()) and not (
                    deferred_everywhere(self.picture, nodes, context)
                )
            if admissible:
                eligible.append(entry)
        return eligible

    def _follow_gang(self, key: str, entry: WaitingPod, placed: int, unit: AdmissionDecision) -> WaitingPod:
        """A gang member's refusal says how many of its gang are placed. Once it is refused, its
        filter may never run again - kube-scheduler's own filters (no device free for its claim)
        reject it before asking the extender - while its gang's members bind: when the count
        moved since it was written, the refusal is written again as it stands (condition and
        event: "3 placed ... GPUs free for 0 of its 1 missing pods", not the "0 placed" of then)."""
        if entry.placed is None:
            entry.placed = placed  # as the filter wrote it, moments ago
        elif entry.placed != placed and not unit.admit:
            self.waiting.refused(
                entry.namespace, entry.name, entry.uid, entry.queue, unit.reason, unit.kind, moved=True
            )
            entry = self.waiting.waiting[key]
            entry.placed = placed
        return entry

    async def _recheck_loop(self) -> None:
        # Some things that make a pod eligible are no event of the picture (an admission
        # reservation expiring), so the requeue check also runs on a slow tick; so does the
        # look for pods the filter never saw.
        while True:
            await asyncio.sleep(RECHECK_INTERVAL_S)
            self._changed.set()
            if self.picture.ready():
                self.explain_unschedulable()
                self._forget_owners()

    def _forget_owners(self) -> None:
        """Owners none of whose pods waits any more (deleted with them, say): their next wait is
        news, and what was said about them is not kept."""
        if not self._owner_said:
            return
        pods = self.picture.kind("Pod")
        keys = [*self.waiting.waiting, *self.waiting.unplaced]
        waiting = {str(controller_of(pods.get(key) or {}).get("uid", "")) for key in keys}
        for uid in [uid for uid in self._owner_said if uid not in waiting]:
            del self._owner_said[uid]

    def explain_unschedulable(self) -> int:
        """Why GPU pods wait that kube-scheduler found Unschedulable without asking the extender
        (its own filters - no device free for the claim - refused every node first): the
        admission rule's refusal, or, admitted, whether reclaim comes (`why_unplaced`), judged
        again every pass (the filter may never see them) and written when it changes
        (`WaitingPods`). A pod admission refuses is the requeue check's from then on. Returns
        how many pods were judged."""
        explained = 0
        nodes: list[str] | None = None  # every node a candidate, as in the requeue check
        gangs: dict[str, AdmissionDecision] = {}  # gang workload -> its decision, judged once
        for key, pod in self.picture.kind("Pod").items():
            if key in self.waiting.waiting or not unschedulable(pod):
                continue
            if is_gated(pod) or not self.picture.is_pending(key, pod):
                continue
            demand = self.picture.demand(pod)
            if demand.problem or not demand.wants_gpu:
                continue
            namespace, _, name = key.partition("/")
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            nodes = list(self.picture.kind("Node")) if nodes is None else nodes
            decision, context = waiting_decision(self.picture, nodes, key, pod, demand, gangs)
            if decision.admit:
                code, reason = why_unplaced(context)
                self.waiting.no_node_fits(namespace, name, uid, demand.queue, reason, code)
            else:
                self.waiting.refused(namespace, name, uid, demand.queue, decision.reason, decision.kind)
            explained += 1
        return explained

    async def _requeue_once(self) -> None:
        now = time.monotonic()
        retry_in: float | None = None
        for entry in self.eligible_now():
            wait = entry.last_nudge + MIN_NUDGE_INTERVAL_S - now
            if wait > 0:
                retry_in = wait if retry_in is None else min(retry_in, wait)
                continue
            entry.nudged = True
            entry.last_nudge = now
            try:
                # False -> True: always a change of the pod, so always an update event.
                await self._write_condition(
                    entry.namespace,
                    entry.name,
                    True,
                    f"queue '{entry.queue}' can admit it now; the scheduler retries it",
                    NUDGE_REASON,
                )
                self.metrics.requeue_nudges.inc()
                log.info("pod %s/%s may be admitted now; nudged the scheduler", entry.namespace, entry.name)
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("could not nudge %s/%s: %s", entry.namespace, entry.name, exc)
        if retry_in is not None:
            asyncio.get_running_loop().call_later(retry_in, self._changed.set)

    # ---- Queue status ---------------------------------------------------------------------------

    async def _queue_status_loop(self) -> None:
        while True:
            try:
                if self.picture.ready():
                    await self.write_queue_statuses()
            except Exception:
                log.exception("writing queue status failed")
            await asyncio.sleep(self.queue_status_interval_s)

    async def write_queue_statuses(self) -> None:
        """Patch the status of every Queue object whose computed status changed."""
        view = self.picture.fairness()
        # The queues as of now: the watch may add one while a PATCH is awaited (the next pass's).
        queues = dict(self.picture.kind("Queue"))
        previous: dict[str, Sequence[Mapping[str, Any]]] = {
            key: (obj.get("status") or {}).get("conditions") or [] for key, obj in queues.items()
        }
        statuses = queue_statuses(view.specs, view.usage, view.fair_shares, previous)
        workloads = self.picture.workload_counts()
        for key, obj in queues.items():
            status = statuses.get(key) or self._invalid_status(view.invalid.get(key, "not parsed"))
            if key in statuses:
                status = with_workloads(status, *workloads.get(key, (0, 0)))
            if self.reclaim is not None and key in statuses:
                counts = self.reclaim
                status = with_reclaim(
                    status,
                    counts.reclaimed_for.get(key, 0),
                    counts.evicted_from.get(key, 0),
                    key in counts.reclaiming,
                    previous.get(key, ()),
                )
            comparable = {k: v for k, v in status.items() if k != "conditions"}
            comparable["conditions"] = [(c["type"], c["status"], c["message"]) for c in status["conditions"]]
            if self._written.get(key) == comparable:
                continue
            path = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}/{key}/status"
            patch = {"status": _with_removals(obj.get("status") or {}, status)}
            try:
                await request(self.api, "PATCH", path, body=patch, content_type=MERGE_PATCH)
                self._written[key] = comparable
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("could not write status of queue %s: %s", key, exc)

    @staticmethod
    def _invalid_status(problem: str) -> dict[str, Any]:
        return {
            "conditions": [
                {
                    "type": "Valid",
                    "status": "False",
                    "reason": "InvalidSpec",
                    "message": problem,
                    "lastTransitionTime": now_rfc3339(),
                }
            ]
        }


def _with_removals(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch keeps map keys it does not mention: null out resources no longer listed."""
    patched = dict(new)
    for section in ("allocated", "requested", "fairShare"):
        before = old.get(section)
        if isinstance(before, Mapping):
            patched[section] = {**{k: None for k in before}, **new.get(section, {})}
    return patched
