"""The GPU inventory (`extender.picture.inventory`): free GPUs are slice devices minus allocations,
classic GPUs of a device plugin, optimistic binds, and no memory for unknown node names.
"""

from __future__ import annotations

from tests import extender_objects as objects
from tests.unit.extender.pictures import (
    CLASS,
    assumed_nodes,
    remembered_nodes,
    synced_picture,
    two_nodes,
    with_rv,
)


def test_free_gpus_are_slice_devices_minus_allocations() -> None:
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim("ns", "whole", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
            objects.claim(
                "ns", "part", objects.claim_spec(CLASS, memory="20Gi"), allocated=[("a", "gpu-1", "20Gi")]
            ),
        ]
    )
    assert picture.ready()
    a = picture.node_gpus("a")
    assert (a.model, a.free_milli) == ("H100-80GB", (0, 750, 1000, 1000))
    assert picture.node_gpus("b").free_milli == (1000,) * 4
    assert picture.node_gpus("unknown").free_milli == ()
    picture.apply("ResourceClaim", "DELETED", objects.claim("ns", "whole", {}))
    assert picture.node_gpus("a").free_milli == (1000, 750, 1000, 1000)


def test_slices_of_other_drivers_and_non_gpu_devices_are_ignored() -> None:
    mig = objects.gpu_slice("a", 2, name="a-mig")
    mig["spec"]["devices"][1]["attributes"]["type"] = {"string": "mig"}
    picture = synced_picture([objects.gpu_slice("a", 2, driver="nic.example.com"), mig])
    assert picture.node_gpus("a").free_milli == (1000,)


def test_classic_extended_resource_gpus_on_a_node() -> None:
    picture = synced_picture(
        [
            objects.node("c", classic_gpus=4, labels={"nvidia.com/gpu.product": "T4"}),
            objects.pod("ns", "p", queue="q", classic_gpus=3, node_name="c"),
        ]
    )
    assert picture.node_gpus("c").free_milli == (1000, 0, 0, 0)
    assert picture.node_gpus("c").model == "T4"
    assert picture.capacity()["gpu/T4"] == 4
    assert picture.pod_resources("ns/p", picture.kind("Pod")["ns/p"])["gpu/T4"] == 3


def test_an_optimistic_bind_counts_once_before_and_after_the_watch_event() -> None:
    pending = objects.pod("ns", "p", queue="q", classic_gpus=1)
    picture = synced_picture([objects.node("c", classic_gpus=2), objects.queue("q"), with_rv(pending, 10)])
    assert picture.fairness().usage["q"].requested == {"gpu": 1, "cpu": 0.1, "memory": 64 * 2**20}
    picture.assume_bound("ns", "p", "c")
    assert picture.fairness().usage["q"].allocated["gpu"] == 1
    assert picture.fairness().usage["q"].requested == {}
    assert picture.node_gpus("c").free_milli == (1000, 0)
    bound = objects.pod("ns", "p", queue="q", classic_gpus=1, node_name="c")
    picture.apply("Pod", "MODIFIED", with_rv(bound, 11))
    picture.apply("Pod", "MODIFIED", with_rv(bound, 11))  # the same event twice
    assert picture.fairness().usage["q"].allocated["gpu"] == 1
    assert picture.node_gpus("c").free_milli == (1000, 0)
    assert assumed_nodes(picture) == {}
    picture.apply("Pod", "DELETED", bound)
    assert picture.node_gpus("c").free_milli == (1000, 1000)


def test_unknown_node_names_are_not_remembered() -> None:
    picture = synced_picture(two_nodes())
    for index in range(1000):
        assert picture.node_gpus(f"made-up-{index}").free_milli == ()
    assert picture.node_gpus("a").free_milli == (1000,) * 4
    assert remembered_nodes(picture) <= {"a", "b"}
