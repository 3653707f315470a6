"""A synthetic cluster picture for the benchmarks, as the Kubernetes JSON the extender watches.

``nodes`` nodes with 8 GPUs each, published as one ResourceSlice per node (shareable devices, so
fractional claims can consume part of a GPU's memory); ``pods`` pods bound to nodes, about 70% of
the GPUs held by GPU pods (two whole-GPU pods for every two half-GPU pods sharing one GPU), the
rest of the pods plain CPU pods; two queues; and the pending pod the scheduler asks about.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from contract.names import DRIVER_NAME, QUEUE_GROUP, QUEUE_LABEL, QUEUE_VERSION
from extender.kubeapi import JsonObject
from extender.picture.cluster import ClusterPicture
from extender.picture.store import Stored
from extender.picture.watcher import freeze_after_list

GPUS_PER_NODE = 8
GPU_MEMORY = "80Gi"
HALF_GPU_MEMORY = "40Gi"
DEVICE_CLASS = "gpu.tessera.dev"
NAMESPACE = "bench"
QUEUES = ("team-a", "team-b")
GPU_FILL = 0.7


def queue_tree(roots: int = 10, children: int = 9, leaves: int = 10) -> list[tuple[str, str | None]]:
    """(queue, parent) of a three-level tree: 10 x 9 x 10 = 900 leaves under 100 parents, 1000 queues."""
    tree: list[tuple[str, str | None]] = []
    for r in range(roots):
        tree.append((f"r{r}", None))
        for c in range(children):
            tree.append((f"r{r}-c{c}", f"r{r}"))
            tree.extend((f"r{r}-c{c}-l{leaf}", f"r{r}-c{c}") for leaf in range(leaves))
    return tree


def leaf_queues(tree: list[tuple[str, str | None]] | None) -> tuple[str, ...]:
    """The queues pods go to: the leaves of `tree`, or the two flat queues without one."""
    if tree is None:
        return QUEUES
    parents = {parent for _, parent in tree}
    return tuple(name for name, _ in tree if name not in parents)


def node_name(index: int) -> str:
    return f"bench-node-{index:05d}"


def node_object(index: int) -> JsonObject:
    """A Node as the API server returns it (labels, capacity, conditions): ~1.5 KB of JSON."""
    name = node_name(index)
    allocatable = {"cpu": "128", "memory": "1Ti", "pods": "250", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(1000 + index),
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": f"zone-{index % 3}",
                "node.kubernetes.io/instance-type": "gpu-8x-h100",
                "tessera.dev/simulated": "true",
            },
        },
        "spec": {"podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24"},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-11-30T09:00:00Z",
                    "lastTransitionTime": "2026-11-30T09:00:00Z",
                    "message": "kubelet is ready",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 256 % 256}.{index % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.37.2",
                "containerRuntimeVersion": "containerd://2.1.0",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
        },
    }


def slice_object(index: int) -> JsonObject:
    name = node_name(index)
    memory_policy = {"default": GPU_MEMORY, "validRange": {"min": "1Gi", "step": "1Gi"}}
    devices = [
        {
            "name": f"gpu-{minor}",
            "allowMultipleAllocations": True,
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "H100-80GB"},
                "uuid": {"string": f"GPU-{name}-{minor}"},
            },
            "capacity": {"memory": {"value": GPU_MEMORY, "requestPolicy": memory_policy}},
        }
        for minor in range(GPUS_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER_NAME}"},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim_spec(memory: str | None) -> JsonObject:
    exactly: JsonObject = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


_POD_VERSIONS = itertools.count(1)


def pod_object(
    name: str, queue: str, node: str | None, claim: str | None = None, template: str | None = None
) -> JsonObject:
    container: JsonObject = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
    }
    spec: JsonObject = {"schedulerName": "tessera", "containers": [container]}
    if claim or template:
        ref = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
        spec["resourceClaims"] = [{"name": "gpus", **ref}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": str(next(_POD_VERSIONS)),  # as every pod the API server serves has one
            "labels": {QUEUE_LABEL: queue, "app": "bench"},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def _claim_object(name: str, memory: str | None, pool: str, device: str) -> JsonObject:
    result: JsonObject = {"request": "gpus", "driver": DRIVER_NAME, "pool": pool, "device": device}
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": _claim_spec(memory),
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


@dataclass
class Picture:
    objects: dict[str, list[Stored]]  # JSON objects, or their projections (`load_picture`)
    node_names: list[str]
    pending_pods: dict[str, JsonObject]  # "whole" and "half": what the scheduler asks about

    def count(self) -> dict[str, int]:
        return {kind: len(items) for kind, items in self.objects.items()}


def build_picture(
    nodes: int,
    pods: int,
    seed: int = 0,
    fill: float = GPU_FILL,
    borrower: str | None = None,
    tree: list[tuple[str, str | None]] | None = None,
) -> Picture:
    """The picture; `fill` of the GPUs held, all by `borrower` when given (else by the queues in
    turn); the queues are team-a and team-b, or those of `tree` (pods in its leaves)."""
    rng = random.Random(seed)
    leaves = leaf_queues(tree)
    names = [node_name(i) for i in range(nodes)]
    pod_objs: list[Stored] = []
    claims: list[Stored] = []
    gpu_slots = [(name, f"gpu-{minor}") for name in names for minor in range(GPUS_PER_NODE)]
    rng.shuffle(gpu_slots)
    used = gpu_slots[: int(len(gpu_slots) * fill)]
    for i, (node, device) in enumerate(used):
        if len(pod_objs) >= pods:
            break
        shared = i % 3 == 2  # one GPU in three holds two half-GPU pods
        for part in range(2 if shared else 1):
            name = f"gpu-pod-{i:06d}-{part}"
            memory = HALF_GPU_MEMORY if shared else None
            claims.append(_claim_object(f"{name}-gpus", memory, node, device))
            pod_objs.append(pod_object(name, borrower or leaves[i % len(leaves)], node, claim=f"{name}-gpus"))
    for i in range(pods - len(pod_objs)):
        pod_objs.append(pod_object(f"cpu-pod-{i:06d}", leaves[i % len(leaves)], names[rng.randrange(nodes)]))
    templates: list[Stored] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": _claim_spec(memory)},
        }
        for name, memory in (("one-gpu", None), ("half-gpu", HALF_GPU_MEMORY))
    ]
    # Quotas: the GPUs split evenly between the queues of a level (children within their parent).
    layout = tree if tree is not None else [(q, None) for q in QUEUES]
    siblings: dict[str | None, int] = {}
    for _, parent in layout:
        siblings[parent] = siblings.get(parent, 0) + 1
    quota: dict[str | None, float] = {None: float(nodes * GPUS_PER_NODE)}
    for name, parent in layout:  # parents come before their children
        quota[name] = quota[parent] / siblings[parent]
    queues: list[Stored] = [
        {
            "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}",
            "kind": "Queue",
            "metadata": {"name": name, "annotations": {}},
            "spec": {
                **({"parent": parent} if parent else {}),
                "resources": {"gpu": {"quota": quota[name]}},
            },
        }
        for name, parent in layout
    ]
    selector = {"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [selector]},
    }
    return Picture(
        objects={
            "Node": [node_object(i) for i in range(nodes)],
            "ResourceSlice": [slice_object(i) for i in range(nodes)],
            "DeviceClass": [device_class],
            "ResourceClaimTemplate": templates,
            "ResourceClaim": claims,
            "Pod": pod_objs,
            "Queue": queues,
        },
        node_names=names,
        pending_pods={
            "whole": pod_object("pending-whole", leaves[0], None, template="one-gpu"),
            "half": pod_object("pending-half", leaves[-1], None, template="half-gpu"),
        },
    )


def load_picture(built: Picture, projected: bool = False) -> ClusterPicture:
    """A ClusterPicture holding the picture, synced as after the watcher's first list
    (`projected`: the objects are the store's projections already)."""
    picture = ClusterPicture()
    for kind in (
        "Namespace",
        "DeviceClass",
        "Node",
        "ResourceSlice",
        "ResourceClaimTemplate",
        "ResourceClaim",
        "Queue",
        "Job",
        "Pod",
    ):
        picture.replace(kind, built.objects.get(kind, []), projected)
    if not picture.ready():
        raise RuntimeError("the synthetic picture did not sync every watched kind")
    for label, pod in built.pending_pods.items():
        if picture.pod_demand(pod) is None:
            raise RuntimeError(f"the {label} pending pod has no GPU demand in the picture")
    freeze_after_list()
    return picture
