"""The deployed path's model: kube-scheduler's plugin scores, the DRA allocator's first fit, the
extender's rank scores and mix, worked by hand."""

from __future__ import annotations

import random

import pytest

from extender.policy.placement import GpuDemand, placement_demand, rounded_mix
from tessera.simulate.cluster import Cluster, NodeShape, NodeState
from tessera.simulate.deployed import (
    SHIPPED_PROFILE,
    STOCK_PROFILE,
    DeployedPlacer,
    balanced_allocation_score,
    first_fit_gpus,
    least_allocated_score,
)
from tessera.simulate.trace import SimNode

# A V100 node (32 cores, 128 GiB) with 14.5 cores and 28 GiB requested, GPU 1 taken, GPU 0 at 750.
STATE = NodeState(NodeShape("V100M16", 2, 32_000, 131_072), (0, 750), 17_500, 102_400)
QUARTER = placement_demand(GpuDemand(1, 250), 4_000, 8_192)


def test_least_allocated_is_the_mean_free_share_after_the_pod_in_integers() -> None:
    # CPU: requested 14500 + 4000 = 18500 of 32000 -> (32000 - 18500) x 100 // 32000 = 42;
    # memory: 28672 + 8192 = 36864 of 131072 -> 94208 x 100 // 131072 = 71; (42 + 71) // 2 = 56.
    assert least_allocated_score(STATE, QUARTER) == 56
    # A request of 0 counts as kube-scheduler's non-zero defaults (100m, 200 MiB):
    # CPU (32000 - 14600) x 100 // 32000 = 54, memory (131072 - 28872) x 100 // 131072 = 77 -> 65.
    assert least_allocated_score(STATE, GpuDemand(1, 250)) == 65


def test_balanced_allocation_rewards_what_evens_out_cpu_and_memory() -> None:
    # Before: CPU 14500/32000 = 0.453, memory 28672/131072 = 0.219 -> 1 - 0.234/2 -> 88.
    # After:  CPU 18500/32000 = 0.578, memory 36864/131072 = 0.281 -> 1 - 0.297/2 -> 85.
    # 50 + (50 + 85 - 88) // 2 = 50 + 23 = 73: the pod makes the node less balanced.
    assert balanced_allocation_score(STATE, QUARTER) == 73
    # A memory-heavy pod evens it out: after CPU 14500 + 1000 = 0.484, memory 28672 + 40960 =
    # 0.531 -> 1 - 0.047/2 -> 97; 50 + (50 + 97 - 88) // 2 = 79.
    assert balanced_allocation_score(STATE, placement_demand(None, 1_000, 40_960)) == 79


@pytest.mark.parametrize(
    ("free", "demand", "chosen"),
    [
        ((400, 1000, 250, 1000), GpuDemand(1, 250), (0,)),  # first that holds it, not the fullest (2)
        ((400, 1000, 250, 1000), GpuDemand(2), (1, 3)),  # the first idle ones
        ((400, 1000, 250, 1000), GpuDemand(1, 500), (1,)),
        ((400, 1000), placement_demand(None, 1_000, 1_024), ()),  # no GPU, no device
    ],
)
def test_the_dra_allocator_takes_the_first_device_with_the_share_free(
    free: tuple[int, ...], demand: GpuDemand, chosen: tuple[int, ...]
) -> None:
    assert first_fit_gpus(free, demand) == chosen


def test_profiles_describe_their_scoring() -> None:
    assert STOCK_PROFILE.describe() == "extender x5 + LeastAllocated x1 + BalancedAllocation x1"
    assert SHIPPED_PROFILE.describe() == "extender x5"


def _two_nodes() -> Cluster:
    nodes = [SimNode(name, "T4", 2, 8_000, 32_768) for name in ("a", "b")]
    return Cluster(nodes, rounded_mix({}))


def test_deployed_placer_fills_the_partly_used_node_and_its_first_fitting_gpu() -> None:
    cluster = _two_nodes()
    half = placement_demand(GpuDemand(1, 500), 1_000, 2_048)
    cluster.place(1, half, (1,))  # b: GPU 1 at 500, GPU 0 idle
    placer = DeployedPlacer(cluster, SHIPPED_PROFILE, random.Random(0))
    # The extender ranks b first (the half fills GPU 1 exactly and keeps a's GPUs whole), 10 x 5 x 10
    # = 500 against 0; on b the allocator takes GPU 0, the first with 500 free, not GPU 1.
    assert placer.place(half) == (1, (0,))
    # The pod joined the mix before it was ranked (it exists before it is scheduled).
    assert placer.mix == rounded_mix({half: 1})
