"""Consolidation in the packing replay: the move budget, worked out by hand."""

from __future__ import annotations

import pytest

from extender.policy.placement import GpuDemand
from tessera.simulate.cluster import Cluster
from tessera.simulate.moves import Consolidator, consolidation_rules
from tessera.simulate.packing import replay_packing, workload_mix
from tessera.simulate.trace import SimNode, SimPod


def demand(milli: int) -> GpuDemand:
    return GpuDemand(count=1, milli=milli, cpu_milli=1000, memory_mib=1024)


def fragmented(moves_per_100_pods: float) -> tuple[Cluster, Consolidator]:
    """Node a: 2 GPUs, 600 used on each (400 + 400 free); node b: 1 GPU, 300 used (700 free).
    1300 milli are free in all, yet no GPU is whole: a 1000 pod fits nowhere."""
    nodes = [
        SimNode("a", "T4", gpus=2, cpu_milli=8000, memory_mib=8192),
        SimNode("b", "T4", gpus=1, cpu_milli=8000, memory_mib=8192),
    ]
    mix = workload_mix([SimPod(str(m), demand(m)) for m in (600, 600, 300, 1000)])
    cluster = Cluster(nodes, mix)
    consolidator = Consolidator(cluster, moves_per_100_pods)
    for number, (key, index, gpu, milli) in enumerate(
        [("p1", 0, 0, 600), ("p2", 0, 1, 600), ("p3", 1, 0, 300)]
    ):
        cluster.place(index, demand(milli), [gpu])
        consolidator.placed(key, index, demand(milli), [gpu], now=number)
    return cluster, consolidator


def test_one_move_lets_the_pending_pod_fit() -> None:
    # Budget 50 per 100 placed pods, 3 placed: floor(50 x 3 / 100) = 1 move allowed.
    # One move suffices either way: p1 (600) to b's GPU (700 free) frees a's GPU 0, or p3 (300)
    # to a's GPU (400 free) frees b's GPU. The planner moves the fewest GPUs: p3, 0.3 of one.
    cluster, consolidator = fragmented(50)
    assert consolidator.allowed(placed=3) == 1
    assert consolidator.serve("big", demand(1000), placed=3, now=3)
    stats = consolidator.stats
    assert (stats.moves, stats.moved_milli, stats.pods_served) == (1, 300, 1)
    # a: (400 - 300, 400) = (100, 400) free; b: whole GPU taken by the 1000 pod.
    assert sorted(cluster.free[0]) == [100, 400]
    assert cluster.free[1] == [0]
    assert cluster.allocated_milli == 600 + 600 + 300 + 1000
    # The budget is spent: 1 move for 3 placed pods, 1 allowed until 4 placed allow floor(2) = 2.
    assert consolidator.allowed(placed=3) == 0
    assert consolidator.allowed(placed=4) == 1


@pytest.mark.parametrize(
    "budget",
    [0, 30],  # 0: never; 30 x 3 / 100 = 0.9, floored to 0 moves
)
def test_no_move_without_budget(budget: float) -> None:
    cluster, consolidator = fragmented(budget)
    before = [list(free) for free in cluster.free]
    assert consolidator.allowed(placed=3) == 0
    assert not consolidator.serve("big", demand(1000), placed=3, now=3)
    assert cluster.free == before
    assert consolidator.stats.plans_tried == 0


def test_no_move_when_moves_cannot_make_room() -> None:
    # An 800 pod: moving p3 frees b's GPU (1000 free) - it fits. A 2-GPU pod fits nowhere, even
    # with every pod moved off a: p1 and p2 (1200 milli) cannot land on b (700 free).
    _, consolidator = fragmented(100)
    assert not consolidator.serve("pair", GpuDemand(2, 1000, cpu_milli=1000, memory_mib=1024), 3, now=3)
    assert consolidator.stats.moves == 0
    assert consolidator.serve("big", demand(800), placed=3, now=3)


@pytest.mark.parametrize(("moves_per_pod", "served"), [(1, False), (2, True)])
def test_moves_per_pod(moves_per_pod: int, served: bool) -> None:
    # Node a: 4 GPUs, a 500 pod on each; a 2-GPU pod fits nowhere (2000 milli free in halves).
    # Two halves moved onto the other two free two GPUs: two moves, so only with 2 per pod.
    nodes = [SimNode("a", "T4", gpus=4, cpu_milli=16000, memory_mib=16384)]
    pair = GpuDemand(2, 1000, cpu_milli=1000, memory_mib=1024)
    cluster = Cluster(nodes, workload_mix([SimPod("h", demand(500)), SimPod("p", pair)]))
    consolidator = Consolidator(cluster, 50, consolidation_rules(moves_per_pod))
    for gpu in range(4):
        cluster.place(0, demand(500), [gpu])
        consolidator.placed(f"h{gpu}", 0, demand(500), [gpu], now=gpu)
    # 50 x 4 / 100 = 2 moves allowed.
    assert consolidator.serve("pair", pair, placed=4, now=4) is served
    assert consolidator.stats.moves == (2 if served else 0)
    assert sorted(cluster.free[0]) == ([0, 0, 0, 0] if served else [500, 500, 500, 500])


def test_a_pod_is_served_by_at_least_one_move() -> None:
    with pytest.raises(ValueError, match="at least one move"):
        consolidation_rules(0)


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        fragmented(-1)


def _workload() -> tuple[list[SimNode], list[SimPod]]:
    nodes = [SimNode(f"n{i}", "T4", gpus=2, cpu_milli=16000, memory_mib=32768) for i in range(4)]
    # 16 pods asking 10500 milli of 8000, cut at random to 130% (10400). In the seed-2 shuffle plain
    # Tessera places 10 of the 15 left (93.1% allocated at the end); with 50 moves per 100 placed
    # pods, one move lets an 11th in (99.4%).
    millis = [450, 300, 1000, 700, 500, 500, 1000, 1000, 450, 1000, 600, 1000, 600, 500, 600, 300]
    pods = [SimPod(f"p{i:02d}", demand(milli)) for i, milli in enumerate(millis)]
    return nodes, pods


@pytest.mark.parametrize("budget", [0.0, 50.0])
def test_replay_keeps_moves_within_the_budget(budget: float) -> None:
    nodes, pods = _workload()
    plain = replay_packing(nodes, pods, "tessera", seed=2)
    moved = replay_packing(nodes, pods, "tessera", seed=2, moves_per_100_pods=budget)
    assert moved.moves <= budget * moved.pods_placed / 100
    assert moved.label == f"tessera+moves{budget:g}"
    assert moved.pods_served_by_moves <= moved.moves <= 2 * moved.pods_served_by_moves  # 1-2 a pod
    if budget == 0:  # the plain replay, step for step
        assert (moved.allocation_pct, moved.curve) == (plain.allocation_pct, plain.curve)
    else:
        assert moved.moves > 0 and moved.final_allocation_pct > plain.final_allocation_pct
        # Any budget from `same_from_budget` up replays alike, and no smaller one plans the move.
        assert 0 < moved.same_from_budget <= budget
        alike = replay_packing(nodes, pods, "tessera", seed=2, moves_per_100_pods=moved.same_from_budget)
        assert (alike.moves, alike.curve) == (moved.moves, moved.curve)


def test_moves_need_the_tessera_policy() -> None:
    nodes, pods = _workload()
    with pytest.raises(ValueError, match="tessera policy"):
        replay_packing(nodes, pods, "fgd", moves_per_100_pods=5)
