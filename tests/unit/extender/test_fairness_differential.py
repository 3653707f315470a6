"""The O(n log n) water-filling gives the shares of the quadratic one it replaced; shares kept up
to date as queues' usage changes (`FairShares.update`) are those of a division of the whole tree.

The oracle is the earlier algorithm (bench/fairshare.py keeps it as the benchmark's baseline);
both run through the same ``compute_fair_shares`` on seeded random hierarchies with ties,
zero weights, priorities, limits, allocations above quota and scarce or plentiful capacity.
Shares agree to 1e-9 (relative above 1): the two sum the same amounts in a different order.
"""

from __future__ import annotations

import math
import random
from typing import Literal

import pytest

from bench.fairshare import quadratic_water_fill, water_filling
from extender.policy.fairness import (
    FairShareInputs,
    FairShares,
    QueueSpec,
    QueueTree,
    QueueUsage,
    compute_fair_shares,
)

RESOURCES = ("gpu", "cpu")
KINDS: tuple[Literal["allocated", "requested"], ...] = ("allocated", "requested")
Question = tuple[str, Literal["allocated", "requested"], str]  # a subtree sum: queue, kind, resource


def random_picture(
    rng: random.Random,
) -> tuple[list[QueueSpec], dict[str, QueueUsage], dict[str, float]]:
    count = rng.randint(1, 40)
    specs: list[QueueSpec] = []
    usage: dict[str, QueueUsage] = {}
    for index in range(count):
        name = f"q{index}"
        parent = f"q{rng.randrange(index)}" if index and rng.random() < 0.6 else None
        # Few distinct values, so ties between demands, quotas and weights are common.
        quota = {r: float(rng.choice((0, 1, 2, 4))) for r in RESOURCES if rng.random() < 0.7}
        limit = {r: quota.get(r, 0.0) + rng.choice((0, 2, 8)) for r in RESOURCES if rng.random() < 0.3}
        weight = {r: rng.choice((0.0, 0.001, 0.5, 1.0, 3.0, 1000.0)) for r in RESOURCES if rng.random() < 0.7}
        specs.append(QueueSpec(name, parent, rng.choice((0, 0, 1, 2)), quota, limit, weight))
        usage[name] = QueueUsage(
            allocated={r: float(rng.choice((0, 0, 1, 3))) for r in RESOURCES},
            requested={r: rng.choice((0.0, 0.5, 1.0, 2.0, 7.0, rng.uniform(0, 20))) for r in RESOURCES},
        )
    capacity = {r: rng.choice((0.0, 1.0, 5.0, 16.0, 1000.0, rng.uniform(0, 50))) for r in RESOURCES}
    return specs, usage, capacity


@pytest.mark.parametrize("seed", range(400))
def test_shares_equal_the_quadratic_oracle(seed: int) -> None:
    rng = random.Random(seed)
    specs, usage, capacity = random_picture(rng)
    shares = compute_fair_shares(FairShareInputs(specs, usage, capacity))
    with water_filling(quadratic_water_fill):
        expected = compute_fair_shares(FairShareInputs(specs, usage, capacity))
    assert shares.keys() == expected.keys()
    for queue, per_resource in expected.items():
        for resource, amount in per_resource.items():
            got = shares[queue][resource]
            assert math.isfinite(got)
            assert got == pytest.approx(amount, rel=1e-9, abs=1e-9), (queue, resource)


@pytest.mark.parametrize("seed", range(300))
def test_shares_kept_up_to_date_equal_a_division_of_the_whole_tree(seed: int) -> None:
    # A random tree (sometimes with a queue whose parent does not exist), then 12 changes of 1-3
    # queues' usage each - a pod waiting more, a bind, pods gone, all of a queue's usage gone -;
    # after each, the kept shares equal compute_fair_shares of the new usage exactly (the same
    # divisions of the same floats), and the shares handed out before are unchanged.
    rng = random.Random(seed)
    specs, usage, capacity = random_picture(rng)
    if rng.random() < 0.3:
        specs.append(QueueSpec("orphan", "missing", quota={"gpu": 1.0}))
        usage["orphan"] = QueueUsage(allocated={"gpu": 1.0}, requested={})
    kept = FairShares(FairShareInputs(specs, usage, capacity))
    assert kept.shares == compute_fair_shares(FairShareInputs(specs, usage, capacity))
    for _ in range(12):
        changed = rng.sample(sorted(usage), k=min(len(usage), rng.randint(1, 3)))
        usage = dict(usage)
        for name in changed:
            changed_usage(rng, usage, name)
        handed_out = kept.shares
        before = {name: dict(shares) for name, shares in handed_out.items()}
        kept.update(usage, changed)
        assert kept.shares == compute_fair_shares(FairShareInputs(specs, usage, capacity))
        assert handed_out == before


