"""The gate controller's choice: gated pods oldest first, each counted before the next."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import ADMISSION_GATE
from extender.controllers.gates import GateController, waiting_ungated
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
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
