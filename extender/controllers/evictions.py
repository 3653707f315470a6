"""What the loops that act on running pods share: evicting pods through the Eviction API (so
PodDisruptionBudgets hold), recording an event on a pod, and reporting what a planning cycle's
work budget cut off.

A cycle's evictions go out together (`evict_all`): at most `EvictionLimits.concurrency` calls in
flight, each given up after `EvictionLimits.timeout_s`. A slow Eviction API (an admission webhook
on pods/eviction, an overloaded API server) then costs a cycle about one timeout per
`concurrency` victims, instead of every victim's wait one after the other (16 victims behind 30 s
each held the reclaim cycle for 8 minutes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp
from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.events import post_pod_event
from extender.kubeapi import KubeError, request
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.policy.reclaim import Budget

log = logging.getLogger(__name__)

# evicted; blocked by a PodDisruptionBudget (429); gone already (404); no answer within the
# timeout (it may still happen: the picture shows it); failed otherwise.
EvictionOutcome = Literal["evicted", "blocked", "gone", "timed_out", "failed"]


@dataclass(frozen=True)
class EvictionLimits:
    """How the Eviction API is called: how many calls may be in flight at once, and how long
    one may take before it is given up (a slow answer is not waited for: the next cycle sees
    from the picture whether the pod went)."""

    concurrency: int = 16
    timeout_s: float = 5.0


async def evict(api: ApiClient, key: str, timeout_s: float) -> EvictionOutcome:
    namespace, name = key.split("/", 1)
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    try:
        await request(api, "POST", path, body=body, timeout=timeout_s)
    except KubeError as exc:
        if exc.status == 429:
            return "blocked"
        if exc.status == 404:
            return "gone"
        log.warning("evicting %s failed: %s", key, exc)
        return "failed"
    except TimeoutError:  # (before ClientError: aiohttp's read timeout is both)
        log.warning("evicting %s: no answer within %.3gs; given up", key, timeout_s)
        return "timed_out"
    except aiohttp.ClientError as exc:
        log.warning("evicting %s failed: %s", key, exc)
        return "failed"
    return "evicted"


async def evict_all(
    api: ApiClient, keys: Sequence[str], limits: EvictionLimits
) -> dict[str, EvictionOutcome]:
    """Evict every pod of `keys` at once, at most `limits.concurrency` calls in flight, each given
    up after `limits.timeout_s`: the outcome of each."""
    in_flight = asyncio.Semaphore(limits.concurrency)

    async def one(key: str) -> EvictionOutcome:
        async with in_flight:
            return await evict(api, key, limits.timeout_s)

    outcomes = await asyncio.gather(*(one(key) for key in keys))
    return dict(zip(keys, outcomes, strict=True))


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
