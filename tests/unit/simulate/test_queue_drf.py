"""DRF in reclaim through `tessera simulate queues` (rule 10 of extender.policy.reclaim,
extender.policy.drf): a GPU pod that fits no node for CPU or memory, as declarative scenarios.
The arithmetic is in the comments; docs/queues.md, "CPU and memory (DRF)", has the tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tessera.simulate
from tessera.simulate.queues import QueueRunResult, load_workload, parse_workload, run_queue_workload
from tests.unit.simulate.test_queue_reclaim import state_at

EXAMPLES = Path(tessera.simulate.__file__).parent / "examples"


def cpu_hog_and_light_pods(**top: Any) -> QueueRunResult:
    # The case of issue 25: one node, 8 GPUs, 64 cores. a's 4 pods of <1 GPU, 16 cores> hold
    # every core until t=3600; b's 8 pods of <1 GPU, 2 cores> arrive at t=10. GPU shares 4 / 4
    # (a wants 4, b 8); cores: b asks 16 and is given them, a 48 - a holds 64.
    return run_queue_workload(
        parse_workload(
            {
                "name": "hog",
                "nodes": [{"name": "n", "gpus": 8, "cpu": 64, "memory": "512Gi"}],
                "queues": [{"name": "a"}, {"name": "b"}],
                "jobs": [
                    {"name": "a", "queue": "a", "count": 4, "duration": 3600, "cpu": 16},
                    {"name": "b", "queue": "b", "count": 8, "arrival": 10, "duration": 3600, "cpu": 2},
                ],
                **top,
            }
        )
    )


def test_the_starved_queue_gets_cores_from_the_cpu_hog_within_a_cycle() -> None:
    # The cycle at t=10 (after the scheduler tried b's pods): a (dominant share 64/48 = 1.33)
    # gives its newest pod to b (0); a ends at 3/4 GPUs, 48/48 cores (1), b's first pod starts
    # on 1 GPU and 2 of the 16 cores freed, and b's next 4 take the 4 GPUs that were idle (8 more
    # cores): 8 of 8 GPUs busy, 58 cores.
    # a's evicted pod does not take the cores back: the plan's hold keeps b's pod's GPU and its
    # 2 cores, b's next pods the rest; it restarts at t=3600, when a's others end. Before: b
    # waited until t=3600 beside 4 idle GPUs.
    result = cpu_hog_and_light_pods()
    at_100 = state_at(result, 100)
    assert (at_100["a"].running, at_100["b"].running) == (3, 5)
    assert [(e.time, e.goal, e.victim_queue, e.served_queue) for e in result.evictions] == [
        (10.0, "drf", "a", "b")
    ]
    assert result.ping_pong == 0
    # No GPU idled while a pod waited that would fit with the cores shared fairly.
    assert result.idle_gpu_s_while_host_starved_pod_waits == 0.0


def test_idle_gpus_beside_a_cpu_starved_pod_are_counted() -> None:
    # Reclaim off: b's pods wait from t=10 to t=3600 beside 4 idle GPUs, which they would fit
    # if a gave back the cores beyond its share: 4 GPUs x 3590 s = 14360 GPU-s. (A fitting pod
    # never waited: the other measure stays 0.)
    result = cpu_hog_and_light_pods(reclaimInterval=0)
    assert result.idle_gpu_s_while_host_starved_pod_waits == pytest.approx(4 * 3590)
    assert result.idle_gpu_s_while_fitting_pod_waits == 0.0
    assert result.evictions == []


@pytest.mark.parametrize(
    ("example", "utilisation"),
    [
        # 1 node: a's 4 hogs for 2 h, b's 48 light pods from t=10 (numbers in docs/queues.md).
        ("cpu-starved.yaml", 95.9),
        # 4 nodes, two departments, four teams: the hog's burst fills every node's cores.
        ("cpu-starved-teams.yaml", 90.3),
    ],
)
def test_cpu_starved_examples_keep_the_gpus_busy(example: str, utilisation: float) -> None:
    # Before DRF: 80.0% and 82.1%, with 28760 and 85440 GPU-s idle beside pods that would fit
    # with CPU shared fairly (the target: 85% at least).
    result = run_queue_workload(load_workload(EXAMPLES / example))
    assert result.utilisation_pct == pytest.approx(utilisation, abs=0.05)
    assert result.idle_gpu_s_while_host_starved_pod_waits == 0.0
    assert result.ping_pong == 0
