"""Fair shares, DRF order and admission against hand-worked numbers (see docs/queues.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from extender.policy.fairness import (
    FairnessSnapshot,
    FairShareInputs,
    QueueSpec,
    QueueUsage,
    WeightAdjustment,
    compute_fair_shares,
    drf_order,
)


def usage(allocated: float = 0.0, requested: float = 0.0, resource: str = "gpu") -> QueueUsage:
    return QueueUsage(allocated={resource: allocated}, requested={resource: requested})


def q(name: str, parent: str | None = None, priority: int = 0, **gpu: float) -> QueueSpec:
    """A queue with GPU settings only: q("a", quota=4, limit=8, weight=2)."""
    return QueueSpec(
        name=name,
        parent=parent,
        priority=priority,
        quota={"gpu": gpu["quota"]} if "quota" in gpu else {},
        limit={"gpu": gpu["limit"]} if "limit" in gpu else {},
        over_quota_weight={"gpu": gpu["weight"]} if "weight" in gpu else {},
    )


@dataclass(frozen=True)
class ShareCase:
    """Queues and their GPU demand (pending only, nothing allocated unless given) in, GPU shares out."""

    name: str
    capacity: float
    queues: list[QueueSpec]
    demand: dict[str, float]
    expected: dict[str, float]
    allocated: dict[str, float] = field(default_factory=dict)


SHARE_CASES = [
    # Demand fits: everyone gets exactly its demand, nothing more.
    ShareCase(
        "demand below quotas",
        capacity=10,
        queues=[q("a", quota=4), q("b", quota=4)],
        demand={"a": 3, "b": 4},
        expected={"a": 3, "b": 4},
    ),
    # a's idle quota is lent to b: b gets the whole cluster.
    ShareCase(
        "idle quota is lent",
        capacity=10,
        queues=[q("a", quota=5), q("b", quota=5)],
        demand={"a": 0, "b": 10},
        expected={"a": 0, "b": 10},
    ),
    # Counted demand is what is held plus what waits: a holds 2 and wants 1 more -> 3.
    ShareCase(
        "allocated counts as demand",
        capacity=10,
        queues=[q("a", quota=5), q("b")],
        demand={"a": 1, "b": 20},
        allocated={"a": 2, "b": 3},
        expected={"a": 3, "b": 7},
    ),
    # Quotas 2+2 first, the remaining 8 split 1:3 by weight -> 2+2=4 and 2+6=8.
    ShareCase(
        "over-quota weights",
        capacity=12,
        queues=[q("a", quota=2, weight=1), q("b", quota=2, weight=3)],
        demand={"a": 20, "b": 20},
        expected={"a": 4, "b": 8},
    ),
    # Water-filling: level 3 per unit weight fills a (demand 3); the last 3 split 1:2 -> b 4, c 8.
    ShareCase(
        "satisfied queues drop out of water-filling",
        capacity=15,
        queues=[q("a"), q("b"), q("c", weight=2)],
        demand={"a": 3, "b": 20, "c": 20},
        expected={"a": 3, "b": 4, "c": 8},
    ),
    # a is capped at its limit 3; b takes the rest.
    ShareCase(
        "limit caps a share, rest goes to others",
        capacity=10,
        queues=[q("a", limit=3), q("b")],
        demand={"a": 10, "b": 10},
        expected={"a": 3, "b": 7},
    ),
    # Quota above limit: the limit wins.
    ShareCase(
        "quota above limit",
        capacity=10,
        queues=[q("a", quota=8, limit=4)],
        demand={"a": 10},
        expected={"a": 4},
    ),
    # Quotas first (hi 2, lo1 2), then tier 1 takes what it wants (hi +4 = 6), then tier 0 splits the
    # last 2 equally (lo1 3, lo2 1).
    ShareCase(
        "priority tiers are served first beyond quota",
        capacity=10,
        queues=[q("hi", priority=1, quota=2), q("lo1", quota=2), q("lo2")],
        demand={"hi": 6, "lo1": 6, "lo2": 6},
        expected={"hi": 6, "lo1": 3, "lo2": 1},
    ),
    # Capacity below the sum of quotas (a node was lost): the 6 GPUs split in proportion to the quotas.
    ShareCase(
        "oversubscribed quotas shrink proportionally",
        capacity=6,
        queues=[q("a", quota=4), q("b", quota=2)],
        demand={"a": 8, "b": 8},
        expected={"a": 4, "b": 2},
    ),
    ShareCase(
        "oversubscribed quotas equal priority",
        capacity=6,
        queues=[q("a", quota=4), q("b", quota=4)],
        demand={"a": 8, "b": 8},
        expected={"a": 3, "b": 3},
    ),
    # Higher priority keeps its whole quota when quotas cannot all be honoured.
    ShareCase(
        "oversubscribed quotas by priority",
        capacity=6,
        queues=[q("a", priority=1, quota=4), q("b", quota=4)],
        demand={"a": 8, "b": 8},
        expected={"a": 4, "b": 2},
    ),
    # Weight 0 only takes leftovers: b is served to its demand 4, a gets the remaining 6.
    ShareCase(
        "zero weight takes leftovers",
        capacity=10,
        queues=[q("a", weight=0), q("b")],
        demand={"a": 10, "b": 4},
        expected={"a": 6, "b": 4},
    ),
    # Top-down: org-a demand 11 (a1 10, a2 1) gets min(12, 11) = 11, org-b gets its quota 8 plus the
    # last 1 -> 9. Inside org-a: a1 8, a2 1, the remaining 2 to a1 -> 10. org-b passes 9 to b1.
    ShareCase(
        "two-level hierarchy",
        capacity=20,
        queues=[
            q("org-a", quota=12),
            q("a1", "org-a", quota=8),
            q("a2", "org-a", quota=4),
            q("org-b", quota=8),
            q("b1", "org-b", quota=8),
        ],
        demand={"a1": 10, "a2": 1, "b1": 30},
        expected={"org-a": 11, "a1": 10, "a2": 1, "org-b": 9, "b1": 9},
    ),
    # The parent's limit 6 caps its whole subtree: p gets 6 (split 3/3), r the remaining 14.
    ShareCase(
        "ancestor limit caps children",
        capacity=20,
        queues=[q("p", limit=6), q("c1", "p"), q("c2", "p"), q("r")],
        demand={"c1": 10, "c2": 10, "r": 20},
        expected={"p": 6, "c1": 3, "c2": 3, "r": 14},
    ),
    # The child's quota only counts inside its parent: p has no quota, so at the root p and r split
    # equally (r only wants 2 -> p gets 8); inside p, c1's quota 6 comes first and the last 2 split
    # equally -> c1 7, c2 1.
    ShareCase(
        "child quota applies within the parent's share",
        capacity=10,
        queues=[q("p"), q("c1", "p", quota=6), q("c2", "p"), q("r")],
        demand={"c1": 10, "c2": 10, "r": 2},
        expected={"p": 8, "c1": 7, "c2": 1, "r": 2},
    ),
    # Pods labelled with the parent itself compete as an unnamed child (no quota, weight 1).
    ShareCase(
        "parent's own pods compete with its children",
        capacity=6,
        queues=[q("p"), q("c", "p")],
        demand={"p": 4, "c": 4},
        expected={"p": 6, "c": 3},
    ),
    # Broken ancestries take no part: unknown parent and a two-queue cycle get 0; ok gets everything.
    ShareCase(
        "broken hierarchy is excluded",
        capacity=8,
        queues=[q("ok"), q("orphan", "missing"), q("x", "y"), q("y", "x")],
        demand={"ok": 8, "orphan": 4, "x": 4, "y": 4},
        expected={"ok": 8, "orphan": 0, "x": 0, "y": 0},
    ),
    ShareCase(
        "no demand at all",
        capacity=8,
        queues=[q("a", quota=4), q("b")],
        demand={},
        expected={"a": 0, "b": 0},
    ),
]


@pytest.mark.parametrize("case", SHARE_CASES, ids=lambda c: c.name)
def test_fair_shares(case: ShareCase) -> None:
    usages = {
        name: usage(case.allocated.get(name, 0.0), case.demand.get(name, 0.0))
        for name in {*case.demand, *case.allocated}
    }
    shares = compute_fair_shares(FairShareInputs(case.queues, usages, {"gpu": case.capacity}))
    assert {name: per_resource["gpu"] for name, per_resource in shares.items()} == pytest.approx(
        case.expected
    )


def test_resources_are_shared_independently() -> None:
    # GPUs split 4/4 by equal weight; cpu: a only wants 8 of 64 cores, b gets the other 56.
    queues = [QueueSpec("a"), QueueSpec("b")]
    usages = {
        "a": QueueUsage(allocated={}, requested={"gpu": 8, "cpu": 8}),
        "b": QueueUsage(allocated={}, requested={"gpu": 8, "cpu": 100}),
    }
    shares = compute_fair_shares(FairShareInputs(queues, usages, {"gpu": 8, "cpu": 64}))
    assert shares == {"a": {"gpu": 4.0, "cpu": 8.0}, "b": {"gpu": 4.0, "cpu": 56.0}}


def test_gpu_models_are_separate_resources() -> None:
    # Only a asks for H100s, so it gets all 4 of them while the 8 GPUs overall split 4/4.
    queues = [QueueSpec("a"), QueueSpec("b")]
    usages = {
        "a": QueueUsage(allocated={}, requested={"gpu": 6, "gpu/H100": 6}),
        "b": QueueUsage(allocated={}, requested={"gpu": 6, "gpu/T4": 6}),
    }
    shares = compute_fair_shares(FairShareInputs(queues, usages, {"gpu": 8, "gpu/H100": 4, "gpu/T4": 4}))
    assert shares["a"] == {"gpu": 4.0, "gpu/H100": 4.0, "gpu/T4": 0.0}
    assert shares["b"] == {"gpu": 4.0, "gpu/H100": 0.0, "gpu/T4": 4.0}


@dataclass(frozen=True)
class AdjustedCase:
    """Two queues without quota, each waiting for 10 GPUs of 8, one factor on a's weight."""

    name: str
    weight_a: float
    factor_a: float
    expected: dict[str, float]


