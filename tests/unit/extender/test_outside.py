"""Pods outside Tessera: what a pod of another scheduler holds is busy capacity and is charged to
its namespace's default queue; a gang whose held GPUs such a pod takes is judged again at once.

The cluster: nodes a and b with 2 H100s each; Tessera's scheduler is `tessera`; namespace `ns`
names `ns-queue` as its default queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from contract.names import CLASSIC_GPU_RESOURCE, NAMESPACE_QUEUE_LABEL
from extender.controllers.outside import BYPASS_CONDITION, bypassing
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from extender.picture.gangs import rehold_slots
from extender.policy.placement import GpuDemand, NodeGpus, node_supply
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"
TESSERA = "tessera"


def namespace(name: str, default_queue: str | None) -> dict[str, Any]:
    labels = {NAMESPACE_QUEUE_LABEL: default_queue} if default_queue else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def picture_of(*extra: dict[str, Any]) -> ClusterPicture:
    picture = ClusterPicture(PictureConfig(scheduler_names=frozenset({TESSERA})))
    objs = [
        *objects.two_nodes_of_two_gpus(CLASS),
        namespace("ns", "ns-queue"),
        namespace("bare", None),
        objects.queue("team-a"),
        objects.queue("ns-queue"),
        *extra,
    ]
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


def gpu_pod(
    name: str,
    scheduler: str,
    node: str | None,
    device: str | None,
    queue: str | None = "team-a",
    ns: str = "ns",
) -> list[dict[str, Any]]:
    """A pod with its own one-GPU claim, allocated to `device` on node a when given."""
    pod = objects.pod(ns, name, queue=queue, claim_name=f"{name}-gpu", node_name=node, scheduler=scheduler)
    allocated: list[tuple[str, str, str | None]] | None = [("a", device, None)] if device else None
    return [pod, objects.claim(ns, f"{name}-gpu", objects.claim_spec(CLASS), allocated=allocated)]


# (case, scheduler, bound to a, claim allocated to a's gpu-0, namespace) -> the queue charged
# with 1 GPU (None: no queue holds it) and whether node a shows gpu-0 taken.
CHARGES = [
    # Tessera's pod: its label's queue, as always.
    ("tessera pod, bound", TESSERA, True, True, "ns", "team-a", True),
    # Another scheduler's pod: its namespace's default queue, never the queue its label names
    # (it passed no admission); `bare` names none, so `default`.
    ("default-scheduler pod, bound", "default-scheduler", True, True, "ns", "ns-queue", True),
    (
        "default-scheduler pod, namespace without default",
        "default-scheduler",
        True,
        True,
        "bare",
        "default",
        True,
    ),
    # That scheduler allocates the claim before it binds: the GPU is taken from then on.
    (
        "default-scheduler pod, allocated, bind to come",
        "default-scheduler",
        False,
        True,
        "ns",
        "ns-queue",
        True,
    ),
    # Not allocated, not bound: it holds nothing, and waits in no Tessera queue.
    ("default-scheduler pod, pending", "default-scheduler", False, False, "ns", None, False),
]


@pytest.mark.parametrize(
    ("scheduler", "bound", "allocated", "ns", "charged", "taken"),
    [case[1:] for case in CHARGES],
    ids=[case[0] for case in CHARGES],
)
def test_a_pods_gpu_is_charged_to_the_queue_it_may_use(
    scheduler: str, bound: bool, allocated: bool, ns: str, charged: str | None, taken: bool
) -> None:
    picture = picture_of(
        *gpu_pod("p", scheduler, "a" if bound else None, "gpu-0" if allocated else None, ns=ns)
    )
    usage = picture.fairness().usage
    holding = {queue: u.allocated.get("gpu") for queue, u in usage.items() if u.allocated.get("gpu")}
    assert holding == ({charged: 1.0} if charged else {})
    assert not any(u.requested for u in usage.values())  # never waiting in a Tessera queue
    # Node a: 2 GPUs, gpu-0 taken by the claim -> 0 free there (1000 thousandths free: gpu-1).
    assert picture.node_gpus("a").free_milli == ((0, 1000) if taken else (1000, 1000))


def test_nvidia_gpu_through_the_extended_resource_mapping_counts_the_claims_device() -> None:
    """`limits: {nvidia.com/gpu: 1}` on the default scheduler: kube-scheduler makes a claim of the
    mapped class and names it in `status.extendedResourceClaimStatus`. The picture counts that
    claim's device (model and index), not a classic GPU of an unknown model."""
    pod = objects.pod("ns", "classic", node_name="a", classic_gpus=1)
    pod["status"]["extendedResourceClaimStatus"] = {
        "requestMappings": [
            {"containerName": "main", "resourceName": CLASSIC_GPU_RESOURCE, "requestName": "r"}
        ],
        "resourceClaimName": "classic-extended-resources-x",
    }
    claim = objects.claim(
        "ns", "classic-extended-resources-x", objects.claim_spec(CLASS), [("a", "gpu-1", None)]
    )
    picture = picture_of(pod, claim)
    demand = picture.demand(pod)
    assert (demand.outside, demand.classic_gpus, demand.queue) == (True, 0, "ns-queue")
    assert picture.fairness().usage["ns-queue"].allocated == {
        "cpu": 0.1,
        "memory": 64 * 2**20,
        "gpu": 1.0,
        "gpu/H100-80GB": 1.0,  # the claim's device, so its model too
    }
    assert picture.node_gpus("a").free_milli == (1000, 0)
    # The planners see it on the device it holds (gpu-1: index 1), like any pod with a claim.
    assert picture.snapshot().running["ns/classic"].gpus == ((1, 1000),)


