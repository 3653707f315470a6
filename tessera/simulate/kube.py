"""Trace nodes and pods as the Kubernetes objects a cluster would hold for them.

The end-to-end packing bench creates these objects on the real control plane, and the unit test of
identical inputs feeds them to the extender's picture: what the extender then builds for placement
must be what the simulator builds from the trace rows themselves.

* A node: a Node whose allocatable CPU and memory are the trace's (``cpu_milli`` m, ``memory_mib``
  Mi), and the ResourceSlices the DRA driver publishes for its GPUs (``dra_driver.slices``, with
  consumable capacity), each GPU a ``productName`` of the trace's model with ``GPU_MEMORY_MIB``.
* A pod: its CPU and memory requests, and for GPU pods a claim from a ResourceClaimTemplate per
  distinct GPU request: whole GPUs from the ``gpu.tessera.dev`` class by count, a fraction of m
  thousandths as a ``memory`` request of m x 16 MiB from ``fractional-gpu.tessera.dev`` (16 MiB is a
  thousandth of ``GPU_MEMORY_MIB`` and the driver's MiB step keeps it exact), a model list
  (``V100M16|V100M32``) as a CEL selector on ``productName``.
"""

from __future__ import annotations

from typing import Any

from contract.names import DRIVER_NAME, GPU_MILLI, MODEL_ATTRIBUTE
from dra_driver.profiles.nvidia.simulated import ProfileSpec, build_inventory
from dra_driver.slices import NodeRef, SharingMode, build_slices
from extender.policy.placement import GpuDemand

from .trace import SimNode

JsonObject = dict[str, Any]

GPU_MEMORY_MIB = 16 * GPU_MILLI  # 16000 MiB: a thousandth of a GPU is 16 MiB
WHOLE_CLASS = "gpu.tessera.dev"
FRACTION_CLASS = "fractional-gpu.tessera.dev"
CLAIM = "gpus"


def node_profile(node: SimNode) -> JsonObject:
    """The simulated driver's profile for the node's GPUs (``dra_driver.profiles.nvidia.simulated``)."""
    return {
        "description": f"{node.gpus}x {node.model} from the trace",
        "driverVersion": "535.104.05",
        "cudaDriverVersion": "12.2",
        "gpus": [
            {
                "count": node.gpus,
                "productName": node.model,
                "architecture": "Trace",
                "cudaComputeCapability": "8.0",
                "memory": f"{GPU_MEMORY_MIB}Mi",
            }
        ],
    }


def node_object(node: SimNode) -> JsonObject:
    allocatable = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "1000"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name}},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def node_slices(node: SimNode) -> list[JsonObject]:
    """The ResourceSlices the driver publishes for the node's GPUs (device ``gpu-<i>`` is GPU i)."""
    gpus = build_inventory(ProfileSpec.model_validate(node_profile(node)), node.name) if node.gpus else []
    return build_slices(NodeRef(node.name), DRIVER_NAME, gpus, SharingMode.CONSUMABLE_CAPACITY, 1)


def template_name(demand: GpuDemand) -> str:
    """One template per distinct GPU request (count, share, models)."""
    share = "whole" if demand.milli == GPU_MILLI else f"m{demand.milli}"
    models = "-".join(sorted(model.lower() for model in demand.models)) or "any"
    return f"gpu-{demand.count}-{share}-{models}"


def claim_template(namespace: str, demand: GpuDemand) -> JsonObject:
    exactly: JsonObject = {"deviceClassName": WHOLE_CLASS, "count": demand.count}
    if demand.milli < GPU_MILLI:
        exactly = {
            "deviceClassName": FRACTION_CLASS,
            "count": 1,
            "capacity": {"requests": {"memory": f"{demand.milli * GPU_MEMORY_MIB // GPU_MILLI}Mi"}},
        }
    if demand.models:
        attribute = f'device.attributes["{DRIVER_NAME}"].{MODEL_ATTRIBUTE}'
        expression = " || ".join(f'{attribute} == "{model}"' for model in sorted(demand.models))
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(demand), "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": CLAIM, "exactly": exactly}]}}},
    }


def pod_object(namespace: str, name: str, demand: GpuDemand, scheduler: str) -> JsonObject:
    """A pod asking for the demand's CPU, memory and (from its template) GPUs."""
    requests = {"cpu": f"{demand.cpu_milli}m", "memory": f"{demand.memory_mib}Mi"}
    container: JsonObject = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": requests},
    }
    spec: JsonObject = {"schedulerName": scheduler, "containers": [container]}
    if demand.count:
        spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template_name(demand)}]
        container["resources"]["claims"] = [{"name": CLAIM}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
