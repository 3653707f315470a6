"""bench.packing's pure parts: judging a pod unschedulable, and checking the cluster's choices
pod by pod against the deployed model."""

from __future__ import annotations

from bench.packing import _unschedulable, agreement, trace_slice
from extender.policy.placement import GpuDemand, placement_demand
from tessera.simulate.deployed import SHIPPED_PROFILE
from tessera.simulate.trace import SimNode, SimPod

NODES = [SimNode("a", "T4", 2, 8_000, 32_768), SimNode("b", "T4", 2, 8_000, 32_768)]
HALF = SimPod("half", placement_demand(GpuDemand(1, 500), 1_000, 2_048))
WHOLE = SimPod("whole", placement_demand(GpuDemand(1), 1_000, 2_048))
HUGE = SimPod("huge", placement_demand(GpuDemand(4), 1_000, 2_048))  # 4 GPUs: fits no node


def test_the_cluster_agreeing_with_the_model_pod_by_pod() -> None:
    # 1. half: the idle nodes tie, so a is as good as b; the allocator's first fit is GPU 0.
    # 2. half: a's GPU 0 (500 free) fills exactly - the model's best; the first fit is GPU 0 again.
    # 3. whole: a (GPU 1 idle, none left after) beats b (two idle, one left); first idle GPU: 1.
    # 4. huge (4 GPUs) fits nowhere, and the cluster left it unscheduled.
    got = [("a", (0,)), ("a", (0,)), ("a", (1,)), None]
    agreed = agreement(NODES, [HALF, HALF, WHOLE, HUGE], got, SHIPPED_PROFILE)
    assert (agreed.pods, agreed.nodes_agreed, agreed.placed, agreed.devices_agreed) == (4, 4, 3, 3)


def test_a_choice_the_model_does_not_rank_best_is_counted_against_it() -> None:
    # The second half on b (idle) instead of a's half-used GPU, and on b's GPU 1 rather than the
    # first fit, GPU 0.
    got = [("a", (0,)), ("b", (1,))]
    agreed = agreement(NODES, [HALF, HALF], got, SHIPPED_PROFILE)
    assert (agreed.nodes_agreed, agreed.devices_agreed) == (1, 1)


def test_unschedulable_only_after_a_pass_over_the_nodes() -> None:
    def pod(message: str) -> dict[str, object]:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        return {"status": {"conditions": [condition]}}

    assert _unschedulable(pod("0/50 nodes are available: 50 cannot allocate all claims."))
    assert not _unschedulable(pod('pod "p" does not have the claim yet'))
    assert not _unschedulable({"status": {}})


def test_a_slice_is_drawn_by_seed_in_name_order() -> None:
    nodes = [SimNode(f"n{i:02d}", "T4", 1, 1_000, 1_024) for i in range(20)]
    chosen = trace_slice(nodes, 5, seed=3)
    assert chosen == trace_slice(nodes, 5, seed=3) != trace_slice(nodes, 5, seed=4)
    assert [node.name for node in chosen] == sorted(node.name for node in chosen)
