"""GPU demand from claims, templates and extended resources; CPU/memory requests of pods."""

from __future__ import annotations

from contract.kube import ClaimRef, pod_claim_refs
from extender.claims import (
    AllocatedDevice,
    GpuRequest,
    allocated_devices,
    claim_gpu_requests,
    device_class_gpu_models,
    fraction_milli,
    pod_classic_gpus,
    pod_resource_request,
    to_gpu_demand,
)
from extender.policy.placement import GpuDemand
from tests import extender_objects as objects

GIB = 2**30
GPU_CLASSES = {"gpu.tessera.dev": frozenset[str](), "h100.tessera.dev": frozenset({"H100-80GB"})}


def test_device_class_is_a_gpu_class_when_it_selects_a_gpu_driver() -> None:
    assert device_class_gpu_models(objects.device_class("c"), ["gpu.tessera.dev"]) == frozenset()
    nic = objects.device_class("c", driver="nic.example.com")
    assert device_class_gpu_models(nic, ["gpu.tessera.dev"]) is None
    pinned = objects.device_class("h100")
    pinned["spec"]["selectors"].append(
        {"cel": {"expression": 'device.attributes["gpu.tessera.dev"].productName == "H100-80GB"'}}
    )
    assert device_class_gpu_models(pinned, ["gpu.tessera.dev"]) == frozenset({"H100-80GB"})


def test_whole_gpu_requests_count_devices() -> None:
    spec = objects.claim_spec("gpu.tessera.dev", count=2)
    assert claim_gpu_requests(spec, GPU_CLASSES) == [GpuRequest(count=2)]


def test_fractional_request_carries_its_memory_and_model_from_class_and_selector() -> None:
    spec = objects.claim_spec("h100.tessera.dev", memory="20Gi")
    assert claim_gpu_requests(spec, GPU_CLASSES) == [
        GpuRequest(count=1, memory_bytes=20 * GIB, models=frozenset({"H100-80GB"}))
    ]
    spec = objects.claim_spec("gpu.tessera.dev", model="T4")
    assert claim_gpu_requests(spec, GPU_CLASSES)[0].models == frozenset({"T4"})


def test_requests_of_other_classes_and_first_available_lists() -> None:
    assert claim_gpu_requests(objects.claim_spec("nic.example.com"), GPU_CLASSES) == []
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "r",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.tessera.dev", "count": 4},
                        {"name": "small", "deviceClassName": "gpu.tessera.dev", "count": 1},
                    ],
                }
            ]
        }
    }
    assert claim_gpu_requests(spec, GPU_CLASSES) == [GpuRequest(count=4)]


def test_allocated_devices_with_consumed_memory() -> None:
    claim = objects.claim(
        "ns",
        "c",
        objects.claim_spec("gpu.tessera.dev"),
        allocated=[("node-a", "gpu-0", None), ("node-a", "gpu-1", "10Gi")],
    )
    assert allocated_devices(claim) == [
        AllocatedDevice("gpu.tessera.dev", "node-a", "gpu-0"),
        AllocatedDevice("gpu.tessera.dev", "node-a", "gpu-1", consumed_memory=10 * GIB),
    ]
    assert allocated_devices(objects.claim("ns", "c", {})) == []


def test_claim_refs_resolve_generated_claims_through_pod_status() -> None:
    pod = objects.pod("ns", "p", template="tpl")
    assert pod_claim_refs(pod) == [ClaimRef(claim=None, template="tpl")]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "p-gpus-x7"}]
    assert pod_claim_refs(pod) == [ClaimRef(claim="p-gpus-x7", template="tpl")]
    assert pod_claim_refs(objects.pod("ns", "q", claim_name="shared")) == [ClaimRef("shared", None)]


def test_pod_requests_take_the_larger_of_app_sum_and_init_containers() -> None:
    pod = objects.pod("ns", "p", cpu="500m")
    pod["spec"]["containers"].append({"name": "side", "resources": {"limits": {"cpu": "1"}}})
    assert pod_resource_request(pod, "cpu") == 1.5
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "2"}}}]
    assert pod_resource_request(pod, "cpu") == 2.0
    assert pod_resource_request(pod, "memory") == 64 * 2**20


def test_classic_extended_resource_gpus() -> None:
    assert pod_classic_gpus(objects.pod("ns", "p", classic_gpus=2)) == 2
    assert pod_classic_gpus(objects.pod("ns", "p")) == 0


def test_fraction_milli_rounds_up_and_stays_in_range() -> None:
    assert fraction_milli(20 * GIB, 80 * GIB) == 250
    assert fraction_milli(1, 80 * GIB) == 1
    assert fraction_milli(100 * GIB, 80 * GIB) == 1000
    assert fraction_milli(10 * GIB, 0) == 1000  # unknown device size: assume the whole device


def test_demand_folding() -> None:
    assert to_gpu_demand([], 0, 80 * GIB) is None
    assert to_gpu_demand([GpuRequest(count=2)], 1, 80 * GIB) == GpuDemand(count=3)
    fraction = GpuRequest(count=1, memory_bytes=20 * GIB, models=frozenset({"H100-80GB"}))
    assert to_gpu_demand([fraction], 0, 80 * GIB) == GpuDemand(
        count=1, milli=250, models=frozenset({"H100-80GB"})
    )
    # A fraction next to another request is reserved as a whole device.
    assert to_gpu_demand([fraction, GpuRequest(count=1)], 0, 80 * GIB) == GpuDemand(
        count=2, models=frozenset({"H100-80GB"})
    )
