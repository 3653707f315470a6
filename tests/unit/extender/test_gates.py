"""The gate controller's choice: gated pods oldest first, each counted before the next."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.names import ADMISSION_GATE
from extender.controllers.gates import GateController, waiting_ungated
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from tests import extender_objects as objects
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
