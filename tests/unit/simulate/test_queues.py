"""Queue workloads replayed through fairness and placement, with hand-worked timelines."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.simulate.queues import WorkloadError, parse_workload, run_queue_workload


def workload(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "small",
        "nodes": [{"name": "gpu", "count": 1, "model": "T4", "gpus": 4, "cpu": 32, "memory": "64Gi"}],
        "queues": [
            {"name": "a", "spec": {"resources": {"gpu": {"quota": 2, "limit": 3}}}},
            {"name": "b", "spec": {"resources": {"gpu": {"quota": 2}}}},
        ],
        "jobs": [
            {"name": "a-job", "queue": "a", "count": 4, "arrival": 0, "duration": 100, "gpus": 1},
            {"name": "b-job", "queue": "b", "count": 2, "arrival": 10, "duration": 100, "gpus": 1},
        ],
    }
    data.update(overrides)
    return data


def test_idle_share_is_lent_within_limit_and_reclaimed() -> None:
    # t=0: only a wants GPUs; its limit is 3, so three pods start and the fourth is refused
    # (over_limit). t=10: b arrives; shares become 2 / 2; one GPU is free and b0 takes it. The
    # reclaim cycle at t=10 finds b (1 held + 1 waiting <= 2) below its share and a (3) above: one
    # of a's pods is evicted (delay 0), b1 starts at once, and the evicted pod waits again. t=100:
    # a's two remaining pods end; the evicted pod and a's fourth start. t=110: b's end; t=200: a's.
    # Waits: a 0, 0, 90 (evicted at 10, restarted at 100), 100 -> 47.5; b 0, 0.
    result = run_queue_workload(parse_workload(workload()))
    by_name = {q.name: q for q in result.queues}
    assert by_name["a"].max_allocated_gpu == 3
    assert by_name["a"].mean_wait_s == pytest.approx(47.5)
    assert by_name["b"].mean_wait_s == 0.0
    assert by_name["a"].finished == 4 and by_name["b"].finished == 2
    assert [(e.time, e.victim_queue, e.served_queue) for e in result.evictions] == [(10.0, "a", "b")]
    assert result.makespan_s == pytest.approx(200.0)
    assert result.refusals["over_limit"] >= 1
    shares_at_10 = {s.queue: s.fair_share_gpu for s in result.timeline if s.time == 10}
    assert shares_at_10 == {"a": 2.0, "b": 2.0}


def test_without_reclaim_the_lent_gpus_come_back_only_as_pods_end() -> None:
    # Reclaim off: b0 takes the free GPU at t=10, b1 waits until a's pods end at t=100.
    # Waits: a 0, 0, 0, 100 -> 25; b 0, 90 -> 45.
    result = run_queue_workload(parse_workload(workload()), reclaim_interval_s=0)
    by_name = {q.name: q for q in result.queues}
    assert by_name["a"].mean_wait_s == pytest.approx(25.0)
    assert by_name["b"].mean_wait_s == pytest.approx(45.0)
    assert result.evictions == []
    assert result.makespan_s == pytest.approx(200.0)


@pytest.mark.parametrize(("interval", "expected"), [(1.0, 76.25), (0.0, 75.0)])
def test_utilisation_is_time_weighted(interval: float, expected: float) -> None:
    # GPU-time held, with reclaim: a 2 x 100 + 10 (the evicted run) + 2 x 100, b 2 x 100 = 610 GPU-s
    # over 200 s on 4 GPUs = 76.25% (the 10 s of the evicted run are held, then lost).
    # Without: a 4 x 100, b 2 x 100 = 600 GPU-s -> 75%.
    result = run_queue_workload(parse_workload(workload()), reclaim_interval_s=interval)
    assert result.utilisation_pct == pytest.approx(expected)


def test_fractional_jobs_share_a_gpu() -> None:
    data = workload(
        jobs=[{"name": "infer", "queue": "a", "count": 8, "duration": 50, "gpus": 1, "gpuMilli": 250}]
    )
    result = run_queue_workload(parse_workload(data))
    # 8 quarter GPUs = 2 GPUs, inside a's limit of 3: all start at once.
    assert {q.name: q.mean_wait_s for q in result.queues}["a"] == 0.0
    assert result.makespan_s == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"jobs": [{"name": "j", "queue": "nobody", "duration": 1}]}, "unknown queue 'nobody'"),
        ({"nodes": [{"name": "n", "gpus": 2, "memory": "lots"}]}, "memory"),
        ({"queues": [{"name": "a", "spec": {"parent": "ghost"}}]}, "ghost"),
        ({"jobs": [{"name": "j", "queue": "a", "duration": 1, "gpus": 2, "gpuMilli": 500}]}, "fraction"),
        ({"jobs": []}, "jobs"),
    ],
)
def test_invalid_workloads_are_explained(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_workload(workload(**overrides))
