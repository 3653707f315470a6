"""The local control plane is real: DRA allocation, consumable capacity, extenders, validation."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import (
    ClusterError,
    LocalCluster,
    create_fake_node,
    delete_nodes,
    free_port,
    wait_until,
)

DRIVER = "test.tessera.dev"
GiB = 1024**3


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def resource_slice(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim_template(
    namespace: str, name: str, device_class_name: str, memory: str | None = None
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod_with_claim(
    namespace: str, name: str, template: str, scheduler: str = "default-scheduler"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


async def node_of(cluster: LocalCluster, namespace: str, pod: str) -> str | None:
    name: str | None = get_json(cluster, "pod", "-n", namespace, pod)["spec"].get("nodeName")
    return name


@pytest.fixture
async def fake_node(local_cluster: LocalCluster, k8s: ApiClient) -> AsyncIterator[str]:
    name = unique("node")
    await create_fake_node(k8s, name, labels={"gpu.tessera.dev/model": "test-80gb"})
    try:
        yield name
    finally:
        local_cluster.kubectl("delete", "resourceslice", f"{name}-{DRIVER}", "--ignore-not-found")
        await delete_nodes(k8s, [name])


def test_binaries_report_the_pinned_release(local_cluster: LocalCluster) -> None:
    version = json.loads(local_cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.37.")
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]


async def test_scheduler_allocates_a_device_from_a_slice_and_binds(
    local_cluster: LocalCluster, namespace: str, fake_node: str
) -> None:
    klass = unique("gpu")
    local_cluster.apply(device_class(klass))
    local_cluster.apply(
        resource_slice(
            fake_node,
            [
                {"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
                {"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}},
            ],
        )
    )
    local_cluster.apply(claim_template(namespace, "one-gpu", klass))
    local_cluster.apply(pod_with_claim(namespace, "worker", "one-gpu"))
    try:
        bound = await wait_until(
            lambda: node_of(local_cluster, namespace, "worker"), timeout=30, what="pod bound"
        )
        assert bound == fake_node
        claims = get_json(local_cluster, "resourceclaims", "-n", namespace)["items"]
        assert len(claims) == 1, "the resourceclaim controller creates one claim from the template"
        results = claims[0]["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, fake_node)]
        assert results[0]["device"] in {"gpu-0", "gpu-1"}
    finally:
        local_cluster.kubectl("delete", "deviceclass", klass)


async def test_consumable_capacity_shares_a_device_until_it_is_full(
    local_cluster: LocalCluster, namespace: str, fake_node: str
) -> None:
    klass = unique("gpu-share")
    local_cluster.apply(device_class(klass))
    local_cluster.apply(
        resource_slice(
            fake_node,
            [
                {
                    "name": "gpu-0",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": "80Gi",
                            "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi"}},
                        }
                    },
                }
            ],
        )
    )
    local_cluster.apply(claim_template(namespace, "half-gpu", klass, memory="40Gi"))
    try:
        for index in range(2):
            local_cluster.apply(pod_with_claim(namespace, f"half-{index}", "half-gpu"))
            await wait_until(
                lambda i=index: node_of(local_cluster, namespace, f"half-{i}"),  # type: ignore[misc]
                timeout=30,
                what=f"pod half-{index} bound",
            )
        local_cluster.apply(pod_with_claim(namespace, "half-2", "half-gpu"))

        async def unschedulable() -> bool:
            pod = get_json(local_cluster, "pod", "-n", namespace, "half-2")
            conditions = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == "PodScheduled" and c["reason"] == "Unschedulable" for c in conditions)

        await wait_until(unschedulable, timeout=30, what="third pod reported unschedulable")
        assert await node_of(local_cluster, namespace, "half-2") is None
        claims = get_json(local_cluster, "resourceclaims", "-n", namespace)["items"]
        consumed = [
            result["consumedCapacity"]["memory"]
            for claim in claims
            if claim.get("status", {}).get("allocation")
            for result in claim["status"]["allocation"]["devices"]["results"]
        ]
        assert consumed == ["40Gi", "40Gi"]
    finally:
        local_cluster.kubectl("delete", "deviceclass", klass)


async def test_scheduler_calls_a_configured_extender_filter(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, fake_node: str
) -> None:
    seen: list[dict[str, Any]] = []

    async def filter_verb(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"NodeNames": body["NodeNames"], "FailedNodes": {}, "Error": ""})

    app = web.Application()
    app.router.add_post("/filter", filter_verb)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    scheduler_name = unique("with-extender")
    scheduler = local_cluster.start_scheduler(
        scheduler_name,
        extenders=[
            {
                "urlPrefix": f"http://127.0.0.1:{port}",
                "filterVerb": "filter",
                "nodeCacheCapable": True,
                "enableHTTPS": False,
            }
        ],
    )
    try:
        local_cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "probe", "namespace": namespace},
                "spec": {
                    "schedulerName": scheduler_name,
                    "nodeSelector": {"kubernetes.io/hostname": fake_node},
                    "containers": [{"name": "main", "image": "registry.invalid/none"}],
                },
            }
        )
        assert (
            await wait_until(lambda: node_of(local_cluster, namespace, "probe"), timeout=30, what="pod bound")
            == fake_node
        )
        assert seen, "the scheduler never called the extender"
        assert {"Pod", "Nodes", "NodeNames"} <= set(seen[0])
        assert seen[0]["Pod"]["metadata"]["name"] == "probe"
        assert seen[0]["NodeNames"] == [fake_node]
    finally:
        scheduler.stop()
        await runner.cleanup()


def test_apiserver_rejects_a_slice_over_the_device_limit(local_cluster: LocalCluster, fake_node: str) -> None:
    devices = [{"name": f"gpu-{i}"} for i in range(129)]
    with pytest.raises(ClusterError) as rejected:
        local_cluster.apply(resource_slice(fake_node, devices))
    message = str(rejected.value)
    assert "spec.devices" in message
    assert "128" in message
