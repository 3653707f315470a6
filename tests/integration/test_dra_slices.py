"""The driver's ResourceSlices on the real control plane: accepted, readable, kept current, and
allocated from by the real scheduler (whole GPUs, fractions by memory, shared time-sliced claims,
a model chosen by CEL), with the repository's own DeviceClasses and example claims.

Each test uses its own driver name, so the shipped manifests are applied with ``gpu.tessera.dev``
rewritten to it; nothing here collides with other tests' slices or classes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, ResourceV1Api

from contract.names import CLASSIC_GPU_RESOURCE, DRIVER_NAME
from contract.quantity import parse_quantity
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.slices import SharingMode, SliceReconciler, read_json
from tessera.dev.localcluster import (
    LocalCluster,
    api_client,
    create_fake_node,
    delete_nodes,
    free_port,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
GIB = 1 << 30
SINGLE_H100 = """
driverVersion: "570.124.06"
cudaDriverVersion: "12.8"
gpus:
  - productName: NVIDIA H100 80GB HBM3
    architecture: Hopper
    cudaComputeCapability: "9.0"
    memory: 80Gi
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class DriverNode:
    name: str
    backend: SimulatedDiscovery
    reconciler: SliceReconciler


@dataclass
class Pools:
    driver: str
    h100: DriverNode  # one H100 80GB
    t4: DriverNode  # two T4 16GB


async def slices_of(k8s: ApiClient, driver: str, node: str) -> list[dict[str, Any]]:
    listed = await read_json(
        ResourceV1Api(k8s).list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver}", _preload_content=False
        )
    )
    items: list[dict[str, Any]] = listed["items"]
    return sorted(items, key=lambda s: s["metadata"]["name"])


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


@pytest.fixture
async def pools(local_cluster: LocalCluster, k8s: ApiClient, tmp_path: Path) -> AsyncIterator[Pools]:
    driver = f"{unique('gpu')}.tessera.dev"
    profile = tmp_path / "h100x1.yaml"
    profile.write_text(SINGLE_H100)
    nodes: list[DriverNode] = []
    for prefix, source in (("h100", profile), ("t4", Path("t4x2"))):
        name = unique(prefix)
        await create_fake_node(k8s, name)
        backend = SimulatedDiscovery.from_file(source, node_name=name)
        nodes.append(DriverNode(name, backend, SliceReconciler(k8s, name, driver, backend)))
    try:
        yield Pools(driver, nodes[0], nodes[1])
    finally:
        for node in nodes:
            await node.reconciler.delete_all()
        await delete_nodes(k8s, [n.name for n in nodes])


