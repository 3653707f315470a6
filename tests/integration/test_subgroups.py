"""Subgroups on the real control plane: a workload of a leader and its workers, each part with its
own minimum (`scheduling.tessera.dev/subgroup`, `subgroup-min-members: leader=1,workers=4`), the
node agent running what binds.

3 nodes of 2 GPUs (6), two one-GPU fillers: 4 free for a gang whose minimum needs 5; and a
CPU-only leader with workers of 2 GPUs, each part planned with its own shape.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import SUBGROUP_LABEL, SUBGROUP_MINIMUMS_ANNOTATION, WORKLOAD_LABEL
from extender.kubeapi import JsonObject, request
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import GpuCluster, gpu_cluster
from tests.integration.test_gangs import condition, live
from tests.integration.test_topology import filler, node_of

pytestmark = pytest.mark.integration


async def create_member(env: GpuCluster, queue: str, part: str, index: int) -> None:
    pod = env.pod(queue, f"lw-{part}-{index}")
    pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}
    pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: "leader=1,workers=4"}
    await request(env.api, "POST", f"/api/v1/namespaces/{env.namespace}/pods", body=pod)


async def test_a_leader_and_workers_wait_naming_the_short_part_then_start_whole(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=3, gpus_per_node=2, agent=True) as env:
        team = await env.create_queue("t")
        await filler(env, team, "f1", env.nodes[0])
        await filler(env, team, "f2", env.nodes[1])

        async def fillers_bound() -> bool:
            return sum(1 for p in await env.pods() if node_of(p)) == 2

        await wait_until(fillers_bound, timeout=60, interval=0.2, what="the 2 fillers bound")
        await create_member(env, team, "leader", 0)
        for index in range(4):
            await create_member(env, team, "workers", index)

        def members(pods: list[JsonObject]) -> list[JsonObject]:
            return [p for p in pods if p["metadata"]["name"].startswith("lw-")]

        async def refused_by_part() -> str | None:
            pods = members(await env.pods())
            assert not any(node_of(p) for p in pods), "a member bound before its gang was admitted"
            messages = [condition(p).get("message", "") for p in pods]
            return next((m for m in messages if "part workers" in m), None)

        message = await wait_until(refused_by_part, timeout=60, interval=0.2, what="the gang refused by part")
        # 4 free GPUs for 5 missing pods: the leader's 1, then 3 for the 4 workers.
        assert "GPUs free for 4 of its 5 missing pods (1 GPU each)" in message
        assert "part workers: minimum 4, 0 placed, 4 present; room for 3 of its 4 missing" in message

        # One filler goes: 5 free, the whole gang (the leader and its 4 workers) starts.
        await env.delete_pods(["f2"])

        async def all_bound() -> list[str] | None:
            nodes = [node_of(p) for p in members(await env.pods()) if live(p)]
            return nodes if len(nodes) == 5 and all(nodes) else None

        nodes = await wait_until(all_bound, timeout=90, interval=0.2, what="the gang's 5 pods bound")
        assert sorted(nodes).count(env.nodes[0]) == 1, nodes  # f1 keeps one GPU of node 0


async def test_a_cpu_only_leader_and_two_gpu_workers_start_together_each_with_its_shape(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    # 3 nodes of 2 GPUs, one GPU taken on nodes 0 and 1 (1 + 1 + 2 free: 4). A leader without GPUs
    # and 2 workers of 2 GPUs each ("leader=1,workers=2"): by count 3 pods would fit 4 GPUs, but
    # only node 2 holds a worker. They wait naming the part; no member binds (not the leader
    # either, though it needs no GPU). When node 0's filler goes, both workers start on whole
    # nodes, the leader with them.
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=3, gpus_per_node=2, agent=True) as env:
        team = await env.create_queue("t")
        templates = f"/apis/resource.k8s.io/v1/namespaces/{env.namespace}/resourceclaimtemplates"
        two = objects.claim_template(env.namespace, "two-gpus", objects.claim_spec(env.driver, 2))
        await request(env.api, "POST", templates, body=two)
        await filler(env, team, "f1", env.nodes[0])
        await filler(env, team, "f2", env.nodes[1])

        async def fillers_bound() -> bool:
            return sum(1 for p in await env.pods() if node_of(p)) == 2

        await wait_until(fillers_bound, timeout=60, interval=0.2, what="the 2 fillers bound")
        leader = objects.pod(env.namespace, "lw-leader-0", queue=team, scheduler=env.scheduler_name)
        del leader["metadata"]["uid"], leader["status"]
        members = [leader, *(env.pod(team, f"lw-workers-{i}", template="two-gpus") for i in range(2))]
        for pod in members:
            part = "leader" if pod is leader else "workers"
            pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}
            pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: "leader=1,workers=2"}
            await request(env.api, "POST", f"/api/v1/namespaces/{env.namespace}/pods", body=pod)

        def of_gang(pods: list[JsonObject]) -> list[JsonObject]:
            return [p for p in pods if p["metadata"]["name"].startswith("lw-")]

        async def refused_by_part() -> str | None:
            pods = of_gang(await env.pods())
            assert not any(node_of(p) for p in pods), "a member bound before its gang was admitted"
            messages = [condition(p).get("message", "") for p in pods]
            return next((m for m in messages if "part workers" in m), None)

        message = await wait_until(refused_by_part, timeout=60, interval=0.2, what="the gang refused by part")
        assert "part workers: GPUs free for 1 of its 2 missing pods" in message

        await env.delete_pods(["f1"])

        async def all_bound() -> dict[str, str] | None:
            nodes = {p["metadata"]["name"]: node_of(p) for p in of_gang(await env.pods()) if live(p)}
            return nodes if len(nodes) == 3 and all(nodes.values()) else None

        nodes = await wait_until(all_bound, timeout=90, interval=0.2, what="the gang's 3 pods bound")
        assert sorted([nodes["lw-workers-0"], nodes["lw-workers-1"]]) == [env.nodes[0], env.nodes[2]], nodes