ADJUSTED_CASES = [
    # Weights 1 and 1: 4 and 4, as without an adjustment.
    AdjustedCase("factor 1 changes nothing", 1.0, 1.0, {"a": 4.0, "b": 4.0}),
    # Weight 1 x 3 = 3 against 1: a gets 8 x 3/4 = 6, b 8 x 1/4 = 2.
    AdjustedCase("a factor scales the weight", 1.0, 3.0, {"a": 6.0, "b": 2.0}),
    # Weight 1 x 0 is held at the least weight, 1e-3: a gets 8 x 1e-3/1.001 ~ 0.008, still a
    # weighted queue beside b (not a leftovers-only one, which would get 0 here).
    AdjustedCase("a factor 0 keeps the least weight", 1.0, 0.0, {"a": 8e-3 / 1.001, "b": 8 / 1.001}),
    # Weight 1 x 5000 is held at the greatest weight, 1e3: a gets 8 x 1000/1001 ~ 7.992.
    AdjustedCase("a factor past the bounds is held", 1.0, 5000.0, {"a": 8000 / 1001, "b": 8 / 1001}),
    # A leftovers-only queue (weight 0) stays one: b, weighted, takes all 8 it can.
    AdjustedCase("weight 0 stays 0", 0.0, 5.0, {"a": 0.0, "b": 8.0}),
    # A factor that is no finite number >= 0 adjusts nothing: 4 and 4.
    AdjustedCase("a negative factor is ignored", 1.0, -2.0, {"a": 4.0, "b": 4.0}),
    AdjustedCase("a NaN factor is ignored", 1.0, float("nan"), {"a": 4.0, "b": 4.0}),
]