async def test_slices_are_accepted_readable_and_kept_current(
    local_cluster: LocalCluster, k8s: ApiClient, pools: Pools
) -> None:
    node = pools.h100
    assert await node.reconciler.detect_sharing_mode() is SharingMode.CONSUMABLE_CAPACITY
    assert await node.reconciler.publish(node.backend.inventory())
    assert await pools.t4.reconciler.publish(pools.t4.backend.inventory())

    (published,) = await slices_of(k8s, pools.driver, node.name)
    spec = published["spec"]
    assert spec["pool"] == {"name": node.name, "generation": 1, "resourceSliceCount": 1}
    owner = published["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node.name)
    gpu = devices_of([published])["gpu-0"]
    # The apiserver kept the consumable-capacity fields: the feature is on in this cluster.
    assert gpu["allowMultipleAllocations"] is True
    # Memory is a readable quantity, kept as such by the apiserver.
    assert gpu["capacity"]["memory"]["value"] == "80Gi"
    assert gpu["capacity"]["memory"]["requestPolicy"]["default"] == "80Gi"
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert sorted(devices_of(await slices_of(k8s, pools.driver, pools.t4.name))) == ["gpu-0", "gpu-1"]

    described = local_cluster.kubectl("describe", "resourceslice", published["metadata"]["name"]).stdout
    for text in ("gpu-0", "NVIDIA H100 80GB HBM3", "Allow Multiple Allocations", "Hopper", "80Gi", node.name):
        assert text in described, f"{text!r} missing from kubectl describe:\n{described}"

    assert not await node.reconciler.publish(node.backend.inventory()), "nothing changed: no republish"

    async def pool_at(generation: int) -> list[dict[str, Any]] | None:
        slices = await slices_of(k8s, pools.driver, node.name)
        return slices if slices and slices[0]["spec"]["pool"]["generation"] == generation else None

    # The GPU fails while the driver is down; run() publishes the taint at start, then follows
    # the backend's health changes.
    node.backend.set_health(0, healthy=False, message="XID 79 fell off the bus")
    reconciling = asyncio.create_task(node.reconciler.run(resync_s=1.0))
    try:
        tainted = await wait_until(lambda: pool_at(2), timeout=20, what="republish at start")
        (taint,) = devices_of(tainted)["gpu-0"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            f"{pools.driver}/unhealthy",
            "XID-79-fell-off-the-bus",
            "NoSchedule",
        )
        node.backend.set_health(0, healthy=True)
        healed = await wait_until(lambda: pool_at(3), timeout=20, what="republish after recovery")
        assert "taints" not in devices_of(healed)["gpu-0"]
        # Someone deletes the slice: the periodic resync puts it back.
        local_cluster.kubectl("delete", "resourceslice", healed[0]["metadata"]["name"])
        healed = await wait_until(lambda: pool_at(4), timeout=20, what="resync after deletion")
    finally:
        reconciling.cancel()

    # A slice left behind (say by an older, larger inventory) is deleted by a restarted driver,
    # whose pool generation continues above what it finds.
    stale = json.loads(json.dumps(healed[0]))
    stale.update(apiVersion="resource.k8s.io/v1", kind="ResourceSlice")
    stale["metadata"] = {"name": f"{node.name}-{pools.driver}-7"}
    stale["spec"]["pool"]["generation"] = 5
    local_cluster.apply(stale)
    restarted = SliceReconciler(k8s, node.name, pools.driver, node.backend)
    assert await restarted.publish(node.backend.inventory())
    current = await slices_of(k8s, pools.driver, node.name)
    assert [s["metadata"]["name"] for s in current] == [f"{node.name}-{pools.driver}-0"]
    assert current[0]["spec"]["pool"]["generation"] == 6


def manifest_documents(path: Path, driver: str) -> list[dict[str, Any]]:
    """The shipped YAML, re-targeted at this test's driver name and, since this tests the driver
    alone, at the default scheduler (the examples name the chart's Tessera scheduler profile)."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text().replace(DRIVER_NAME, driver)) if doc]
    for doc in documents:
        if doc["kind"] == "Pod":
            doc["spec"].pop("schedulerName", None)
    return documents


def fraction_pod(namespace: str, name: str, driver: str) -> list[dict[str, Any]]:
    """A pod with its own claim for 40Gi of a GPU's memory (through the shipped fractional class)."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": f"fractional-{driver}",
                                "capacity": {"requests": {"memory": "40Gi"}},
                            },
                        }
                    ]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    return [template, pod]


