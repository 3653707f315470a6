"""bench/prepare.py runs end to end: the driver prepares every claim it is sent (no timing here)."""

from __future__ import annotations

from bench.prepare import prepare_table, run_prepare


def test_the_prepare_benchmark_measures_both_servers() -> None:
    rows = run_prepare(sizes=(1, 3), calls=20)  # raises if the driver answers a claim with an error
    assert [(r.claims, r.requests) for r in rows] == [(1, 20), (3, 20)]
    assert all(r.prepare.p50_ms > 0 and r.floor_unprepare.p99_ms > 0 for r in rows)
    assert "p99 / floor" in prepare_table(rows)