@pytest.mark.parametrize("case", ADJUSTED_CASES, ids=lambda c: c.name)
def test_a_weight_adjustment_scales_over_quota_weights(case: AdjustedCase) -> None:
    queues = [q("a", weight=case.weight_a), q("b")]
    adjustment = WeightAdjustment(version=1, factors={"a": {"gpu": case.factor_a}})
    inputs = FairShareInputs(queues, {"a": usage(0, 10), "b": usage(0, 10)}, {"gpu": 8}, adjustment)
    shares = compute_fair_shares(inputs)
    assert {name: s["gpu"] for name, s in shares.items()} == pytest.approx(case.expected)


def test_the_inputs_version_names_queues_capacity_and_adjustment_not_usage() -> None:
    queues = [q("a"), q("b")]
    capacity = {"gpu": 8.0}
    base = FairShareInputs(queues, {"a": usage(0, 1)}, capacity, WeightAdjustment(1, {}), queues_version=3)
    # Other usage, the same version: kept shares follow it by `FairShares.update`.
    assert (
        FairShareInputs(
            queues, {"a": usage(0, 9)}, capacity, WeightAdjustment(1, {}), queues_version=3
        ).version
        == base.version
    )
    # Another adjustment version, capacity or queues' version: divided again.
    for other in (
        FairShareInputs(queues, {}, capacity, WeightAdjustment(2, {}), queues_version=3),
        FairShareInputs(queues, {}, {"gpu": 9.0}, WeightAdjustment(1, {}), queues_version=3),
        FairShareInputs(queues, {}, capacity, WeightAdjustment(1, {}), queues_version=4),
        FairShareInputs(queues, {}, capacity, None, queues_version=3),
    ):
        assert other.version != base.version
    # Without a queues' version the specs themselves are compared.
    assert (
        FairShareInputs(queues, {}, capacity).version == FairShareInputs(list(queues), {}, capacity).version
    )
    assert FairShareInputs(queues, {}, capacity).version != FairShareInputs([q("a")], {}, capacity).version


