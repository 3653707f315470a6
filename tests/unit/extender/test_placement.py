"""Placement scoring with hand-worked numbers (see the comments for the arithmetic)."""

from __future__ import annotations

import pytest

from extender.policy.placement import (
    GpuDemand,
    NodeGpus,
    WorkloadMix,
    choose_gpus,
    fits,
    host_cpu_milli,
    host_memory_mib,
    mix_from_demands,
    node_fragmentation,
    node_packing_loss,
    node_set_loss,
    node_supply,
    placement_cost,
    placement_demand,
    score_nodes,
    scores_from_costs,
)

HALF = GpuDemand(count=1, milli=500)
WHOLE = GpuDemand(count=1)
PAIR = GpuDemand(count=2)
HALF_AND_WHOLE = WorkloadMix(demands=((HALF, 1.0), (WHOLE, 1.0)))


def node(name: str, *free: int, model: str = "T4") -> NodeGpus:
    return NodeGpus(name=name, model=model, free_milli=free)


def test_fragmentation_of_partly_used_node() -> None:
    # idle 1300. HALF fits; the 300 GPU is too small for it -> 300. WHOLE fits; 300 is not a
    # whole GPU -> 300. Mean over equally popular types: 300.
    assert node_fragmentation(node("n", 1000, 300), HALF_AND_WHOLE) == pytest.approx(300.0)


def test_fragmentation_when_no_type_fits_is_all_idle() -> None:
    # Neither HALF (needs 500 on one GPU) nor WHOLE fits: all 400 idle milli are fragments.
    assert node_fragmentation(node("n", 200, 200), HALF_AND_WHOLE) == pytest.approx(400.0)


def test_fragmentation_of_idle_and_full_nodes_is_zero() -> None:
    assert node_fragmentation(node("idle", 1000, 1000), HALF_AND_WHOLE) == 0.0
    assert node_fragmentation(node("full", 0, 0), HALF_AND_WHOLE) == 0.0


def test_fragmentation_weights_by_popularity() -> None:
    # Node (1000, 300): HALF -> 300, PAIR does not fit -> 1300. Weights 3:1 -> (900 + 1300) / 4.
    mix = WorkloadMix(demands=((HALF, 3.0), (PAIR, 1.0)))
    assert node_fragmentation(node("n", 1000, 300), mix) == pytest.approx(550.0)


def test_fragmentation_counts_model_mismatch_as_all_idle() -> None:
    v100_only = GpuDemand(count=1, milli=500, models=frozenset({"V100"}))
    mix = WorkloadMix(demands=((v100_only, 1.0),))
    assert node_fragmentation(node("n", 1000, 600, model="T4"), mix) == pytest.approx(1600.0)
    assert node_fragmentation(node("n", 1000, 600, model="V100"), mix) == 0.0


def test_fraction_goes_where_fragmentation_shrinks() -> None:
    # A fraction ranks by fragmentation growth + 0.5 x packing-loss growth.
    # n1 idle (1000, 1000): frag 0, loss 0. 500 -> (500, 1000): frag (0 + 500) / 2 = 250; loss: HALF
    # fits 3 -> 0, WHOLE fits 1 -> 500, so 250. Cost 250 + 125 = 375.
    # n2 (1000, 600): frag (0 + 600) / 2 = 300; loss: HALF 3 -> 100, WHOLE 1 -> 600, so 350.
    # Onto GPU 1 -> (1000, 100): frag (100 + 100) / 2 = 100; loss (100 + 100) / 2 = 100.
    # Cost -200 + 0.5 x -250 = -325. Onto GPU 0 -> (500, 600): frag (0 + 1100) / 2 = 550, loss
    # (100 + 1100) / 2 = 600: cost 250 + 125 = 375.
    n1, n2 = node("n1", 1000, 1000), node("n2", 1000, 600)
    assert choose_gpus(n2, HALF, HALF_AND_WHOLE) == (1,)
    cost_n1 = placement_cost(n1, HALF, HALF_AND_WHOLE)
    cost_n2 = placement_cost(n2, HALF, HALF_AND_WHOLE)
    assert cost_n1 is not None and cost_n1[0] == pytest.approx(375.0)
    assert cost_n2 is not None and cost_n2[0] == pytest.approx(-325.0)
    assert score_nodes([n1, n2], HALF, HALF_AND_WHOLE) == {"n1": 0, "n2": 10}


