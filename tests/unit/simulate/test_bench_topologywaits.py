"""bench.topologywaits' table: the per-seed p95 ratio, the worst seed, and the p95 of every seed's
gangs pooled, as a worked example."""

from __future__ import annotations

from bench.topologywaits import PLACEBO_DRAW, SeedRow, mixed_workload, p95, run_seed, table
from tessera.simulate.queues import parse_workload, run_queue_workload


def test_the_pooled_p95_is_over_every_seeds_gangs_together() -> None:
    # Seed 0's 20 gangs: with the preference 0..19 s, without 0..18 and 38 (its longest twice as
    # long): p95 (nearest rank: round(0.95 x 19) = the 19th of 0-based 20) is 18 with, 18 without.
    # Seed 1's: with 0, 0, ..., 0, 40, 50 (20 gangs), without all 0 but one of 25: p95 40 / 0.
    seed0 = SeedRow(
        0, 20, 18.0, 18.0, 9.5, 10.4, 1.0, 2.0, tuple(map(float, range(20))), (*map(float, range(19)), 38.0)
    )
    seed1 = SeedRow(1, 20, 40.0, 0.0, 4.5, 1.25, 1.0, 2.0, (0.0,) * 18 + (40.0, 50.0), (0.0,) * 19 + (25.0,))
    assert p95(seed0.waits_with_s) == 18.0 and p95(seed1.waits_with_s) == 40.0
    assert (seed0.ratio, seed1.ratio) == (1.0, float("inf"))  # no wait without, some with: inf
    # Pooled, 40 gangs each way: the 38th smallest (round(0.95 x 39) = 37, 0-based). With: 0 x 18,
    # 0..19, 40, 50 sorted: the 38th is 19. Without: 0 x 19, 0..18, 25, 38: the 38th is 18.
    pooled = table([seed0, seed1]).splitlines()[-1].split()
    assert pooled == ["pooled", "40", "19", "18", "1.06x"]
    assert table([seed0, seed1]).splitlines()[-3].split()[:4] == ["worst", "seed", "1", "infx"]


def test_the_placebo_replays_both_ways_without_the_asks_on_two_draws() -> None:
    # The A/A test: its first replay is the workload without the asks on another placement draw,
    # its second the real comparison's "without" replay, unchanged.
    real, placebo = (run_seed(0, 6, 1.0, placebo=flag) for flag in (False, True))
    workload = parse_workload(mixed_workload(0, 6, 1.0), "seed 0")
    other_draw = run_queue_workload(workload, "tessera", PLACEBO_DRAW, topology_asks=False)
    assert placebo.waits_with_s == tuple(gang.wait_s for gang in other_draw.gangs)
    assert placebo.racks_with == sum(gang.spanned["rack"] for gang in other_draw.gangs) / 6
    assert (placebo.waits_without_s, placebo.racks_without) == (real.waits_without_s, real.racks_without)
    # The asks are what packs the gangs: without them, on either draw, they span more racks.
    assert real.racks_with < min(placebo.racks_with, placebo.racks_without)