class Cluster:
    """kubectl helpers bound to one namespace."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def apply(self, docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            if doc["kind"] not in {"DeviceClass"}:
                doc["metadata"]["namespace"] = self.namespace
            self.cluster.apply(doc)

    def get(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl("get", "-n", self.namespace, *args, "-o", "json").stdout)

    async def node_of(self, pod: str) -> str | None:
        node: str | None = self.get("pod", pod)["spec"].get("nodeName")
        return node

    async def bound(self, pod: str) -> str:
        return await wait_until(lambda: self.node_of(pod), timeout=40, what=f"pod {pod} bound")

    async def unschedulable(self, pod: str) -> bool:
        conditions = self.get("pod", pod).get("status", {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    def results_of(self, pod: str) -> list[dict[str, Any]]:
        """The device allocation results of every claim the pod uses."""
        statuses = self.get("pod", pod).get("status", {}).get("resourceClaimStatuses", [])
        claim_names = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
        spec_claims = self.get("pod", pod)["spec"]["resourceClaims"]
        claim_names += [c["resourceClaimName"] for c in spec_claims if c.get("resourceClaimName")]
        results: list[dict[str, Any]] = []
        for claim in claim_names:
            allocation = self.get("resourceclaim", claim).get("status", {}).get("allocation")
            if allocation:
                results.extend(allocation["devices"]["results"])
        return results

    def force_delete(self, *pods: str) -> None:
        # No kubelet confirms termination on a fake node, so skip the grace period.
        self.cluster.kubectl(
            "delete", "pod", "-n", self.namespace, *pods, "--grace-period=0", "--force", "--wait=false"
        )


async def test_scheduler_allocates_whole_fractional_and_shared_gpus_from_published_slices(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, pools: Pools
) -> None:
    for node in (pools.h100, pools.t4):
        assert await node.reconciler.publish(node.backend.inventory())
    classes = manifest_documents(MANIFESTS / "deviceclasses.yaml", pools.driver)
    assert len(classes) == 4
    for device_class in classes:
        local_cluster.apply(device_class)
    cluster = Cluster(local_cluster, namespace)
    examples = MANIFESTS / "examples"
    try:
        # Two 40Gi fractions share the one 80Gi H100; a third does not fit anywhere and waits.
        for name in ("half-0", "half-1"):
            cluster.apply(fraction_pod(namespace, name, pools.driver))
            assert await cluster.bound(name) == pools.h100.name
        halves = cluster.results_of("half-0") + cluster.results_of("half-1")
        assert [(r["device"], parse_quantity(r["consumedCapacity"]["memory"])) for r in halves] == [
            ("gpu-0", 40 * GIB)
        ] * 2
        assert halves[0]["shareID"] != halves[1]["shareID"]
        cluster.apply(fraction_pod(namespace, "half-2", pools.driver))
        await wait_until(lambda: cluster.unschedulable("half-2"), timeout=40, what="third 40Gi pod waits")
        assert await cluster.node_of("half-2") is None

        # A plain whole-GPU claim (the shipped example) takes all of a T4's memory.
        cluster.apply(manifest_documents(examples / "whole-gpu.yaml", pools.driver))
        assert await cluster.bound("whole-gpu-trainer") == pools.t4.name
        (whole,) = cluster.results_of("whole-gpu-trainer")
        assert parse_quantity(whole["consumedCapacity"]["memory"]) == 15360 * (1 << 20)

        # One time-sliced claim shared by two pods: both on the other T4.
        cluster.apply(manifest_documents(examples / "timesliced-shared.yaml", pools.driver))
        assert await cluster.bound("notebook-a") == pools.t4.name
        assert await cluster.bound("notebook-b") == pools.t4.name
        (shared,) = cluster.get("resourceclaim", "shared-gpu")["status"]["allocation"]["devices"]["results"]
        assert shared["device"] != whole["device"]
        reserved = cluster.get("resourceclaim", "shared-gpu")["status"]["reservedFor"]
        assert sorted(r["name"] for r in reserved) == ["notebook-a", "notebook-b"]

        # The quarter-GPU example is valid as shipped (nothing has 20Gi free now, so dry run).
        for doc in manifest_documents(examples / "quarter-gpu.yaml", pools.driver):
            doc["metadata"]["namespace"] = namespace
            local_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=json.dumps(doc))

        # Free the H100; the CEL model selector (H100, >= 80Gi, compute capability >= 9.0) gets it.
        cluster.force_delete("half-2", "half-0", "half-1")

        async def h100_free() -> bool:
            claims = cluster.get("resourceclaims")["items"]
            return not any(c["metadata"]["name"].startswith("half-") for c in claims)

        await wait_until(h100_free, timeout=40, what="fraction claims removed")
        model_docs = manifest_documents(examples / "gpu-by-model.yaml", pools.driver)
        model_pod = fraction_pod(namespace, "by-model", pools.driver)[1]
        model_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "h100-gpu"
        cluster.apply([*model_docs, model_pod])
        assert await cluster.bound("by-model") == pools.h100.name
    finally:
        pods = [p["metadata"]["name"] for p in cluster.get("pods")["items"]]
        if pods:
            cluster.force_delete(*pods)
        for device_class in classes:
            local_cluster.kubectl(
                "delete", "deviceclass", device_class["metadata"]["name"], "--ignore-not-found"
            )


async def test_a_pod_asking_nvidia_gpu_gets_a_device_of_the_driver_through_the_shipped_class(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, pools: Pools
) -> None:
    """The whole-GPU DeviceClass maps the extended resource nvidia.com/gpu (DRAExtendedResource,
    GA in 1.37): a pod with `limits: {nvidia.com/gpu: 1}` and no claim is scheduled onto a node
    without that resource in its allocatable, on a device of the driver's ResourceSlices, through
    the claim kube-scheduler makes for it."""
    (whole_class,) = [
        doc
        for doc in manifest_documents(MANIFESTS / "deviceclasses.yaml", pools.driver)
        if doc["metadata"]["name"] == pools.driver
    ]
    assert whole_class["spec"]["extendedResourceName"] == CLASSIC_GPU_RESOURCE
    await pools.t4.reconciler.publish(pools.t4.backend.inventory())
    local_cluster.apply(whole_class)
    served = local_cluster.kubectl("get", "deviceclass", pools.driver, "-o", "json").stdout
    assert json.loads(served)["spec"]["extendedResourceName"] == CLASSIC_GPU_RESOURCE  # not dropped
    cluster = Cluster(local_cluster, namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "classic"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/none",
                    "resources": {"limits": {CLASSIC_GPU_RESOURCE: "1"}},
                }
            ]
        },
    }
    try:
        cluster.apply([pod])
        assert await cluster.bound("classic") == pools.t4.name  # the only node with this driver's GPUs
        status = cluster.get("pod", "classic")["status"]["extendedResourceClaimStatus"]
        mappings = [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]]
        assert mappings == [("main", CLASSIC_GPU_RESOURCE)]
        claim = cluster.get("resourceclaim", status["resourceClaimName"])
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        slices = await slices_of(k8s, pools.driver, pools.t4.name)
        assert (result["driver"], result["pool"]) == (pools.driver, slices[0]["spec"]["pool"]["name"])
        assert result["device"] in devices_of(slices)
    finally:
        cluster.force_delete("classic")
        local_cluster.kubectl("delete", "deviceclass", pools.driver, "--ignore-not-found")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_driver_process_publishes_serves_and_stops_cleanly(
    local_cluster: LocalCluster, k8s: ApiClient, short_dir: Path
) -> None:
    """The console entry point end to end: slices published, plugin sockets served, SIGTERM exits 0."""
    node, driver, port = unique("proc"), f"{unique('gpu')}.tessera.dev", free_port()
    await create_fake_node(k8s, node)
    command = [sys.executable, "-m", "dra_driver", "--node-name", node, "--driver-name", driver]
    command += ["--backend", "simulated", "--profile", "mixed", "--kubeconfig", str(local_cluster.kubeconfig)]
    for flag in ("plugin-dir", "registry-dir", "cdi-dir", "checkpoint-dir"):
        command += [f"--{flag}", str(short_dir / flag)]
    process = await asyncio.create_subprocess_exec(*command, "--http-port", str(port), cwd=REPO)
    try:

        async def published_slices() -> list[dict[str, Any]] | None:
            return await slices_of(k8s, driver, node) or None

        published = await wait_until(published_slices, timeout=30, what="the driver process publishes")
        assert sorted(devices_of(published)) == [
            "gpu-0",
            "gpu-1",
            "gpu-2-mig-1-0",
            "gpu-2-mig-2-0",
            "gpu-2-mig-3-0",
            "gpu-3",
        ]

        async def healthy() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/healthz") as response,
                ):
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(healthy, timeout=30, what="/healthz answers 200")
        sockets = [
            short_dir / "registry-dir" / f"{driver}-reg.sock",
            short_dir / "plugin-dir" / driver / "dra.sock",
        ]
        assert all(path.is_socket() for path in sockets)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert not any(path.exists() for path in sockets)
        # Slices outlive a restart of the driver; the Node's deletion removes them (owner reference).
        assert await slices_of(k8s, driver, node)
        await delete_nodes(k8s, [node])

        async def collected() -> bool:
            return not await slices_of(k8s, driver, node)

        await wait_until(collected, timeout=60, what="garbage collection of the node's slices")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await SliceReconciler(k8s, node, driver, SimulatedDiscovery([])).delete_all()
        await delete_nodes(k8s, [node])


async def test_without_consumable_capacity_whole_gpus_are_published_and_shared_by_claims(
    tmp_path: Path,
) -> None:
    """A cluster with DRAConsumableCapacity off: detected, whole devices, time-slicing by a shared claim."""
    with LocalCluster(
        workdir=tmp_path / "cluster", feature_gates={"DRAConsumableCapacity": False}
    ) as cluster:
        api = await api_client(cluster.kubeconfig)
        try:
            node, driver = unique("t4"), f"{unique('gpu')}.tessera.dev"
            await create_fake_node(api, node)
            backend = SimulatedDiscovery.from_file(Path("t4x2"), node_name=node)
            reconciler = SliceReconciler(api, node, driver, backend)
            assert await reconciler.detect_sharing_mode() is SharingMode.WHOLE_DEVICE
            assert await reconciler.publish(backend.inventory())
            devices = devices_of(await slices_of(api, driver, node))
            assert sorted(devices) == ["gpu-0", "gpu-1"]
            assert all("allowMultipleAllocations" not in d for d in devices.values())

            for device_class in manifest_documents(MANIFESTS / "deviceclasses.yaml", driver):
                cluster.apply(device_class)
            cluster.kubectl("create", "namespace", "fallback")
            kube = Cluster(cluster, "fallback")
            examples = MANIFESTS / "examples"
            kube.apply(manifest_documents(examples / "timesliced-shared.yaml", driver))
            assert await kube.bound("notebook-a") == node
            assert await kube.bound("notebook-b") == node
            kube.apply(manifest_documents(examples / "whole-gpu.yaml", driver))
            assert await kube.bound("whole-gpu-trainer") == node
            # Both GPUs are taken: one by the shared claim, one by the whole-GPU claim.
            extra = manifest_documents(examples / "whole-gpu.yaml", driver)[1]
            extra["metadata"]["name"] = "one-too-many"
            kube.apply([extra])
            await wait_until(
                lambda: kube.unschedulable("one-too-many"), timeout=40, what="third GPU pod waits"
            )
        finally:
            await api.close()
