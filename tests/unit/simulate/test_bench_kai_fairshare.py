"""bench.kai_fairshare: Tessera's side of the comparison with KAI's simulator, without KAI."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kai_fairshare import compare, read_kai_csv, read_setup, tessera_shares

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
    assert rows[0][:4] == ["0", "6", "100.0", "0.000"]
