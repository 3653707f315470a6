"""The gate controller: lifts the admission gate of pods whose queue has room again.

The pod webhook (`extender.webhook`) creates a pod that its queue holds back with the scheduling
gate `scheduling.tessera.dev/admission`; kube-scheduler leaves such a pod alone, so it never shows
as Unschedulable to cluster autoscalers. About every second, while this replica is the active one
(the reclaim loop's Lease), this controller takes the gated pods oldest first and asks the
admission rule (`extender.policy.admission.admit`, what `extender.admission.gate_reason` reads) for
each, with the queue's pods already in the scheduler's hands
counted ahead of it; a pod with no reason left loses its gate (a JSON Patch that first tests the
gate is still where it was read) and counts ahead of the next one. Limit 4 GPUs, 2 held, gated
pods of 1, 1 and 1 GPU: the first two are lifted (2 + 1, 2 + 1 + 1), the third waits.

Why a pod keeps its gate (the refusal, with its code) goes to the status writer
(`extender.status.WaitingPods`), which writes it on the pod as a condition and an event, and sums
up the pods of its owner in one event: each written when the reason changes, not every pass. A
lifted pod's condition turns True.

A pod whose namespace may not use its queue (`extender.policy.tenancy`: the Queue or the
Namespace changed after the pod was gated) keeps its gate whatever room its queue has; the filter
would refuse it with the same reason.

A gang not admitted yet is judged once, at its oldest gated pod, as a whole (the rule with its
`GangState`): when it has its minimum and its queue takes all its missing pods, every gated
pod of it is lifted in the same pass, and its whole missing demand counts ahead of the next pods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.admission import gate_removal, is_gated
from extender.controllers.periodic import PeriodicPass
from extender.kubeapi import KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.picture.demands import pod_created
from extender.picture.ledger import Contribution
from extender.policy.admission import Ask, GangState, admit
from extender.policy.fairness import AdmissionDecision
from extender.policy.waiting import QUEUE_NOT_ALLOWED
from extender.status import WaitingPods

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"
# What a pod whose gate is lifted says (its condition turns True).
LIFTED = "admission gate lifted: its queue has room; the scheduler places it"


def _ungated(picture: ClusterPicture, key: str) -> Contribution | None:
    """What a pending pod without the gate asks of its queue (None: not such a pod)."""
    contribution = picture.contributions.get(key)
    if contribution is None or contribution.bucket != "requested":
        return None
    pod = picture.get("Pod", key)
    if pod is None or is_gated(pod) or meta(pod).get("deletionTimestamp"):
        return None
    demand = picture.demand(pod)
    if not (demand.wants_gpu or demand.labelled):
        return None  # not held to its queue by the filter either
    return contribution


def _add(total: dict[str, float], amounts: Mapping[str, float], times: float = 1.0) -> None:
    for resource, amount in amounts.items():
        total[resource] = total.get(resource, 0.0) + amount * times


def waiting_ungated(picture: ClusterPicture) -> dict[str, dict[str, float]]:
    """Per queue, what its pending pods without the gate ask for (the scheduler has them)."""
    ahead: dict[str, dict[str, float]] = {}
    for key in picture.contributions:
        contribution = _ungated(picture, key)
        if contribution is not None:
            _add(ahead.setdefault(contribution.queue, {}), contribution.amounts)
    return ahead


def gang_of(picture: ClusterPicture, pod: Mapping[str, Any], creating: bool = False) -> GangState:
    """The pod's gang as the gate counts it. `creating`: the pod is being created, so not in the
    picture yet: it counts as a member of a gang not admitted yet."""
    gang = picture.gang(pod)
    if creating and not gang.admitted:
        return gang.with_pod_created()
    return gang


def ahead_of(picture: ClusterPicture, gang: GangState, queued: Mapping[str, float]) -> dict[str, float]:
    """`queued` (its queue's ungated pods) without, for a gang judged whole, its own: they are in
    its missing demand."""
    ahead = dict(queued)
    if not gang.admitted:
        for key in picture.members(gang.workload.key):
            contribution = _ungated(picture, key)
            if contribution is not None:
                _add(ahead, contribution.amounts, -1.0)
    return ahead


class GateController:
    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        metrics: ExtenderMetrics,
        interval_s: float = 1.0,
        is_leader: Callable[[], bool] = lambda: True,
        waiting: WaitingPods | None = None,
    ) -> None:
        self.api = api
        self.picture = picture
        self.metrics = metrics
        self.waiting = waiting  # where why a gated pod waits is reported (None: not reported)
        self._loop = PeriodicPass("gates", interval_s, lambda: is_leader() and picture.ready(), self.run_once)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def admissible(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Gated pods that may be scheduled now, oldest first, each counted before the next."""
        return self.judge().lifted

    def judge(self) -> GateVerdicts:
        """Every gated pod: lifted (oldest first, each counted before the next) or held, why."""
        picture = self.picture
        verdicts = GateVerdicts()
        gated = [(key, pod) for key, pod in picture.kind("Pod").items() if is_gated(pod)]
        if not gated:
            return verdicts
        view = picture.fairness()
        ahead = waiting_ungated(picture)
        gangs: dict[str, AdmissionDecision] = {}  # gang workload -> judged at its oldest gated pod
        for key, pod in sorted(gated, key=lambda item: (pod_created(item[1]), item[0])):
            if meta(pod).get("deletionTimestamp"):
                continue
            demand = picture.demand(pod)
            if demand.problem:
                verdicts.lifted.append((key, pod))  # unreadable: the filter refuses it with the reason
                continue
            refusal = picture.tenancy_refusal(demand.queue, demand.namespace)
            if refusal:
                # Its namespace may not use its queue (since it was gated): no room fixes that.
                verdicts.held.append(
                    Held(key, pod, demand.queue, AdmissionDecision(False, refusal, QUEUE_NOT_ALLOWED))
                )
                continue
            gang = gang_of(picture, pod)
            workload = "" if gang.admitted else gang.workload.key
            decision = gangs.get(workload) if workload else None
            if decision is None:
                resources = picture.pod_resources(key, pod)
                queued = ahead_of(picture, gang, ahead.get(demand.queue, {}))
                ask = Ask(demand.queue, resources, demand.preemptible, gang, queued)
                decision = admit(view, ask)
                if workload:
                    gangs[workload] = decision
                if decision.admit:
                    _add(queued, ask.asked())
                    ahead[demand.queue] = queued
            if decision.admit:
                verdicts.lifted.append((key, pod))
            else:
                verdicts.held.append(Held(key, pod, demand.queue, decision))
        return verdicts

    async def run_once(self) -> int:
        """One pass: lift the gates of the admissible pods; returns how many were lifted. Why
        each other gated pod waits goes to the status writer (written when it changes)."""
        verdicts = self.judge()
        if self.waiting is not None:
            for held in verdicts.held:
                namespace, _, name = held.key.partition("/")
                uid = str(meta(held.pod).get("uid", ""))
                self.waiting.refused(
                    namespace, name, uid, held.queue, held.decision.reason, held.decision.kind
                )
        lifted = 0
        for key, pod in verdicts.lifted:
            namespace, _, name = key.partition("/")
            try:
                await request(
                    self.api,
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    body=gate_removal(pod),
                    content_type=JSON_PATCH,
                )
                lifted += 1
                self.metrics.decisions.labels("gates", "lifted", "").inc()
                log.info("pod %s: admission gate lifted, its queue has room", key)
                if self.waiting is not None:
                    uid = str(meta(pod).get("uid", ""))
                    self.waiting.admitted(namespace, name, uid, LIFTED)
            except KubeError as exc:  # gone, or its gates changed: the next pass reads it again
                log.info("pod %s: gate not lifted: %s", key, exc)
        return lifted


class Held(NamedTuple):
    """A gated pod that keeps its gate, and the refusal that keeps it there."""

    key: str
    pod: Mapping[str, Any]
    queue: str
    decision: AdmissionDecision


@dataclass
class GateVerdicts:
    lifted: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
