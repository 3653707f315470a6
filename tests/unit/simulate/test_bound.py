"""The upper bound on what moves could reach, and the idle breakdown, worked out by hand."""

from __future__ import annotations

import pytest

from extender.policy.placement import GpuDemand
from tessera.simulate.bound import gap_bound, idle_breakdown, knapsack_milli, placed_prefix_capping
from tessera.simulate.cluster import Cluster
from tessera.simulate.packing import replay_packing, workload_mix
from tessera.simulate.trace import SimNode, SimPod


def pod(milli: int, count: int = 1, cpu: int = 1000, memory: int = 1024) -> GpuDemand:
    return GpuDemand(count=count, milli=milli, cpu_milli=cpu, memory_mib=memory)


@pytest.mark.parametrize(
    ("placed", "skipped", "bound", "theta"),
    [
        # Two GPUs, an 810 pod on each: gaps 190 + 190 = 380 that only pods of < 191 fill; two
        # skipped 100s bring 200 of them: at most 2000 - (380 - 200) = 1820.
        ([810, 810], [100, 100], 1820, 191),
        # Four 100s (400) can fill both gaps (380): no bound below the capacity.
        ([810, 810], [100, 100, 100, 100], 2000, 0),
        # A 600 pod leaves a gap of 400, and the skipped 500s cannot use it: 2000 - 400 = 1600,
        # which is reached (the two 500s on the other GPU).
        ([600], [500, 500], 1600, 401),
        # Whole GPUs (gap 0) and a 4-GPU pod leave no gap: the capacity.
        ([1000], [1000], 2000, 0),
    ],
)
def test_gap_bound(placed: list[int], skipped: list[int], bound: int, theta: int) -> None:
    placed_pods = [pod(m) for m in placed]
    found = gap_bound(2, placed_pods, [*placed_pods, *(pod(m) for m in skipped)])
    assert (found.milli, found.theta) == (bound, theta)


def test_gap_bound_counts_every_gpu_of_a_pod() -> None:
    # A 4-GPU pod of whole GPUs has no gap; with a 900 pod (gap 100) on a 5th GPU and nothing
    # small: 5000 - 100.
    placed = [pod(1000, count=4), pod(900)]
    assert gap_bound(5, placed, placed).milli == 4900


def test_knapsack_takes_the_best_ratio_first_and_the_last_pod_in_part() -> None:
    # 500 milli for 1000 CPU (0.5 per CPU milli) first, then 1000 milli for 4000 CPU (0.25):
    # 3000 free CPU take the 500 pod whole and 2000 / 4000 of the other, 500: 1000 in all.
    skipped = [pod(1000, cpu=4000), pod(500, cpu=1000), GpuDemand(0, cpu_milli=100)]
    assert knapsack_milli(skipped, 3000, "cpu") == 1000
    # Memory: 1024 MiB each, 1024 free: the 1000 pod (more milli per MiB) whole, nothing else.
    assert knapsack_milli(skipped, 1024, "memory") == 1000


def test_idle_breakdown() -> None:
    # Node a: 2 GPUs, an 810 pod on GPU 0 (190 sliver), GPU 1 whole; 8000 CPU.
    # Node b: 1 GPU, whole, but 1000 CPU: the skipped whole-GPU pod needs 2000.
    nodes = [SimNode("a", "T4", 2, 8000, 8192), SimNode("b", "T4", 1, 1000, 8192)]
    skipped = [pod(1000, cpu=2000)]
    cluster = Cluster(nodes, workload_mix([SimPod("x", pod(810)), SimPod("y", skipped[0])]))
    cluster.place(0, pod(810), [0])
    idle = idle_breakdown(cluster, skipped)
    # idle = 190 + 1000 + 1000; whole 2000, of which b's 1000 is host-short (a's GPU 1 fits it);
    # the 190 sliver is below the smallest skipped request (1000).
    assert (idle.idle_milli, idle.whole_milli, idle.whole_host_short_milli) == (2190, 2000, 1000)
    assert (idle.sliver_milli, idle.sliver_below_smallest_milli) == (190, 190)


@pytest.mark.parametrize(
    ("target", "prefix"),
    [
        # Arrivals 810, 810, 100 on 2 GPUs. Bound with the first k placed: k=0: 2000; k=1: gap 190,
        # small 100: 1910; k=2: gaps 380: 1720.
        (1950, 1),
        (1900, 2),
        (1700, None),  # even all three placed leave 1720
    ],
)
def test_placed_prefix_capping(target: int, prefix: int | None) -> None:
    assert placed_prefix_capping(2, [pod(810), pod(810), pod(100)], target) == prefix


def test_a_replay_reports_its_bound() -> None:
    # One node of 2 GPUs, three 810 pods (2430 milli, under 130% of 2000 = 2600; a fourth draw
    # would pass it): two placed, the third fits nowhere. Gaps 190 + 190, nothing small: the
    # bound is 2000 - 380 = 1620, what is placed - no move could add anything; the early pods
    # (before the first unfit one) are the two placed.
    nodes = [SimNode("n", "T4", 2, 32000, 65536)]
    pods = [SimPod(name, pod(810)) for name in "abc"]
    result = replay_packing(nodes, pods, "tessera")
    bound = result.bound
    assert bound is not None
    assert (bound.allocated_milli, bound.arrived_milli, bound.milli) == (1620, 2430, 1620)
    assert (bound.gaps.milli, bound.early_gaps.milli, bound.early_milli) == (1620, 1620, 1620)
    assert bound.host_milli == 1620 + 810  # CPU and memory would take the third pod
    assert bound.pct(bound.milli) == 81.0
