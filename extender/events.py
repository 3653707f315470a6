"""Kubernetes Events about pods, the one way the extender tells a user why something happened."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Literal

from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import request

COMPONENT = "tessera-extender"
MAX_MESSAGE = 1024  # the API truncates long messages anyway; keep events small


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    now = now_rfc3339()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": name,
            "uid": uid,
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
    await request(api, "POST", f"/api/v1/namespaces/{namespace}/events", body=event)
