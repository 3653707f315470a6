"""Queue trees of any depth and width: every walk over the tree is iterative.

Subtree sums recursed once per level (two Python frames each), so a chain deeper than ~500
queues raised RecursionError in the DRF order and the Queue status. The cases below are worked
by hand: a chain of 2000 queues beside one leaf, and one parent with 5000 leaves.
"""

from __future__ import annotations

import pytest

from extender.policy.fairness import (
    FairnessSnapshot,
    FairShareInputs,
    QueueSpec,
    QueueTree,
    QueueUsage,
    broken_ancestries,
    compute_fair_shares,
    drf_order,
)
from extender.queues import queue_statuses, validate_hierarchy

DEPTH = 2000
WIDTH = 5000


def chain(depth: int, top_parent: str | None = "r") -> list[QueueSpec]:
    """deep-0000 under `top_parent`, each next one under the one before; quota 4 GPUs each."""
    return [
        QueueSpec(f"deep-{i:04d}", parent=f"deep-{i - 1:04d}" if i else top_parent, quota={"gpu": 4})
        for i in range(depth)
    ]


def deep_tree() -> tuple[list[QueueSpec], dict[str, QueueUsage]]:
    """Root r (quota 8, limit 8) with two children: the 2000-deep chain, and the leaf `flat`
    (quota 4). The chain's last queue holds 6 GPUs and waits for 2; flat holds 2 and waits for 2."""
    specs = [
        QueueSpec("r", quota={"gpu": 8}, limit={"gpu": 8}),
        *chain(DEPTH),
        QueueSpec("flat", parent="r", quota={"gpu": 4}),
    ]
    usage = {
        f"deep-{DEPTH - 1:04d}": QueueUsage({"gpu": 6}, {"gpu": 2}),
        "flat": QueueUsage({"gpu": 2}, {"gpu": 2}),
    }
    return specs, usage


def test_a_chain_of_2000_queues_has_shares_sums_order_and_status() -> None:
    specs, usage = deep_tree()
    capacity = {"gpu": 8.0}
    shares = compute_fair_shares(FairShareInputs(specs, usage, capacity))
    # r's 8 GPUs: every queue of the chain wants 8 (6 held + 2 waiting), flat 4; each gets its
    # quota, 4 and 4, and nothing is left. Each queue of the chain passes its 4 to its one child.
    assert shares["r"] == {"gpu": 8.0} and shares["flat"] == {"gpu": 4.0}
    assert {share["gpu"] for name, share in shares.items() if name.startswith("deep-")} == {4.0}

    tree = QueueTree(specs, usage)
    assert tree.subtree("r", "allocated", "gpu") == 8.0  # 6 at the chain's end + flat's 2
    assert tree.subtree("deep-0000", "requested", "gpu") == 2.0
    assert tree.subtree(f"deep-{DEPTH - 1:04d}", "allocated", "gpu") == 6.0

    # flat holds 2 of its share of 4 and waits: first. Then by dominant share: the chain's queues
    # hold 6/8 (in name order: the chain from the top), r holds 8/8.
    order = drf_order(specs, usage, shares, capacity)
    assert order == ["flat", *(f"deep-{i:04d}" for i in range(DEPTH)), "r"]

    # A pod at the chain's end is checked against every queue up to r: r's limit of 8 is reached.
    snapshot = FairnessSnapshot(tuple(specs), usage, capacity, shares)
    assert snapshot.admit(f"deep-{DEPTH - 1:04d}", {"gpu": 1}).kind == "over_limit"

    assert validate_hierarchy(specs) == {spec.name: [] for spec in specs}
    statuses = queue_statuses(specs, usage, shares)
    assert statuses["r"]["allocated"] == {"gpu": "8"} and statuses["r"]["requested"] == {"gpu": "4"}
    assert statuses["deep-0000"]["allocated"] == {"gpu": "6"}
    assert statuses["deep-0000"]["fairShare"] == {"gpu": "4"}


def test_a_chain_of_2000_under_a_missing_parent_or_in_a_cycle_is_broken_whole() -> None:
    orphans = {spec.name: spec for spec in chain(DEPTH, top_parent="gone")}
    broken = broken_ancestries(orphans)
    assert broken == dict.fromkeys(orphans, "parent queue 'gone' of 'deep-0000' does not exist")

    # deep-0000's parent is the chain's last queue: all 2000 form one cycle.
    ring = {spec.name: spec for spec in chain(DEPTH, top_parent=f"deep-{DEPTH - 1:04d}")}
    broken = broken_ancestries(ring)
    assert broken.keys() == ring.keys()
    assert broken["deep-0000"].startswith("parents form a cycle: deep-0000 -> deep-1999 -> deep-1998")


def test_one_parent_with_5000_leaves() -> None:
    # 6000 GPUs; even leaves hold 1 and wait for 1 (demand 2), odd leaves wait for 1 (demand 1):
    # 7500 wanted. No quotas, equal weights: water-filling satisfies the odd ones at 1 (2500),
    # and the even ones share the other 3500 at 1.4 each.
    specs = [QueueSpec("wide"), *(QueueSpec(f"w-{i:04d}", parent="wide") for i in range(WIDTH))]
    usage = {
        f"w-{i:04d}": QueueUsage({"gpu": 1}, {"gpu": 1}) if i % 2 == 0 else QueueUsage({}, {"gpu": 1})
        for i in range(WIDTH)
    }
    capacity = {"gpu": 6000.0}
    shares = compute_fair_shares(FairShareInputs(specs, usage, capacity))
    assert shares["wide"]["gpu"] == 6000.0
    assert {name: share["gpu"] for name, share in shares.items() if name != "wide"} == pytest.approx(
        {f"w-{i:04d}": 1.4 if i % 2 == 0 else 1.0 for i in range(WIDTH)}
    )
    # Everyone is below its share and waits. Dominant share: odd leaves 0, even 1/6000, the
    # parent 2500/6000; then names.
    order = drf_order(specs, usage, shares, capacity)
    odd, even = [f"w-{i:04d}" for i in range(1, WIDTH, 2)], [f"w-{i:04d}" for i in range(0, WIDTH, 2)]
    assert order == [*odd, *even, "wide"]
    statuses = queue_statuses(specs, usage, shares)
    assert statuses["wide"]["allocated"] == {"gpu": "2500"}
    assert statuses["wide"]["requested"] == {"gpu": "5000"}