def changed_usage(rng: random.Random, usage: dict[str, QueueUsage], name: str) -> None:
    """One random change of queue `name`'s usage in place: a pod more waits, what waited is
    bound, pods are gone, or all of the queue's usage is gone."""
    old = usage[name]
    roll = rng.random()
    if roll < 0.4:  # one more pod waits
        usage[name] = QueueUsage(
            old.allocated, {r: a + rng.choice((0.5, 1.0, 8.0)) for r, a in old.requested.items()}
        )
    elif roll < 0.7:  # what waited is bound
        usage[name] = QueueUsage({r: old.allocated.get(r, 0.0) + a for r, a in old.requested.items()}, {})
    elif roll < 0.9:  # pods gone
        usage[name] = QueueUsage({r: a / 2 for r, a in old.allocated.items()}, old.requested)
    else:
        del usage[name]


@pytest.mark.parametrize("seed", range(200))
def test_subtree_sums_kept_across_trees_equal_those_of_a_fresh_tree(seed: int) -> None:
    # A random tree (sometimes with a queue whose parent does not exist, or two that are each
    # other's parent, and pods of a queue no spec names), then 12 changes of 1-3 queues' usage.
    # Before each, some sums are asked of the tree (so it holds some, not all); the next tree
    # (`with_usage(usage, changed)`) keeps those of the queues no change is under. Every sum of
    # every tree equals that of a tree built afresh on its usage, to the bit (the same additions
    # in the same order), and the sums of the trees before are unchanged.
    rng = random.Random(seed)
    specs, usage, _ = random_picture(rng)
    if rng.random() < 0.3:
        specs.append(QueueSpec("orphan", "missing"))
        usage["orphan"] = QueueUsage(allocated={"gpu": 1.0}, requested={})
    if rng.random() < 0.3:
        specs += [QueueSpec("x", "y"), QueueSpec("y", "x")]
        usage["x"] = QueueUsage(allocated={"gpu": 2.0}, requested={"cpu": 1.0})
    if rng.random() < 0.3:
        usage["unnamed"] = QueueUsage(allocated={"gpu": 4.0}, requested={})
    queues = sorted(set(usage) | {spec.name for spec in specs})
    questions = [(queue, kind, r) for queue in queues for kind in KINDS for r in RESOURCES]
    tree = QueueTree(specs, usage)
    handed_out: list[tuple[QueueTree, dict[Question, float]]] = []
    for _ in range(12):
        for question in rng.sample(questions, k=rng.randint(0, len(questions))):
            tree.subtree(*question)
        changed = rng.sample(sorted(usage), k=min(len(usage), rng.randint(1, 3)))
        usage = dict(usage)
        for name in changed:
            changed_usage(rng, usage, name)
        tree = tree.with_usage(usage, changed)
        fresh = QueueTree(specs, usage)
        sums = {question: tree.subtree(*question) for question in questions}
        assert sums == {question: fresh.subtree(*question) for question in questions}
        for earlier, before in handed_out:
            assert {question: earlier.subtree(*question) for question in before} == before
        handed_out.append((tree, sums))


def test_many_siblings_with_extreme_weights_stay_finite_and_add_up() -> None:
    """Weights at both bounds of the parser and 4000 siblings: every share finite, the pool used."""
    rng = random.Random(1)
    specs = [QueueSpec(f"q{i}", over_quota_weight={"gpu": rng.choice((1e-3, 1e3))}) for i in range(4000)]
    usage = {s.name: QueueUsage(allocated={}, requested={"gpu": float(rng.randint(1, 50))}) for s in specs}
    shares = compute_fair_shares(FairShareInputs(specs, usage, {"gpu": 20_000.0}))
    values = [per["gpu"] for per in shares.values()]
    assert all(math.isfinite(v) and v >= 0 for v in values)
    assert sum(values) == pytest.approx(20_000.0)


def test_a_light_queue_among_thousands_of_heavy_ones_keeps_its_precise_share() -> None:
    """Weights 1000 and 0.001 side by side: the weight left after the heavy queues are satisfied
    is summed from the light end, not subtracted from the total (which lost 1e-7 here)."""
    rng = random.Random(3)
    specs = [QueueSpec(f"heavy{i}", over_quota_weight={"gpu": 1000.0}) for i in range(2000)]
    specs += [QueueSpec(f"light{i}", over_quota_weight={"gpu": w}) for i, w in enumerate((0.001, 0.0013))]
    usage = {s.name: QueueUsage(allocated={}, requested={"gpu": rng.uniform(0.3, 3.0)}) for s in specs}
    usage |= {f"light{i}": QueueUsage(allocated={}, requested={"gpu": 1e6}) for i in range(2)}
    shares = compute_fair_shares(FairShareInputs(specs, usage, {"gpu": 6000.0}))
    with water_filling(quadratic_water_fill):
        expected = compute_fair_shares(FairShareInputs(specs, usage, {"gpu": 6000.0}))
    for queue in ("light0", "light1"):
        assert shares[queue]["gpu"] == pytest.approx(expected[queue]["gpu"], rel=1e-10)
