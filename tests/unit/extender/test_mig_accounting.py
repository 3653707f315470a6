"""The extender's accounting of MIG placements published as partitionable devices (the DRA
driver's own slices for two H100s in MIG mode): a placement is charged its compute slices of the
7, and a GPU holding one is that much used for placement and consolidation (the whole GPU no
longer counts free), while MIG placements add no GPU capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.names import DRIVER_NAME
from dra_driver.profiles.nvidia.simulated import build_inventory, load_profile
from dra_driver.slices import NodeRef, SharingMode, build_slices
from tests import extender_objects as objects
from tests.unit.extender.pictures import CLASS, running_on, synced_picture

NODE = "m"


def partitionable_node() -> list[dict[str, Any]]:
    gpus = build_inventory(load_profile(Path("h100x2-mig")), seed=NODE)
    slices = build_slices(
        NodeRef(NODE), DRIVER_NAME, gpus, SharingMode.CONSUMABLE_CAPACITY, 1, partitionable=True
    )
    for index, obj in enumerate(slices):
        obj["metadata"]["resourceVersion"] = str(index + 1)
    return [objects.node(NODE), *slices, objects.device_class(CLASS)]


def placement_pod(name: str, device: str) -> list[dict[str, Any]]:
    claim = objects.claim("ns", name, objects.claim_spec(CLASS), allocated=[(NODE, device, None)])
    return [claim, running_on(name, NODE, name)]


@pytest.mark.parametrize(
    ("held", "charged", "free_milli"),
    [
        # nothing held: two whole GPUs free
        ([], 0.0, (1000, 1000)),
        # a 1g placement on GPU 0: 1 of 7 compute slices = 143 thousandths (not 10Gi/80Gi = 125)
        ([("one", "gpu-0-mig-1g-10gb-at-0")], 1 / 7, (857, 1000)),
        # 1g + 3g on GPU 0 (slices 0 and 4-7) and a 2g on GPU 1: each placement rounded on its
        # own, 1000 - 143 - 429 = 428 and 1000 - 286 = 714 free
        (
            [
                ("one", "gpu-0-mig-1g-10gb-at-0"),
                ("three", "gpu-0-mig-3g-40gb-at-4"),
                ("two", "gpu-1-mig-2g-20gb-at-0"),
            ],
            6 / 7,
            (428, 714),
        ),
        # the whole GPU 1 (its 7g instance): all of it
        ([("whole", "gpu-1")], 1.0, (1000, 0)),
    ],
    ids=["none", "1g", "1g+3g and 2g", "whole"],
)
def test_a_placement_is_charged_its_compute_slices_and_uses_its_gpu(
    held: list[tuple[str, str]], charged: float, free_milli: tuple[int, ...]
) -> None:
    picture = synced_picture(
        [*partitionable_node(), *(o for name, device in held for o in placement_pod(name, device))]
    )
    usage = picture.fairness().usage
    assert (usage["q"].allocated.get("gpu", 0.0) if "q" in usage else 0.0) == pytest.approx(charged, abs=1e-3)
    assert picture.node_gpus(NODE).free_milli == free_milli
    assert picture.capacity()["gpu"] == 2  # placements add no capacity: 2 GPUs, not 2 + 34


def test_a_freed_placement_frees_its_share_of_the_gpu() -> None:
    objs = [*partitionable_node(), *placement_pod("three", "gpu-0-mig-3g-40gb-at-4")]
    picture = synced_picture(objs)
    assert picture.node_gpus(NODE).free_milli == (571, 1000)
    claim = next(o for o in objs if o["kind"] == "ResourceClaim")
    claim["metadata"]["resourceVersion"] = "99"
    picture.apply("ResourceClaim", "DELETED", claim)
    assert picture.node_gpus(NODE).free_milli == (1000, 1000)
