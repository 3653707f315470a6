"""Topology-aware gangs on the real control plane: fake nodes labelled into racks, an indexed Job
that requires one rack, the node agent running what binds.

Racks r1 (nodes 0, 1) and r2 (nodes 2, 3), 2 GPUs per node: 4 GPUs a rack, 8 in all.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import TOPOLOGY_REQUIRED_ANNOTATION
from extender.kubeapi import JsonObject, request
from extender.policy.topology import parse_topology
from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import GpuCluster, gpu_cluster
from tests.integration.test_gangs import JOB_LABEL, condition, live

pytestmark = pytest.mark.integration

RACK = "example.com/rack"
TOPOLOGY = parse_topology(f"rack={RACK},host=kubernetes.io/hostname")


async def label_racks(env: GpuCluster) -> None:
    """Nodes 0 and 1 into r1, 2 and 3 into r2: labels added after the nodes exist, as an operator
    would, so the picture learns them from the watch."""
    for index, node in enumerate(env.nodes):
        await request(
            env.api,
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": {RACK: "r1" if index < 2 else "r2"}}},
            content_type="application/merge-patch+json",
        )


async def filler(env: GpuCluster, queue: str, name: str, node: str) -> None:
    """A one-GPU pod kept to one node (by its hostname)."""
    pod = env.pod(queue, name)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    await request(env.api, "POST", f"/api/v1/namespaces/{env.namespace}/pods", body=pod)


def node_of(pod: JsonObject) -> str:
    return str(pod["spec"].get("nodeName") or "")


async def test_a_gang_requiring_one_rack_waits_with_the_reason_then_lands_in_the_rack_that_frees(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(
        local_cluster, k8s, namespace, nodes=4, gpus_per_node=2, agent=True, topology=TOPOLOGY
    ) as env:
        await label_racks(env)
        team = await env.create_queue("t")
        # One GPU taken in each rack: 3 free in r1, 3 in r2 (6 in all, enough without the ask).
        await filler(env, team, "f1", env.nodes[0])
        await filler(env, team, "f2", env.nodes[2])

        async def fillers_bound() -> bool:
            return sum(1 for p in await env.pods() if node_of(p)) == 2

        await wait_until(fillers_bound, timeout=60, interval=0.2, what="the 2 fillers bound")
        await env.create_job(team, "ring", 4, annotations={TOPOLOGY_REQUIRED_ANNOTATION: "rack"})

        async def refused_by_rack() -> str | None:
            messages = [
                condition(p).get("message", "")
                for p in await env.pods()
                if JOB_LABEL in p["metadata"]["labels"]
            ]
            return next((m for m in messages if "in one rack" in m), None)

        message = await wait_until(refused_by_rack, timeout=60, interval=0.2, what="the gang refused by rack")
        assert (
            "needs 4 GPUs in one rack; largest rack has 3 free (room for 3 of its 4 missing pods)" in message
        )
        assert not any(node_of(p) for p in await env.pods() if JOB_LABEL in p["metadata"]["labels"])

        # r2's filler goes: r2 has 4 free, the whole gang lands there.
        await env.delete_pods(["f2"])

        async def ring_bound() -> list[str] | None:
            nodes = [node_of(p) for p in await env.pods() if JOB_LABEL in p["metadata"]["labels"] and live(p)]
            return nodes if len(nodes) == 4 and all(nodes) else None

        nodes = await wait_until(ring_bound, timeout=90, interval=0.2, what="the gang's 4 pods bound")
        assert sorted(set(nodes)) == env.nodes[2:], nodes
