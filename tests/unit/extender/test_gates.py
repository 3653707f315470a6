"""The gate controller's choice: gated pods oldest first, each counted before the next."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import ADMISSION_GATE
from extender.controllers.gates import GateController, waiting_ungated
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.status import WaitingPods
from tests import extender_objects as objects
from tests.unit.extender.test_gangs import job, member
from tests.unit.extender.test_webhook import cluster


def gated(name: str, created: str, queue: str = "team-a") -> dict[str, Any]:
    pod = objects.pod("plain", name, queue=queue, template="one")
    pod["metadata"]["creationTimestamp"] = created
    pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    return pod


async def test_gated_pods_are_lifted_oldest_first_while_the_limit_has_room() -> None:
    # team-a: limit 3 GPUs, 1 held, 1 pending ungated: room for 1 more (1 + 1 + 1 = 3).
    objs = [o for o in cluster() if o["metadata"]["name"] != "team-a"]
    objs += [
        objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": 3}}),
        objects.pod("plain", "waiting", queue="team-a", template="one"),
        gated("late", "2026-01-01T00:00:09Z"),
        gated("early", "2026-01-01T00:00:01Z"),
        gated("other", "2026-01-01T00:00:05Z", queue="team-b"),
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    assert waiting_ungated(picture)["team-a"]["gpu"] == 1  # "waiting"; the gated pods are not ahead
    async with ApiClient() as api:
        controller = GateController(api, picture, ExtenderMetrics(picture))
        # early: 1 + 1 + 1 = 3 <= 3, lifted; late: 1 + 2 + 1 = 4 > 3, stays; team-b has no limit.
        assert [key for key, _ in controller.admissible()] == ["plain/early", "plain/other"]


def worker(index: int, created: str, gate: bool = True) -> dict[str, Any]:
    """Worker `index` of the indexed Job "train" (a gang of 3) in team-a, created at `created`."""
    pod = member("train", index, queue="team-a", namespace="plain")
    pod["metadata"]["creationTimestamp"] = created
    if gate:
        pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    return pod


@pytest.mark.parametrize(
    ("limit", "workers", "lifted"),
    [
        # Limit 4, 1 held: the gang's 3 missing pods together, 1 + 3 = 4 <= 4, all three go;
        # then "late": 1 + 3 + 1 = 5 > 4, it stays.
        (
            4,
            [worker(i, f"2026-01-01T00:00:0{i}Z") for i in range(3)],
            ["plain/train-0", "plain/train-1", "plain/train-2"],
        ),
        # Limit 3: 1 + 3 = 4 > 3, the whole gang stays; "late" goes, 1 + 1 = 2 <= 3.
        (3, [worker(i, f"2026-01-01T00:00:0{i}Z") for i in range(3)], ["plain/late"]),
        # 2 of its 3 pods exist: incomplete, it stays; "late" goes, 1 + 1 = 2 <= 4.
        (4, [worker(i, f"2026-01-01T00:00:0{i}Z") for i in range(2)], ["plain/late"]),
        # One worker already ungated (pending): it is in the gang's 3 missing, not ahead of it
        # (1 + 3 = 4 <= 4, not 1 + 1 + 3): the two gated ones go; "late": 1 + 3 + 1 = 5 > 4.
        (
            4,
            [
                worker(0, "2026-01-01T00:00:00Z", gate=False),
                *(worker(i, f"2026-01-01T00:00:0{i}Z") for i in (1, 2)),
            ],
            ["plain/train-1", "plain/train-2"],
        ),
    ],
)
async def test_a_gang_is_lifted_whole_when_complete_and_its_queue_takes_it(
    limit: int, workers: list[dict[str, Any]], lifted: list[str]
) -> None:
    objs = [o for o in cluster() if o["metadata"]["name"] != "team-a"]
    objs += [
        objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": limit}}),
        job("train", 3, namespace="plain"),
        *workers,
        gated("late", "2026-01-01T00:00:09Z"),
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    async with ApiClient() as api:
        controller = GateController(api, picture, ExtenderMetrics(picture))
        assert [key for key, _ in controller.admissible()] == lifted


@pytest.mark.parametrize(
    ("limit", "workers", "code", "says"),
    [
        # Limit 3, 1 held: the gang's 3 missing pods together, 1 + 3 = 4 > 3.
        (
            3,
            [worker(i, f"2026-01-01T00:00:0{i}Z") for i in range(3)],
            "over_limit",
            "starts whole or not at all; its 3 missing pods together: queue 'team-a': gpu allocated 1 + "
            "request 3 would exceed its limit (3)",
        ),
        # 2 of its 3 pods exist.
        (
            4,
            [worker(i, f"2026-01-01T00:00:0{i}Z") for i in range(2)],
            "gang_incomplete",
            "waits for its pods: 2 of its minimum 3 exist",
        ),
    ],
)
async def test_every_gated_pod_of_a_gang_that_stays_carries_the_gangs_refusal(
    limit: int, workers: list[dict[str, Any]], code: str, says: str
) -> None:
    objs = [o for o in cluster() if o["metadata"]["name"] != "team-a"]
    objs += [
        objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": limit}}),
        job("train", 3, "plain"),
    ]
    objs += workers
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    async with ApiClient() as api:
        held = GateController(api, picture, ExtenderMetrics(picture)).judge().held
    assert [h.key for h in held] == [f"plain/train-{i}" for i in range(len(workers))]
    assert all(h.decision.kind == code and says in h.decision.reason for h in held), held


async def test_a_pass_hands_why_each_gated_pod_waits_to_the_status_writer_once() -> None:
    # team-a: limit 1 GPU, 1 held: 1 + 1 > 1. "lost" names a queue that does not exist.
    objs = [
        *cluster(),
        gated("early", "2026-01-01T00:00:01Z"),
        gated("lost", "2026-01-01T00:00:02Z", "team-x"),
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    waiting = WaitingPods()
    async with ApiClient() as api:
        controller = GateController(api, picture, ExtenderMetrics(picture), waiting=waiting)
        assert await controller.run_once() == 0
        assert {key: (r.admitted, r.code, r.post_event) for key, r in waiting.reports.items()} == {
            "plain/early": (False, "over_limit", True),
            "plain/lost": (False, "unknown_queue", True),
        }
        assert waiting.reports["plain/early"].reason == (
            "queue 'team-a': gpu allocated 1 + request 1 would exceed its limit (1)"
        )
        assert waiting.reports["plain/lost"].reason == "queue 'team-x' does not exist"
        waiting.reports.clear()
        await controller.run_once()  # the next pass: the same reasons, nothing to write
        assert waiting.reports == {}
