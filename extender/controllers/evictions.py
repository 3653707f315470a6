"""What the loops that act on running pods share: evicting a pod through the Eviction API (so
PodDisruptionBudgets hold), recording an event on a pod, and reporting what a planning cycle's
work budget cut off."""

from __future__ import annotations

import logging
from typing import Literal

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.events import post_pod_event
from extender.kubeapi import KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.policy.reclaim import Budget

log = logging.getLogger(__name__)

# evicted; blocked by a PodDisruptionBudget (429); gone already (404); failed otherwise.
EvictionOutcome = Literal["evicted", "blocked", "gone", "failed"]


async def evict(api: ApiClient, key: str) -> EvictionOutcome:
    namespace, name = key.split("/", 1)
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    try:
        await request(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
    except KubeError as exc:
        if exc.status == 429:
            return "blocked"
        if exc.status == 404:
            return "gone"
        log.warning("evicting %s failed: %s", key, exc)
        return "failed"
    return "evicted"


def uid_of(picture: ClusterPicture, key: str) -> str | None:
    """The pod's uid as the picture knows it (None when it is gone): read it before evicting, as
    an evicted pod may leave the picture before its event is written."""
    pod = picture.kind("Pod").get(key)
    return None if pod is None else str(meta(pod).get("uid", ""))


async def pod_event(
    api: ApiClient,
    key: str,
    uid: str | None,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"],
) -> None:
    """An event on the pod `key` (nothing when its uid is unknown: it was gone already)."""
    if uid is None:
        return
    namespace, name = key.split("/", 1)
    try:
        await post_pod_event(api, namespace, name, uid, reason, message, kind)
    except KubeError as exc:
        if exc.status != 404:
            log.warning("could not record %s on %s: %s", reason, key, exc)


def report_cut_off(metrics: ExtenderMetrics, planner: str, work: Budget) -> None:
    """Count and log what a planning cycle left untried for lack of budget (nothing when none)."""
    if work.cut_off:
        metrics.planning_cut_off.labels(planner).inc(work.cut_off)
        log.info(
            "%s cycle: work budget spent; %d waiting pod(s) left for a later cycle", planner, work.cut_off
        )
