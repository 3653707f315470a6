"""The timeline replay (tessera.simulate.timeline) on tiny timelines, the arithmetic in comments.

Nodes are T4 nodes of 2 GPUs with CPU and memory to spare, so only GPUs decide; each pod asks for
1 CPU and 1 GiB. A pod's run time is deletion_time - scheduled_time; here scheduled = creation
unless a test is about the trace's recorded waits.
"""

from __future__ import annotations

import math

import pytest

from contract.names import GPU_MILLI
from extender.policy.consolidation import ConsolidationRules
from extender.policy.placement import GpuDemand, placement_demand
from tessera.simulate.timeline import (
    MOVES,
    Timeline,
    percentile,
    replay_timeline,
    sample_nodes,
    size_class,
    timed_pods,
)
from tessera.simulate.trace import SimNode, SimPod


def node(name: str, gpus: int = 2, model: str = "T4") -> SimNode:
    return SimNode(name, model, gpus, 32000, 65536)


def pod(name: str, gpus: int, milli: int, created: int, runs: int, scheduled: int | None = None) -> SimPod:
    demand = placement_demand(GpuDemand(gpus, milli, frozenset()) if gpus else None, 1000, 1024)
    start = created if scheduled is None else scheduled
    return SimPod(name, demand, creation_time=created, scheduled_time=start, deletion_time=start + runs)


def test_load_factor_divides_the_gaps_between_arrivals_and_keeps_run_times() -> None:
    pods = [
        pod("a", 1, 1000, created=100, runs=50),
        pod("b", 1, 1000, created=300, runs=60, scheduled=310),  # the trace made it wait 10 s
        pod("c", 1, 1000, created=700, runs=70),
        # No scheduled_time: deleted while pending in the trace.
        SimPod("never-ran", placement_demand(None, 1000, 1024), creation_time=50, deletion_time=90),
    ]
    timed, never_ran = timed_pods(pods, load=2.0)
    # Arrivals relative to the first creation of a pod that ran (100), halved:
    # (100-100)/2, (300-100)/2, (700-100)/2.
    assert [(p.name, p.arrival_s) for p in timed] == [("a", 0.0), ("b", 100.0), ("c", 300.0)]
    # Run times are deletion - scheduled, whatever the load: 50, 370-310 = 60, 70.
    assert [p.run_s for p in timed] == [50, 60, 70]
    assert [p.recorded_wait_s for p in timed] == [0, 10, 0]
    assert never_ran == 1  # not replayed


def test_a_departure_opens_a_hole_and_the_waiting_pods_start_in_arrival_order() -> None:
    # One node of 2 GPUs. t=0 "big" takes both GPUs for 100 s. t=10 "one" (1 GPU, 50 s) and t=20
    # "two" (1 GPU, 50 s) fit nowhere and wait. t=100 "big" leaves: "one" then "two" start,
    # waits 100-10 = 90 s and 100-20 = 80 s; both leave at 150. t=200 "late" (a fraction) arrives
    # on an empty node.
    pods = [
        pod("big", 2, 1000, created=0, runs=100),
        pod("one", 1, 1000, created=10, runs=50),
        pod("two", 1, 1000, created=20, runs=50),
        pod("late", 1, 500, created=200, runs=10),
    ]
    result = replay_timeline([node("n0")], pods, "fgd")
    assert result.waits == {"2-4": [0.0], "1": [90.0, 80.0], "fraction": [0.0]}
    # Wait x GPUs: (90 + 80) s x 1 GPU = 170 GPU-s.
    assert result.wait_gpu_hours == pytest.approx(170 / 3600)
    # Allocation over the arrival span 0..200: 2 GPUs busy 0..150, none 150..200:
    # 2000 milli x 150 s / (2000 milli x 200 s) = 75%.
    assert result.allocation_pct == pytest.approx(75.0)
    # A GPU pod waits 10..100 with the node full: 100% allocated then, and no idle GPU to strand.
    assert result.waiting_s == pytest.approx(90.0)
    assert result.allocation_waiting_pct == pytest.approx(100.0)
    assert result.stranded_gpu_s == 0.0
    assert result.work_gpu_s == pytest.approx(2 * 100 + 50 + 50 + 0.5 * 10)


