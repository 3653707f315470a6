"""Queues with reclaim in the timeline replay (tessera.simulate.timeline_queues), the arithmetic in
comments.

One T4 node of 4 GPUs with CPU and memory to spare, so only GPUs decide; each pod asks for 2 GPUs,
1 CPU and 1 GiB. Two queues of GPU quota 2 each. By the rule crc32(name) mod 2, pods "a1" and "a2"
are in q1 and "b1" in q0 (asserted below, so a change of the rule shows here first).
"""

from __future__ import annotations

import math
import zlib

import pytest

from extender.policy.consolidation import ConsolidationRules
from extender.policy.placement import GpuDemand, placement_demand
from tessera.simulate.queues import QueueSummary
from tessera.simulate.timeline import MOVES, node_order, replay_timeline
from tessera.simulate.timeline_queues import (
    TimelineQueuesResult,
    equal_quotas,
    queue_of,
    replay_timeline_queues,
)
from tessera.simulate.timeline_report import (
    fair_share_gpu_hours,
    timeline_queues_table,
    used_pct_of_share,
    worst_queue,
    worst_queues_table,
)
from tessera.simulate.trace import SimNode, SimPod

NODES = [SimNode("n0", "T4", 4, 32000, 65536)]


def pod(name: str, created: int, runs: int, gpus: int = 2) -> SimPod:
    demand = placement_demand(GpuDemand(gpus, 1000, frozenset()), 1000, 1024)
    return SimPod(name, demand, creation_time=created, scheduled_time=created, deletion_time=created + runs)


# t=0 a1 and a2 (q1) take all 4 GPUs for 1000 s: q1 borrows q0's idle 2. t=100 b1 (q0, 300 s)
# fits nowhere.
BORROW_THEN_OWNER = [pod("a1", 0, 1000), pod("a2", 0, 1000), pod("b1", 100, 300)]


def by_queue(result: TimelineQueuesResult) -> dict[str, QueueSummary]:
    return {queue.name: queue for queue in result.run.queues}


def test_the_rule_maps_a_name_by_its_crc32_and_the_quotas_sum_to_the_cluster() -> None:
    assert [queue_of(name, 2) for name in ("a1", "a2", "b1")] == ["q1", "q1", "q0"]
    # crc32("b1") = 1204558816 = 4 x 301139704: q0 of 4; crc32("a1") = 1826703395 = 4 x 456675848 + 3.
    assert zlib.crc32(b"b1") == 1204558816 and queue_of("b1", 4) == "q0"
    assert queue_of("a1", 4) == "q3"
    assert queue_of("anything", 1) == "q0"
    # 124 GPUs in 4 queues: 31 each; 10 in 4: 10 = 4 x 2 + 2, the first two get one more.
    assert equal_quotas(124, 4) == [31, 31, 31, 31]
    assert equal_quotas(10, 4) == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="at least one queue"):
        equal_quotas(10, 0)


