"""Fractional GPUs end to end: consumable `memory` capacity counted as parts of a GPU, packed together."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import QUARTER_TEMPLATE, gpu_cluster
from tests.integration.test_extender_fairness import converge, queue_status_equals, waiting_condition

pytestmark = pytest.mark.integration


async def test_fractional_pods_count_as_parts_of_a_gpu_and_pack_onto_one_node(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=2, shareable=True) as env:
        team = await env.create_queue("f", resources={"gpu": {"limit": 1}})
        await env.submit(team, 5, "quarter", template=QUARTER_TEMPLATE)
        # 20Gi of an 80Gi GPU is a quarter: four fit in the limit of one GPU, the fifth waits.
        await converge(env, {team: 4}, {team: 4})
        await queue_status_equals(env, team, allocated="1", fair="1")
        nodes = {p["spec"]["nodeName"] for p in await env.pods() if p["spec"].get("nodeName")}
        assert len(nodes) == 1, f"fractional pods spread over {nodes} instead of packing"

        async def refused() -> bool:
            waiting = [waiting_condition(p) for p in await env.pods() if not p["spec"].get("nodeName")]
            return (
                len(waiting) == 1
                and waiting[0] is not None
                and "gpu allocated 1 + request 0.25 would exceed its limit (1)" in waiting[0]["message"]
            )

        await wait_until(refused, timeout=20, what="the fifth quarter's wait reason")
        assert env.service is not None
        supply = env.service.picture.node_gpus(nodes.pop())
        assert sorted(supply.free_milli) == [0, 1000], supply
