"""The MIG packing replay's three models on hand-checked arrivals, and the synthetic mix."""

from __future__ import annotations

import pytest

from tessera.simulate.mig import SYNTHETIC_MIX, _Packer, replay_mig, synthetic_pods


@pytest.mark.parametrize(
    ("model", "pods", "placed"),
    [
        # one H100: 3g at slices 0-3, 3g at 4-7, then no memory slice is left for the 1g
        ("dynamic", ["3g.40gb", "3g.40gb", "1g.10gb"], [True, True, False]),
        # MPS has no placement rule: 3 + 3 + 1 = 7 compute slices
        ("mps", ["3g.40gb", "3g.40gb", "1g.10gb"], [True, True, True]),
        # carved ahead as 3g + 2g + 1g + 1g: one 3g instance only
        ("static", ["3g.40gb", "3g.40gb", "1g.10gb"], [True, False, True]),
        # a partition makes the GPU unavailable whole; without one the whole GPU is free
        ("dynamic", ["1g.10gb", "whole"], [True, False]),
        ("dynamic", ["whole", "1g.10gb"], [True, False]),
        # carved ahead: never a whole GPU nor a 4g
        ("static", ["whole", "4g.40gb", "2g.20gb"], [False, False, True]),
        # 4g at 0-3 leaves 4-7: a 3g fits at 4 (4 + 3 = 7 compute slices)
        ("dynamic", ["4g.40gb", "3g.40gb", "1g.10gb"], [True, True, False]),
    ],
)
def test_one_gpu(model: str, pods: list[str], placed: list[bool]) -> None:
    packer = _Packer(model, 1)  # type: ignore[arg-type]
    assert [packer.place(profile) for profile in pods] == placed


def test_best_fit_fills_a_partitioned_gpu_before_a_fresh_one() -> None:
    packer = _Packer("dynamic", 2)
    assert packer.place("3g.40gb") and packer.place("whole")  # 3g on one GPU, the whole the other
    assert [g.free_compute for g in packer.gpus] == [4, 0]


def test_the_synthetic_mix_reaches_its_target_and_is_seeded() -> None:
    pods = synthetic_pods(gpus=8, target_pct=100, seed=3)
    compute = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "whole": 7}
    asked = sum(compute[p] for p in pods)
    assert 56 <= asked < 56 + 7  # 8 GPUs x 7 compute slices, passed by the last pod only
    assert pods == synthetic_pods(gpus=8, target_pct=100, seed=3)
    assert set(pods) <= set(SYNTHETIC_MIX)


def test_partitions_on_demand_allocate_more_than_partitions_carved_ahead() -> None:
    dynamic, static, mps = (replay_mig(m, gpus=16, seed=0) for m in ("dynamic", "static", "mps"))
    assert static.allocation_pct < dynamic.allocation_pct <= mps.allocation_pct
    # Carved ahead, no GPU is ever whole: every whole-GPU pod of the arrivals is skipped.
    assert static.skipped_by_profile["whole"] == synthetic_pods(16, 130.0, 0).count("whole")
