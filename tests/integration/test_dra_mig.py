"""Partitionable MIG on the real control plane: a simulated node with 2 H100 80GB in MIG mode
(``h100x2-mig``) publishes counter sets and placements that the apiserver accepts; the real
kube-scheduler allocates placements without overlap (the counters), a whole-GPU claim waits while
both GPUs hold a partition and takes the GPU freed; the kubelet's own client (``tests.kubelet``)
prepares and unprepares them over the driver's socket, and the simulated GPUs record the exact
``nvidia-smi mig`` commands.

The outcome is made unambiguous by pinning the partitions: the 1g claim selects GPU index 0, the
3g claim index 1, so after both no GPU is free for the whole-GPU claim.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api, ResourceV1Api

from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.share import Command
from dra_driver.profiles.nvidia.mig import SimulatedSmi
from dra_driver.profiles.nvidia.profile import SIMULATED_MIG_STATE
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery, build_inventory, load_profile
from dra_driver.sharing import RecordingRunner
from dra_driver.slices import SliceReconciler
from tessera.dev.localcluster import LocalCluster, api_client, create_fake_node, delete_nodes, wait_until
from tessera.dev.nodeagent import node_driver_config
from tests.kubelet.client import container_cdi_ids

from .test_dra_kubelet import bound_claim, node_with_driver, registered
from .test_dra_prepare import (
    SHIPPED_PROFILES,
    DriverProcess,
    Pods,
    device_classes,
    driver,
    kubelet,
    short_dir,
    slices_published,
    unique,
)

__all__ = ["device_classes", "driver", "short_dir"]  # fixtures used here

PROFILE = SHIPPED_PROFILES / "h100x2-mig.yaml"
# The shipped class's name names no driver (the fixture rewrites only its selector to this test's).
MIG_CLASS = "mig.tessera.dev"


def start(device: str) -> int:
    """The placement's first memory slice, from its name (``gpu-0-mig-1g-10gb-at-3`` -> 3)."""
    return int(device.rsplit("-", 1)[1])


