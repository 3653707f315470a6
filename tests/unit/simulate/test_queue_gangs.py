"""Gangs in `tessera simulate queues`: jobs with `minMembers` start whole or not at all, grow
beyond their minimum, and are reclaimed whole (docs/workloads.md). The arithmetic is in the
comments."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.simulate.queues import WorkloadError, parse_workload, run_queue_workload
from tests.unit.simulate.test_queue_reclaim import queue, run, state_at

EIGHT = [{"name": "n", "count": 1, "gpus": 8}]


def job(name: str, queue_name: str, count: int, duration: float, **fields: Any) -> dict[str, Any]:
    return {"name": name, "queue": queue_name, "count": count, "duration": duration, **fields}


@pytest.mark.parametrize(("min_members", "split"), [(1, True), (8, False)])
def test_two_eight_pod_jobs_on_eight_gpus(min_members: int, split: bool) -> None:
    # Two queues of quota 4, an 8-pod job each; their pods arrive in turn (a at 0, 1, ..., 7; b at
    # 0.5, 1.5, ..., 7.5). Pod by pod, admission lets each start as it comes: 4 + 4 by t=3.5,
    # and both jobs hold half of what they need. As gangs, ja starts whole when its 8th pod comes
    # (t=7); jb waits whole and starts when ja ends (t=107): makespan 207, nothing evicted.
    result = run(
        EIGHT,
        [queue("a", 4), queue("b", 4)],
        [
            job("ja", "a", 8, 100, minMembers=min_members, interval=1),
            job("jb", "b", 8, 100, minMembers=min_members, interval=1, arrival=0.5),
        ],
    )
    at_eight = state_at(result, 8)
    if split:
        assert (at_eight["a"].allocated_gpu, at_eight["b"].allocated_gpu) == (4, 4)
        return
    assert (at_eight["a"].allocated_gpu, at_eight["b"].allocated_gpu) == (8, 0)
    assert (state_at(result, 107)["a"].allocated_gpu, state_at(result, 107)["b"].allocated_gpu) == (0, 8)
    assert result.makespan_s == 207 and result.evictions == []
    assert all(q.finished == 8 for q in result.queues)


def test_a_gang_of_min_two_of_four_starts_with_two_and_grows() -> None:
    # 4 GPUs; another job holds 2 until t=50. The gang (4 pods, minimum 2) arrives at t=1: its
    # minimum fits the 2 free GPUs and starts; its 2 elastic pods start at t=50 (1 + 100 = 101 and
    # 50 + 100 = 150: makespan 150).
    result = run(
        [{"name": "n", "count": 1, "gpus": 4}],
        [queue("t")],
        [job("other", "t", 2, 50, interval=0), job("g", "t", 4, 100, arrival=1, minMembers=2, interval=0)],
    )
    assert state_at(result, 1)["t"].allocated_gpu == 4 and state_at(result, 1)["t"].running == 4
    assert state_at(result, 50)["t"].allocated_gpu == 4
    assert result.makespan_s == 150 and result.evictions == []


def test_a_gang_is_not_started_when_its_minimum_does_not_fit() -> None:
    # 8 GPUs, 5 taken until t=30; a gang of 4 (minimum 4) arriving at t=0 does not start with 3
    # free: it waits whole and starts at 30.
    result = run(
        EIGHT,
        [queue("t")],
        [job("other", "t", 5, 30, interval=0), job("g", "t", 4, 100, minMembers=4, interval=0)],
    )
    assert state_at(result, 0)["t"].allocated_gpu == 5
    assert state_at(result, 30)["t"].allocated_gpu == 4
    assert result.refusals.get("gang_no_fit") == 4


def test_a_gang_at_its_minimum_is_not_broken_for_a_small_pod() -> None:
    # a (quota 4) runs a gang of 8 (minimum 8) on all 8 GPUs; b (quota 4) submits one pod at
    # t=10: shares a 7, b 1. Evicting the gang whole would leave a at 0 < 7: nothing is evicted,
    # b's pod starts when the gang ends at 100.
    result = run(
        EIGHT,
        [queue("a", 4), queue("b", 4)],
        [job("ja", "a", 8, 100, minMembers=8, interval=0), job("pb", "b", 1, 10, arrival=10)],
    )
    assert result.evictions == []
    assert state_at(result, 100)["b"].allocated_gpu == 1


def test_a_waiting_gang_reclaims_whole() -> None:
    # a (quota 4) borrowed all 8 GPUs with 8 lone pods; b (quota 4) submits a gang of 4 at t=10.
    # b's share is 4: reclaim serves the 4 members together, evicting 4 of a's pods.
    result = run(
        EIGHT,
        [queue("a", 4), queue("b", 4)],
        [job("pa", "a", 8, 1000, interval=0), job("jb", "b", 4, 100, arrival=10, minMembers=4, interval=0)],
    )
    assert len(result.evictions) == 4
    assert state_at(result, 10)["b"].allocated_gpu == 4


def test_min_members_above_the_count_is_refused() -> None:
    with pytest.raises(WorkloadError, match="minMembers 5 is more than its 4 pods"):
        parse_workload({"nodes": EIGHT, "queues": [queue("t")], "jobs": [job("g", "t", 4, 10, minMembers=5)]})


@pytest.mark.parametrize(("in_order", "at_two", "at_120"), [(False, 8, 4), (True, 6, 6)])
def test_gangs_in_order_keeps_a_later_gang_from_starting_ahead_of_an_older_one(
    in_order: bool, at_two: int, at_120: int
) -> None:
    # 8 GPUs, 6 taken until t=50. Gang big (4 one-GPU pods) comes at t=1: 2 free, it waits. Gang
    # small (2 pods) comes at t=2 and fits the 2 free: it starts at once (6 + 2 = 8 GPUs taken at
    # t=2), ahead of big, and ends at 102; big starts at 50 and ends at 150, alone at t=120 (4).
    # With `gangs_in_order` (the counterfactual bench.topologywaits uses) small waits while big
    # does (6 taken at t=2); both start at t=50 (8 free: 4 + 2) and run at t=120 (6).
    workload = parse_workload(
        {
            "name": "case",
            "nodes": EIGHT,
            "queues": [queue("t")],
            "jobs": [
                job("other", "t", 6, 50, interval=0),
                job("big", "t", 4, 100, arrival=1, minMembers=4, interval=0),
                job("small", "t", 2, 100, arrival=2, minMembers=2, interval=0),
            ],
        }
    )
    result = run_queue_workload(workload, gangs_in_order=in_order)
    assert state_at(result, 2)["t"].allocated_gpu == at_two
    assert state_at(result, 50)["t"].allocated_gpu == 6
    assert state_at(result, 120)["t"].allocated_gpu == at_120


@pytest.mark.parametrize(
    ("hold_back_after_s", "at_20", "at_150"),
    [(None, 8, 4), (0.0, 6, 8), (60.0, 8, 4)],
)
def test_a_later_gang_is_kept_off_the_nodes_held_back_for_the_first(
    hold_back_after_s: float | None, at_20: int, at_150: int
) -> None:
    # Nodes x, y of 4 GPUs. At t=0 gang first (2 pods of 2 GPUs, until 100) fills one node and a
    # pod alone of 2 GPUs (until 1000) half the other: 2 free. Gang big (3 pods of 2) comes at
    # t=10 and waits; gang small (2 pods of 1, for 500 s) comes at t=20.
    # Without the rule small takes the 2 free (8 taken at t=20); first ends at 100, big finds
    # 4 free of its 6 and waits for small's end at 520 (4 taken at t=150: the pod alone, small).
    # With the rule (bound 0): the nodes held back for big are both (the freer holds 2 of its
    # pods once empty, the other 2 more: 4 >= 3), so small waits (6 taken at t=20); at 100 big
    # fits the 6 free and starts (8 at t=150), small after it at 300. With a bound of 60 s big
    # has waited 10 s at t=20: no head yet, small goes as without the rule.
    workload = parse_workload(
        {
            "name": "case",
            "nodes": [{"name": "n", "count": 2, "gpus": 4}],
            "queues": [queue("t")],
            "jobs": [
                job("first", "t", 2, 100, minMembers=2, interval=0, gpus=2),
                job("alone", "t", 1, 1000, gpus=2),
                job("big", "t", 3, 200, arrival=10, minMembers=3, interval=0, gpus=2),
                job("small", "t", 2, 500, arrival=20, minMembers=2, interval=0),
            ],
        }
    )
    result = run_queue_workload(workload, hold_back_after_s=hold_back_after_s)
    assert state_at(result, 20)["t"].allocated_gpu == at_20
    assert state_at(result, 150)["t"].allocated_gpu == at_150