def test_only_resources_with_capacity_are_shared() -> None:
    shares = compute_fair_shares(FairShareInputs([q("a", quota=2)], {"a": usage(0, 4)}, {"cpu": 16}))
    assert shares == {"a": {"cpu": 0.0}}


@pytest.mark.parametrize("capacity", [0.0, 7.0, 40.0])
def test_shares_never_exceed_capacity_demand_or_limits(capacity: float) -> None:
    queues = [
        q("p", quota=4, limit=9),
        q("c1", "p", quota=3, weight=2),
        q("c2", "p", limit=2),
        q("r", priority=1, weight=0.5),
        q("s", quota=1),
    ]
    demand = {"c1": 7, "c2": 5, "p": 1, "r": 6, "s": 3}
    shares = compute_fair_shares(
        FairShareInputs(queues, {n: usage(0, d) for n, d in demand.items()}, {"gpu": capacity})
    )
    gpu = {name: per_resource["gpu"] for name, per_resource in shares.items()}
    roots = gpu["p"] + gpu["r"] + gpu["s"]
    assert roots == pytest.approx(min(capacity, 9 + 6 + 3))  # work-conserving at the root
    assert gpu["c1"] + gpu["c2"] <= gpu["p"] + 1e-9
    assert gpu["p"] <= 9 + 1e-9 and gpu["c2"] <= 2 + 1e-9
    assert all(gpu[name] <= demand.get(name, 0) + 1e-9 for name in ("c1", "c2", "r", "s"))