def test_the_owner_reclaims_from_the_borrower_and_the_victim_loses_its_runtime_so_far() -> None:
    result = replay_timeline_queues(NODES, BORROW_THEN_OWNER, "tessera", queues=2)
    (eviction,) = result.run.evictions
    # At t=100 q1 holds 4 GPUs against a fair share of 2 (both queues want 2 or more: each gets
    # its quota); the reclaim cycle at t=100 evicts one of its pods for b1. The victim had run
    # 100 s on 2 GPUs: 2 x 100 = 200 GPU-seconds of work lost.
    assert (eviction.victim_queue, eviction.served_queue, eviction.time) == ("q1", "q0", 100.0)
    assert eviction.ran_s == 100.0
    q0, q1 = by_queue(result)["q0"], by_queue(result)["q1"]
    assert (q1.evicted, q1.lost_gpu_s, q0.evicted, q0.lost_gpu_s) == (1, 200.0, 0, 0.0)
    # b1 starts at once on the freed GPUs (wait 0). The victim waits again from t=100 until b1
    # leaves at 400 (300 s), restarts and runs its whole 1000 s again: the run ends at 1400.
    assert result.run.makespan_s == 1400.0
    assert q0.p95_wait_s == 0.0
    # q1's waits: 0 (the other pod), 300 (the victim); p95 by nearest rank of 2 is the 2nd, and
    # the longest. Waiting GPU-hours: 300 s x 2 GPUs = 600 GPU-s.
    assert (q1.p95_wait_s, q1.max_wait_s) == (300.0, 300.0)
    assert q1.wait_gpu_hours == pytest.approx(600 / 3600) and q0.wait_gpu_hours == 0.0
    # GPU-seconds used by q1: 4 x 100 (0-100) + 2 x 300 (100-400) + 4 x 600 (400-1000, the victim
    # back) + 2 x 400 (1000-1400) = 4200; by q0: 2 x 300 = 600. Shares follow demand: q1 wants 4
    # whenever q0 wants nothing and gets them, 2 while b1 runs, 2 at the end (all it wants), so
    # its share integrates to the same 4200 GPU-s; q0's to 600.
    assert q1.gpu_hours == pytest.approx(4200 / 3600) and q0.gpu_hours == pytest.approx(600 / 3600)
    assert fair_share_gpu_hours(q1, result) == pytest.approx(4200 / 3600)
    assert fair_share_gpu_hours(q0, result) == pytest.approx(600 / 3600)
    assert used_pct_of_share(q1, result) == pytest.approx(100.0)
    # Never below its share: while the victim waited q1 held 2 = its share, and 2 more would
    # take it past it; b1 did not wait.
    assert (q0.below_fair_share_s, q1.below_fair_share_s) == (0.0, 0.0)
    # Lost work, % of the GPU-seconds held over the run (4200 + 600 + the 200 lost, which q1's
    # 4200 counts already: 4800 in all): 200 / 4800.
    assert result.run.lost_pct == pytest.approx(100 * 200 / 4800)


def test_in_one_queue_nobody_is_owed_the_pod_waits_and_nothing_is_evicted() -> None:
    # The same pods in one queue of quota 4: b1 waits from 100 until a1 and a2 leave at 1000.
    result = replay_timeline_queues(NODES, BORROW_THEN_OWNER, "tessera", queues=1)
    (only,) = result.run.queues
    assert (len(result.run.evictions), only.lost_gpu_s, result.run.makespan_s) == (0, 0.0, 1300.0)
    # Waits 0, 0, 900: p95 by nearest rank of 3 is the 3rd; 900 s x 2 GPUs = 0.5 GPU-h waiting.
    assert (only.p95_wait_s, only.max_wait_s, only.wait_gpu_hours) == (900.0, 900.0, 0.5)


def test_the_worst_queue_of_each_figure_is_reported_not_the_mean() -> None:
    result = replay_timeline_queues(NODES, BORROW_THEN_OWNER, "tessera", queues=2)
    assert worst_queue(result, "evictions") == ("q1", 1.0)
    assert worst_queue(result, "lost GPU-s") == ("q1", 200.0)
    assert worst_queue(result, "p95 wait min") == ("q1", 5.0)  # 300 s
    name, gpu_hours = worst_queue(result, "wait GPU-h")
    assert name == "q1" and gpu_hours == pytest.approx(600 / 3600)
    assert worst_queue(result, "used % of share")[1] == pytest.approx(100.0)
    table = worst_queues_table([result])
    assert "5.0 (q1)" in table and "200 (q1)" in table
    per_queue = timeline_queues_table([result]).splitlines()
    assert len(per_queue) == 2 + 2  # header, rule, one row per queue
    assert per_queue[2].split()[:5] == ["1x", "tessera", "0", "q0", "1"]


