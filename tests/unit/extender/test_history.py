"""Fair share over time (extender.policy.history): worked examples of the formula."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from extender.policy.fairness import (
    FairShareInputs,
    QueueSpec,
    QueueTree,
    QueueUsage,
    WeightAdjustment,
    compute_fair_shares,
)
from extender.policy.history import (
    FairShareHistory,
    HistoryParams,
    HistorySettings,
    QueueHistory,
    bounded_factors,
    decayed_integral,
    history_moves,
    material_changes,
    resolve_params,
    target_factors,
)

HOUR = 3600.0
LN2 = math.log(2)


@pytest.mark.parametrize(
    ("amount", "start", "end", "now", "half_life", "expected"),
    [
        # No decay: 8 GPUs for an hour = 28800 GPU-seconds.
        (8, 0, HOUR, HOUR, None, 8 * HOUR),
        # Half-life 1 h, counted at the end: 8 * 3600 / ln2 * (0.5^0 - 0.5^1) = 20775.2.
        (8, 0, HOUR, HOUR, HOUR, 8 * HOUR / LN2 * 0.5),
        # The same hour counted an hour later: half of it, 8 * 3600 / ln2 * (0.5^1 - 0.5^2).
        (8, 0, HOUR, 2 * HOUR, HOUR, 8 * HOUR / LN2 * 0.25),
    ],
)
def test_decayed_integral(
    amount: float, start: float, end: float, now: float, half_life: float | None, expected: float
) -> None:
    assert decayed_integral(amount, start, end, now, half_life) == pytest.approx(expected)


def _held(history: QueueHistory, spans: list[tuple[float, float]], capacity: float) -> QueueHistory:
    """Advance `history` through (until, gpus held until then) spans."""
    for until, gpus in spans:
        history = history.advance(until, {"gpu": gpus}, {"gpu": capacity})
    return history


@pytest.mark.parametrize(
    ("half_life", "spans", "now_fraction"),
    [
        # KAI's example: 10 GPUs, 10 hours; 8 GPUs for 3 h then none for 7 h: 24 of 100 GPU-hours.
        (None, [(3 * HOUR, 8), (10 * HOUR, 0)], 0.24),
        # 12 GPUs for 2 h of the 10: also 24 GPU-hours, also 0.24.
        (None, [(2 * HOUR, 12), (10 * HOUR, 0)], 0.24),
        # Half-life 1 h, 8 GPUs for 1 h then none for 1 h, at 2 h: the usage decays by
        # (0.5^1 - 0.5^2) = 0.25, the capacity (10 GPUs for both hours) by (1 - 0.5^2) = 0.75:
        # 8 * 0.25 / (10 * 0.75) = 0.2667 (no decay: 8 / 20 = 0.4).
        (HOUR, [(HOUR, 8), (2 * HOUR, 0)], 8 * 0.25 / (10 * 0.75)),
        # Recent use weighs more: none for 1 h then 8 GPUs for 1 h: 8 * 0.5 / 7.5 = 0.5333.
        (HOUR, [(HOUR, 0), (2 * HOUR, 8)], 8 * 0.5 / (10 * 0.75)),
    ],
)
def test_usage_normalised_to_capacity(
    half_life: float | None, spans: list[tuple[float, float]], now_fraction: float
) -> None:
    start = QueueHistory(0.0, HistoryParams(True, half_life, 12 * HOUR))
    assert _held(start, spans, 10).fraction("gpu") == pytest.approx(now_fraction)


def test_the_window_drops_whole_buckets() -> None:
    # Window 12 h in 12 buckets of 1 h: 8 GPUs in the first hour, then idle. At 12.5 h the first
    # bucket [0, 1 h) ended 11.5 h ago: still in the window (8 GPU-h of 125: 0.064); at 13 h it
    # is out, and nothing is left.
    history = _held(
        QueueHistory(0.0, HistoryParams(True, None, 12 * HOUR)), [(HOUR, 8), (12.5 * HOUR, 0)], 10
    )
    assert history.resource_seconds("gpu") == pytest.approx(8 * HOUR)
    assert history.fraction("gpu") == pytest.approx(8 / 125)
    assert history.advance(13 * HOUR, {"gpu": 0}, {"gpu": 10}).resource_seconds("gpu") == 0


def _tree(*specs: QueueSpec, busy: tuple[str, ...] = ()) -> QueueTree:
    return QueueTree(specs, {name: QueueUsage(allocated={}, requested={"gpu": 16}) for name in busy})


ON = HistoryParams(enabled=True)


@pytest.mark.parametrize(
    ("fractions", "k", "expected"),
    [
        # W' = 0.5 each; U' = 0.75, 0.25; k = 1: P = 0.5 + (0.5 - 0.75) = 0.25 and 0.75 (sum 1):
        # factors P / W' = 0.5 and 1.5.
        ({"a": 0.75, "b": 0.25}, 1.0, {"a": 0.5, "b": 1.5}),
        # k = 0.5: P = 0.5 - 0.5 * 0.25 = 0.375 and 0.625: factors 0.75 and 1.25.
        ({"a": 0.75, "b": 0.25}, 0.5, {"a": 0.75, "b": 1.25}),
        # The cluster was 60 % idle: U' = 0.3, 0.1: P = 0.7, 0.9 (sum 1.6), normalised 0.4375,
        # 0.5625: factors 0.875, 1.125 (KAI's normalisation: U' is the fraction of the cluster).
        ({"a": 0.3, "b": 0.1}, 1.0, {"a": 0.875, "b": 1.125}),
        # a held everything: P = max(0.5 + (0.5 - 1), 0) = 0 and 1.0: factors 0 and 2.
        ({"a": 1.0, "b": 0.0}, 1.0, {"a": 0.0, "b": 2.0}),
        # Equal use: P = W': factors 1.
        ({"a": 0.5, "b": 0.5}, 1.0, {"a": 1.0, "b": 1.0}),
    ],
)
def test_two_queues(fractions: dict[str, float], k: float, expected: dict[str, float]) -> None:
    tree = _tree(QueueSpec("a"), QueueSpec("b"), busy=("a", "b"))
    params = {name: HistoryParams(True, k=k) for name in "ab"}
    factors = target_factors(tree, {q: {"gpu": u} for q, u in fractions.items()}, params, ["gpu"])
    assert {q: factors[q]["gpu"] for q in "ab"} == pytest.approx(expected)


def test_a_newcomer_among_two_users() -> None:
    # W' = 1/3 each; U' = 0.5, 0.5, 0: P = 1/3 - 1/6 = 1/6, 1/6 and 1/3 + 1/3 = 2/3 (sum 1):
    # factors (1/6) / (1/3) = 0.5, 0.5 and (2/3) / (1/3) = 2.
    tree = _tree(QueueSpec("a"), QueueSpec("b"), QueueSpec("new"), busy=("a", "b", "new"))
    fractions = {"a": {"gpu": 0.5}, "b": {"gpu": 0.5}, "new": {"gpu": 0.0}}
    factors = target_factors(tree, fractions, dict.fromkeys(("a", "b", "new"), ON), ["gpu"])
    assert [factors[q]["gpu"] for q in ("a", "b", "new")] == pytest.approx([0.5, 0.5, 2.0])


def test_weights_and_siblings_under_a_parent() -> None:
    # Parent p held half the cluster (U = 0.5); its children a (weight 3) and b (weight 1) held
    # 0.4 and 0.1 of it: U' = 0.8 and 0.2 (relative to p), W' = 0.75 and 0.25:
    # P = 0.75 + (0.75 - 0.8) = 0.7 and 0.25 + (0.25 - 0.2) = 0.3 (sum 1): factors 0.7 / 0.75 =
    # 0.9333 and 0.3 / 0.25 = 1.2. The top level (p alone, no sibling with demand) is not adjusted.
    tree = _tree(
        QueueSpec("p"),
        QueueSpec("a", parent="p", over_quota_weight={"gpu": 3}),
        QueueSpec("b", parent="p"),
        busy=("a", "b"),
    )
    fractions = {"p": {"gpu": 0.5}, "a": {"gpu": 0.4}, "b": {"gpu": 0.1}}
    factors = target_factors(tree, fractions, dict.fromkeys("pab", ON), ["gpu"])
    assert factors["a"]["gpu"] == pytest.approx(0.7 / 0.75)
    assert factors["b"]["gpu"] == pytest.approx(1.2)
    assert factors["p"] == {}


def test_who_takes_part() -> None:
    # b has the rule off: it takes part with U' = W' = 0.5, so P = 0.5; a (U' = 0.75) gets 0.25;
    # normalised 1/3 and 2/3: factors 2/3 and 4/3. c has no demand and d weight 0: neither takes
    # part (no factor), and they change nobody's W'.
    tree = _tree(
        QueueSpec("a"),
        QueueSpec("b"),
        QueueSpec("c"),
        QueueSpec("d", over_quota_weight={"gpu": 0}),
        busy=("a", "b", "d"),
    )
    params = {"a": ON, "b": HistoryParams(enabled=False), "c": ON, "d": ON}
    fractions = {"a": {"gpu": 0.75}, "b": {"gpu": 0.25}, "c": {"gpu": 0.9}, "d": {"gpu": 0.9}}
    factors = target_factors(tree, fractions, params, ["gpu"])
    assert factors["a"]["gpu"] == pytest.approx(2 / 3)
    assert factors["b"]["gpu"] == pytest.approx(4 / 3)
    assert factors["c"] == factors["d"] == {}


def _shares(tree: QueueTree, factors: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    inputs = FairShareInputs(
        tuple(tree.specs.values()), tree.usage, {"gpu": 16}, WeightAdjustment(0, factors)
    )
    return {q: s["gpu"] for q, s in compute_fair_shares(inputs).items()}


def _wanting(*specs: QueueSpec, held: Mapping[str, float]) -> QueueTree:
    """Queues each holding `held` GPUs (missing: none) and waiting for 16 more."""
    return QueueTree(specs, {s.name: QueueUsage({"gpu": held.get(s.name, 0.0)}, {"gpu": 16}) for s in specs})


NEWCOMER = (QueueSpec("a"), QueueSpec("b"), QueueSpec("new"))


@pytest.mark.parametrize(
    ("tree", "previous", "targets", "change", "expected"),
    [
        # 16 GPUs, two queues wanting more, W' = 0.5: shares with history off 8 and 8, so a
        # share may move 0.1 * 8 = 0.8 GPU per minute. Targets 0 and 2 would move each by 8: a
        # tenth of the way, factors 0.9 and 1.1, shares 7.2 and 8.8.
        (
            _wanting(QueueSpec("a"), QueueSpec("b"), held={}),
            {},
            {"a": 0.0, "b": 2.0},
            0.1,
            {"a": 0.9, "b": 1.1},
        ),
        # The newcomer among two (W' = 1/3, shares off 16/3 = 5.333, a bound of 0.533 GPU):
        # targets 0.5, 0.5, 2 move the shares by -2.667, -2.667, +5.333; the newcomer's bound
        # is the tightest, 0.533 / 5.333 = 0.1 of the way: factors 0.95, 0.95, 1.1 (each part of
        # the level, 1/3 + 0.1 * (1/6 - 1/3) = 0.3167 and 1/3 + 0.1 * (2/3 - 1/3) = 0.3667),
        # shares 5.067, 5.067, 5.867. Moving every factor 0.1 instead (0.9, 0.9, 1.1) gave the
        # newcomer 16 * 1.1 / 2.9 = 6.069: 0.736 GPU in a minute, 1.38 times its bound.
        (
            _wanting(*NEWCOMER, held={}),
            {},
            {"a": 0.5, "b": 0.5, "new": 2.0},
            0.1,
            {"a": 0.95, "b": 0.95, "new": 1.1},
        ),
        # Within the bound: the targets at once (parts 0.5 -> 0.52, 0.8 GPU of 8 allowed).
        (
            _wanting(QueueSpec("a"), QueueSpec("b"), held={}),
            {},
            {"a": 0.96, "b": 1.04},
            0.1,
            {"a": 0.96, "b": 1.04},
        ),
        # Factors 0.5 and 0.5 left from a newcomer that has gone: only their ratio counts, so
        # the targets 1 and 1 change no share and are taken at once.
        (
            _wanting(QueueSpec("a"), QueueSpec("b"), held={}),
            {"a": {"gpu": 0.5}, "b": {"gpu": 0.5}},
            {"a": 1.0, "b": 1.0},
            0.1,
            {"a": 1.0, "b": 1.0},
        ),
        # c wants 2 GPUs only (capped at 2 with history off and on): a and b split the other 14,
        # shares off 7 each, 0.7 GPU a minute. Factors 0.2 and 1.8 (a at 14 * 0.2 / 2 = 1.4)
        # toward 1 and 1 would move a by 5.6: an eighth of the way, 0.7 / 5.6, in parts of the
        # level (W' = 1/3: 0.0667 -> 0.0667 + (1/3 - 0.0667) / 8 = 0.1, 0.6 -> 0.5667, c stays
        # at 1/3): factors 0.3, 1.7, 1; a gets 14 * 0.3 / 2 = 2.1, b 11.9, c 2.
        (
            QueueTree(
                (QueueSpec("a"), QueueSpec("b"), QueueSpec("c")),
                {
                    "a": QueueUsage({}, {"gpu": 16}),
                    "b": QueueUsage({}, {"gpu": 16}),
                    "c": QueueUsage({}, {"gpu": 2}),
                },
            ),
            {"a": {"gpu": 0.2}, "b": {"gpu": 1.8}},
            {"a": 1.0, "b": 1.0, "c": 1.0},
            0.1,
            {"a": 0.3, "b": 1.7, "c": 1.0},
        ),
    ],
)
def test_a_share_moves_at_most_a_tenth_of_its_share_off_per_minute(
    tree: QueueTree,
    previous: dict[str, dict[str, float]],
    targets: dict[str, float],
    change: float,
    expected: dict[str, float],
) -> None:
    wanted = {q: {"gpu": f} for q, f in targets.items()}
    factors = bounded_factors(tree, {"gpu": 16}, previous, wanted, ["gpu"], change)
    assert {q: factors.get(q, {}).get("gpu", 1.0) for q in expected} == pytest.approx(expected, abs=1e-3)
    before, after, off = _shares(tree, previous), _shares(tree, factors), _shares(tree, {})
    for queue in tree.specs:
        assert abs(after[queue] - before[queue]) <= change * off[queue] + 1e-6


def test_the_newcomers_share_moves_a_tenth_of_its_share_off_in_the_first_minute() -> None:
    # a and b held 8 GPUs each for an hour, the newcomer none; all three want 16 more. Shares
    # with history off: 16 / 3 = 5.333 each, so a share may move 0.533 GPU in the first minute:
    # the newcomer's goes to 5.867, a's and b's to 5.067 (the second row of the table above).
    tree = _wanting(*NEWCOMER, held={"a": 8, "b": 8})
    rule = FairShareHistory(defaults=ON)
    rule.record(0.0, tree, {"gpu": 16}, {})
    rule.record(HOUR, tree, {"gpu": 16}, {})
    first = rule.adjustment(HOUR, tree, {"gpu": 16})
    assert first is not None
    assert _shares(tree, first.factors) == pytest.approx({"a": 5.067, "b": 5.067, "new": 5.867}, abs=1e-3)


ORGS = (
    QueueSpec("org-a"),
    QueueSpec("a1", parent="org-a"),
    QueueSpec("a2", parent="org-a"),
    QueueSpec("org-b"),
    QueueSpec("b1", parent="org-b"),
    QueueSpec("c"),
)


@pytest.mark.parametrize(
    ("enabled", "moving"),
    [
        # Nowhere: no share moves.
        ((), set()),
        # a1 only: a1 and a2 compete under org-a with adjusted weights; org-a's share among the
        # top-level queues is today's, and so is everything outside org-a.
        (("a1",), {"a1", "a2"}),
        # org-a (a1 and a2 inherit it): the top level's weights move, so every top-level queue's
        # share does, and with them their children's.
        (("org-a", "a1", "a2"), {"org-a", "a1", "a2", "org-b", "b1", "c"}),
        # c, a top-level leaf: the same.
        (("c",), {"org-a", "a1", "a2", "org-b", "b1", "c"}),
    ],
)
def test_the_queues_whose_shares_history_moves(enabled: tuple[str, ...], moving: set[str]) -> None:
    params = {name: HistoryParams(enabled=name in enabled) for name in (s.name for s in ORGS)}
    assert history_moves(QueueTree(ORGS, {}), params) == moving


def test_parameters_are_inherited() -> None:
    tree = _tree(QueueSpec("org"), QueueSpec("team", parent="org"), QueueSpec("other"))
    settings = {
        "org": HistorySettings(enabled=True, half_life_s=HOUR, k=0.5),
        "team": HistorySettings(half_life_s=0, window_s=DAY),  # 0: no decay, over the parent's
    }
    resolved = resolve_params(tree, settings, HistoryParams())
    assert resolved["org"] == HistoryParams(True, HOUR, HistoryParams().window_s, 0.5)
    assert resolved["team"] == HistoryParams(True, None, DAY, 0.5)
    assert resolved["other"] == HistoryParams()  # the defaults: off


DAY = 24 * HOUR


def test_off_everywhere_is_no_adjustment() -> None:
    rule = FairShareHistory()
    tree = _tree(QueueSpec("a"), QueueSpec("b"), busy=("a", "b"))
    rule.record(0.0, tree, {"gpu": 16}, {})
    assert rule.adjustment(0.0, tree, {"gpu": 16}) is None


def _flat(factors: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {queue: resources["gpu"] for queue, resources in factors.items()}


def test_a_long_user_gets_less_and_the_version_moves_once_per_period() -> None:
    # a held all 16 GPUs for an hour, b none; both want 16 now. Targets: U' = 1 and 0, P = 0 and
    # 1: factors 0 and 2; the first step moves each 0.1 (one period of 60 s): 0.9 and 1.1, so the
    # over-quota split is 16 * 0.9 / 2 = 7.2 and 8.8.
    tree = QueueTree(
        (QueueSpec("a"), QueueSpec("b")),
        {
            "a": QueueUsage(allocated={"gpu": 16}, requested={}),
            "b": QueueUsage(allocated={}, requested={"gpu": 16}),
        },
    )
    rule = FairShareHistory(defaults=ON)
    rule.record(0.0, tree, {"gpu": 16}, {})
    rule.record(HOUR, tree, {"gpu": 16}, {})
    first = rule.adjustment(HOUR, tree, {"gpu": 16})
    assert first is not None
    assert _flat(first.factors) == pytest.approx({"a": 0.9, "b": 1.1})
    usage = {"a": QueueUsage({"gpu": 16}, {"gpu": 16}), "b": QueueUsage({}, {"gpu": 16})}
    shares = compute_fair_shares(FairShareInputs(tuple(tree.specs.values()), usage, {"gpu": 16}, first))
    assert (shares["a"]["gpu"], shares["b"]["gpu"]) == pytest.approx((7.2, 8.8))
    # Within the period: the same adjustment; after it, a new version and the next step.
    assert rule.adjustment(HOUR + 30, tree, {"gpu": 16}) == first
    later = rule.adjustment(HOUR + 60, tree, {"gpu": 16})
    assert later is not None and later.version != first.version
    assert _flat(later.factors) == pytest.approx({"a": 0.8, "b": 1.2})


def test_weight_factors_divide_the_over_quota_part() -> None:
    # Two queues of weight 1 wanting 16 of 16 GPUs, factors 0.5 and 1.5: 4 and 12.
    specs = (QueueSpec("a"), QueueSpec("b"))
    usage = {q: QueueUsage({}, {"gpu": 16}) for q in "ab"}
    adjustment = WeightAdjustment(1, {"a": {"gpu": 0.5}, "b": {"gpu": 1.5}})
    shares = compute_fair_shares(FairShareInputs(specs, usage, {"gpu": 16}, adjustment))
    assert (shares["a"]["gpu"], shares["b"]["gpu"]) == pytest.approx((4.0, 12.0))


def test_status_round_trip_and_bad_status() -> None:
    history = _held(QueueHistory(0.0, HistoryParams(True, HOUR, DAY)), [(HOUR, 8), (2 * HOUR, 4)], 10)
    status = history.to_status({"gpu": 0.8})
    restored = QueueHistory.from_status(status)
    assert restored is not None
    again, factors = restored
    assert factors == {"gpu": 0.8}
    assert again.params == history.params
    assert again.fraction("gpu") == pytest.approx(history.fraction("gpu"), rel=1e-6)
    assert status["gpuHours"] == pytest.approx(history.resource_seconds("gpu") / HOUR, abs=1e-3)
    for bad in (
        None,
        "x",
        {},
        {**status, "updated": "soon"},
        {**status, "windowSeconds": 0},
        {**status, "buckets": [1]},
    ):
        assert QueueHistory.from_status(bad) is None


def test_material_changes() -> None:
    # A factor moved by 0.25 or more (a missing one is 1).
    before = {"a": {"gpu": 1.0}, "b": {"gpu": 0.9}}
    after = {"a": {"gpu": 0.7}, "c": {"gpu": 1.3}}
    assert material_changes(before, after, 0.25) == {"a": {"gpu": (1.0, 0.7)}, "c": {"gpu": (1.0, 1.3)}}


def test_a_restored_history_counts_the_time_since_it_was_kept() -> None:
    # Kept at t = 1000 s with 4 GPUs held for 1000 s (4000 GPU-s, no decay); taken up at 1100 s
    # with 4 GPUs held: the 100 s between count as held (a leader change keeps the allocation),
    # 4400 GPU-s; the capacity of 8 GPUs for 1100 s: 4400 / 8800 = 0.5.
    tree = QueueTree((QueueSpec("a"),), {"a": QueueUsage(allocated={"gpu": 4}, requested={})})
    kept = QueueHistory(0.0, ON).advance(1000.0, {"gpu": 4}, {"gpu": 8})
    rule = FairShareHistory(defaults=ON)
    rule.restore({"a": kept}, {})
    rule.record(1100.0, tree, {"gpu": 8}, {})
    assert rule.histories["a"].resource_seconds("gpu") == pytest.approx(4400.0)
    assert rule.histories["a"].fraction("gpu") == pytest.approx(0.5)


def test_buckets_of_a_length_that_is_no_whole_number() -> None:
    # Window 256 s: buckets of 21.33 s; one second at a time, 64 s of 16 GPUs of 16: 1024 GPU-s
    # (a start on a bucket's edge that rounding put below it looped forever before).
    history = QueueHistory(0.0, HistoryParams(True, None, 256.0))
    for second in range(1, 65):
        history = history.advance(float(second), {"gpu": 16}, {"gpu": 16})
    assert history.resource_seconds("gpu") == pytest.approx(1024.0)
    assert history.fraction("gpu") == pytest.approx(1.0)