# --- DRF order ---------------------------------------------------------------------------------


def test_drf_order_below_fair_share_first_then_priority_then_dominant_share() -> None:
    capacity = {"gpu": 8, "cpu": 64}
    queues = [QueueSpec("a"), QueueSpec("b"), QueueSpec("c", priority=1), QueueSpec("d")]
    usages = {
        # a: at its fair share 4; dominant share gpu 4/8 = 0.5.
        "a": QueueUsage(allocated={"gpu": 4, "cpu": 8}, requested={"gpu": 2}),
        # b: below its fair share 2 while waiting -> first, despite the highest dominant share (48/64).
        "b": QueueUsage(allocated={"gpu": 1, "cpu": 48}, requested={"gpu": 1}),
        # c: at its fair share but priority 1 -> before the other priority-0 queues.
        "c": QueueUsage(allocated={"gpu": 2}, requested={"gpu": 1}),
        # d: holds nothing, dominant share 0 -> before a.
        "d": QueueUsage(allocated={}, requested={}),
    }
    fair = {"a": {"gpu": 4}, "b": {"gpu": 2}, "c": {"gpu": 2}, "d": {"gpu": 0}}
    assert drf_order(queues, usages, fair, capacity) == ["b", "c", "d", "a"]


def test_drf_order_uses_the_dominant_resource() -> None:
    # x: gpu 2/8 = 0.25 but cpu 40/64 = 0.625 -> dominant 0.625; y: gpu 4/8 = 0.5 -> y goes first.
    capacity = {"gpu": 8, "cpu": 64}
    usages = {
        "x": QueueUsage(allocated={"gpu": 2, "cpu": 40}, requested={"gpu": 1}),
        "y": QueueUsage(allocated={"gpu": 4}, requested={"gpu": 1}),
    }
    fair = {"x": {"gpu": 2, "cpu": 40}, "y": {"gpu": 4}}
    assert drf_order([QueueSpec("x"), QueueSpec("y")], usages, fair, capacity) == ["y", "x"]


def test_drf_order_counts_a_parent_by_its_subtree() -> None:
    # p holds nothing itself but its child holds 6 of 8 GPUs; r holds 2 -> r before p.
    queues = [q("p"), q("c", "p"), q("r")]
    usages = {"c": usage(6), "r": usage(2)}
    fair = {"p": {"gpu": 6}, "c": {"gpu": 6}, "r": {"gpu": 2}}
    assert drf_order(queues, usages, fair, {"gpu": 8}) == ["r", "c", "p"]


# --- admission ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionCase:
    name: str
    queue: str
    request: float
    queues: list[QueueSpec]
    usage: dict[str, tuple[float, float]]  # queue -> (allocated, requested) GPUs
    fair: dict[str, float]  # hand-computed fair shares (the table is the input, not the algorithm)
    capacity: float
    admit: bool
    kind: str
    reason_has: tuple[str, ...]
    preemptible: bool = True
    # queue -> of its allocated GPUs, those its non-preemptible pods hold (what a quota guarantees)
    non_preemptible: dict[str, float] = field(default_factory=dict)