def test_the_load_divides_the_gaps_and_pods_fitting_no_node_are_left_out() -> None:
    pods = [*BORROW_THEN_OWNER, pod("too-big", 50, 10, gpus=8)]
    # At 2x b1 arrives at 100 / 2 = 50; the victim has run 50 s: 2 x 50 = 100 GPU-s lost.
    result = replay_timeline_queues(NODES, pods, "fgd", queues=2, load=2.0)
    assert (result.pods, result.never_fit) == (3, 1)
    assert result.run.lost_gpu_s == 100.0
    assert math.isclose(result.run.makespan_s, 50 + 300 + 1000)


def scattered_fractions_then_owed_pod() -> list[SimPod]:
    """Two T4 nodes of 2 GPUs end with a 0.6 fraction on each while a 2-GPU pod of an owed queue
    waits. By crc32 mod 2, "y1", "y2", "f1" and "f2" are in q0, "x" in q1 (asserted in the test).

    t=0  y1 (2 GPUs, 10 s) takes one node whole (call it A).
    t=1  f1 (600 milli, 100 s): A is full, so node B, GPU 0.
    t=2  y2 (1 GPU, 10 s): B's GPU 1, the only idle one.
    t=10 y1 leaves: A is empty.
    t=11 f2 (600 milli, 100 s): B has 400 milli at most, so A.
    t=12 y2 leaves: A holds f2, B holds f1, one idle GPU on each.
    t=13 x (2 GPUs, 10 s, q1) fits no node and waits.
    """

    def fraction(name: str, gpus: int, milli: int, created: int, runs: int) -> SimPod:
        demand = placement_demand(GpuDemand(gpus, milli, frozenset()), 1000, 1024)
        return SimPod(
            name, demand, creation_time=created, scheduled_time=created, deletion_time=created + runs
        )

    return [
        fraction("y1", 2, 1000, 0, 10),
        fraction("f1", 1, 600, 1, 100),
        fraction("y2", 1, 1000, 2, 10),
        fraction("f2", 1, 600, 11, 100),
        fraction("x", 2, 1000, 13, 10),
    ]


TWO_NODES = [SimNode(name, "T4", 2, 32000, 65536) for name in ("a", "b")]
# A mover has run 20 s: f1 (started at 1) may move from t=21, f2 (started at 11) from t=31.
MOVE_RULES = ConsolidationRules(min_runtime_s=20.0, max_moves_per_pod=2, max_moves_per_cycle=4)


def test_a_move_lets_the_waiting_pod_of_an_owed_queue_start_and_the_mover_restarts() -> None:
    pods = scattered_fractions_then_owed_pod()
    assert [queue_of(p.name, 2) for p in pods] == ["q0", "q0", "q0", "q0", "q1"]
    # From t=13 q1 is owed: its fair share is 2 GPUs (its quota, all it asks), it holds 0; q0
    # holds 0.6 + 0.6 = 1.2 GPUs, within its quota of 2, so reclaim has nobody to take from.
    plain = replay_timeline_queues(TWO_NODES, pods, "tessera", queues=2)
    q1 = by_queue(plain)["q1"]
    assert plain.run.evictions == [] and plain.run.moves is None
    # Without moves x waits until f1 leaves at 1 + 100 = 101: 88 s, x 2 GPUs = 176 GPU-s.
    assert q1.p95_wait_s == 88.0 and q1.wait_gpu_hours * 3600 == pytest.approx(176.0)
    # Budget 100 moves per 100 pods started: y1, f1, y2 and f2 started by t=21, floor(100 x 4 /
    # 100) = 4 moves allowed. At t=21 f1 comes of age; the reclaim cycle finds nothing, the
    # consolidation cycle after it moves f1 next to f2 and x starts on the node emptied.
    moved = replay_timeline_queues(TWO_NODES, pods, MOVES, queues=2, move_budget=100.0, rules=MOVE_RULES)
    stats = moved.run.moves
    assert stats is not None and (stats.moves, stats.pods_served) == (1, 1)
    assert moved.run.evictions == [] and moved.moves == 1
    q0, q1 = by_queue(moved)["q0"], by_queue(moved)["q1"]
    # x waits 21 - 13 = 8 s: 8 x 2 = 16 GPU-s of waiting (176 without the move).
    assert q1.p95_wait_s == 8.0 and q1.wait_gpu_hours * 3600 == pytest.approx(16.0)
    # f1 restarts: 0.6 GPU x (21 - 1) s = 12 GPU-s lost, and it runs its 100 s again: it leaves
    # at 121, the run's end (f2 at 111, x at 31). Its wait is 0 (it restarts at once).
    assert stats.lost_gpu_s == pytest.approx(12.0)
    assert moved.run.makespan_s == 121.0 and q0.max_wait_s == 0.0
    # q0 held 2 x 10 (y1) + 0.6 x 20 (f1's lost run) + 1 x 10 (y2) + 0.6 x 100 (f1 again) + 0.6 x
    # 100 (f2) = 162 GPU-s; q1 2 x 10 = 20. Lost to moves: 12 of the 182 held = 6.59%.
    assert q0.gpu_hours * 3600 == pytest.approx(162.0) and q1.gpu_hours * 3600 == pytest.approx(20.0)
    assert moved.move_lost_pct == pytest.approx(100 * 12 / 182)
    row = worst_queues_table([moved]).splitlines()[2].split()
    assert row[-3:-1] == ["1", f"{100 * 12 / 182:.3f}"]  # moves, their lost work %