async def create_pod(k8s: ApiClient, namespace: str, name: str, device_class: str, cel: str = "") -> None:
    request: dict[str, Any] = {"deviceClassName": device_class}
    if cel:
        request["selectors"] = [{"cel": {"expression": cel}}]
    template: Any = {
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }
    await ResourceV1Api(k8s).create_namespaced_resource_claim_template(namespace, template)
    pod: Any = {
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {"name": "main", "image": "registry.invalid/cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    await CoreV1Api(k8s).create_namespaced_pod(namespace, pod)


async def allocated_device(k8s: ApiClient, namespace: str, claim_name: str) -> str:
    claim: Any = await ResourceV1Api(k8s).read_namespaced_resource_claim(claim_name, namespace)
    (result,) = claim.status.allocation.devices.results
    device: str = result.device
    return device


def mig_commands(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [" ".join(json.loads(line)["argv"]) for line in lines]


def cdi_env(cdi_dir: Path, driver: str, claim_uid: str) -> dict[str, str]:
    spec = json.loads((cdi_dir / f"k8s.{driver}-claim_{claim_uid}.json").read_text())
    return dict(item.split("=", 1) for item in spec["containerEdits"]["env"])


async def test_the_scheduler_allocates_placements_without_overlap_and_the_kubelet_prepares_them(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    async with node_with_driver(local_cluster, k8s, short_dir, PROFILE, driver) as (config, process):
        node = config.node_name
        gpu0, gpu1 = (g.uuid for g in build_inventory(load_profile(PROFILE), seed=node))
        # The pool as the apiserver stored it: counters in their own slice, 2 x 18 devices.
        slices: Any = await ResourceV1Api(k8s).list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver}"
        )
        specs = sorted(
            (k8s.sanitize_for_serialization(s)["spec"] for s in slices.items), key=lambda s: "devices" in s
        )
        assert [len(s.get("sharedCounters", ())) for s in specs] == [2, 0]
        devices = {d["name"]: d for d in specs[1]["devices"]}
        assert len(devices) == 36
        assert devices["gpu-0-mig-3g-40gb-at-4"]["consumesCounters"] == [
            {
                "counterSet": "gpu-0",
                "counters": {
                    "compute-slices": {"value": "3"},
                    **{f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)},
                },
            }
        ]
        # A fraction (MPS) is not offered on a GPU whose partitions are made on demand: the
        # shipped fractional class leaves partitionable GPUs out, free as both are.
        pods = Pods(k8s, namespace)
        await pods.create("fraction", f"fractional-{driver}", memory="20Gi")
        await wait_until(lambda: pods.unschedulable("fraction"), timeout=40, what="no fraction of a MIG GPU")
        await CoreV1Api(k8s).delete_namespaced_pod("fraction", namespace, grace_period_seconds=0)
        attr = f'device.attributes["{driver}"]'
        await create_pod(
            k8s,
            namespace,
            "one-g",
            MIG_CLASS,
            f'{attr}.profile == "1g.10gb" && {attr}.index == 0',
        )
        await create_pod(
            k8s,
            namespace,
            "three-g",
            MIG_CLASS,
            f'{attr}.profile == "3g.40gb" && {attr}.index == 1',
        )
        one_g, three_g = [await bound_claim(k8s, namespace, name) for name in ("one-g", "three-g")]
        await create_pod(k8s, namespace, "whole", driver)
        await wait_until(lambda: pods.unschedulable("whole"), timeout=40, what="the whole GPU waits")
        one_g_device = await allocated_device(k8s, namespace, one_g.name)
        three_g_device = await allocated_device(k8s, namespace, three_g.name)
        assert one_g_device.startswith("gpu-0-mig-1g-10gb-at-")
        assert three_g_device.startswith("gpu-1-mig-3g-40gb-at-")

        # A second 1g on GPU 0 gets another placement: the counters keep the scheduler off the first.
        await create_pod(
            k8s,
            namespace,
            "one-g-b",
            MIG_CLASS,
            f'{attr}.profile == "1g.10gb" && {attr}.index == 0',
        )
        one_g_b = await bound_claim(k8s, namespace, "one-g-b")
        assert await allocated_device(k8s, namespace, one_g_b.name) not in (one_g_device,)

        kubelet, endpoint = await registered(config)
        prepared = await kubelet.prepare(endpoint, [one_g, three_g, one_g_b])
        assert {uid: p.error for uid, p in prepared.items()} == {
            one_g.uid: "",
            three_g.uid: "",
            one_g_b.uid: "",
        }
        assert container_cdi_ids(prepared[one_g.uid], "gpu") == [
            f"k8s.{driver}/claim={one_g.uid}-{one_g_device}"
        ]
        log = config.checkpoint_dir / "sharing-commands.jsonl"
        one_g_b_device = await allocated_device(k8s, namespace, one_g_b.name)
        assert mig_commands(log) == [
            f"nvidia-smi mig -i {gpu0} -lgi",  # each GPU's placements checked free, once
            f"nvidia-smi mig -i {gpu1} -lgi",
            f"nvidia-smi mig -i {gpu0} -cgi 19:{start(one_g_device)} -C",
            f"nvidia-smi mig -i {gpu1} -cgi 9:{start(three_g_device)} -C",
            f"nvidia-smi mig -i {gpu0} -cgi 19:{start(one_g_b_device)} -C",
        ]
        smi = SimulatedSmi(
            config.checkpoint_dir / SIMULATED_MIG_STATE,
            build_inventory(load_profile(PROFILE), seed=node),
            RecordingRunner().run,
        )
        assert cdi_env(config.cdi_dir, driver, one_g.uid)[
            "NVIDIA_VISIBLE_DEVICES"
        ] == await smi.instance_uuid(gpu0, 1, 0)

        # The 3g pod goes: the kubelet unprepares it (its instance destroyed), the claim is freed,
        # and the whole-GPU claim takes GPU 1, prepared as its 7g instance.
        assert await kubelet.unprepare(endpoint, [three_g]) == {three_g.uid: ""}
        await CoreV1Api(k8s).delete_namespaced_pod("three-g", namespace, grace_period_seconds=0)
        whole = await bound_claim(k8s, namespace, "whole")
        assert await allocated_device(k8s, namespace, whole.name) == "gpu-1"
        assert (await kubelet.prepare(endpoint, [whole]))[whole.uid].error == ""
        assert mig_commands(log)[5:] == [
            f"nvidia-smi mig -i {gpu1} -lgi",
            f"nvidia-smi mig -i {gpu1} -gi 1 -dci",
            f"nvidia-smi mig -i {gpu1} -gi 1 -dgi",
            f"nvidia-smi mig -i {gpu1} -lgi",
            f"nvidia-smi mig -i {gpu1} -cgi 0:0 -C",
        ]
        assert smi.instances() == {
            gpu0: {
                1: ("1g.10gb", start(one_g_device), [0]),
                2: ("1g.10gb", start(one_g_b_device), [0]),
            },
            gpu1: {1: ("7g.80gb", 0, [0])},
        }
        assert await kubelet.unprepare(endpoint, [one_g, one_g_b, whole]) == {
            one_g.uid: "",
            one_g_b.uid: "",
            whole.uid: "",
        }
        assert smi.instances() == {}
        assert process.proc is not None and process.proc.poll() is None


async def test_without_partitionable_devices_mig_gpus_publish_their_existing_instances(
    tmp_path: Path,
) -> None:
    """A cluster with DRAPartitionableDevices off: detected, and a GPU in MIG mode publishes the
    instances that exist (here, the shipped a100x4-mig node's), as before partitions on demand;
    the dynamic GPUs of h100x2-mig publish nothing, since none of theirs exists."""
    with LocalCluster(
        workdir=tmp_path / "cluster", feature_gates={"DRAPartitionableDevices": False}
    ) as cluster:
        api = await api_client(cluster.kubeconfig)
        try:
            for profile, expected in (("a100x4-mig", 14), ("h100x2-mig", 0)):
                node, driver = unique("mig"), f"{unique('gpu')}.tessera.dev"
                await create_fake_node(api, node)
                backend = SimulatedDiscovery.from_file(Path(profile), node_name=node)
                reconciler = SliceReconciler(api, node, driver, backend)
                assert await reconciler.detect_partitionable() is False
                assert await reconciler.publish(backend.inventory())
                listed: Any = await ResourceV1Api(api).list_resource_slice(
                    field_selector=f"spec.nodeName={node},spec.driver={driver}"
                )
                specs = [api.sanitize_for_serialization(s)["spec"] for s in listed.items]
                assert all("sharedCounters" not in spec for spec in specs)
                devices = [d for spec in specs for d in spec.get("devices") or ()]
                # a100x4-mig: 2 x (2 x 3g.20gb) + 2 x (2 x 2g.10gb + 3 x 1g.5gb) = 14 MIG devices
                assert len(devices) == expected
                assert all("consumesCounters" not in d for d in devices)
        finally:
            await api.close()


async def test_the_node_agent_runs_a_mig_pod_and_its_deletion_destroys_the_instance(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    """The simulated node agent's kubelet stand-in (what the demo and scale tests run): a 2g pod
    is prepared and Running; deleting it unprepares the claim and the GPU holds no instance."""
    async with node_with_driver(local_cluster, k8s, short_dir, PROFILE, driver) as (config, _):
        node = config.node_name
        smi = SimulatedSmi(
            config.checkpoint_dir / SIMULATED_MIG_STATE,
            build_inventory(load_profile(PROFILE), seed=node),
            RecordingRunner().run,
        )
        async with kubelet(k8s, config):
            attr = f'device.attributes["{driver}"]'
            await create_pod(k8s, namespace, "two-g", MIG_CLASS, f'{attr}.profile == "2g.20gb"')
            pods = Pods(k8s, namespace)
            assert await pods.running_on("two-g") == node
            (gpu_uuid,) = smi.instances()
            assert [(p, s) for p, s, _ in smi.instances()[gpu_uuid].values()] == [("2g.20gb", 0)]
            await pods.delete("two-g")
            await wait_until(lambda: pods.gone("two-g"), timeout=60, what="pod two-g gone")
            assert smi.instances() == {}


async def test_a_driver_killed_between_making_an_instance_and_recording_it_leaves_no_orphan(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    """The driver process is SIGKILLed while `nvidia-smi mig -cgi` has made the instance and not
    yet returned (the simulated command takes 3 s to return after its change), so the checkpoint
    says `started` with no instance id. The restarted driver destroys the instance at its
    placement before serving, and the node agent's retry makes it again: one instance, never two."""
    profile = yaml.safe_load(PROFILE.read_text())
    profile["migCommandSeconds"] = 3
    slow = short_dir / "h100x2-mig-slow.yaml"
    slow.write_text(yaml.safe_dump(profile))
    node = unique("migcrash")
    config = node_driver_config(node, short_dir, slow, local_cluster.kubeconfig, driver)
    gpus = build_inventory(load_profile(slow), seed=node)
    smi = SimulatedSmi(config.checkpoint_dir / SIMULATED_MIG_STATE, gpus, RecordingRunner().run)
    log = config.checkpoint_dir / "sharing-commands.jsonl"
    first = DriverProcess(config, short_dir / f"{node}.log")
    second = DriverProcess(config, short_dir / f"{node}-2.log")
    await create_fake_node(k8s, node)
    first.start()
    try:
        await wait_until(partial(slices_published, k8s, driver, node), timeout=60, what="slices")
        async with kubelet(k8s, config):
            attr = f'device.attributes["{driver}"]'
            await create_pod(
                k8s, namespace, "one-g", MIG_CLASS, f'{attr}.profile == "1g.10gb" && {attr}.index == 0'
            )

            async def made() -> bool:
                return bool(smi.instances())

            await wait_until(made, timeout=60, what="the instance made")
            first.kill()
            ((gpu_uuid, instances),) = smi.instances().items()
            assert list(instances.values()) == [("1g.10gb", 0, [0])]  # made by the killed driver
            (record,) = Checkpoint(config.checkpoint_dir).claims.values()
            assert record.state == "started" and record.shares[0].partition is not None
            assert record.shares[0].partition.gpu_instance is None  # its id was never recorded

            second.start()
            pods = Pods(k8s, namespace)
            assert await pods.running_on("one-g") == node
            assert mig_commands(log) == [
                f"nvidia-smi mig -i {gpu_uuid} -lgi",  # the killed driver's: slice 0 free...
                f"nvidia-smi mig -i {gpu_uuid} -cgi 19:0 -C",  # ...and made there
                f"nvidia-smi mig -i {gpu_uuid} -lgi",  # recover(): found at its placement...
                f"nvidia-smi mig -i {gpu_uuid} -gi 1 -dci",
                f"nvidia-smi mig -i {gpu_uuid} -gi 1 -dgi",  # ...and destroyed
                f"nvidia-smi mig -i {gpu_uuid} -lgi",  # the retry
                f"nvidia-smi mig -i {gpu_uuid} -cgi 19:0 -C",
            ]
            assert smi.instances() == {gpu_uuid: {1: ("1g.10gb", 0, [0])}}  # one, not two
            # The restarted driver's first publish comes after its recovery: the slices are
            # built on the checkpoint it leaves (the driver's own instances told by it).
            restarted_log = short_dir / f"{node}-2.log"

            async def published_again() -> list[str] | None:
                lines = restarted_log.read_text().splitlines()
                return lines if any("published pool" in line for line in lines) else None

            lines = await wait_until(published_again, timeout=30, what="the restarted driver's publish")
            rolled_back = next(i for i, line in enumerate(lines) if "rolled back 1 claim(s)" in line)
            assert rolled_back < next(i for i, line in enumerate(lines) if "published pool" in line)
            await pods.delete("one-g")
            await wait_until(lambda: pods.gone("one-g"), timeout=60, what="pod one-g gone")
            assert smi.instances() == {}
    finally:
        second.stop()
        if first.proc is not None and first.proc.poll() is None:
            first.kill()
        await delete_nodes(k8s, [node])


ADMIN_PROFILE = """driverVersion: '550.54.15'
cudaDriverVersion: '12.4'
gpus:
  - {productName: NVIDIA H100 80GB HBM3, architecture: Hopper, cudaComputeCapability: '9.0', memory: 80Gi,
     mig: dynamic, madeByAdmin: [{profile: 3g.40gb, start: 4}]}
  - {productName: NVIDIA H100 80GB HBM3, architecture: Hopper, cudaComputeCapability: '9.0', memory: 80Gi,
     mig: dynamic}
"""


async def test_an_instance_an_administrator_made_is_published_allocated_and_left_alone(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,
    device_classes: None,
    short_dir: Path,
) -> None:
    """GPU 0 holds a 3g.40gb at memory slices 4-7 made by hand: the apiserver stores it as a
    device consuming those counters, with only the 10 placements clear of it beside it; the real
    scheduler hands one claim the instance and another the 3g placement at 0, and the kubelet's
    prepare and unprepare of both make and destroy only the second."""
    profile = short_dir / "h100x2-admin.yaml"
    profile.write_text(ADMIN_PROFILE)
    async with node_with_driver(local_cluster, k8s, short_dir, profile, driver) as (config, _process):
        node = config.node_name
        gpus = build_inventory(load_profile(profile), seed=node)
        gpu0 = gpus[0].uuid
        slices: Any = await ResourceV1Api(k8s).list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver}"
        )
        devices = {
            d["name"]: d
            for s in slices.items
            for d in k8s.sanitize_for_serialization(s)["spec"].get("devices") or ()
        }
        on_gpu0 = {name for name in devices if name.startswith("gpu-0")}
        # 10 placements clear of slices 4-7 (1g.10gb at 0-3, 1g.20gb and 2g.20gb at 0 and 2, 3g
        # and 4g at 0) and the instance; 18 on GPU 1.
        assert len(on_gpu0) == 11 and "gpu-0" not in on_gpu0 and "gpu-0-mig-1-0" in on_gpu0
        assert len(devices) - len(on_gpu0) == 18
        assert devices["gpu-0-mig-1-0"]["consumesCounters"][0]["counters"] == {
            "compute-slices": {"value": "3"},
            **{f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)},
        }
        attr = f'device.attributes["{driver}"]'
        pinned = f'{attr}.profile == "3g.40gb" && {attr}.index == 0 && {attr}.placementStart =='
        await create_pod(k8s, namespace, "admins", MIG_CLASS, f"{pinned} 4")
        await create_pod(k8s, namespace, "made", MIG_CLASS, f"{pinned} 0")
        admins, made = [await bound_claim(k8s, namespace, name) for name in ("admins", "made")]
        assert await allocated_device(k8s, namespace, admins.name) == "gpu-0-mig-1-0"
        assert await allocated_device(k8s, namespace, made.name) == "gpu-0-mig-3g-40gb-at-0"
        kubelet, endpoint = await registered(config)
        prepared = await kubelet.prepare(endpoint, [admins, made])
        assert {uid: p.error for uid, p in prepared.items()} == {admins.uid: "", made.uid: ""}
        assert (
            cdi_env(config.cdi_dir, driver, admins.uid)["NVIDIA_VISIBLE_DEVICES"]
            == gpus[0].mig_devices[0].uuid
        )
        log = config.checkpoint_dir / "sharing-commands.jsonl"
        assert mig_commands(log) == [
            f"nvidia-smi mig -i {gpu0} -lgi",
            f"nvidia-smi mig -i {gpu0} -cgi 9:0 -C",
        ]
        assert await kubelet.unprepare(endpoint, [admins, made]) == {admins.uid: "", made.uid: ""}
        assert mig_commands(log)[2:] == [
            f"nvidia-smi mig -i {gpu0} -lgi",
            f"nvidia-smi mig -i {gpu0} -gi 2 -dci",
            f"nvidia-smi mig -i {gpu0} -gi 2 -dgi",
        ]
        smi = SimulatedSmi(config.checkpoint_dir / SIMULATED_MIG_STATE, gpus, RecordingRunner().run)
        assert smi.instances() == {gpu0: {1: ("3g.40gb", 4, [0])}}


