"""ResourceSlice building for every shipped profile: attributes, capacities, taints, API limits, splitting."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contract.names import GPU_MILLI
from contract.quantity import parse_quantity
from dra_driver.devices.attributes import semver
from dra_driver.devices.model import Gpu
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.slices import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_TAINTED_SLICE,
    NodeRef,
    SharingMode,
    build_devices,
    build_slices,
    chunk_devices,
    memory_quantity,
    read_json,
    slice_name,
    taint_value,
)

DRIVER = "gpu.tessera.dev"
PROFILES = ["h100x8", "a100x4-mig", "t4x2", "mixed"]
GIB = 1 << 30
MIB = 1 << 20
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ATTRIBUTE_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def inventory(profile: str, node: str = "node-a") -> list[Gpu]:
    return SimulatedDiscovery.from_file(Path(profile), node_name=node).inventory()


def by_name(devices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", list(SharingMode))
def test_every_device_respects_api_limits(profile: str, mode: SharingMode) -> None:
    for device in build_devices(inventory(profile), DRIVER, mode):
        assert DNS_LABEL.match(device["name"]), device["name"]
        assert len(device["attributes"]) + len(device.get("capacity", {})) <= 32
        for name, value in device["attributes"].items():
            assert ATTRIBUTE_NAME.match(name), name
            ((kind, scalar),) = value.items()
            assert kind in {"int", "bool", "string", "version"}
            if kind in {"string", "version"}:
                assert len(scalar) <= 64
            if kind == "version":
                assert SEMVER.match(scalar), scalar


def test_h100_whole_gpu_attributes_and_consumable_capacities() -> None:
    devices = by_name(build_devices(inventory("h100x8"), DRIVER, SharingMode.CONSUMABLE_CAPACITY))
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(8))
    gpu = devices["gpu-2"]
    attrs = gpu["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["brand"] == {"string": "Nvidia"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "570.124.6"}
    assert attrs["cudaDriverVersion"] == {"version": "12.8.0"}
    assert attrs["index"] == {"int": 2} and attrs["minor"] == {"int": 2}
    assert attrs["uuid"]["string"].startswith("GPU-")
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:28:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}
    assert gpu["allowMultipleAllocations"] is True
    memory = gpu["capacity"]["memory"]
    # Quantities that read well in `kubectl describe resourceslice`, not raw bytes.
    assert memory["value"] == "80Gi"
    # A plain request takes the whole memory: the whole GPU. A 10Gi request takes a slice.
    assert memory["requestPolicy"]["default"] == "80Gi"
    assert memory["requestPolicy"]["validRange"] == {"min": "1Mi", "step": "1Mi"}
    compute = gpu["capacity"]["compute"]
    assert compute["value"] == str(GPU_MILLI)
    assert compute["requestPolicy"]["default"] == "0"
    assert compute["requestPolicy"]["validRange"]["max"] == str(GPU_MILLI)
    assert "taints" not in gpu


def test_whole_device_mode_has_no_sharing_fields() -> None:
    for device in build_devices(inventory("t4x2"), DRIVER, SharingMode.WHOLE_DEVICE):
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": "15Gi"}}


def test_t4_attributes_normalise_versions() -> None:
    gpu = build_devices(inventory("t4x2"), DRIVER, SharingMode.WHOLE_DEVICE)[1]
    assert gpu["attributes"]["architecture"] == {"string": "Turing"}
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "7.5.0"}
    # "535.104.05" has a leading zero, which semver forbids.
    assert gpu["attributes"]["driverVersion"] == {"version": "535.104.5"}


def test_mig_gpus_publish_their_instances_instead_of_the_parent() -> None:
    gpus = inventory("a100x4-mig")
    devices = by_name(build_devices(gpus, DRIVER, SharingMode.CONSUMABLE_CAPACITY))
    assert not any(name in devices for name in ("gpu-0", "gpu-1", "gpu-2", "gpu-3"))
    assert len(devices) == 2 + 2 + 5 + 5
    mig = devices["gpu-2-mig-3-0"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "1g.5gb"}
    assert mig["attributes"]["parentUUID"] == {"string": gpus[2].uuid}
    assert mig["attributes"]["uuid"] == {"string": gpus[2].mig_devices[2].uuid}
    assert mig["attributes"]["gpuInstance"] == {"int": 3}
    assert mig["capacity"] == {"memory": {"value": "4864Mi"}}
    assert "allowMultipleAllocations" not in mig


def test_mixed_node_has_whole_gpus_mig_instances_and_an_l4() -> None:
    devices = by_name(build_devices(inventory("mixed"), DRIVER, SharingMode.CONSUMABLE_CAPACITY))
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2-mig-1-0", "gpu-2-mig-2-0", "gpu-2-mig-3-0", "gpu-3"]
    l4 = devices["gpu-3"]
    assert l4["attributes"]["architecture"] == {"string": "Ada Lovelace"}
    assert l4["capacity"]["memory"]["value"] == "23034Mi"
    assert devices["gpu-0"]["capacity"]["memory"]["value"] == "80Gi"


@pytest.mark.parametrize("profile", PROFILES)
def test_one_slice_per_small_node_with_pool_and_owner(profile: str) -> None:
    slices = build_slices(
        NodeRef("node-a", "uid-1"), DRIVER, inventory(profile), SharingMode.CONSUMABLE_CAPACITY, 7
    )
    assert len(slices) == 1
    (resource_slice,) = slices
    assert resource_slice["apiVersion"] == "resource.k8s.io/v1"
    assert resource_slice["metadata"]["name"] == "node-a-gpu.tessera.dev-0"
    assert resource_slice["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]
    spec = resource_slice["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 1}
    assert spec["devices"] == build_devices(inventory(profile), DRIVER, SharingMode.CONSUMABLE_CAPACITY)


def test_no_owner_reference_without_node_uid() -> None:
    (resource_slice,) = build_slices(NodeRef("n"), DRIVER, inventory("t4x2"), SharingMode.WHOLE_DEVICE, 1)
    assert "ownerReferences" not in resource_slice["metadata"]


def test_node_without_gpus_publishes_an_empty_pool() -> None:
    (resource_slice,) = build_slices(NodeRef("n"), DRIVER, [], SharingMode.WHOLE_DEVICE, 1)
    assert resource_slice["spec"]["devices"] == []
    assert resource_slice["spec"]["pool"]["resourceSliceCount"] == 1


def test_unhealthy_gpu_gets_a_taint_with_a_label_safe_value() -> None:
    gpus = inventory("h100x8")
    gpus[5] = replace(gpus[5], healthy=False, health_message="XID 79: GPU has fallen off the bus")
    devices = by_name(build_devices(gpus, DRIVER, SharingMode.CONSUMABLE_CAPACITY))
    assert devices["gpu-5"]["taints"] == [
        {
            "key": "gpu.tessera.dev/unhealthy",
            "effect": "NoSchedule",
            "value": "XID-79-GPU-has-fallen-off-the-bus",
        }
    ]
    assert all("taints" not in d for name, d in devices.items() if name != "gpu-5")


def test_unhealthy_mig_parent_taints_every_instance_and_effect_is_configurable() -> None:
    gpus = inventory("a100x4-mig")
    gpus[0] = replace(gpus[0], healthy=False, health_message="")
    devices = build_devices(gpus, DRIVER, SharingMode.WHOLE_DEVICE, taint_effect="NoExecute")
    tainted = [d["name"] for d in devices if d.get("taints")]
    assert tainted == ["gpu-0-mig-1-0", "gpu-0-mig-2-0"]
    assert devices[0]["taints"] == [{"key": "gpu.tessera.dev/unhealthy", "effect": "NoExecute"}]


def synthetic_gpus(count: int) -> list[Gpu]:
    template = inventory("h100x8")[0]
    return [replace(template, minor=i, index=i, uuid=f"GPU-{i}") for i in range(count)]


def test_large_pool_is_split_at_128_devices() -> None:
    slices = build_slices(NodeRef("big"), DRIVER, synthetic_gpus(300), SharingMode.CONSUMABLE_CAPACITY, 3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert [s["metadata"]["name"] for s in slices] == [f"big-{DRIVER}-{i}" for i in range(3)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(300)]


def test_slices_holding_taints_are_limited_to_64_devices() -> None:
    gpus = synthetic_gpus(300)
    gpus[10] = replace(gpus[10], healthy=False, health_message="XID 48")
    slices = build_slices(NodeRef("big"), DRIVER, gpus, SharingMode.CONSUMABLE_CAPACITY, 3)
    sizes = [len(s["spec"]["devices"]) for s in slices]
    assert sum(sizes) == 300
    for resource_slice in slices:
        tainted = any(d.get("taints") for d in resource_slice["spec"]["devices"])
        limit = MAX_DEVICES_PER_TAINTED_SLICE if tainted else MAX_DEVICES_PER_SLICE
        assert len(resource_slice["spec"]["devices"]) <= limit
    assert sizes == [64, 128, 108]


def test_chunking_closes_a_large_untainted_chunk_before_a_tainted_device() -> None:
    devices: list[dict[str, Any]] = [{"name": f"d{i}"} for i in range(100)]
    devices.append({"name": "sick", "taints": [{"key": "k", "effect": "NoSchedule"}]})
    assert [len(chunk) for chunk in chunk_devices(devices)] == [100, 1]


def test_slice_names_stay_within_the_name_limit() -> None:
    long_node = "n" * 250
    name = slice_name(long_node, DRIVER, 2)
    assert len(name) <= 253 and name.endswith("-2")
    assert name != slice_name(long_node, "other.example.com", 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("9.0", "9.0.0"),
        ("12.4", "12.4.0"),
        ("535.104.05", "535.104.5"),
        ("570.124.06", "570.124.6"),
        ("8", "8.0.0"),
    ],
)
def test_semver(text: str, expected: str) -> None:
    assert semver(text) == expected


def test_taint_value_is_a_label_value() -> None:
    assert taint_value("  XID 79 (fell off the bus) ") == "XID-79-fell-off-the-bus"
    assert len(taint_value("x" * 200)) == 63
    assert taint_value("") == ""


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (80 * GIB, "80Gi"),
        (MIB, "1Mi"),
        (23034 * MIB, "23034Mi"),
        (GIB + MIB, "1025Mi"),
        (MIB + 1, str(MIB + 1)),
    ],
)
def test_memory_is_published_as_the_most_readable_exact_quantity(size: int, text: str) -> None:
    assert memory_quantity(size) == text
    assert parse_quantity(text) == size  # what the extender and the scheduler read back


async def test_an_api_call_that_never_answers_is_bounded() -> None:
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()  # an apiserver that hangs
    with pytest.raises(TimeoutError):
        await read_json(never, timeout_s=0.05)