def test_wait_gpu_hours_are_split_by_pod_size() -> None:
    # One node of 2 GPUs, held by "big" 0..100. Waiting: "f1" (half a GPU) from 10, "f2" (half a
    # GPU) from 20, "one" (1 GPU) from 30. At 100 "big" leaves and all three start, in arrival
    # order: Tessera's binpack puts f2 next to f1 on one GPU, so "one" takes the other whole.
    pods = [
        pod("big", 2, 1000, created=0, runs=100),
        pod("f1", 1, 500, created=10, runs=50),
        pod("f2", 1, 500, created=20, runs=50),
        pod("one", 1, 1000, created=30, runs=50),
    ]
    result = replay_timeline([node("n0")], pods, "tessera")
    assert result.waits == {"2-4": [0.0], "fraction": [90.0, 80.0], "1": [70.0]}
    # Fractions: (90 + 80) s x 0.5 GPU = 85 GPU-s; 1 GPU: 70 s x 1 GPU = 70 GPU-s; "big" 0.
    assert result.wait_gpu_hours_by_size == pytest.approx({"2-4": 0.0, "fraction": 85 / 3600, "1": 70 / 3600})
    # They add up to the total: 85 + 70 = 155 GPU-s.
    assert result.wait_gpu_hours == pytest.approx(155 / 3600)


def test_a_smaller_later_pod_starts_in_a_hole_the_earlier_bigger_one_cannot_use() -> None:
    # t=0 "a" and t=1 "b" (1 GPU each) fill the node; t=2 "pair" (2 GPUs) and t=3 "single"
    # (1 GPU) wait. t=50 "a" leaves: one GPU free, "pair" (first in line) does not fit it, "single"
    # does and starts (wait 47). t=100 "b" leaves, t=130 "single" leaves (50 + 80): "pair" starts
    # at 130, wait 128.
    pods = [
        pod("a", 1, 1000, created=0, runs=50),
        pod("b", 1, 1000, created=1, runs=99),
        pod("pair", 2, 1000, created=2, runs=10),
        pod("single", 1, 1000, created=3, runs=80),
    ]
    result = replay_timeline([node("n0")], pods, "bestfit")
    assert result.waits["1"] == [0.0, 0.0, 47.0]
    assert result.waits["2-4"] == [128.0]
    # "pair" waits 2..130 while one GPU is idle 50..130, and 2000 milli never fit in 1000 idle:
    # nothing is stranded (moves could not make room either).
    assert result.stranded_gpu_s == 0.0


def _scattered_fractions() -> list[SimPod]:
    """Two nodes of 2 GPUs end with a 0.6 fraction on each and a 2-GPU pod waiting.

    t=0  y1 (2 GPUs, 10 s) takes one node whole (call it A).
    t=1  f1 (600 milli, 100 s): A is full, so node B, GPU 0.
    t=2  y2 (1 GPU, 10 s): the only idle GPU, B's GPU 1.
    t=10 y1 leaves: A is empty.
    t=11 f2 (600 milli, 100 s): B has 400 milli at most, so A.
    t=12 y2 leaves: A holds f2, B holds f1, one idle GPU on each.
    t=13 w (2 GPUs, 10 s) fits no node and waits.
    """
    return [
        pod("y1", 2, 1000, created=0, runs=10),
        pod("f1", 1, 600, created=1, runs=100),
        pod("y2", 1, 1000, created=2, runs=10),
        pod("f2", 1, 600, created=11, runs=100),
        pod("w", 2, 1000, created=13, runs=10),
    ]


