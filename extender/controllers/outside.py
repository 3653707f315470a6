"""Marks pods that hold GPUs without passing through Tessera: a condition and one Warning event.

A pod addressed to another scheduler (`default-scheduler`, say) that gets a GPU of Tessera's
DeviceClass - through a claim, or `nvidia.com/gpu` through the class's `extendedResourceName` -
is counted in its namespace's default queue (`extender.picture.demands`), yet it skipped queue
ordering, limits and fair shares when it was placed. Its user should know, where users look: the
pod gets the condition `scheduling.tessera.dev/BypassesQueue` (True, with the queue charged and
the way in) and one `BypassesQueue` Warning event, once per pod - the condition itself says it is
done, so a restart or another replica does not repeat them. Only the active replica writes.

Which pods to look at comes from the accounting (the pods it recounted), so a pass costs the pods
that changed, not every pod.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.kube import mapping, meta, sequence
from contract.names import QUEUE_GROUP
from extender.controllers.periodic import PeriodicPass
from extender.events import now_rfc3339, post_pod_event, set_pod_condition
from extender.kubeapi import KubeError
from extender.picture.cluster import ClusterPicture

log = logging.getLogger(__name__)

BYPASS_CONDITION = f"{QUEUE_GROUP}/BypassesQueue"
BYPASS_REASON = "BypassesQueue"


def is_marked(pod: Mapping[str, Any]) -> bool:
    return any(
        mapping(c).get("type") == BYPASS_CONDITION and mapping(c).get("status") == "True"
        for c in sequence(mapping(pod.get("status")).get("conditions"))
    )


def bypass_message(pod: Mapping[str, Any], queue: str, gpus: float) -> str:
    scheduler = mapping(pod.get("spec")).get("schedulerName") or "default-scheduler"
    return (
        f"placed by scheduler {scheduler!r}, not by Tessera: it bypasses queue ordering, limits and "
        f"fair shares. What it holds ({gpus:g} GPU) is charged to queue {queue!r}, its namespace's "
        "default, against that queue's quota; set schedulerName to Tessera's to wait in a queue instead"
    )


def bypassing(picture: ClusterPicture, keys: Iterable[str]) -> list[tuple[str, Mapping[str, Any], str]]:
    """Of `keys`, the pods outside Tessera that hold GPUs and are not marked yet, with the message."""
    picture.settle()
    found: list[tuple[str, Mapping[str, Any], str]] = []
    contributions = picture.contributions
    for key in keys:
        pod = picture.get("Pod", key)
        contribution = contributions.get(key)
        if pod is None or contribution is None or contribution.bucket != "allocated" or is_marked(pod):
            continue
        gpus = contribution.amounts.get("gpu", 0.0)
        if gpus > 0 and picture.demand(pod).outside:
            found.append((key, pod, bypass_message(pod, contribution.queue, gpus)))
    return found


class BypassReporter:
    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        interval_s: float = 1.0,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.picture = picture
        self._to_check: set[str] | None = None  # pods recounted since the last pass (None: all)
        # Pod key -> uid of the pods this replica marked (its patch may not be in the picture yet).
        self._marked: dict[str, str] = {}
        picture.on_recount(self._recounted)
        self._loop = PeriodicPass(
            "bypass", interval_s, lambda: is_leader() and picture.ready(), self.run_once
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def _recounted(self, keys: Iterable[str] | None) -> None:
        if keys is None:
            self._to_check = None
        elif self._to_check is not None:
            self._to_check.update(keys)

    async def run_once(self) -> int:
        """Mark the pods found since the last pass; returns how many were marked."""
        keys = self._to_check if self._to_check is not None else set(self.picture.kind("Pod"))
        self._to_check = set()
        for key in [k for k in keys if k in self._marked and self.picture.get("Pod", k) is None]:
            del self._marked[key]  # gone
        marked = 0
        for key, pod, message in bypassing(self.picture, keys):
            uid = str(meta(pod).get("uid", ""))
            if self._marked.get(key) == uid:
                continue
            namespace, name = str(meta(pod).get("namespace")), str(meta(pod).get("name"))
            condition = {
                "type": BYPASS_CONDITION,
                "status": "True",
                "reason": BYPASS_REASON,
                "message": message,
                "lastTransitionTime": now_rfc3339(),
            }
            try:
                await set_pod_condition(self.api, namespace, name, condition)
                await post_pod_event(self.api, namespace, name, uid, BYPASS_REASON, message, "Warning")
            except KubeError as exc:
                if exc.status != 404:  # (a pod deleted meanwhile is normal)
                    log.warning("could not mark %s as bypassing its queue: %s", key, exc)
                    self._recounted([key])  # tried again next pass
                continue
            self._marked[key] = uid
            marked += 1
            log.info("pod %s holds GPUs outside Tessera: %s", key, message)
        return marked