ADMISSION_CASES = [
    AdmissionCase(
        "within fair share",
        queue="a",
        request=1,
        queues=[q("a", quota=4), q("b", quota=4)],
        usage={"a": (2, 1), "b": (2, 2)},
        fair={"a": 3, "b": 4},
        capacity=8,
        admit=True,
        kind="within_fair_share",
        reason_has=("'a'", "within"),
    ),
    AdmissionCase(
        "own limit",
        queue="a",
        request=2,
        queues=[q("a", limit=4)],
        usage={"a": (3, 2)},
        fair={"a": 5},
        capacity=8,
        admit=False,
        kind="over_limit",
        reason_has=("queue 'a'", "gpu allocated 3 + request 2", "its limit (4)"),
    ),
    # p's subtree holds 2 (c) + 4 (d) = 6 = p's limit: one more for c would pass it.
    AdmissionCase(
        "ancestor limit",
        queue="c",
        request=1,
        queues=[q("p", limit=6), q("c", "p"), q("d", "p")],
        usage={"c": (2, 1), "d": (4, 0)},
        fair={"p": 7, "c": 3, "d": 4},
        capacity=16,
        admit=False,
        kind="over_limit",
        reason_has=("queue 'c'", "allocated 6 + request 1", "ancestor queue 'p'", "(6)"),
    ),
    # a at its fair share 4 while b holds 2 of its 4 with 2 waiting: a preemptible pod of a still
    # borrows the idle GPU (work-conserving); reclaim gives it back to b when b's pods need it.
    AdmissionCase(
        "over fair share while another queue waits: borrow, reclaim restores",
        queue="a",
        request=1,
        queues=[q("a", quota=4), q("b", quota=4)],
        usage={"a": (4, 3), "b": (2, 2)},
        fair={"a": 4, "b": 4},
        capacity=8,
        admit=True,
        kind="borrowing",
        reason_has=("'a'", "borrows idle gpu", "preemptible"),
    ),
    # The same pod, not preemptible, and a's 4 GPUs held by non-preemptible pods: a's quota is
    # 4, so 4 + 1 > 4.
    AdmissionCase(
        "not preemptible: refused beyond quota",
        queue="a",
        request=1,
        queues=[q("a", quota=4), q("b", quota=4)],
        usage={"a": (4, 3), "b": (2, 2)},
        fair={"a": 4, "b": 4},
        capacity=8,
        admit=False,
        kind="over_quota",
        reason_has=(
            "queue 'a'",
            "gpu non-preemptible allocated 4 + request 1",
            "its quota (4)",
            "only preemptible pods",
        ),
        preemptible=False,
        non_preemptible={"a": 4},
    ),
    # a's 4 GPUs held by its own preemptible pods: the quota guarantees non-preemptible work, so
    # 0 + 1 <= 4 and the pod is admitted (it then preempts one of them: docs/queues.md).
    AdmissionCase(
        "not preemptible: the queue's own preemptible pods do not count against the quota",
        queue="a",
        request=1,
        queues=[q("a", quota=4), q("b", quota=4)],
        usage={"a": (4, 3), "b": (2, 2)},
        fair={"a": 4, "b": 4},
        capacity=8,
        admit=True,
        kind="borrowing",
        reason_has=("'a'", "beyond its fair share", "within its quota for non-preemptible pods"),
        preemptible=False,
    ),
    # 3 + 1 = 4 <= quota 4: a non-preemptible pod is fine within the quota.
    AdmissionCase(
        "not preemptible: within quota",
        queue="a",
        request=1,
        queues=[q("a", quota=4)],
        usage={"a": (3, 1)},
        fair={"a": 4},
        capacity=8,
        admit=True,
        kind="within_fair_share",
        reason_has=("within",),
        preemptible=False,
        non_preemptible={"a": 3},
    ),
    # c holds 1 of its own quota 2, but its parent p (quota 3) holds 1 + d's 2 = 3, all
    # non-preemptible: 3 + 1 > 3.
    AdmissionCase(
        "not preemptible: ancestor quota",
        queue="c",
        request=1,
        queues=[q("p", quota=3), q("c", "p", quota=2), q("d", "p", quota=2)],
        usage={"c": (1, 1), "d": (2, 0)},
        fair={"p": 4, "c": 2, "d": 2},
        capacity=8,
        admit=False,
        kind="over_quota",
        reason_has=(
            "queue 'c'",
            "non-preemptible allocated 3 + request 1",
            "the quota of ancestor queue 'p' (3)",
        ),
        preemptible=False,
        non_preemptible={"c": 1, "d": 2},
    ),
    # The same, d's 2 preemptible: p's non-preemptible use is c's 1, 1 + 1 <= 3.
    AdmissionCase(
        "not preemptible: a sibling's preemptible pods do not count against the ancestor's quota",
        queue="c",
        request=1,
        queues=[q("p", quota=3), q("c", "p", quota=2), q("d", "p", quota=2)],
        usage={"c": (1, 1), "d": (2, 0)},
        fair={"p": 4, "c": 2, "d": 2},
        capacity=8,
        admit=True,
        kind="within_fair_share",
        reason_has=("within",),
        preemptible=False,
        non_preemptible={"c": 1},
    ),
    # No GPU quota means no GPU guarantee (0): only preemptible pods of such a queue run.
    AdmissionCase(
        "not preemptible: queue without a GPU quota",
        queue="a",
        request=1,
        queues=[q("a")],
        usage={"a": (0, 1)},
        fair={"a": 8},
        capacity=8,
        admit=False,
        kind="over_quota",
        reason_has=("its quota (0)",),
        preemptible=False,
    ),
    # b is owed 1 but 8 - 2 - 1 = 5 GPUs stay free after admitting: a borrows.
    AdmissionCase(
        "over fair share, enough free capacity left for the waiting queue",
        queue="a",
        request=1,
        queues=[q("a", quota=2), q("b", quota=4)],
        usage={"a": (2, 3), "b": (0, 1)},
        fair={"a": 2, "b": 4},
        capacity=8,
        admit=True,
        kind="borrowing",
        reason_has=("borrows",),
    ),
    # A queue with children takes no pods of its own: they would compete with the children's
    # guarantees as an unnamed child (it took a child's guaranteed 8 of 8 GPUs before).
    AdmissionCase(
        "pods go to leaf queues",
        queue="org",
        request=1,
        queues=[q("org", quota=8), q("team", "org", quota=8)],
        usage={"team": (0, 8)},
        fair={"org": 8, "team": 8},
        capacity=8,
        admit=False,
        kind="not_leaf",
        reason_has=("queue 'org' has child queues (team)", "leaf queue"),
    ),
    AdmissionCase(
        "unknown queue",
        queue="nope",
        request=1,
        queues=[q("a")],
        usage={},
        fair={},
        capacity=8,
        admit=False,
        kind="unknown_queue",
        reason_has=("'nope'", "does not exist"),
    ),
    AdmissionCase(
        "queue in a parent cycle",
        queue="x",
        request=1,
        queues=[q("x", "y"), q("y", "x")],
        usage={},
        fair={},
        capacity=8,
        admit=False,
        kind="invalid_queue",
        reason_has=("'x'", "not usable", "cycle"),
    ),
]


