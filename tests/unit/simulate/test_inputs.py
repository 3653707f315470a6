"""The extender and the simulator build identical placement inputs from the same pods and nodes.

Trace rows become the simulator's nodes and demands; the same rows rendered as Kubernetes objects
(``tessera.simulate.kube``: Nodes, the driver's ResourceSlices, templates, bound pods with their
allocated claims) become the extender's picture. Node supply (free GPU shares, CPU, memory), pod
demand (GPUs, CPU, memory; GPU-less pods too) and the workload mix must come out equal.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from contract.names import DRIVER_NAME, GPU_MILLI
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.placement import GpuDemand, NodeGpus, placement_demand, rounded_mix, score_nodes
from tessera.simulate.cluster import Cluster
from tessera.simulate.kube import (
    CLAIM,
    GPU_MEMORY_MIB,
    claim_template,
    node_object,
    node_slices,
    pod_object,
)
from tessera.simulate.trace import SimNode, SimPod

REPO = Path(__file__).resolve().parents[3]

# Two trace node shapes (cpu milli, memory MiB as in openb_node_list_gpu_node.csv).
NODES = [SimNode("node-a", "V100M16", 2, 32_000, 131_072), SimNode("node-b", "T4", 1, 16_000, 65_536)]
V100S = frozenset({"V100M16", "V100M32"})
# name, demand, (node index, GPUs) where it runs, or None: pending.
PODS: list[tuple[str, GpuDemand, tuple[int, tuple[int, ...]] | None]] = [
    ("whole", placement_demand(GpuDemand(1, models=V100S), 8_000, 16_384), (0, (1,))),
    ("quarter", placement_demand(GpuDemand(1, 250), 4_000, 8_192), (0, (0,))),
    ("slice", placement_demand(GpuDemand(1, 600), 2_000, 2_048), (1, (0,))),
    ("web", placement_demand(None, 2_500, 4_096), (1, ())),
    ("batch", placement_demand(None, 2_500, 4_096), (0, ())),
    ("waiting", placement_demand(GpuDemand(2), 16_000, 32_768), None),
]


def _cluster_objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [
        *yaml.safe_load_all((REPO / "manifests" / "deviceclasses.yaml").read_text())
    ]
    for node in NODES:
        objects += [node_object(node), *node_slices(node)]
    for name, demand, placed in PODS:
        pod = pod_object("ns", name, demand, "tessera")
        pod["metadata"]["uid"] = f"uid-{name}"
        if demand.count:
            objects.append(claim_template("ns", demand))
        if placed is not None:
            index, gpus = placed
            pod["spec"]["nodeName"] = NODES[index].name
            pod["status"] = {"phase": "Running"}
            if demand.count:
                claim = f"{name}-{CLAIM}"
                pod["status"]["resourceClaimStatuses"] = [{"name": CLAIM, "resourceClaimName": claim}]
                # What the DRA allocator writes: the device and the memory it consumes (all of it
                # for a whole GPU, the request policy's default).
                consumed = f"{demand.milli * GPU_MEMORY_MIB // GPU_MILLI}Mi"
                results = [
                    {
                        "request": CLAIM,
                        "driver": DRIVER_NAME,
                        "pool": NODES[index].name,
                        "device": f"gpu-{gpu}",
                        "consumedCapacity": {"memory": consumed},
                    }
                    for gpu in gpus
                ]
                template = claim_template("ns", demand)
                objects.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {"name": claim, "namespace": "ns"},
                        "spec": template["spec"]["spec"],
                        "status": {"allocation": {"devices": {"results": results}}},
                    }
                )
        objects.append(pod)
    return objects


def _picture() -> ClusterPicture:
    picture = ClusterPicture()
    objects = _cluster_objects()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [obj for obj in objects if obj.get("kind") == kind])
    return picture


def _simulated() -> Cluster:
    pods = [SimPod(name, demand) for name, demand, _ in PODS]
    cluster = Cluster(NODES, rounded_mix(Counter(pod.demand for pod in pods)))
    for _, demand, placed in PODS:
        if placed is not None:
            cluster.place(placed[0], demand, placed[1])
    return cluster


def test_extender_and_simulator_build_identical_node_supply() -> None:
    picture, cluster = _picture(), _simulated()
    live = [picture.node_gpus(node.name) for node in NODES]
    simulated = [cluster.node_gpus(index) for index in range(len(NODES))]
    assert live == simulated
    # node-a: GPU 0 has 1000 - 250 left, GPU 1 is taken; CPU 32000 - 8000 - 4000 - 2500 = 17500 m,
    # memory 131072 - 16384 - 8192 - 4096 = 102400 Mi. node-b: 1000 - 600 = 400 on its T4,
    # CPU 16000 - 2000 - 2500 = 11500 m, memory 65536 - 2048 - 4096 = 59392 Mi.
    assert live == [
        NodeGpus("node-a", "V100M16", (750, 0), 17_500, 102_400, host_tracked=True),
        NodeGpus("node-b", "T4", (400,), 11_500, 59_392, host_tracked=True),
    ]


def test_extender_and_simulator_build_identical_pod_demands_and_mix() -> None:
    picture = _picture()
    pods = {obj["metadata"]["name"]: obj for obj in picture.kind("Pod").values()}
    for name, demand, _ in PODS:
        parsed = picture.demand(pods[name])
        # Fractions are sized against the largest GPU the pod could land on, as in the filter.
        assert parsed.placement_at(picture.reference_memory(parsed.models)) == demand, name
    # The mix: every pod seen (GPU-less and pending ones too), by count (rounded to two digits).
    assert picture.fairness().mix == rounded_mix(Counter(demand for _, demand, _ in PODS))


def test_extender_ranks_a_gpu_less_pod_as_the_simulator_does() -> None:
    picture, cluster = _picture(), _simulated()
    web = next(demand for name, demand, _ in PODS if name == "web")
    supplies = [picture.node_gpus(node.name) for node in NODES]
    simulated = [cluster.node_gpus(index) for index in range(len(NODES))]
    assert score_nodes(supplies, web, picture.fairness().mix) == score_nodes(simulated, web, cluster.mix)
