"""ResourceClaims, DeviceClass selectors and pods' container resources, read from plain Kubernetes
JSON: what a pod asks for and what a claim holds. Pure: no I/O.

GPU demand comes from DRA ResourceClaims (whole devices by count, fractions by the consumable
`memory` capacity they request relative to the device's) and from classic `nvidia.com/gpu`
extended resources for clusters still on the device plugin. A GPU model is recognised from the
`productName` attribute tested in a CEL selector (request or DeviceClass), e.g.
`device.attributes["gpu.tessera.dev"].productName == "H100-80GB"`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.kube import mapping, sequence
from contract.names import CLASSIC_GPU_RESOURCE, GPU_MILLI, MEMORY_CAPACITY, MODEL_ATTRIBUTE
from contract.quantity import parse_quantity
from extender.policy.placement import GpuDemand

_MODEL_IN_CEL = re.compile(MODEL_ATTRIBUTE + r"""\s*==\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class GpuRequest:
    """One GPU request of a claim: `count` devices, each whole or a `memory_bytes` slice of one."""

    count: int
    memory_bytes: int | None = None
    models: frozenset[str] = frozenset()


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of a claim's `status.allocation.devices.results`."""

    driver: str
    pool: str
    device: str
    consumed_memory: int | None = None


def models_in_selectors(selectors: object) -> frozenset[str]:
    """GPU models a list of CEL selectors pins the device to (empty: any model)."""
    found: set[str] = set()
    for selector in sequence(selectors):
        expression = mapping(mapping(selector).get("cel")).get("expression", "")
        found.update(_MODEL_IN_CEL.findall(str(expression)))
    return frozenset(found)


def device_class_gpu_models(
    device_class: Mapping[str, Any], gpu_drivers: Iterable[str]
) -> frozenset[str] | None:
    """None when the class does not select a GPU driver; else the models it pins (empty: any)."""
    selectors = mapping(device_class.get("spec")).get("selectors")
    expressions = " ".join(
        str(mapping(mapping(s).get("cel")).get("expression", "")) for s in sequence(selectors)
    )
    if not any(f'"{driver}"' in expressions or f"'{driver}'" in expressions for driver in gpu_drivers):
        return None
    return models_in_selectors(selectors)


def claim_gpu_requests(
    claim_spec: Mapping[str, Any], gpu_classes: Mapping[str, frozenset[str]]
) -> list[GpuRequest]:
    """GPU requests of a ResourceClaim spec (or a template's spec.spec).

    `gpu_classes` maps each GPU DeviceClass name to the models it pins. A prioritized list
    (`firstAvailable`) counts as its first, preferred alternative. `allocationMode: All` cannot be
    sized before allocation and counts as one device.
    """
    requests: list[GpuRequest] = []
    for request in sequence(mapping(claim_spec.get("devices")).get("requests")):
        request = mapping(request)
        alternatives = sequence(request.get("firstAvailable"))
        exact = mapping(request.get("exactly")) or (mapping(alternatives[0]) if alternatives else {})
        class_name = str(exact.get("deviceClassName", ""))
        if class_name not in gpu_classes:
            continue
        count = 1 if exact.get("allocationMode") == "All" else int(exact.get("count") or 1)
        memory_text = mapping(mapping(exact.get("capacity")).get("requests")).get(MEMORY_CAPACITY)
        memory = int(parse_quantity(memory_text)) if memory_text is not None else None
        models = gpu_classes[class_name] | models_in_selectors(exact.get("selectors"))
        requests.append(GpuRequest(count=max(count, 1), memory_bytes=memory, models=models))
    return requests


def allocated_devices(claim: Mapping[str, Any]) -> list[AllocatedDevice]:
    """Devices a claim's allocation holds (empty while unallocated)."""
    allocation = mapping(mapping(claim.get("status")).get("allocation"))
    devices: list[AllocatedDevice] = []
    for result in sequence(mapping(allocation.get("devices")).get("results")):
        result = mapping(result)
        consumed = mapping(result.get("consumedCapacity")).get(MEMORY_CAPACITY)
        devices.append(
            AllocatedDevice(
                driver=str(result.get("driver", "")),
                pool=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                consumed_memory=int(parse_quantity(consumed)) if consumed is not None else None,
            )
        )
    return devices


def _containers(pod: Mapping[str, Any], kind: str) -> Sequence[Mapping[str, Any]]:
    return [mapping(c) for c in sequence(mapping(pod.get("spec")).get(kind))]


def _container_request(container: Mapping[str, Any], resource: str) -> float:
    resources = mapping(container.get("resources"))
    value = mapping(resources.get("requests")).get(resource, mapping(resources.get("limits")).get(resource))
    return parse_quantity(value) if value is not None else 0.0


def pod_resource_request(pod: Mapping[str, Any], resource: str) -> float:
    """Effective request of a pod: max(sum over app containers, largest init container)."""
    app = sum(_container_request(c, resource) for c in _containers(pod, "containers"))
    init = max((_container_request(c, resource) for c in _containers(pod, "initContainers")), default=0.0)
    return max(app, init)


def pod_classic_gpus(pod: Mapping[str, Any]) -> int:
    """Whole GPUs asked through the device plugin's extended resource."""
    return int(pod_resource_request(pod, CLASSIC_GPU_RESOURCE))


def fraction_milli(memory_bytes: int, device_memory_bytes: int) -> int:
    """Thousandths of a device that `memory_bytes` of its memory are (rounded up, at most 1000)."""
    if device_memory_bytes <= 0:
        return GPU_MILLI
    return max(1, min(GPU_MILLI, math.ceil(GPU_MILLI * memory_bytes / device_memory_bytes)))


def to_gpu_demand(
    requests: Sequence[GpuRequest], classic_gpus: int, device_memory_bytes: int
) -> GpuDemand | None:
    """Fold a pod's GPU requests into one placement demand; None when the pod needs no GPU.

    A single fractional request becomes `count=1, milli<1000` relative to `device_memory_bytes`
    (the memory of the GPUs being considered). Fractions mixed with other GPU requests are
    counted as whole devices, which over-reserves but never over-commits.
    """
    total = classic_gpus + sum(r.count for r in requests)
    if total == 0:
        return None
    models: frozenset[str] = frozenset()
    for request in requests:
        if request.models:
            models = request.models if not models else models & request.models
    if classic_gpus == 0 and len(requests) == 1 and requests[0].count == 1 and requests[0].memory_bytes:
        milli = fraction_milli(requests[0].memory_bytes, device_memory_bytes)
        return GpuDemand(count=1, milli=milli, models=models)
    return GpuDemand(count=total, models=models)
