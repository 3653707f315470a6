"""`GET /status/queues` (extender.statusapi): the queues' numbers and each queue's pending pods
in the scheduler's order, with the wait reason the filter recorded."""

from __future__ import annotations

from tests import extender_objects as objects
from tests.unit.extender.test_server import Extender, args, cluster, extender

__all__ = ["extender"]  # the fixture, used by name


async def test_the_report_lists_a_queues_pending_pods_by_priority_then_creation(extender: Extender) -> None:
    # team-a: quota 1, limit 2, one GPU held on node a. Three pods of 2 GPUs wait:
    #   early (created 10:00, priority 0), late (10:05, priority 0), urgent (10:10, priority 5).
    # Order: urgent first (higher priority), then early, then late (older first).
    pods = []
    for name, minute, priority in (("early", "00", 0), ("late", "05", 0), ("urgent", "10", 5)):
        pod = objects.pod("ns", name, queue="team-a", template="two")
        pod["metadata"]["creationTimestamp"] = f"2026-12-01T10:{minute}:00Z"
        pod["spec"]["priority"] = priority
        pods.append(pod)
    extender.sync(cluster(*pods))
    # The filter refuses `late`: 1 held + 2 asked > limit 2; the report carries its reason.
    _, refused = await extender.call("filter", args(pods[1], ["a", "b"]))
    assert refused["NodeNames"] == []

    response = await extender.client.get("/status/queues")
    assert response.status == 200
    report = await response.json()
    assert report["ready"] is True and report["version"] == 1
    team_a = report["queues"]["team-a"]
    assert team_a["quota"] == {"gpu": 1.0} and team_a["limit"] == {"gpu": 2.0}
    assert team_a["allocated"]["gpu"] == 1.0 and team_a["pendingPods"] == 3
    line = report["waiting"]["team-a"]
    assert [entry["pod"] for entry in line] == ["ns/urgent", "ns/early", "ns/late"]
    assert [entry["gpu"] for entry in line] == [2.0, 2.0, 2.0]
    late = line[2]
    assert late["code"] == "over_limit" and "limit (2)" in late["reason"]
    # No pod fits the limit (1 + 2 > 2), so the planners make room for none.
    assert [entry["planned"] for entry in line] == [False, False, False]
    assert line[0]["reason"] == ""  # never filtered: nothing said yet


async def test_an_unsynced_picture_reports_not_ready(extender: Extender) -> None:
    response = await extender.client.get("/status/queues")
    assert response.status == 200
    assert await response.json() == {"version": 1, "ready": False, "queues": {}, "invalid": {}, "waiting": {}}
