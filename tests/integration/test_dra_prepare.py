"""The kubelet-plugin half on the real control plane: the real scheduler allocates whole and
fractional GPUs from the driver's slices, the node agent prepares them over the real sockets,
the CDI specs carry the expected environment and limits, and killing the driver (between prepare
and unprepare, and in the middle of a prepare) loses nothing.

Each test uses its own driver name (the shipped DeviceClasses are applied with ``gpu.tessera.dev``
rewritten to it) and its own fake nodes, deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api, ResourceV1Api

from contract.names import DRIVER_NAME
from dra_driver.checkpoint import Checkpoint
from dra_driver.config import DriverConfig
from dra_driver.devices.share import Command
from dra_driver.plugin import RECOVERY_EVENT_REASON, SIMULATED_COMMAND_LOG, build_plugin, report_recovery
from dra_driver.prepare import ApiClaimReader
from dra_driver.profiles.nvidia.simulated import PROFILE_DIR
from dra_driver.profiles.registry import build_profile
from dra_driver.sharing import RecordingRunner
from dra_driver.slices import SliceReconciler
from tessera.dev.localcluster import LocalCluster, create_fake_node, delete_nodes, wait_until
from tessera.dev.nodeagent import KubeletStandIn, Registrar, node_driver_config, run_kubelet_stand_in

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
SHIPPED_PROFILES = PROFILE_DIR


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths must stay under 108 bytes; pytest's tmp_path can be too long for that.
    path = Path(tempfile.mkdtemp(prefix="tdp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def h100_profile(short_dir: Path) -> Path:
    """One H100 80GB: the shipped 8-GPU profile cut down to a single GPU."""
    profile = yaml.safe_load((SHIPPED_PROFILES / "h100x8.yaml").read_text())
    profile["gpus"][0]["count"] = 1
    path = short_dir / "h100x1.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


@pytest.fixture
def driver() -> str:
    return f"{unique('gpu')}.tessera.dev"


@pytest.fixture
def device_classes(local_cluster: LocalCluster, driver: str) -> Iterator[None]:
    # Rename the driver, not the GpuConfig API group (gpu.tessera.dev/v1alpha1 whatever the driver).
    shipped = (REPO / "manifests" / "deviceclasses.yaml").read_text()
    text = re.sub(re.escape(DRIVER_NAME) + "(?!/)", driver, shipped)
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(text) if doc]
    local_cluster.apply(text)
    yield
    local_cluster.kubectl("delete", "deviceclass", *names, "--ignore-not-found")


class ChildProcess:
    """A Python child process (a driver or the node agent), killable like a real DaemonSet pod."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *self.args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 15 s); the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.returncode != 0:
            sys.stderr.write(self.log_path.read_text()[-3000:])
        return self.proc.returncode


class DriverProcess(ChildProcess):
    """``python -m dra_driver`` for one fake node."""

    def __init__(self, config: DriverConfig, log_path: Path) -> None:
        c = config
        args = [
            "-m", "dra_driver",
            "--node-name", c.node_name, "--driver-name", c.driver_name,
            "--backend", "simulated", "--profile", str(c.profile), "--kubeconfig", str(c.kubeconfig),
            "--plugin-dir", str(c.plugin_dir), "--registry-dir", str(c.registry_dir),
            "--cdi-dir", str(c.cdi_dir), "--checkpoint-dir", str(c.checkpoint_dir),
        ]  # fmt: skip
        super().__init__(args, log_path)
        self.config = config

    def commands(self) -> list[tuple[str, ...]]:
        """The sharing commands the simulated backend recorded, across restarts."""
        path = self.config.checkpoint_dir / SIMULATED_COMMAND_LOG
        if not path.exists():
            return []
        return [tuple(json.loads(line)["argv"]) for line in path.read_text().splitlines()]


@dataclass
class SimNode:
    name: str
    config: DriverConfig
    stand_in: KubeletStandIn
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def kubelet(k8s: ApiClient, config: DriverConfig) -> AsyncIterator[SimNode]:
    """The node agent's kubelet stand-in for one node, running until the block ends."""
    config.registry_dir.mkdir(parents=True, exist_ok=True)
    stand_in = KubeletStandIn(k8s, config.node_name, Registrar(config.registry_dir))
    stop = asyncio.Event()
    task = asyncio.create_task(run_kubelet_stand_in(stand_in, stop, interval_s=0.3))
    try:
        yield SimNode(config.node_name, config, stand_in, stop)
    finally:
        stop.set()
        await task