def test_whole_gpu_keeps_whole_free_gpus_together() -> None:
    # Only whole-GPU pods in the mix, so fragmentation never grows; the tie-break counts the
    # whole free GPUs left: n2 -> 0, n3 -> 1, n1 -> 3. Best fit first.
    mix = WorkloadMix(demands=((WHOLE, 1.0),))
    nodes = [node("n1", 1000, 1000, 1000, 1000), node("n2", 1000, 0, 0, 0), node("n3", 1000, 1000, 0, 0)]
    assert score_nodes(nodes, WHOLE, mix) == {"n2": 10, "n3": 5, "n1": 0}


def test_whole_gpu_avoids_breaking_the_last_pair() -> None:
    # Mix of 2-GPU pods. n3 (1000, 1000, 0, 0) fits a pair (frag 0); after taking one GPU it does
    # not: frag 1000, growth +1000. n1 (four idle): growth 0. n2 (1000, 0, 0, 0) cannot fit a pair
    # (frag 1000) and becomes full (frag 0): growth -1000.
    mix = WorkloadMix(demands=((PAIR, 1.0),))
    nodes = [node("n1", 1000, 1000, 1000, 1000), node("n2", 1000, 0, 0, 0), node("n3", 1000, 1000, 0, 0)]
    assert score_nodes(nodes, WHOLE, mix) == {"n2": 10, "n1": 5, "n3": 0}


def test_cpu_only_pod_avoids_starving_gpu_tasks_of_cpu() -> None:
    # HALF needs 4000m CPU. On "small" (8000m) a 6000m CPU-only pod leaves 2000m: HALF no longer
    # fits, all 2000 idle GPU milli become fragments (+2000); packing loss goes from 1000 (CPU for
    # 2 of the 4 halves) to 2000: cost 2000 + 0.5 x 1000 = 2500. On "big" (16000m -> 10000m) HALF
    # still fits (frag +0) but CPU now holds 2 halves, not 4: loss 0 -> 1000, cost 500.
    gpu_task = GpuDemand(count=1, milli=500, cpu_milli=4000)
    mix = WorkloadMix(demands=((gpu_task, 1.0),))
    cpu_only = GpuDemand(count=0, cpu_milli=6000)
    small = NodeGpus("small", "T4", (1000, 1000), cpu_free_milli=8000, host_tracked=True)
    big = NodeGpus("big", "T4", (1000, 1000), cpu_free_milli=16000, host_tracked=True)
    cost_small = placement_cost(small, cpu_only, mix)
    cost_big = placement_cost(big, cpu_only, mix)
    assert cost_small is not None and cost_small[0] == pytest.approx(2500.0)
    assert cost_big is not None and cost_big[0] == pytest.approx(500.0)
    assert score_nodes([small, big], cpu_only, mix) == {"small": 0, "big": 10}


def test_spread_prefers_emptiest_node_and_gpu() -> None:
    n1, n2 = node("n1", 1000, 1000), node("n2", 500, 1000)
    demand = GpuDemand(count=1, milli=300)
    assert score_nodes([n1, n2], demand, HALF_AND_WHOLE, strategy="spread") == {"n1": 10, "n2": 0}
    assert choose_gpus(n2, demand, HALF_AND_WHOLE, strategy="spread") == (1,)
    # binpack puts it on the half-used GPU instead
    assert choose_gpus(n2, demand, HALF_AND_WHOLE) == (0,)


def test_packing_loss_counts_remainders_and_host_limits() -> None:
    # Node (1000, 700), 8000m CPU; idle 1700.
    # 300-milli type, 1000m CPU: GPUs hold 3 + 2 = 5, CPU holds 8 -> 5 x 300 = 1500, loses 200.
    # 300-milli type, 4000m CPU: CPU holds 2 -> 600, loses 1100.
    # whole-GPU type: 1 -> loses 700. Pair type: 0 -> loses 1700. GPU-less 9000m: does not fit -> 1700.
    small = GpuDemand(count=1, milli=300, cpu_milli=1000)
    hungry = GpuDemand(count=1, milli=300, cpu_milli=4000)
    candidate = NodeGpus("n", "T4", (1000, 700), cpu_free_milli=8000, host_tracked=True)
    cases = [
        (small, 200.0),
        (hungry, 1100.0),
        (WHOLE, 700.0),
        (PAIR, 1700.0),
        (GpuDemand(count=0, cpu_milli=9000), 1700.0),
    ]
    for demand, lost in cases:
        assert node_packing_loss(candidate, WorkloadMix(demands=((demand, 1.0),))) == pytest.approx(lost)
    mix = WorkloadMix(demands=((small, 1.0), (hungry, 3.0)))
    assert node_packing_loss(candidate, mix) == pytest.approx((200.0 + 3 * 1100.0) / 4)


