"""The watcher (`extender.picture.watcher`): watch events applied, bookmarks advance, a 410 asks for
a relist, and a burst of events is settled once, before the next request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from extender.kubeapi import KubeError
from extender.picture import watcher
from extender.picture.watcher import ClusterWatcher, apply_watch_event
from tests import extender_objects as objects
from tests.unit.extender.pictures import CLASS, synced_picture, two_nodes, with_rv


def test_watch_events_apply_bookmarks_advance_and_410_asks_for_a_relist() -> None:
    picture = synced_picture([])
    added = {"type": "ADDED", "object": with_rv(objects.gpu_slice("a", 1), 20)}
    assert apply_watch_event(picture, "ResourceSlice", added, "10") == "20"
    assert picture.node_gpus("a").free_milli == (1000,)
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "30"}}}
    assert apply_watch_event(picture, "ResourceSlice", bookmark, "20") == "30"
    assert list(picture.kind("ResourceSlice")) == ["a-gpu.tessera.dev"]
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert apply_watch_event(picture, "ResourceSlice", expired, "30") == ""
    with pytest.raises(KubeError) as failure:
        failed = {"type": "ERROR", "object": {"code": 500, "message": "boom"}}
        apply_watch_event(picture, "ResourceSlice", failed, "30")
    assert failure.value.status == 500


async def test_the_watcher_counts_a_burst_of_events_once_before_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template = objects.claim_template("ns", "one", objects.claim_spec(CLASS))
    picture = synced_picture([*two_nodes(), template, objects.queue("q")])
    pods = [
        with_rv(objects.pod("ns", f"p{index}", queue="q", template="one"), 10 + index) for index in range(3)
    ]

    async def three_pods(*_: Any) -> Any:
        for pod in pods:
            yield {"type": "ADDED", "object": pod}

    monkeypatch.setattr(watcher, "watch_lines", three_pods)
    settled: list[int] = []
    monkeypatch.setattr(picture, "settle", lambda: settled.append(len(picture.kind("Pod"))))
    assert await ClusterWatcher(None, picture)._watch("Pod", "/api/v1/pods", "1") == "12"  # type: ignore[arg-type]
    assert settled == []  # not while applying the events at hand
    await asyncio.sleep(0)
    assert settled == [3]  # once, with all three
