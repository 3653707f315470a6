"""Consolidation freeing a rack for a gang that requires one, on the real control plane (the
consolidation harness: four one-GPU H100 nodes run by the node agent, the controller manager's
Deployment, ReplicaSet and Job controllers, kube-scheduler with the extender in this process).

Racks r1 (nodes 0, 1) and r2 (nodes 2, 3). A Deployment's two whole-GPU pods run one in each rack
(on nodes 0 and 2): 2 GPUs free, one per rack. An indexed Job of 2 pods requiring one rack fits no
rack; reclaim cannot help (one queue). Consolidation moves one Deployment pod out of a rack into
the other's free GPU and holds the freed rack for the gang, whose 2 pods then run there.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import QUEUE_LABEL, TOPOLOGY_REQUIRED_ANNOTATION
from extender.kubeapi import JsonObject, request
from extender.policy.topology import parse_topology
from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.test_consolidation import (
    MERGE_PATCH,
    Env,
    _count_is,
    consolidation_cluster,
    deployment,
    event_reasons,
    gpu_of,
    sample,
)

# Fixtures shared with the driver tests (see test_consolidation).
from tests.integration.test_dra_prepare import device_classes, driver, short_dir  # noqa: F401

pytestmark = pytest.mark.integration

RACK = "example.com/rack"
TOPOLOGY = parse_topology(f"rack={RACK},host=kubernetes.io/hostname")
ONES = "app=ones"
RING = "job-name=ring"


async def label_racks(env: Env) -> None:
    for index, node in enumerate(env.nodes):
        body = {"metadata": {"labels": {RACK: "r1" if index < 2 else "r2"}}}
        await request(env.api, "PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE_PATCH)


async def one_per_rack(env: Env) -> dict[str, str]:
    """The Deployment's 2 whole-GPU pods on nodes 0 and 2 (only that node schedulable while each
    is placed). Returns pod name -> node."""
    deployments = f"/apis/apps/v1/namespaces/{env.namespace}/deployments"
    for count, node in ((1, env.nodes[0]), (2, env.nodes[2])):
        await env.cordon(set(env.nodes) - {node})
        if count == 1:
            await request(env.api, "POST", deployments, body=deployment(env, "ones", 1, "whole"))
        else:
            scale = {"spec": {"replicas": count}}
            await request(env.api, "PATCH", f"{deployments}/ones", body=scale, content_type=MERGE_PATCH)
        await wait_until(partial(_count_is, env, ONES, count), timeout=90, what=f"{count} pods running")
    await env.cordon(set())
    return {p["metadata"]["name"]: gpu_of(p) for p in await env.running(ONES)}


def ring_job(env: Env) -> JsonObject:
    spec = {**env.pod_spec("whole"), "restartPolicy": "Never"}
    template = {
        "metadata": {
            "labels": {QUEUE_LABEL: env.queue},
            "annotations": {TOPOLOGY_REQUIRED_ANNOTATION: "rack"},
        },
        "spec": spec,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ring", "namespace": env.namespace},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": template,
        },
    }


async def test_a_rack_is_freed_by_a_move_and_the_gang_requiring_it_runs_there(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,  # noqa: F811
    device_classes: None,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    async with consolidation_cluster(local_cluster, k8s, namespace, driver, short_dir, TOPOLOGY) as env:
        await label_racks(env)
        before = await one_per_rack(env)
        assert sorted(before.values()) == [env.nodes[0], env.nodes[2]]
        started = time.monotonic()
        jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        await request(k8s, "POST", jobs, body=ring_job(env))
        try:
            ring = await wait_until(
                partial(_count_is, env, RING, 2), timeout=120, what="the gang's 2 pods running"
            )
            seconds = time.monotonic() - started
            nodes = sorted(gpu_of(p) for p in ring)
            racks = {"r1": env.nodes[:2], "r2": env.nodes[2:]}
            freed = next(rack for rack, members in racks.items() if nodes == members)  # one rack, whole
            # One Deployment pod moved out of that rack; its successor runs in the other.
            after = await wait_until(partial(_count_is, env, ONES, 2), timeout=60, what="2 pods running")
            moved = sorted(set(before) - {p["metadata"]["name"] for p in after})
            assert len(moved) == 1 and before[moved[0]] in racks[freed]
            assert sorted(gpu_of(p) for p in after) == [
                n for rack, ns in racks.items() if rack != freed for n in ns
            ]
            assert sample(env, "moves_total", goal="consolidate", outcome="evicted") == 1
            assert sample(env, "plans_total", goal="consolidate", result="carried_out") == 1
            reasons = await event_reasons(env)
            assert (moved[0], "Moved") in reasons
            assert any(
                reason == "ConsolidationPlanned" and name.startswith("ring-") for name, reason in reasons
            )
            print(
                f"\nconsolidation for a gang: moved {moved[0]} off {before[moved[0]]}; the gang ran in rack "
                f"{freed} ({nodes}) {seconds:.1f}s after its Job was created"
            )
        finally:
            await request(k8s, "DELETE", f"{jobs}/ring", query={"propagationPolicy": "Background"})
