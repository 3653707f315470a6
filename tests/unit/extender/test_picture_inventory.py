"""The GPU inventory (`extender.picture.inventory`): free GPUs are slice devices minus allocations,
classic GPUs of a device plugin, optimistic binds, and no memory for unknown node names.
"""

from __future__ import annotations

from tests import extender_objects as objects
from tests.unit.extender.pictures import (
    CLASS,
    assumed_nodes,
    remembered_nodes,
    synced_state,
    two_nodes,
    with_rv,
)


def test_free_gpus_are_slice_devices_minus_allocations() -> None:
    state = synced_state(
        [
            *two_nodes(),
            objects.claim("ns", "whole", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
            objects.claim(
                "ns", "part", objects.claim_spec(CLASS, memory="20Gi"), allocated=[("a", "gpu-1", "20Gi")]
            ),
        ]
    )
    assert state.ready()
    a = state.node_gpus("a")
    assert (a.model, a.free_milli) == ("H100-80GB", (0, 750, 1000, 1000))
    assert state.node_gpus("b").free_milli == (1000,) * 4
    assert state.node_gpus("unknown").free_milli == ()
    state.apply("ResourceClaim", "DELETED", objects.claim("ns", "whole", {}))
    assert state.node_gpus("a").free_milli == (1000, 750, 1000, 1000)


def test_slices_of_other_drivers_and_non_gpu_devices_are_ignored() -> None:
    mig = objects.gpu_slice("a", 2, name="a-mig")
    mig["spec"]["devices"][1]["attributes"]["type"] = {"string": "mig"}
    state = synced_state([objects.gpu_slice("a", 2, driver="nic.example.com"), mig])
    assert state.node_gpus("a").free_milli == (1000,)


def test_classic_extended_resource_gpus_on_a_node() -> None:
    state = synced_state(
        [
            objects.node("c", classic_gpus=4, labels={"nvidia.com/gpu.product": "T4"}),
            objects.pod("ns", "p", queue="q", classic_gpus=3, node_name="c"),
        ]
    )
    assert state.node_gpus("c").free_milli == (1000, 0, 0, 0)
    assert state.node_gpus("c").model == "T4"
    assert state.capacity()["gpu/T4"] == 4
    assert state.pod_resources("ns/p", state.kind("Pod")["ns/p"])["gpu/T4"] == 3


def test_an_optimistic_bind_counts_once_before_and_after_the_watch_event() -> None:
    pending = objects.pod("ns", "p", queue="q", classic_gpus=1)
    state = synced_state([objects.node("c", classic_gpus=2), objects.queue("q"), with_rv(pending, 10)])
    assert state.fairness().usage["q"].requested == {"gpu": 1, "cpu": 0.1, "memory": 64 * 2**20}
    state.assume_bound("ns", "p", "c")
    assert state.fairness().usage["q"].allocated["gpu"] == 1
    assert state.fairness().usage["q"].requested == {}
    assert state.node_gpus("c").free_milli == (1000, 0)
    bound = objects.pod("ns", "p", queue="q", classic_gpus=1, node_name="c")
    state.apply("Pod", "MODIFIED", with_rv(bound, 11))
    state.apply("Pod", "MODIFIED", with_rv(bound, 11))  # the same event twice
    assert state.fairness().usage["q"].allocated["gpu"] == 1
    assert state.node_gpus("c").free_milli == (1000, 0)
    assert assumed_nodes(state) == {}
    state.apply("Pod", "DELETED", bound)
    assert state.node_gpus("c").free_milli == (1000, 1000)


def test_unknown_node_names_are_not_remembered() -> None:
    state = synced_state(two_nodes())
    for index in range(1000):
        assert state.node_gpus(f"made-up-{index}").free_milli == ()
    assert state.node_gpus("a").free_milli == (1000,) * 4
    assert remembered_nodes(state) <= {"a", "b"}
