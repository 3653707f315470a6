"""bench/prepare.py runs end to end: the driver prepares every claim it is sent (no timing here)."""

from __future__ import annotations

from bench.prepare import GPUS, mig_table, prepare_table, recovery_table, run_mig, run_prepare, run_recovery


def test_the_prepare_benchmark_measures_both_servers() -> None:
    rows = run_prepare(sizes=(1, 3), calls=20)  # raises if the driver answers a claim with an error
    assert [(r.claims, r.requests) for r in rows] == [(1, 20), (3, 20)]
    assert all(r.prepare.p50_ms > 0 and r.floor_unprepare.p99_ms > 0 for r in rows)
    assert "p99 / floor" in prepare_table(rows)


def test_the_recovery_benchmark_resets_each_gpu_once_where_the_old_path_reset_per_claim() -> None:
    """16 interrupted fractions on the 8 GPUs (2 each). Before: every claim's release found its
    GPU idle and reset it (16 x 2 MPS reset commands), then each GPU was set up again (8 x 2):
    48. Now: 8 x 2 resets + 8 x 2 setups = 32."""
    before, now = run_recovery(claims=16)
    assert (before.commands, now.commands) == (16 * 2 + GPUS * 2, GPUS * 2 + GPUS * 2)
    assert "speed-up" in recovery_table([before, now])


def test_the_mig_benchmark_prepares_placements_beside_whole_gpus() -> None:
    rows = run_mig(requests=20)  # raises if a placement's prepare answers an error
    assert [(r.devices, r.requests) for r in rows] == [("whole H100", 20), ("1g.10gb placement", 20)]
    assert "p50 / whole" in mig_table(rows)