def test_set_loss_counts_whole_gpus_left_out_of_multi_gpu_sets() -> None:
    # 7 whole free GPUs and one at 500 (the half-free one is never part of a set).
    # 8-GPU type: 7 mod 8 = 7 -> 7000. 4-GPU type: 7 mod 4 = 3 -> 3000. 2-GPU type: 1 -> 1000.
    # 1-GPU and half types: 0. Equal weights over the five: (7000 + 3000 + 1000) / 5 = 2200.
    candidate = node("n", *(1000,) * 7, 500)
    mix = WorkloadMix(
        demands=((GpuDemand(count=8), 1.0), (GpuDemand(count=4), 1.0), (PAIR, 1.0), (WHOLE, 1.0), (HALF, 1.0))
    )
    assert node_set_loss(candidate, mix) == pytest.approx(2200.0)
    # An 8-GPU type of another model loses nothing here (fragmentation counts it): 0 + 3000 over 2.
    other_model = WorkloadMix(
        demands=((GpuDemand(count=8, models=frozenset({"H100"})), 1.0), (GpuDemand(count=4), 1.0))
    )
    assert node_set_loss(candidate, other_model) == pytest.approx(1500.0)
    assert node_set_loss(node("idle", *(1000,) * 8), mix) == 0.0  # one 8-set, two 4-sets, four pairs


def test_whole_gpu_pod_goes_to_the_broken_node_not_the_idle_one() -> None:
    # Mix: 1 GPU + 4 cores (weight 4), 2 GPUs + 8 cores (1), 8 GPUs + 32 cores (0.5); total 5.5.
    # The pod: 1 GPU + 12 cores. "idle": 8 free GPUs, 96 cores. "used": 2 free GPUs, 12 cores.
    #
    # Fragmentation growth alone prefers the idle node:
    #   idle: after, 7 GPUs - the 8-GPU type no longer fits: 7000 x 0.5 / 5.5 = 636.4.
    #   used: before, only the 8-GPU type misses: 2000 x 0.5 / 5.5 = 181.8; after, 1 GPU and 0
    #         cores - nothing fits: 1000 -> growth 818.2.
    # Set loss growth (whole GPUs left out of sets):
    #   idle: 8 -> 7 whole: 8-type 7000 x 0.5 + 2-type 1000 x 1 = 4500 / 5.5 = 818.2 (from 0).
    #   used: 2 -> 1 whole: 8-type 2000 x 0.5 = 1000 -> 181.8; then 500 + 1000 = 1500 -> 272.7;
    #         growth 90.9.
    # Together: idle 636.4 + 818.2 = 1454.5, used 818.2 + 90.9 = 909.1 -> the used node.
    mix = WorkloadMix(
        demands=(
            (GpuDemand(count=1, cpu_milli=4000), 4.0),
            (GpuDemand(count=2, cpu_milli=8000), 1.0),
            (GpuDemand(count=8, cpu_milli=32000), 0.5),
        )
    )
    pod = GpuDemand(count=1, cpu_milli=12000)
    idle = NodeGpus("idle", "T4", (1000,) * 8, cpu_free_milli=96000, host_tracked=True)
    used = NodeGpus("used", "T4", (1000, 1000) + (0,) * 6, cpu_free_milli=12000, host_tracked=True)
    idle_cost, used_cost = placement_cost(idle, pod, mix), placement_cost(used, pod, mix)
    assert idle_cost is not None and used_cost is not None
    assert idle_cost[0] == pytest.approx(1454.545, abs=1e-3)
    assert used_cost[0] == pytest.approx(909.091, abs=1e-3)
    assert score_nodes([idle, used], pod, mix) == {"idle": 0, "used": 10}


def test_fits_checks_model_gpus_and_host() -> None:
    assert fits(node("n", 1000, 400), GpuDemand(count=1, milli=400))
    assert not fits(node("n", 1000, 400), GpuDemand(count=2))
    assert not fits(node("n", 1000), GpuDemand(count=1, models=frozenset({"A100"})))
    exhausted = NodeGpus("n", "T4", (1000,), cpu_free_milli=0, host_tracked=True)
    loose = NodeGpus("n", "T4", (1000,))
    assert not fits(exhausted, GpuDemand(count=1, cpu_milli=1))
    assert fits(loose, GpuDemand(count=1, cpu_milli=1))


def test_no_fit_scores_zero_and_choose_returns_none() -> None:
    full = node("full", 0, 0)
    assert choose_gpus(full, HALF, HALF_AND_WHOLE) is None
    assert score_nodes([full, node("idle", 1000)], HALF, HALF_AND_WHOLE) == {"full": 0, "idle": 10}