async def test_an_instance_an_admin_makes_after_the_start_is_published_within_seconds(
    local_cluster: LocalCluster, k8s: ApiClient, driver: str, short_dir: Path
) -> None:
    """The driver is up and its slices published; an administrator makes a 3g.40gb at memory
    slices 4-7 of GPU 0 with the simulated GPUs' nvidia-smi (another process's, on the driver's
    state file). The apiserver's slices show it as gpu-0-mig-1-0 within seconds (discovery lists
    the instances every 2 s), and the 8 placements overlapping slices 4-7 (1g.10gb at 4, 5, 6,
    1g.20gb at 4 and 6, 2g.20gb at 4, 3g.40gb at 4) and the whole GPU are withdrawn: 18 - 8 + 1 =
    11 devices on GPU 0. Destroyed, the 18 placements are back."""
    async with node_with_driver(local_cluster, k8s, short_dir, PROFILE, driver) as (config, process):
        node = config.node_name
        gpus = build_inventory(load_profile(PROFILE), seed=node)
        admin = SimulatedSmi(config.checkpoint_dir / SIMULATED_MIG_STATE, gpus, RecordingRunner().run)

        async def on_gpu0() -> set[str]:
            listed: Any = await ResourceV1Api(k8s).list_resource_slice(
                field_selector=f"spec.nodeName={node},spec.driver={driver}"
            )
            specs = [k8s.sanitize_for_serialization(s)["spec"] for s in listed.items]
            return {
                d["name"]
                for spec in specs
                for d in spec.get("devices") or ()
                if d["name"].startswith("gpu-0")
            }

        async def showing(wanted: Callable[[set[str]], bool]) -> bool:
            return await slices_published(k8s, driver, node) and wanted(await on_gpu0())

        before = await on_gpu0()
        assert len(before) == 18 and "gpu-0-mig-1-0" not in before
        await admin.run(Command(("nvidia-smi", "mig", "-i", gpus[0].uuid, "-cgi", "9:4", "-C")))
        await wait_until(
            partial(showing, lambda names: "gpu-0-mig-1-0" in names),
            timeout=10,
            what="the admin's instance published",
        )
        overlapping = {f"gpu-0-mig-1g-10gb-at-{s}" for s in (4, 5, 6)} | {
            "gpu-0-mig-1g-20gb-at-4",
            "gpu-0-mig-1g-20gb-at-6",
            "gpu-0-mig-2g-20gb-at-4",
            "gpu-0-mig-3g-40gb-at-4",
            "gpu-0",
        }
        assert await on_gpu0() == (before - overlapping) | {"gpu-0-mig-1-0"}
        await admin.run(Command(("nvidia-smi", "mig", "-i", gpus[0].uuid, "-gi", "1", "-dci")))
        await admin.run(Command(("nvidia-smi", "mig", "-i", gpus[0].uuid, "-gi", "1", "-dgi")))
        await wait_until(
            partial(showing, lambda names: names == before), timeout=10, what="the placements back"
        )
        assert process.proc is not None and process.proc.poll() is None