@pytest.mark.parametrize("case", ADMISSION_CASES, ids=lambda c: c.name)
def test_admission(case: AdmissionCase) -> None:
    usages = {
        name: replace(usage(alloc, req), non_preemptible={"gpu": case.non_preemptible.get(name, 0.0)})
        for name, (alloc, req) in case.usage.items()
    }
    fair = {name: {"gpu": share} for name, share in case.fair.items()}
    request, capacity = {"gpu": case.request}, {"gpu": case.capacity}
    snapshot = FairnessSnapshot(case.queues, usages, capacity, fair)
    decision = snapshot.admit(case.queue, request, preemptible=case.preemptible)
    assert decision.admit is case.admit, decision.reason
    assert decision.kind == case.kind
    for fragment in case.reason_has:
        assert fragment in decision.reason
    # The snapshot asked again (its tree and subtree sums warm) decides exactly the same.
    assert snapshot.admit(case.queue, request, preemptible=case.preemptible) == decision


def test_limit_applies_to_resources_without_capacity_and_formats_memory() -> None:
    # memory is not fair-shared here (no capacity given), but its limit still holds.
    queues = [QueueSpec("a", limit={"memory": 64 * 2**30})]
    usages = {"a": QueueUsage(allocated={"memory": 60 * 2**30}, requested={})}
    decision = FairnessSnapshot(queues, usages, {"gpu": 8}, {"a": {}}).admit("a", {"memory": 8 * 2**30})
    assert not decision.admit
    assert "memory allocated 60Gi + request 8Gi would exceed its limit (64Gi)" in decision.reason


