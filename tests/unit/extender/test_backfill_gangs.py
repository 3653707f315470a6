"""A gang that comes later, planned around the first waiting gang (`extender.policy.backfill`),
through the filter verb: labelled nodes, gangs in; who is admitted, and when.

The cluster (as tests/unit/extender/test_topology_gangs.py): racks r1 (nodes a, b) and r2 (node c),
2 GPUs each; indexed Jobs of one-GPU pods preferring a rack; a pod alone runs on each node, so 3
GPUs are free (a 1, b 1, c 1). Gang "big" (4 members, created at 10:00) does not fit and was
tried by the scheduler; gang "small" (2 members, 10:05) would fit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.server import build_app
from extender.status import WaitingPods
from tests import extender_objects as objects
from tests.unit.extender.serving import serve
from tests.unit.extender.test_gangs import job
from tests.unit.extender.test_server import CLASS, Extender, args
from tests.unit.extender.test_topology_gangs import NODES, TOPOLOGY, cluster, gang

UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def extender_with(hold_back_after_s: float | None) -> Any:
    @pytest.fixture
    async def extender() -> AsyncIterator[Extender]:
        config = PictureConfig(topology=TOPOLOGY, hold_back_after_s=hold_back_after_s)
        picture, waiting, api = ClusterPicture(config), WaitingPods(), ApiClient()
        app = build_app(picture, Binder(api, picture), waiting, ExtenderMetrics(picture))
        async with serve(app) as client:
            yield Extender(client, picture, waiting, api)
        await api.close()

    return extender


extender = extender_with(0.0)
extender_without_the_rule = extender_with(None)


def lone(node: str) -> list[dict[str, Any]]:
    """A pod alone running on `node`'s first GPU."""
    pod = objects.pod("ns", f"lone-{node}", queue="team", template="one", node_name=node)
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"lone-{node}-gpus"}]
    allocated: list[tuple[str, str, str | None]] = [(node, "gpu-0", None)]
    claim = objects.claim("ns", f"lone-{node}-gpus", objects.claim_spec(CLASS), allocated=allocated)
    return [pod, claim]


def created(pods: list[dict[str, Any]], at: str, tried: bool = False) -> list[dict[str, Any]]:
    for pod in pods:
        pod["metadata"]["creationTimestamp"] = f"2026-01-01T{at}:00Z"
        if tried:  # kube-scheduler tried it and no node fit
            pod["status"]["conditions"] = [UNSCHEDULABLE]
    return pods


def scenario(*running: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    big = created(gang("big", 4, required="", preferred="rack"), "10:00", tried=True)
    small = created(gang("small", 2, required="", preferred="rack"), "10:05")
    objs = cluster(job("big", 4), job("small", 2), *big, *small, *(o for node in running for o in lone(node)))
    return objs, big, small


async def test_a_later_gang_waits_off_the_nodes_held_back_for_the_first(extender: Extender) -> None:
    objs, big, small = scenario("a", "b", "c")
    extender.sync(objs)
    # big: 4 members, 3 GPUs free: refused. The nodes held back for it: r1 has 2 free (a, b),
    # r2 1 (c); r1 first, a then b (1 free each) hold 2 + 2 = 4 once empty: a and b.
    _, result = await extender.call("filter", args(big[0], NODES))
    assert result["NodeNames"] == []
    # small: 2 members; off a and b only c is left, 1 free: 1 of its 2 fit, it waits, naming why.
    _, result = await extender.call("filter", args(small[0], NODES))
    assert result["NodeNames"] == []
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert "GPUs free for 1 of its 2 missing pods" in reason
    assert "2 nodes held back for workload Job/ns/big, ahead of it" in reason
    assert extender.picture.gang_reservation("Job/ns/small") is None
    # A pod alone is not held back: it takes a's free GPU.
    alone = created([objects.pod("ns", "alone", queue="team", template="one")], "10:06")[0]
    extender.sync([*objs, alone])
    _, result = await extender.call("filter", args(alone, NODES))
    assert "a" in result["NodeNames"]
    # The pods alone on a and b end: r1 has 4 free, big is admitted there, before small.
    objs, big, small = scenario("c")
    extender.sync(objs)
    _, result = await extender.call("filter", args(big[0], NODES))
    reservation = extender.picture.gang_reservation("Job/ns/big")
    assert reservation is not None and sorted(reservation.nodes) == ["a", "a", "b", "b"]


async def test_without_the_rule_the_later_gang_overtakes(extender_without_the_rule: Extender) -> None:
    # The same picture with `--gang-hold-back-after` unset (the default): small takes 2 of the
    # 3 free GPUs, and big needs 4 of what is left and frees later.
    objs, _, small = scenario("a", "b", "c")
    extender_without_the_rule.sync(objs)
    await extender_without_the_rule.call("filter", args(small[0], NODES))
    assert extender_without_the_rule.picture.gang_reservation("Job/ns/small") is not None
