"""The gate controller: lifts the admission gate of pods whose queue has room again.

The pod webhook (`extender.webhook`) creates a pod that its queue holds back with the scheduling
gate `scheduling.tessera.dev/admission`; kube-scheduler leaves such a pod alone, so it never shows
as Unschedulable to cluster autoscalers. About every second, while this replica is the active one
(the reclaim loop's Lease), this controller takes the gated pods oldest first and asks
`extender.admission.gate_reason` for each, with the queue's pods already in the scheduler's hands
counted ahead of it; a pod with no reason left loses its gate (a JSON Patch that first tests the
gate is still where it was read) and counts ahead of the next one. Limit 4 GPUs, 2 held, gated
pods of 1, 1 and 1 GPU: the first two are lifted (2 + 1, 2 + 1 + 1), the third waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.admission import gate_reason, gate_removal, is_gated
from extender.controllers.periodic import PeriodicPass
from extender.kubeapi import JsonObject, KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, pod_created

log = logging.getLogger(__name__)
JSON_PATCH = "application/json-patch+json"


def waiting_ungated(picture: ClusterPicture) -> dict[str, dict[str, float]]:
    """Per queue, what its pending pods without the gate ask for (the scheduler has them)."""
    ahead: dict[str, dict[str, float]] = {}
    for key, contribution in picture.accounting.ledger.contributions.items():
        if contribution.bucket != "requested":
            continue
        pod = picture.store.get("Pod", key)
        if pod is None or is_gated(pod) or meta(pod).get("deletionTimestamp"):
            continue
        demand = picture.demand(pod)
        if not (demand.wants_gpu or demand.labelled):
            continue  # not held to its queue by the filter either
        amounts = ahead.setdefault(contribution.queue, {})
        for resource, amount in contribution.amounts.items():
            amounts[resource] = amounts.get(resource, 0.0) + amount
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

    def admissible(self) -> list[tuple[str, JsonObject]]:
        """Gated pods that may be scheduled now, oldest first, each counted before the next."""
        picture = self.picture
        gated = [(key, pod) for key, pod in picture.kind("Pod").items() if is_gated(pod)]
        if not gated:
            return []
        view = picture.fairness()
        ahead = waiting_ungated(picture)
        lifted: list[tuple[str, JsonObject]] = []
        for key, pod in sorted(gated, key=lambda item: (pod_created(item[1]), item[0])):
            if meta(pod).get("deletionTimestamp"):
                continue
            demand = picture.demand(pod)
            if demand.problem:
                lifted.append((key, pod))  # unreadable: the filter refuses it with the reason
                continue
            resources = picture.pod_resources(key, pod)
            queued = ahead.setdefault(demand.queue, {})
            if gate_reason(view, demand.queue, resources, preemptible=demand.preemptible, ahead=queued):
                continue
            lifted.append((key, pod))
            for resource, amount in resources.items():
                queued[resource] = queued.get(resource, 0.0) + amount
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
