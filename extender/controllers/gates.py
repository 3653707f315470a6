"""The gate controller: lifts the admission gate of pods whose queue has room again.

The pod webhook (`extender.webhook`) creates a pod that its queue holds back with the scheduling
gate `scheduling.tessera.dev/admission`; kube-scheduler leaves such a pod alone, so it never shows
as Unschedulable to cluster autoscalers. About every second, while this replica is the active one
(the reclaim loop's Lease), this controller takes the gated pods oldest first and asks
`extender.admission.gate_reason` for each, with the queue's pods already in the scheduler's hands
counted ahead of it; a pod with no reason left loses its gate (a JSON Patch that first tests the
gate is still where it was read) and counts ahead of the next one. Limit 4 GPUs, 2 held, gated
pods of 1, 1 and 1 GPU: the first two are lifted (2 + 1, 2 + 1 + 1), the third waits.

A pod whose namespace may not use its queue (`extender.policy.tenancy`: the Queue or the
Namespace changed after the pod was gated) keeps its gate whatever room its queue has; the filter
would refuse it with the same reason.

A gang not admitted yet is judged once, at its oldest gated pod, as a whole (`gate_reason` with
its `GangState`): when it has its minimum and its queue takes all its missing pods, every gated
pod of it is lifted in the same pass, and its whole missing demand counts ahead of the next pods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.admission import gate_reason, gate_removal, is_gated
from extender.controllers.periodic import PeriodicPass
from extender.kubeapi import KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, pod_created
from extender.picture.ledger import Contribution
from extender.policy.admission import Ask, GangState

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"


def _ungated(picture: ClusterPicture, key: str) -> Contribution | None:
    """What a pending pod without the gate asks of its queue (None: not such a pod)."""
    contribution = picture.accounting.ledger.contributions.get(key)
    if contribution is None or contribution.bucket != "requested":
        return None
    pod = picture.store.get("Pod", key)
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
    for key in picture.accounting.ledger.contributions:
        contribution = _ungated(picture, key)
        if contribution is not None:
            _add(ahead.setdefault(contribution.queue, {}), contribution.amounts)
    return ahead


def gang_of(picture: ClusterPicture, pod: Mapping[str, Any], creating: bool = False) -> GangState:
    """The pod's gang as the gate counts it. `creating`: the pod is being created, so not in the
    picture yet: it counts as a member of a gang not admitted yet."""
    gang = picture.gang(pod)
    if creating and not gang.admitted:
        return replace(gang, members=gang.members + 1)
    return gang


def ahead_of(picture: ClusterPicture, gang: GangState, queued: Mapping[str, float]) -> dict[str, float]:
    """`queued` (its queue's ungated pods) without, for a gang judged whole, its own: they are in
    its missing demand."""
    ahead = dict(queued)
    if not gang.admitted:
        for key in picture.workloads.members.get(gang.workload.key, ()):
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
    ) -> None:
        self.api = api
        self.picture = picture
        self.metrics = metrics
        self._loop = PeriodicPass("gates", interval_s, lambda: is_leader() and picture.ready(), self.run_once)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def admissible(self) -> list[tuple[str, Mapping[str, Any]]]:
        """Gated pods that may be scheduled now, oldest first, each counted before the next."""
        picture = self.picture
        gated = [(key, pod) for key, pod in picture.kind("Pod").items() if is_gated(pod)]
        if not gated:
            return []
        view = picture.fairness()
        ahead = waiting_ungated(picture)
        gangs: dict[str, bool] = {}  # gang workload -> lifted (judged at its oldest gated pod)
        lifted: list[tuple[str, Mapping[str, Any]]] = []
        for key, pod in sorted(gated, key=lambda item: (pod_created(item[1]), item[0])):
            if meta(pod).get("deletionTimestamp"):
                continue
            demand = picture.demand(pod)
            if demand.problem:
                lifted.append((key, pod))  # unreadable: the filter refuses it with the reason
                continue
            if picture.tenancy_refusal(demand.queue, demand.namespace):
                continue  # its namespace may not use its queue (since it was gated): no room fixes that
            gang = gang_of(picture, pod)
            workload = "" if gang.admitted else gang.workload.key
            if workload in gangs:
                if gangs[workload]:
                    lifted.append((key, pod))
                continue
            resources = picture.pod_resources(key, pod)
            queued = ahead_of(picture, gang, ahead.get(demand.queue, {}))
            ask = Ask(demand.queue, resources, demand.preemptible, gang, queued)
            go = not gate_reason(view, ask)
            if workload:
                gangs[workload] = go
            if go:
                lifted.append((key, pod))
                _add(queued, resources, ask.pods)
                ahead[demand.queue] = queued
        return lifted

    async def run_once(self) -> int:
        """One pass: lift the gates of the admissible pods; returns how many were lifted."""
        lifted = 0
        for key, pod in self.admissible():
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
            except KubeError as exc:  # gone, or its gates changed: the next pass reads it again
                log.info("pod %s: gate not lifted: %s", key, exc)
        return lifted
