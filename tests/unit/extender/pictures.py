"""Builders shared by the picture's unit tests (`test_picture_*.py`): a picture synced from a list
of objects, two GPU nodes, an object at a resourceVersion, a pod running on a claim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"


def synced_state(objs: Sequence[Mapping[str, Any]], **config: Any) -> ClusterPicture:
    state = ClusterPicture(PictureConfig(**config))
    for kind in WATCHED_PATHS:
        state.replace(kind, [o for o in objs if o["kind"] == kind])
    return state


def two_nodes() -> list[dict[str, Any]]:
    return [
        objects.node("a"),
        objects.node("b"),
        objects.gpu_slice("a", 4, shareable=True),
        objects.gpu_slice("b", 4, model="A100-40GB", memory="40Gi"),
        objects.device_class(CLASS),
    ]


def with_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def running_on(name: str, node: str, claim_name: str, queue: str = "q") -> dict[str, Any]:
    pod = objects.pod("ns", name, queue=queue, claim_name=claim_name, node_name=node)
    return pod