def test_moves_in_the_queue_replay_stay_within_the_budget() -> None:
    # Budget 5 per 100 pods started: floor(5 x 4 / 100) = 0 moves by t=21 (and floor(5 x 5 /
    # 100) = 0 after x starts): the replay is the one without moves.
    pods = scattered_fractions_then_owed_pod()
    starved = replay_timeline_queues(TWO_NODES, pods, MOVES, queues=2, move_budget=5.0, rules=MOVE_RULES)
    assert starved.moves == 0 and by_queue(starved)["q1"].p95_wait_s == 88.0


def test_one_queue_replays_exactly_what_the_plain_timeline_does() -> None:
    # Two 4-GPU T4 nodes, "small" with 16 CPUs and "big" with 64. At t=0 "a" (1 GPU, 2 CPUs, runs
    # 5000 s) arrives, at t=10 "b" (4 GPUs, 48 CPUs, 100 s), which only "big" holds. Twenty pods
    # like "a" that never ran in the trace (no scheduled_time) are not replayed but are in the
    # mix FGD scores against: with them, b's kind is 1 pod in 22 and FGD ranks "a" on either node
    # alike (a tie); scored against the replayed pods alone (b 1 in 2) it keeps "a" off "big".
    never_ran = [
        SimPod(f"c{i}", placement_demand(GpuDemand(1, 1000, frozenset()), 2000, 1024), creation_time=0)
        for i in range(20)
    ]
    shaped = [
        SimPod(
            name,
            placement_demand(GpuDemand(gpus, 1000, frozenset()), cpu, 1024),
            created,
            created,
            created + runs,
        )
        for name, created, runs, gpus, cpu in (("a", 0, 5000, 1, 2000), ("b", 10, 100, 4, 48000))
    ]
    nodes = [SimNode("small", "T4", 4, 16000, 65536), SimNode("big", "T4", 4, 64000, 65536)]
    for seed in range(6):
        plain = replay_timeline(nodes, [*shaped, *never_ran], "fgd", seed=seed)
        queued = replay_timeline_queues(nodes, [*shaped, *never_ran], "fgd", queues=1, seed=seed)
        # The tie goes to the first node in the seed's order, in both replays: where that is
        # "big", b waits until a leaves at 5000: 4990 s x 4 GPUs = 19960 GPU-s; else it waits 0.
        first = node_order(nodes, seed)[0].name
        expected = 4990 * 4 if first == "big" else 0
        assert plain.wait_gpu_hours * 3600 == pytest.approx(expected)
        (only,) = queued.run.queues
        assert only.wait_gpu_hours * 3600 == pytest.approx(expected)
    # Both cases occur among seeds 0-5 (seeds 0 and 5 order "big" first).
    assert {node_order(nodes, seed)[0].name for seed in range(6)} == {"big", "small"}
