"""The driver process as a real kubelet sees it, on the real control plane.

The kubelet here is ``tests.kubelet``: a client built from the kubelet's own ``.proto`` files that
imports nothing from ``dra_driver``, following the v1.37 kubelet's rules (exact request-name
match, health timeout). The real scheduler allocates the claims; the driver is
``python -m dra_driver`` (simulated GPUs), killed and restarted like a DaemonSet pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api, ResourceV1Api

from dra_driver.checkpoint import Checkpoint
from dra_driver.config import DriverConfig
from tessera.dev.localcluster import LocalCluster, create_fake_node, delete_nodes, wait_until
from tessera.dev.nodeagent import node_driver_config
from tests.kubelet.client import ClaimRef, Kubelet, container_cdi_ids

from .test_dra_prepare import (
    SHIPPED_PROFILES,
    DriverProcess,
    Pods,
    device_classes,
    driver,
    h100_profile,
    short_dir,
    slices_published,
    unique,
)

__all__ = ["device_classes", "driver", "h100_profile", "short_dir"]  # fixtures used here


async def bound_claim(k8s: ApiClient, namespace: str, pod: str) -> ClaimRef:
    """The claim of ``pod`` once the scheduler has bound the pod (and so allocated the claim)."""
    core, resource = CoreV1Api(k8s), ResourceV1Api(k8s)

    async def allocated() -> ClaimRef | None:
        status: Any = (await core.read_namespaced_pod(pod, namespace)).status
        if not status.resource_claim_statuses:
            return None
        name = status.resource_claim_statuses[0].resource_claim_name
        claim: Any = await resource.read_namespaced_resource_claim(name, namespace)
        if claim.status is None or claim.status.allocation is None:
            return None
        return ClaimRef(namespace, claim.metadata.uid, name)

    return await wait_until(allocated, timeout=60, what=f"claim of {pod} allocated")


@contextlib.asynccontextmanager
async def node_with_driver(
    local_cluster: LocalCluster, k8s: ApiClient, short_dir: Path, profile: Path, driver: str
) -> AsyncIterator[tuple[DriverConfig, DriverProcess]]:
    node = unique("kv")
    config = node_driver_config(node, short_dir, profile, local_cluster.kubeconfig, driver)
    process = DriverProcess(config, short_dir / f"{node}.log")
    await create_fake_node(k8s, node)
    process.start()
    try:
        await wait_until(partial(slices_published, k8s, driver, node), timeout=60, what="slices")
        yield config, process
    finally:
        process.stop()
        await delete_nodes(k8s, [node])


def identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_ino, st.st_ctime_ns)  # inode numbers are reused


def registration_socket(config: DriverConfig) -> Path:
    return config.registry_dir / f"{config.driver_name}-reg.sock"


async def registered(config: DriverConfig) -> tuple[Kubelet, str]:
    """The kubelet's handshake, retried until the driver's registration socket answers."""
    kubelet = Kubelet(registration_socket(config))

    async def handshake() -> str | None:
        try:
            info = await kubelet.register()
        except Exception:  # not serving yet
            return None
        endpoint: str = info.endpoint
        return endpoint

    return kubelet, await wait_until(handshake, timeout=60, what="driver registration")


async def test_a_prioritized_list_claim_reaches_the_container_naming_its_request(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
    h100_profile: Path,
) -> None:
    async with node_with_driver(local_cluster, k8s, short_dir, h100_profile, driver) as (config, _):
        # firstAvailable: an A100 (none here), else an H100; the container names the request.
        request = {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "a100",
                    "deviceClassName": driver,
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.attributes["{driver}"].productName.startsWith("A100")'
                            }
                        }
                    ],
                },
                {"name": "h100", "deviceClassName": driver},
            ],
        }
        template: Any = {"metadata": {"name": "prio"}, "spec": {"spec": {"devices": {"requests": [request]}}}}
        await ResourceV1Api(k8s).create_namespaced_resource_claim_template(namespace, template)
        pod: Any = {
            "metadata": {"name": "prio"},
            "spec": {
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "prio"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/cuda",
                        "resources": {"claims": [{"name": "gpus", "request": "gpu"}]},
                    }
                ],
            },
        }
        await CoreV1Api(k8s).create_namespaced_pod(namespace, pod)
        ref = await bound_claim(k8s, namespace, "prio")
        allocation: Any = (
            await ResourceV1Api(k8s).read_namespaced_resource_claim(ref.name, namespace)
        ).status
        assert [r.request for r in allocation.allocation.devices.results] == ["gpu/h100"]

        kubelet, endpoint = await registered(config)
        prepared = (await kubelet.prepare(endpoint, [ref]))[ref.uid]
        assert prepared.error == ""
        assert [list(d.request_names) for d in prepared.devices] == [["gpu"]]
        assert container_cdi_ids(prepared, "gpu") == [f"k8s.{driver}/claim={ref.uid}-gpu-0"]
        assert await kubelet.unprepare(endpoint, [ref]) == {ref.uid: ""}


async def test_a_frozen_apiserver_stalls_no_unrelated_claim(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    profile = SHIPPED_PROFILES / "t4x2.yaml"
    pods = Pods(k8s, namespace)
    async with node_with_driver(local_cluster, k8s, short_dir, profile, driver) as (config, _):
        for name in ("first", "second"):
            await pods.create(name, driver)
        first, second = [await bound_claim(k8s, namespace, name) for name in ("first", "second")]
        kubelet, endpoint = await registered(config)
        assert (await kubelet.prepare(endpoint, [first]))[first.uid].error == ""
        (apiserver,) = [c for c in local_cluster.components if c.name == "kube-apiserver"]
        apiserver.process.send_signal(signal.SIGSTOP)
        try:
            # An unprepare needs no API call: it is answered while the apiserver is frozen...
            assert await kubelet.unprepare(endpoint, [first], timeout=5) == {first.uid: ""}
            # ...while a prepare that must read its claim fails after the bound, for that claim only.
            error = (await kubelet.prepare(endpoint, [second], timeout=30))[second.uid].error
            assert "no answer from the API server within 10 s" in error
        finally:
            apiserver.process.send_signal(signal.SIGCONT)
        assert (await kubelet.prepare(endpoint, [second]))[second.uid].error == ""  # the retry works
        assert await kubelet.unprepare(endpoint, [second]) == {second.uid: ""}


async def test_rolling_update_overlap_of_two_driver_processes(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
    h100_profile: Path,
) -> None:
    pods = Pods(k8s, namespace)
    async with node_with_driver(local_cluster, k8s, short_dir, h100_profile, driver) as (config, old):
        await pods.create("frac", f"fractional-{driver}", memory="20Gi")
        ref = await bound_claim(k8s, namespace, "frac")
        kubelet, endpoint = await registered(config)
        old_socket = identity(registration_socket(config))
        # The new DaemonSet pod starts while the old one runs: same node, same directories.
        new = DriverProcess(config, config.checkpoint_dir.parent / "new.log")
        new.start()
        try:

            async def new_one_waits() -> bool:
                return (
                    new.log_path.exists()
                    and "another instance of this driver holds" in new.log_path.read_text()
                )

            await wait_until(new_one_waits, timeout=60, what="the new driver waiting for the old one")
            # The old one still serves, from its own sockets; a prepare now must not be lost.
            prepared = (await kubelet.prepare(endpoint, [ref]))[ref.uid]
            assert prepared.error == ""
            assert identity(registration_socket(config)) == old_socket
            assert old.stop() == 0  # SIGTERM: graceful
            _, endpoint_now = await registered(config)  # the new one serves the same paths
            assert endpoint_now == endpoint
            assert identity(registration_socket(config)) != old_socket
            # It read the checkpoint after the old one let go: same answer, then a full unprepare.
            assert (await kubelet.prepare(endpoint, [ref]))[ref.uid] == prepared
            assert await kubelet.unprepare(endpoint, [ref]) == {ref.uid: ""}
            assert list(config.cdi_dir.iterdir()) == []
            assert new.commands()[-2][0] == "nvidia-cuda-mps-control"  # MPS stopped by the new one
        finally:
            assert new.stop() == 0
        assert not registration_socket(config).exists()
        assert not (config.plugin_dir / driver / "dra.sock").exists()


async def test_sigkills_during_a_batch_prepare_and_unprepare_lose_nothing(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    """24 fractions of 10Gi on an 8x H100 node prepared in one request, the driver SIGKILLed at
    several points and restarted, the kubelet retrying, as it does, until all are prepared; then
    the same for unprepare. The end states must be exact."""
    profile = SHIPPED_PROFILES / "h100x8.yaml"
    pods = Pods(k8s, namespace)
    async with node_with_driver(local_cluster, k8s, short_dir, profile, driver) as (config, process):
        names = [f"f-{n}" for n in range(24)]
        for name in names:
            await pods.create(name, f"fractional-{driver}", memory="10Gi")
        refs = [await bound_claim(k8s, namespace, name) for name in names]

        async def until_all(operation: str, kills: tuple[float, ...]) -> dict[str, Any]:
            for delay in (*kills, None):
                kubelet, endpoint = await registered(config)
                call = getattr(kubelet, operation)(endpoint, refs)
                if delay is None:
                    return dict(await call)
                attempt = asyncio.ensure_future(call)
                await asyncio.sleep(delay)
                process.kill()  # mid-request, or just after it
                with contextlib.suppress(Exception):
                    await attempt
                process.start()
            raise AssertionError("unreachable")

        prepared = await until_all("prepare", (0.05, 0.2, 0.5))
        assert {uid: entry.error for uid, entry in prepared.items()} == {r.uid: "" for r in refs}
        records = Checkpoint(config.checkpoint_dir).claims
        assert sorted(records) == sorted(r.uid for r in refs)
        assert {record.state for record in records.values()} == {"completed"}
        for ref in refs:
            spec = json.loads((config.cdi_dir / f"k8s.{driver}-claim_{ref.uid}.json").read_text())
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in spec["containerEdits"]["env"]
        used = {record.shares[0].gpu_uuid for record in records.values()}

        def compute_modes() -> dict[str, str]:
            """Each GPU's compute mode as the recorded commands left it."""
            modes: dict[str, str] = {}
            for command in process.commands():
                if command[0] == "nvidia-smi" and command[3:4] == ("-c",):
                    modes[command[2]] = command[4]
            return modes

        assert compute_modes() == dict.fromkeys(used, "EXCLUSIVE_PROCESS")
        assert sorted(p.name for p in config.cdi_dir.iterdir()) == sorted(
            f"k8s.{driver}-claim_{r.uid}.json" for r in refs
        )

        unprepared = await until_all("unprepare", (0.05, 0.3))
        assert unprepared == {r.uid: "" for r in refs}
        assert Checkpoint(config.checkpoint_dir).claims == {}
        assert list(config.cdi_dir.iterdir()) == []
        assert compute_modes() == dict.fromkeys(used, "DEFAULT")