def test_scores_from_costs_ranks_evenly() -> None:
    costs: dict[str, tuple[float, ...]] = {"a": (1.0,), "b": (5.0,), "c": (3.0,), "d": (1.0,)}
    assert scores_from_costs(costs) == {"a": 10, "b": 0, "c": 5, "d": 10}
    assert scores_from_costs({"only": (7.0,)}) == {"only": 10}


def test_demand_validation() -> None:
    with pytest.raises(ValueError, match="count == 1"):
        GpuDemand(count=2, milli=500)
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        GpuDemand(count=1, milli=0)


def test_mix_from_demands_counts_popularity() -> None:
    mix = mix_from_demands([HALF, WHOLE, HALF])
    assert dict(mix.demands) == {HALF: 2.0, WHOLE: 1.0}


def _literal_fragmentation(node: NodeGpus, mix: WorkloadMix) -> float:
    """The trace README's definition, word for word, as an independent oracle."""
    idle = sum(node.free_milli)
    total = 0.0
    weights = 0.0
    for task, weight in mix.demands:
        weights += weight
        runs_here = (
            (not task.models or node.model in task.models)
            and task.cpu_milli <= node.cpu_free_milli
            and task.memory_mib <= node.memory_free_mib
            and sum(1 for free in node.free_milli if free >= task.milli) >= task.count
        )
        unusable = sum(free for free in node.free_milli if free < task.milli) if task.count else 0
        total += weight * (unusable if runs_here else idle)
    return total / weights


def test_fragmentation_matches_the_literal_definition_on_random_nodes() -> None:
    import random

    rng = random.Random(5)
    mix = WorkloadMix(
        demands=(
            (GpuDemand(count=1, milli=300, cpu_milli=4000), 5.0),
            (GpuDemand(count=1, milli=700, cpu_milli=2000, memory_mib=100), 3.0),
            (GpuDemand(count=1, cpu_milli=8000), 4.0),
            (GpuDemand(count=2, cpu_milli=16000, models=frozenset({"A"})), 1.0),
            (GpuDemand(count=0, cpu_milli=6000), 2.0),
        )
    )
    for _ in range(300):
        gpus = rng.choice([1, 2, 4, 8])
        candidate = NodeGpus(
            name="n",
            model=rng.choice(["A", "B"]),
            free_milli=tuple(rng.choice([0, 100, 300, 500, 700, 1000]) for _ in range(gpus)),
            cpu_free_milli=rng.randrange(0, 20000, 1000),
            memory_free_mib=rng.choice([0, 50, 200]),
            host_tracked=True,
        )
        assert node_fragmentation(candidate, mix) == pytest.approx(_literal_fragmentation(candidate, mix))


@pytest.mark.parametrize(
    ("amount", "asked", "expected"),
    [
        (0.1, True, 100),  # "100m": 100.00000000000001 milli after parsing is not 101
        (0.2505, True, 251),  # a request rounds up
        (0.2505, False, 250),  # a capacity rounds down
        (64.0, False, 64_000),
    ],
)
def test_cpu_cores_in_milli(amount: float, asked: bool, expected: int) -> None:
    assert host_cpu_milli(amount, request=asked) == expected


@pytest.mark.parametrize(
    ("amount", "asked", "expected"),
    [
        (64 * 2**20, True, 64),
        (1.5 * 2**20, True, 2),  # 1.5 MiB asked takes 2 MiB
        (1.5 * 2**20, False, 1),  # 1.5 MiB allocatable offers 1
        (8e9, True, 7630),  # "8G": 7629.39 MiB asked
    ],
)
def test_memory_bytes_in_mib(amount: float, asked: bool, expected: int) -> None:
    assert host_memory_mib(amount, request=asked) == expected


def test_node_supply_takes_the_placed_pods_cpu_and_memory_off_the_node() -> None:
    placed = [placement_demand(GpuDemand(1, 500), 4_000, 8_192), placement_demand(None, 2_000, 1_024)]
    # 32000 - 4000 - 2000 = 26000 m; 65536 - 8192 - 1024 = 56320 Mi; exact even when it reaches 0.
    assert node_supply("n", "T4", (500, 1000), (32_000, 65_536), placed) == NodeGpus(
        "n", "T4", (500, 1000), 26_000, 56_320, host_tracked=True
    )
    assert node_supply("n", "T4", (1000,), None) == NodeGpus("n", "T4", (1000,))  # host not reported