# min runtime 20 s: f1 (started at 1) may move from t=21, f2 (started at 11) from t=31.
RULES = ConsolidationRules(min_runtime_s=20.0, max_moves_per_pod=2, max_moves_per_cycle=4)


def test_a_move_lets_the_waiting_pod_start_and_the_mover_restarts_with_its_work_lost() -> None:
    pods = _scattered_fractions()
    timed, _ = timed_pods(pods, 1.0)
    # Budget 100 moves per 100 pods started: 4 pods started by t=21, so floor(100 x 4 / 100) = 4.
    timeline = Timeline([node("a"), node("b")], timed, MOVES, move_budget=100.0, rules=RULES)
    result = timeline.run()
    # At t=21 f1 comes of age; the planner moves it next to f2, and w starts on the emptied node:
    # wait 21 - 13 = 8 s.
    assert result.moves == 1 and result.pods_served_by_moves == 1
    assert result.waits["2-4"] == [0.0, 8.0]
    # f1 restarts: 0.6 GPU x (21 - 1) s = 12 GPU-s of work lost, and it runs its 100 s again.
    assert result.lost_gpu_s == pytest.approx(12.0)
    restarted = timeline.running["f1"]
    assert restarted.started_s == 21.0 and restarted.index != timeline.running["w"].index
    assert restarted.index == timeline.running["f2"].index
    # While w waits (13..21) 2 x 400 + 2 x 1000 = 2800 milli are idle on 2-GPU nodes, enough for
    # its 2000 after moves: 2.8 GPUs x 8 s = 22.4 stranded GPU-s.
    assert result.stranded_gpu_s == pytest.approx(22.4)


def test_without_moves_or_budget_the_pod_waits_for_a_fraction_to_finish() -> None:
    # f1 leaves at 1 + 100 = 101 (f2 at 111): w starts at 101, wait 88 s, 2.8 GPUs x 88 s stranded.
    pods = _scattered_fractions()
    plain = replay_timeline([node("a"), node("b")], pods, "tessera", rules=RULES)
    assert plain.waits["2-4"] == [0.0, 88.0]
    assert plain.stranded_gpu_s == pytest.approx(2.8 * 88)
    assert plain.moves == 0 and plain.lost_gpu_s == 0.0
    # Budget 5 per 100 pods: floor(5 x 4 / 100) = 0 moves allowed, so the same wait.
    starved = replay_timeline([node("a"), node("b")], pods, MOVES, move_budget=5.0, rules=RULES)
    assert starved.waits == plain.waits and starved.moves == 0


def test_the_load_factor_turns_a_gap_into_a_wait() -> None:
    # One node of 2 GPUs; "first" (2 GPUs) runs 100 s from t=0, "second" (2 GPUs) is created at
    # 150. At 1.0x it arrives after "first" left; at 2.0x it arrives at 150 / 2 = 75 and waits
    # until 100: 25 s.
    pods = [pod("first", 2, 1000, created=0, runs=100), pod("second", 2, 1000, created=150, runs=100)]
    assert replay_timeline([node("n0")], pods, "fgd", load=1.0).waits["2-4"] == [0.0, 0.0]
    assert replay_timeline([node("n0")], pods, "fgd", load=2.0).waits["2-4"] == [0.0, 25.0]


def test_pods_that_fit_no_node_of_the_empty_cluster_are_counted_and_left_out() -> None:
    pods = [pod("eight", 8, 1000, created=0, runs=10), pod("one", 1, 1000, created=5, runs=10)]
    result = replay_timeline([node("n0")], pods, "random")
    assert (result.pods, result.never_fit) == (1, 1)
    assert result.waits == {"1": [0.0]}


