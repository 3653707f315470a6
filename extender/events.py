"""Kubernetes Events about pods and their owners, and pod conditions: how the extender tells a user
why something happened."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import STRATEGIC_MERGE_PATCH, request

COMPONENT = "tessera-extender"
MAX_MESSAGE = 1024  # the API truncates long messages anyway; keep events small
# Where the Events of a cluster-scoped object (namespace "") are stored: the API server accepts
# them there, and `kubectl describe` finds them by `involvedObject.namespace=""` in every namespace.
CLUSTER_EVENT_NAMESPACE = "default"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def set_pod_condition(api: ApiClient, namespace: str, name: str, condition: dict[str, Any]) -> None:
    """Set one condition in a pod's status: a strategic merge, so other conditions stay as they are."""
    await request(
        api,
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        body={"status": {"conditions": [condition]}},
        content_type=STRATEGIC_MERGE_PATCH,
    )


async def post_pod_event(
    api: ApiClient,
    namespace: str,
    name: str,
    uid: str,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"] = "Normal",
) -> None:
    """Record an event on a pod (raises KubeError; a pod deleted meanwhile gives 404)."""
    await post_event(api, InvolvedObject("v1", "Pod", namespace, name, uid), reason, message, kind)


@dataclass(frozen=True)
class InvolvedObject:
    """The object an event is about (a pod, or the Job or workload that owns pods; a Queue, of
    namespace "")."""

    api_version: str
    kind: str
    namespace: str  # "": a cluster-scoped object
    name: str
    uid: str

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_EVENT_NAMESPACE


async def post_event(
    api: ApiClient,
    about: InvolvedObject,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"] = "Normal",
) -> None:
    """Record an event on any object, namespaced or cluster-scoped (raises KubeError)."""
    now = now_rfc3339()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": about.event_namespace},
        "involvedObject": {
            "apiVersion": about.api_version,
            "kind": about.kind,
            "namespace": about.namespace,
            "name": about.name,
            "uid": about.uid,
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": os.uname().nodename,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    await request(api, "POST", f"/api/v1/namespaces/{about.event_namespace}/events", body=event)