def test_admission_against_computed_shares_converges() -> None:
    # Two equal queues on 8 GPUs, each with 8 one-GPU pods pending: serving pods in DRF order one
    # at a time (admission refuses none of them) fills the cluster with 4 GPUs each.
    queues = [QueueSpec("a"), QueueSpec("b")]
    held = {"a": 0.0, "b": 0.0}
    pending = {"a": 8.0, "b": 8.0}
    capacity = {"gpu": 8.0}
    for _ in range(16):
        usages = {name: usage(held[name], pending[name]) for name in held}
        shares = compute_fair_shares(FairShareInputs(queues, usages, capacity))
        for name in drf_order(queues, usages, shares, capacity):
            free = capacity["gpu"] - sum(held.values())
            if (
                pending[name]
                and free >= 1
                and FairnessSnapshot(queues, usages, capacity, shares).admit(name, {"gpu": 1}).admit
            ):
                held[name] += 1
                pending[name] -= 1
                break
    assert held == {"a": 4.0, "b": 4.0}


@pytest.mark.parametrize("seed", range(5))
def test_invariants_on_a_generated_tree_with_byte_sized_amounts(seed: int) -> None:
    # 3 roots x 3 children x 3 grandchildren, memory in bytes (large floats), random settings.
    rng = random.Random(seed)
    gib = float(2**30)
    queues: list[QueueSpec] = []
    demand: dict[str, float] = {}
    for root in range(3):
        queues.append(QueueSpec(f"r{root}", quota={"memory": rng.choice([0, 100]) * gib}))
        for child in range(3):
            name = f"r{root}c{child}"
            limit = {"memory": rng.choice([50, 200]) * gib} if rng.random() < 0.5 else {}
            queues.append(QueueSpec(name, f"r{root}", priority=rng.choice([0, 1]), limit=limit))
            for leaf in range(3):
                leaf_name = f"{name}l{leaf}"
                weight = {"memory": rng.choice([0.0, 0.5, 1.0, 3.0])}
                quota = {"memory": rng.choice([0, 10, 30]) * gib}
                queues.append(QueueSpec(leaf_name, name, quota=quota, over_quota_weight=weight))
                demand[leaf_name] = rng.choice([0, 5, 40, 120]) * gib + rng.random()
    capacity = rng.choice([150, 400, 2000]) * gib
    usages = {name: QueueUsage(allocated={}, requested={"memory": d}) for name, d in demand.items()}
    shares = {
        name: s["memory"]
        for name, s in compute_fair_shares(FairShareInputs(queues, usages, {"memory": capacity})).items()
    }

    specs = {spec.name: spec for spec in queues}
    children: dict[str | None, list[str]] = {}
    for spec in queues:
        children.setdefault(spec.parent, []).append(spec.name)

    def capped(name: str) -> float:
        total = demand.get(name, 0.0) + sum(capped(child) for child in children.get(name, []))
        return min(total, specs[name].limit.get("memory", float("inf")))

    tolerance = 1e-6 * capacity
    # Work-conserving at every level: a pool is handed out up to what its children want.
    assert sum(shares[r] for r in children[None]) == pytest.approx(
        min(capacity, sum(capped(r) for r in children[None])), abs=tolerance
    )
    for parent in specs:
        kids = children.get(parent, [])
        if kids:
            assert sum(shares[k] for k in kids) == pytest.approx(
                min(shares[parent], sum(capped(k) for k in kids)), abs=tolerance
            )
        assert -tolerance <= shares[parent] <= capped(parent) + tolerance