def test_a_claim_allocated_later_recounts_the_pod() -> None:
    """Bound first, the claim's allocation seen after (two watches, either order): the pod counts
    its ask meanwhile, then the device it got."""
    pod, claim = gpu_pod("p", "default-scheduler", "a", None)
    picture = picture_of(pod, claim)
    assert picture.fairness().usage["ns-queue"].allocated["gpu"] == 1.0  # its ask
    allocated = objects.claim("ns", "p-gpu", objects.claim_spec(CLASS), [("a", "gpu-0", None)])
    picture.apply(
        "ResourceClaim",
        "MODIFIED",
        {**allocated, "metadata": {**allocated["metadata"], "resourceVersion": "2"}},
    )
    assert picture.fairness().usage["ns-queue"].allocated["gpu/H100-80GB"] == 1.0
    assert picture.node_gpus("a").free_milli == (0, 1000)


def supply(name: str, *free: int) -> NodeGpus:
    return node_supply(name, "H100-80GB", list(free), None)


# (case, slots, GPUs no pod takes per node, of those not held for others) -> the slots after
FREE = {"a": (0, 1000), "b": (1000, 1000), "c": (1000, 1000)}
REHOLDS = [
    # Both of a's slots fit its 2 free GPUs: unchanged.
    ("nothing taken", ["a", "a"], {"a": (1000, 1000), "b": (1000, 1000)}, {}, ["a", "a"]),
    # a has 1 GPU left for 2 slots: one stays, one goes to the fullest node with room (b, by name).
    ("one taken", ["a", "a"], FREE, {}, ["a", "b"]),
    # b's GPUs are held for another pod (reclaim freed them for it): the slot goes to c instead.
    ("held for others", ["a", "a"], FREE, {"b": (0, 0)}, ["a", "c"]),
    # No room anywhere: the slots cannot all be held.
    ("no room", ["a", "a"], {"a": (0, 1000), "b": (0, 0), "c": (0, 0)}, {}, None),
]


@pytest.mark.parametrize(
    ("slots", "free", "held", "after"), [case[1:] for case in REHOLDS], ids=[case[0] for case in REHOLDS]
)
def test_rehold_slots(
    slots: list[str],
    free: dict[str, tuple[int, ...]],
    held: dict[str, tuple[int, ...]],
    after: list[str] | None,
) -> None:
    assert (
        rehold_slots(
            slots,
            GpuDemand(1),
            lambda node: supply(node, *free[node]),
            lambda node: supply(node, *held.get(node, free[node])),
            sorted(free),
        )
        == after
    )


def marked(pod: dict[str, Any]) -> dict[str, Any]:
    condition = {"type": BYPASS_CONDITION, "status": "True", "reason": "BypassesQueue", "message": "m"}
    return {**pod, "status": {**pod["status"], "conditions": [condition]}}


# (case, the pod and its claim) -> whether it is to be marked as bypassing its queue
MARKS = [
    ("default-scheduler pod holding a GPU", gpu_pod("p", "default-scheduler", "a", "gpu-0"), True),
    (
        "the same, marked already",
        [
            marked(pod) if pod["kind"] == "Pod" else pod
            for pod in gpu_pod("p", "default-scheduler", "a", "gpu-0")
        ],
        False,
    ),
    ("Tessera's pod holding a GPU", gpu_pod("p", TESSERA, "a", "gpu-0"), False),
    ("default-scheduler pod without GPUs", [objects.pod("ns", "p", node_name="a")], False),
    ("default-scheduler pod waiting for a GPU", gpu_pod("p", "default-scheduler", None, None), False),
]


@pytest.mark.parametrize(("objs", "expected"), [case[1:] for case in MARKS], ids=[case[0] for case in MARKS])
def test_pods_holding_gpus_outside_tessera_are_marked(objs: list[dict[str, Any]], expected: bool) -> None:
    picture = picture_of(*objs)
    found = bypassing(picture, ["ns/p"])
    assert [key for key, _, _ in found] == (["ns/p"] if expected else [])
    if expected:
        assert found[0][2] == (
            "placed by scheduler 'default-scheduler', not by Tessera: it bypasses queue ordering, limits "
            "and fair shares. What it holds (1 GPU) is charged to queue 'ns-queue', its namespace's "
            "default, against that queue's quota; set schedulerName to Tessera's to wait in a queue instead"
        )
