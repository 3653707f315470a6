"""bench.kai_fairshare: Tessera's side of the comparison with KAI's simulator, without KAI."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kai_fairshare import (
    VARIANTS,
    compare,
    read_kai_csv,
    read_setup,
    sliding_fractions,
    tessera_shares,
    whole_gpus,
)
from extender.policy.fairness import QueueSpec, QueueTree, QueueUsage
from extender.policy.history import HistoryParams

# KAI's two-queue oscillation, shortened: a department, two queues of 16-GPU jobs, 16 GPUs.
CONFIG = {
    "Cycles": 4,
    "WindowSize": 4,
    "HalfLifePeriod": 0,
    "KValue": None,
    "Nodes": [{"GPUs": 16, "Count": 1}],
    "Queues": [
        {"Name": "dept", "Parent": ""},
        {"Name": "q1", "Parent": "dept"},
        {"Name": "q2", "Parent": "dept"},
    ],
    "Jobs": {
        "q1": {"GPUs": 16, "NumPods": 1, "NumJobs": 100},
        "q2": {"GPUs": 16, "NumPods": 1, "NumJobs": 100},
    },
}


def test_kais_defaults_are_read() -> None:
    setup = read_setup(CONFIG)
    assert setup.capacity == 16 and setup.demand == {"q1": 1600, "q2": 1600}
    assert (setup.params.window_s, setup.params.half_life_s, setup.params.k) == (4, None, 1.0)
    assert all(spec.priority == 100 and spec.over_quota_weight == {"gpu": 1.0} for spec in setup.specs)


def test_shares_from_the_history_before_each_cycle() -> None:
    # q1 holds the 16 GPUs in cycles 0 and 1. Cycle 0: no history, W' = 0.5 each: 8 and 8.
    # Cycle 1: q1 used 16 of 16 (U' = 1 of the department's 1), q2 none: P = 0 and 1, factors
    # 0 (the smallest weight, 0.001) and 2: 16 * 0.001 / 2.001 = 0.008 and 15.992.
    shares = tessera_shares(read_setup(CONFIG), [{"q1": 16.0}, {"q1": 16.0}])
    assert (shares[0]["q1"], shares[0]["q2"]) == pytest.approx((8.0, 8.0))
    assert shares[1]["q2"] == pytest.approx(16 * 2 / 2.001)
    assert shares[1]["dept"] == pytest.approx(16.0)


def test_the_comparison_agrees_with_itself(tmp_path: Path) -> None:
    setup = read_setup(CONFIG)
    held = [{"q1": 16.0}, {"q1": 16.0}, {"q2": 16.0}]
    ours = tessera_shares(setup, held)
    path = tmp_path / "kai.csv"
    lines = ["Time,QueueID,Allocation,FairShare"] + [
        f"{t},{q},{held[t].get(q, 0.0)},{ours[t][q]}" for t in range(3) for q in ("q1", "q2")
    ]
    path.write_text("\n".join(lines) + "\n")
    rows = compare(read_kai_csv(path), setup, ["q1", "q2"])
    assert rows[0][:5] == ["tessera", "0", "6", "100.0", "0.000"]
    assert [row[0] for row in rows] == [v for v in VARIANTS for _ in range(4)]


def _siblings(shares: dict[str, float]) -> QueueTree:
    specs = [QueueSpec("dept"), *(QueueSpec(q, parent="dept") for q in shares)]
    usage = {q: QueueUsage({"gpu": 0.0}, {"gpu": 100.0}) for q in shares}  # all want more
    return QueueTree(specs, usage)


@pytest.mark.parametrize(
    ("shares", "rounded"),
    [
        # Floors 7 and 8 leave 1 GPU: to q2, the larger remainder (0.7 against 0.3).
        ({"q1": 7.3, "q2": 8.7}, {"q1": 7, "q2": 9}),
        # A tie (0.5 and 0.5): to the queue listed first.
        ({"q1": 7.5, "q2": 8.5}, {"q1": 8, "q2": 8}),
        # 16 / 3 = 5.33 each: floors 5, 5, 5 leave 1, to q1 (a three-way tie).
        ({"q1": 16 / 3, "q2": 16 / 3, "q3": 16 / 3}, {"q1": 6, "q2": 5, "q3": 5}),
        # Whole shares stay as they are.
        ({"q1": 4.0, "q2": 12.0}, {"q1": 4, "q2": 12}),
    ],
)
def test_kais_whole_gpu_rounding(shares: dict[str, float], rounded: dict[str, float]) -> None:
    result = whole_gpus(_siblings(shares), {"dept": 16.0, **shares})
    assert {q: result[q] for q in shares} == pytest.approx(rounded)
    assert result["dept"] == 16.0


@pytest.mark.parametrize(
    ("window", "half_life", "expected"),
    [
        # q1 held 16 of 16 for two cycles, q2 the last one: 32 / 48 and 16 / 48.
        (4, None, {"q1": 2 / 3, "q2": 1 / 3}),
        # Weighed 0.5^3, 0.5^2, 0.5^1 (oldest first): q1 0.375 / 0.875 = 0.43, q2 0.5 / 0.875.
        (4, 1.0, {"q1": 0.375 / 0.875, "q2": 0.5 / 0.875}),
        # A window of 2 cycles: the last two only, one each.
        (2, None, {"q1": 0.5, "q2": 0.5}),
    ],
)
def test_kais_usage_per_cycle(window: int, half_life: float | None, expected: dict[str, float]) -> None:
    held = [{"q1": 16.0}, {"q1": 16.0}, {"q2": 16.0}]
    params = HistoryParams(enabled=True, half_life_s=half_life, window_s=window)
    fractions = sliding_fractions(held, 16.0, params)
    assert {q: fractions.get(q, 0.0) for q in expected} == pytest.approx(expected)
