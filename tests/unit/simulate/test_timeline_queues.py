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


def test_moves_have_no_queue_replay() -> None:
    with pytest.raises(ValueError, match="no queue replay for policy 'tessera\\+moves'"):
        replay_timeline_queues(NODES, BORROW_THEN_OWNER, MOVES, queues=2)


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
