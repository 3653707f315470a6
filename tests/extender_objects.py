"""Kubernetes JSON builders for extender tests: nodes, GPU ResourceSlices, claims, pods, queues.

Unit tests feed these to ClusterPicture directly; integration tests create them on the real API
server, so they are valid resource.k8s.io/v1 and scheduling.tessera.dev/v1alpha1 objects.
"""

from __future__ import annotations

from typing import Any

from contract.names import DRIVER_NAME, QUEUE_GROUP, QUEUE_LABEL, QUEUE_VERSION

JsonObject = dict[str, Any]


def node(
    name: str,
    cpu: str = "64",
    memory: str = "512Gi",
    classic_gpus: int = 0,
    labels: dict[str, str] | None = None,
) -> JsonObject:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "250"}
    if classic_gpus:
        allocatable["nvidia.com/gpu"] = str(classic_gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def gpu_slice(
    node_name: str,
    gpus: int,
    model: str = "H100-80GB",
    memory: str = "80Gi",
    driver: str = DRIVER_NAME,
    name: str | None = None,
    shareable: bool = False,
) -> JsonObject:
    """One slice with `gpus` whole-GPU devices; `shareable` lets claims consume parts of their memory."""
    devices = []
    for minor in range(gpus):
        capacity: JsonObject = {"value": memory}
        device: JsonObject = {
            "name": f"gpu-{minor}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": model},
                "uuid": {"string": f"GPU-{node_name}-{minor}"},
            },
            "capacity": {"memory": capacity},
        }
        if shareable:
            device["allowMultipleAllocations"] = True
            capacity["requestPolicy"] = {"default": memory, "validRange": {"min": "1Gi", "step": "1Gi"}}
        devices.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(name: str, driver: str = DRIVER_NAME) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def claim_spec(
    device_class_name: str, count: int = 1, memory: str | None = None, model: str | None = None
) -> JsonObject:
    exactly: JsonObject = {
        "deviceClassName": device_class_name,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if model is not None:
        expression = f'device.attributes["{DRIVER_NAME}"].productName == "{model}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def claim_template(namespace: str, name: str, spec: JsonObject) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def claim(
    namespace: str,
    name: str,
    spec: JsonObject,
    allocated: list[tuple[str, str, str | None]] | None = None,
    driver: str = DRIVER_NAME,
) -> JsonObject:
    """A claim, allocated to (pool, device, consumed memory or None) entries when given."""
    obj: JsonObject = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    if allocated:
        results = []
        for pool, device, consumed in allocated:
            result: JsonObject = {"request": "gpus", "driver": driver, "pool": pool, "device": device}
            if consumed is not None:
                result["consumedCapacity"] = {"memory": consumed}
            results.append(result)
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def pod(
    namespace: str,
    name: str,
    queue: str | None = None,
    template: str | None = None,
    claim_name: str | None = None,
    node_name: str | None = None,
    cpu: str = "100m",
    scheduler: str = "default-scheduler",
    classic_gpus: int = 0,
    uid: str | None = None,
) -> JsonObject:
    """A pod with at most one claim, named directly or made from a template."""
    resources: JsonObject = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    if classic_gpus:
        resources["limits"] = {"nvidia.com/gpu": str(classic_gpus)}
    container: JsonObject = {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
    spec: JsonObject = {"schedulerName": scheduler, "containers": [container]}
    if template is not None or claim_name is not None:
        ref = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim_name}
        spec["resourceClaims"] = [{"name": "gpus", **ref}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    if node_name is not None:
        spec["nodeName"] = node_name
    metadata: JsonObject = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "labels": {QUEUE_LABEL: queue} if queue else {},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def queue(
    name: str,
    parent: str | None = None,
    priority: int = 0,
    resources: dict[str, dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    placement: str | None = None,
) -> JsonObject:
    """A Queue; `resources` is e.g. {"gpu": {"quota": 2, "limit": 4, "overQuotaWeight": 1}}."""
    spec: JsonObject = {"priority": priority, "resources": resources or {}}
    if parent is not None:
        spec["parent"] = parent
    if placement is not None:
        spec["placement"] = placement
    return {
        "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def open_crd(group: str, kind: str, plural: str) -> JsonObject:
    """A namespaced v1 CustomResourceDefinition with an open schema: a stand-in for another
    project's API (its operator not running) that lets the API server store its objects."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def two_nodes_of_two_gpus(class_name: str) -> list[JsonObject]:
    """Nodes a and b with 2 GPUs each, the GPU DeviceClass, and a one-GPU claim template `one` in
    namespace `ns`: the small cluster of the verb tests."""
    return [
        node("a"),
        node("b"),
        gpu_slice("a", 2),
        gpu_slice("b", 2),
        device_class(class_name),
        claim_template("ns", "one", claim_spec(class_name)),
    ]


def replica_set_owner(name: str) -> JsonObject:
    """The ownerReferences entry of a pod whose controller is the ReplicaSet `name` (uid
    `uid-<name>`)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": name,
        "uid": f"uid-{name}",
        "controller": True,
    }