@pytest.mark.parametrize(
    ("gpus", "milli", "size"),
    [
        (0, GPU_MILLI, "cpu"),
        (1, 300, "fraction"),
        (1, 1000, "1"),
        (2, 1000, "2-4"),
        (4, 1000, "2-4"),
        (8, 1000, "8"),
    ],
)
def test_size_classes(gpus: int, milli: int, size: str) -> None:
    assert size_class(pod("p", gpus, milli, 0, 1).demand) == size


def test_percentiles_are_by_nearest_rank() -> None:
    waits = [4.0, 1.0, 3.0, 2.0]
    # p50: rank ceil(0.5 x 4) = 2 -> 2.0; p95: rank ceil(0.95 x 4) = 4 -> 4.0; p25: rank 1 -> 1.0.
    assert [percentile(waits, p) for p in (50, 95, 25)] == [2.0, 4.0, 1.0]
    assert math.isnan(percentile([], 50))


def test_the_cluster_share_keeps_every_shape_in_proportion() -> None:
    nodes = [node(f"t{i}", 2, "T4") for i in range(10)] + [node(f"g{i}", 8, "G2") for i in range(10)]
    # Sorted G2 first, then T4; node j is kept where round(j x 0.1) steps up: j = 4 and j = 14,
    # one of each model.
    kept = sample_nodes(nodes, 0.1)
    assert sorted(n.model for n in kept) == ["G2", "T4"]
    assert len(sample_nodes(nodes, 0.5)) == 10 and len(sample_nodes(nodes, 1.0)) == 20
    with pytest.raises(ValueError, match="share"):
        sample_nodes(nodes, 0.0)


def test_idle_gpus_on_nodes_the_waiting_pod_cannot_use_are_not_stranded() -> None:
    # Node "big" has 64 CPUs, node "small" 8 (both 2 GPUs); both pods ask for 2 GPUs and 16 CPUs,
    # so only "big" fits either. t=0 "hog" takes it for 100 s; t=1 "wide" waits until 100 (99 s)
    # beside "small"'s 2 idle GPUs, which it cannot use whatever moves: 0 stranded GPU-s (counting
    # every node with 2 GPUs would give 2 GPUs x 99 s = 198).
    big, small = SimNode("big", "T4", 2, 64000, 65536), SimNode("small", "T4", 2, 8000, 65536)
    wide = placement_demand(GpuDemand(2, 1000, frozenset()), 16000, 1024)
    pods = [
        SimPod("hog", wide, creation_time=0, scheduled_time=0, deletion_time=100),
        SimPod("wide", wide, creation_time=1, scheduled_time=1, deletion_time=11),
    ]
    result = replay_timeline([big, small], pods, "fgd")
    assert result.waits["2-4"] == [0.0, 99.0]
    assert result.waiting_s == pytest.approx(99.0)
    assert result.stranded_gpu_s == 0.0


def test_a_consolidation_cycle_runs_only_when_a_plan_could_have_appeared() -> None:
    # The scattered fractions, plus "cpu" (no GPU) arriving at t=15 and starting at once: a start
    # only takes room, so it runs no cycle. Cycles: t=13 (w waits anew; nothing is of age yet),
    # t=20 (y1 would have come of age: it left at 10, but a coming of age always counts) and t=21
    # (f1 comes of age: the plan) - 3, not 4.
    pods = [*_scattered_fractions(), pod("cpu", 0, GPU_MILLI, created=15, runs=100)]
    timed, _ = timed_pods(pods, 1.0)
    timeline = Timeline([node("a"), node("b")], timed, MOVES, move_budget=100.0, rules=RULES)
    result = timeline.run()
    assert timeline.consolidator is not None
    assert timeline.consolidator.stats.plans_tried == 3
    assert result.waits["2-4"] == [0.0, 8.0]
    # With a budget that allows no move (floor(5 x 5 / 100) = 0), no cycle runs at all.
    starved = Timeline([node("a"), node("b")], timed, MOVES, move_budget=5.0, rules=RULES)
    starved.run()
    assert starved.consolidator is not None and starved.consolidator.stats.plans_tried == 0