class Pods:
    """Pods and their claims in one namespace, through the API."""

    def __init__(self, k8s: ApiClient, namespace: str) -> None:
        self.api = k8s
        self.core = CoreV1Api(k8s)
        self.resource = ResourceV1Api(k8s)
        self.namespace = namespace

    async def create(self, name: str, device_class: str, memory: str | None = None) -> None:
        """A pod with its own claim (from a template of the same name)."""
        request: dict[str, Any] = {"deviceClassName": device_class}
        if memory:
            request["capacity"] = {"requests": {"memory": memory}}
        template: Any = {
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
        }
        await self.resource.create_namespaced_resource_claim_template(self.namespace, template)
        await self._create_pod(name, {"name": "gpu", "resourceClaimTemplateName": name})

    async def create_shared(
        self, pod_names: list[str], claim_name: str, device_class: str, driver: str
    ) -> None:
        """Pods sharing one time-sliced ResourceClaim (interval Short, set in the claim's config)."""
        parameters = {
            "apiVersion": "gpu.tessera.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}},
        }
        claim: Any = {
            "metadata": {"name": claim_name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}],
                    "config": [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}],
                }
            },
        }
        await self.resource.create_namespaced_resource_claim(self.namespace, claim)
        for name in pod_names:
            await self._create_pod(name, {"name": "gpu", "resourceClaimName": claim_name})

    async def _create_pod(self, name: str, claim_ref: dict[str, str]) -> None:
        pod: Any = {
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [claim_ref],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/cuda",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
        await self.core.create_namespaced_pod(self.namespace, pod)

    async def get(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.api.sanitize_for_serialization(
            await self.core.read_namespaced_pod(name, self.namespace)
        )
        return pod

    async def running_on(self, name: str) -> str:
        async def running() -> str | None:
            pod = await self.get(name)
            node: str | None = pod["spec"].get("nodeName")
            return node if pod["status"].get("phase") == "Running" else None

        return await wait_until(running, timeout=60, what=f"pod {name} Running")

    async def unschedulable(self, name: str) -> bool:
        conditions = (await self.get(name))["status"].get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    async def claim_uid(self, pod_name: str) -> str:
        """The UID of the claim generated for the pod."""
        (status,) = (await self.get(pod_name))["status"]["resourceClaimStatuses"]
        return await self.uid_of_claim(status["resourceClaimName"])

    async def uid_of_claim(self, claim_name: str) -> str:
        claim = await self.resource.read_namespaced_resource_claim(claim_name, self.namespace)
        uid: str = claim.metadata.uid
        return uid

    async def delete(self, name: str) -> None:
        # A normal (graceful) delete: the kubelet stand-in unprepares and finishes it.
        await self.core.delete_namespaced_pod(name, self.namespace)

    async def gone(self, name: str) -> bool:
        listing = await self.core.list_namespaced_pod(self.namespace, field_selector=f"metadata.name={name}")
        return not listing.items


def cdi_env(config: DriverConfig, claim_uid: str) -> dict[str, str]:
    spec = json.loads((config.cdi_dir / f"k8s.{config.driver_name}-claim_{claim_uid}.json").read_text())
    return dict(item.split("=", 1) for item in spec["containerEdits"]["env"])


async def slices_published(k8s: ApiClient, driver: str, node: str) -> bool:
    listing = await ResourceV1Api(k8s).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={driver}"
    )
    # A pool may span several slices (MIG: the counters in one, the devices in another), written
    # one by one; it is published when every slice of its newest generation is there.
    pools = [item.spec.pool for item in listing.items]
    newest = {pool.name: pool.generation for pool in sorted(pools, key=lambda pool: pool.generation)}
    current = [pool for pool in pools if pool.generation == newest[pool.name]]
    return bool(current) and all(
        pool.resource_slice_count == sum(other.name == pool.name for other in current) for pool in current
    )


async def test_whole_and_fractional_gpus_are_prepared_and_survive_a_driver_kill(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
    h100_profile: Path,
) -> None:
    h100, t4 = unique("h100"), unique("t4")
    t4_profile = SHIPPED_PROFILES / "t4x2.yaml"
    configs = {
        name: node_driver_config(name, short_dir, profile, local_cluster.kubeconfig, driver)
        for name, profile in ((h100, h100_profile), (t4, t4_profile))
    }
    drivers = {name: DriverProcess(config, short_dir / f"{name}.log") for name, config in configs.items()}
    pods = Pods(k8s, namespace)
    try:
        for name, process in drivers.items():
            await create_fake_node(k8s, name)
            process.start()
        for name in drivers:
            published = partial(slices_published, k8s, driver, name)
            await wait_until(published, timeout=60, what=f"slices of {name}")
        async with kubelet(k8s, configs[h100]), kubelet(k8s, configs[t4]):
            # Two 40Gi fractions share the 80Gi H100 through MPS; a third waits.
            for name in ("half-0", "half-1"):
                await pods.create(name, f"fractional-{driver}", memory="40Gi")
                assert await pods.running_on(name) == h100
            await pods.create("half-2", f"fractional-{driver}", memory="40Gi")
            await wait_until(lambda: pods.unschedulable("half-2"), timeout=40, what="third fraction waits")

            halves = [await pods.claim_uid(n) for n in ("half-0", "half-1")]
            for claim_uid in halves:
                env = cdi_env(configs[h100], claim_uid)
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={40 * 1024}M"
                assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
                assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
                assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
            uuid_of_h100 = cdi_env(configs[h100], halves[0])["NVIDIA_VISIBLE_DEVICES"]
            assert drivers[h100].commands() == [
                ("nvidia-smi", "-i", uuid_of_h100, "-c", "EXCLUSIVE_PROCESS"),
                ("nvidia-cuda-mps-control", "-d"),
            ]

            # A plain claim takes a whole T4, exclusively: no MPS, no sharing command.
            await pods.create("whole", driver)
            assert await pods.running_on("whole") == t4
            whole_env = cdi_env(configs[t4], await pods.claim_uid("whole"))
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in whole_env
            assert drivers[t4].commands() == []

            # One time-sliced claim shared by two pods takes the other T4: prepared once, and the
            # GPU is reset only when the second pod goes.
            await pods.create_shared(["nb-a", "nb-b"], "shared", f"timesliced-{driver}", driver)
            for name in ("nb-a", "nb-b"):
                assert await pods.running_on(name) == t4
            shared_uid = await pods.uid_of_claim("shared")
            shared_spec = configs[t4].cdi_dir / f"k8s.{driver}-claim_{shared_uid}.json"
            t4_uuid = cdi_env(configs[t4], shared_uid)["NVIDIA_VISIBLE_DEVICES"]
            assert t4_uuid != whole_env["NVIDIA_VISIBLE_DEVICES"]
            timesliced = [
                ("nvidia-smi", "-i", t4_uuid, "-c", "DEFAULT"),
                ("nvidia-smi", "compute-policy", "-i", t4_uuid, "--set-timeslice", "1"),
            ]
            assert drivers[t4].commands() == timesliced
            await pods.delete("nb-a")
            await wait_until(partial(pods.gone, "nb-a"), timeout=60, what="nb-a deleted")
            assert shared_spec.exists() and drivers[t4].commands() == timesliced
            await pods.delete("nb-b")
            await wait_until(partial(pods.gone, "nb-b"), timeout=60, what="nb-b deleted")
            assert not shared_spec.exists()
            assert drivers[t4].commands()[2:] == [
                ("nvidia-smi", "compute-policy", "-i", t4_uuid, "--set-timeslice", "0")
            ]

            # Kill the H100 driver between prepare and unprepare; a new one takes over from the
            # checkpoint (the kubelet stand-in re-registers it when the socket is replaced).
            drivers[h100].kill()
            drivers[h100].start()
            await pods.delete("half-0")
            await wait_until(lambda: pods.gone("half-0"), timeout=60, what="half-0 unprepared and deleted")
            assert not (configs[h100].cdi_dir / f"k8s.{driver}-claim_{halves[0]}.json").exists()
            assert ("nvidia-cuda-mps-control",) not in drivers[h100].commands()  # half-1 still uses MPS

            # The freed 40Gi goes to the waiting pod; the last fraction's unprepare stops MPS.
            assert await pods.running_on("half-2") == h100
            for name in ("half-1", "half-2"):
                await pods.delete(name)
                await wait_until(partial(pods.gone, name), timeout=60, what=f"{name} deleted")
            assert drivers[h100].commands()[-2:] == [
                ("nvidia-cuda-mps-control",),
                ("nvidia-smi", "-i", uuid_of_h100, "-c", "DEFAULT"),
            ]
            assert list(configs[h100].cdi_dir.iterdir()) == []
            assert Checkpoint(configs[h100].checkpoint_dir).claims == {}
    finally:
        for process in drivers.values():
            process.stop()
        await delete_nodes(k8s, list(drivers))


class BlockingRunner(RecordingRunner):
    """Never finishes starting the MPS daemon: the driver is 'killed' while it waits."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = asyncio.Event()

    async def run(self, command: Command) -> str:
        await super().run(command)
        if command.argv == ("nvidia-cuda-mps-control", "-d"):
            self.blocked.set()
            await asyncio.Event().wait()
        return ""


async def test_driver_killed_mid_prepare_is_rolled_back_and_redone(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
    h100_profile: Path,
) -> None:
    node = unique("h100")
    config = node_driver_config(node, short_dir, h100_profile, local_cluster.kubeconfig, driver)
    profile = build_profile("simulated", h100_profile, node_name=node)
    backend = profile.discovery
    await create_fake_node(k8s, node)
    reconciler = SliceReconciler(k8s, node, driver, backend)

    def plugin_with(runner: RecordingRunner) -> Any:
        plugin, _ = build_plugin(
            driver_name=driver,
            node_name=node,
            profile=profile,
            gpus=backend.inventory(),
            claims=ApiClaimReader(k8s),
            runner=runner,
            plugin_dir=config.plugin_dir,
            registry_dir=config.registry_dir,
            cdi_dir=config.cdi_dir,
            checkpoint_dir=config.checkpoint_dir,
        )
        return plugin

    pods = Pods(k8s, namespace)
    try:
        await reconciler.publish(backend.inventory())
        blocking = BlockingRunner()
        first = plugin_with(blocking)
        await first.start()
        async with kubelet(k8s, config):
            await pods.create("frac", f"fractional-{driver}", memory="20Gi")
            await asyncio.wait_for(blocking.blocked.wait(), 60)
            claim_uid = await pods.claim_uid("frac")
            # The crash: the process goes away mid-prepare, leaving the claim "started" on disk.
            await first.stop(grace_s=0)
            record = Checkpoint(config.checkpoint_dir).get(claim_uid)
            assert record is not None and record.state == "started"

            runner = RecordingRunner()
            second = plugin_with(runner)
            await second.start()
            try:
                assert await pods.running_on("frac") == node
                gpu_uuid = backend.inventory()[0].uuid
                # Rolled back (MPS reset) and redone (MPS set up again), exactly once each.
                assert [c.argv for c in runner.commands] == [
                    ("nvidia-cuda-mps-control",),
                    ("nvidia-smi", "-i", gpu_uuid, "-c", "DEFAULT"),
                    ("nvidia-smi", "-i", gpu_uuid, "-c", "EXCLUSIVE_PROCESS"),
                    ("nvidia-cuda-mps-control", "-d"),
                ]
                env = cdi_env(config, claim_uid)
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
                assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
                completed = Checkpoint(config.checkpoint_dir).get(claim_uid)
                assert completed is not None and completed.state == "completed"
                await pods.delete("frac")
                await wait_until(lambda: pods.gone("frac"), timeout=60, what="frac unprepared and deleted")
                assert Checkpoint(config.checkpoint_dir).claims == {}
            finally:
                await second.stop(grace_s=0)
    finally:
        await reconciler.delete_all()
        await delete_nodes(k8s, [node])


async def test_a_damaged_newest_checkpoint_slot_loses_no_running_pod(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
    h100_profile: Path,
) -> None:
    """Pods a and b share the H100 over MPS (b joins a's daemon, so b's only record is the newest
    slot). The driver dies, that slot is cut in half, a new driver starts: b is recovered from its
    CDI spec, and deleting a's pod leaves the daemon up under b; deleting b's stops it."""
    node = unique("h100")
    config = node_driver_config(node, short_dir, h100_profile, local_cluster.kubeconfig, driver)
    profile = build_profile("simulated", h100_profile, node_name=node)
    backend = profile.discovery
    await create_fake_node(k8s, node)
    reconciler = SliceReconciler(k8s, node, driver, backend)

    def plugin_with(runner: RecordingRunner) -> Any:
        plugin, _ = build_plugin(
            driver_name=driver,
            node_name=node,
            profile=profile,
            gpus=backend.inventory(),
            claims=ApiClaimReader(k8s),
            runner=runner,
            plugin_dir=config.plugin_dir,
            registry_dir=config.registry_dir,
            cdi_dir=config.cdi_dir,
            checkpoint_dir=config.checkpoint_dir,
        )
        return plugin

    pods = Pods(k8s, namespace)
    try:
        await reconciler.publish(backend.inventory())
        first = plugin_with(RecordingRunner())
        await first.start()
        async with kubelet(k8s, config):
            await pods.create("a", f"fractional-{driver}", memory="20Gi")
            assert await pods.running_on("a") == node
            await pods.create("b", f"fractional-{driver}", memory="20Gi")
            assert await pods.running_on("b") == node
            b_uid = await pods.claim_uid("b")
            await first.stop(grace_s=0)  # the crash
            checkpoint = Checkpoint(config.checkpoint_dir)
            assert checkpoint.get(b_uid) is not None
            newest = checkpoint.path
            newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

            runner = RecordingRunner()
            second = plugin_with(runner)
            await second.start()
            try:
                spec = config.cdi_dir / f"k8s.{driver}-claim_{b_uid}.json"
                recovered = Checkpoint(config.checkpoint_dir).get(b_uid)
                assert recovered is not None and recovered.state == "completed" and spec.exists()
                # Reported on the node (serve_plugin posts this after a start that recovered).
                await report_recovery(k8s, node, driver, second.recovery)
                events = await CoreV1Api(k8s).list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node},reason={RECOVERY_EVENT_REASON}"
                )
                (event,) = events.items
                assert (
                    event.type == "Warning" and "1 claim(s) recovered from their CDI specs" in event.message
                )
                await pods.delete("a")
                await wait_until(lambda: pods.gone("a"), timeout=60, what="a unprepared and deleted")
                assert runner.commands == [] and spec.exists()  # b's pod keeps its MPS daemon
                await pods.delete("b")
                await wait_until(lambda: pods.gone("b"), timeout=60, what="b unprepared and deleted")
                gpu_uuid = backend.inventory()[0].uuid
                assert [c.argv for c in runner.commands] == [
                    ("nvidia-cuda-mps-control",),
                    ("nvidia-smi", "-i", gpu_uuid, "-c", "DEFAULT"),
                ]
                assert Checkpoint(config.checkpoint_dir).claims == {} and not spec.exists()
            finally:
                await second.stop(grace_s=0)
    finally:
        await reconciler.delete_all()
        await delete_nodes(k8s, [node])


async def test_node_agent_command_runs_fake_nodes_end_to_end(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    """``tessera-node-agent`` as a user runs it: creates its node, publishes, runs pods, cleans up."""
    node = unique("agent")
    t4_profile = SHIPPED_PROFILES / "t4x2.yaml"
    config = node_driver_config(node, short_dir, t4_profile, local_cluster.kubeconfig, driver)
    agent = ChildProcess(
        [
            "-m", "tessera.dev.nodeagent", "--kubeconfig", str(local_cluster.kubeconfig),
            "--profile", str(t4_profile), "--node-name", node, "--driver-name", driver,
            "--state-dir", str(short_dir), "--create-nodes",
        ],
        short_dir / "agent.log",
    )  # fmt: skip
    pods = Pods(k8s, namespace)
    agent.start()
    try:
        await wait_until(partial(slices_published, k8s, driver, node), timeout=60, what="agent's slices")
        await pods.create("whole", driver)
        assert await pods.running_on("whole") == node
        claim_uid = await pods.claim_uid("whole")
        assert cdi_env(config, claim_uid)["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        await pods.delete("whole")
        await wait_until(partial(pods.gone, "whole"), timeout=60, what="pod unprepared and deleted")
        assert list(config.cdi_dir.iterdir()) == []

        # A force-deleted pod never shows a graceful termination: its claim is unprepared anyway.
        await pods.create("forced", driver)
        assert await pods.running_on("forced") == node
        assert list(config.cdi_dir.iterdir()) != []
        await pods.core.delete_namespaced_pod("forced", namespace, grace_period_seconds=0)

        async def unprepared() -> bool:
            return list(config.cdi_dir.iterdir()) == []

        await wait_until(unprepared, timeout=30, what="the force-deleted pod's claim unprepared")
    finally:
        exit_code = agent.stop()
        await delete_nodes(k8s, [node])
    # SIGTERM is a graceful stop: the plugin's sockets are removed on the way out.
    assert exit_code == 0
    assert not (config.registry_dir / f"{driver}-reg.sock").exists()
