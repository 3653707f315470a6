"""Capacity that frees on its own goes first to the most owed queue's waiting pod
(`extender.policy.deference`): the pure rule, and the filter that applies it.

The picture: node n1 with 4 GPUs; queues a and b, quota 2 each. a runs 3 pods (GPUs 0-2) and
waits with a3; b waits with b0. Demand a 4, b 1: fair shares a 3, b 1. GPU 3 is free.
a3 would bring a to 4 of 3, and reclaim would take it back for b0 (b owed 1; a, 1 GPU poorer,
ends at its share: owed 0 < 1): a3 defers to b0 on n1, while b0 waits there unplaced and fits.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.__main__ import parse_args, picture_config
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from extender.policy.deference import (
    COLLECT_FOR_OWED,
    OwedPod,
    collecting_node,
    collecting_nodes,
    deference_reason,
    defers_to,
    owed_pods,
)
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus
from extender.status import StatusWriter, WaitingPods
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs
from tests import extender_objects as objects
from tests.unit.extender.test_reclaim import q

CLASS = "gpu.tessera.dev"
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def running(name: str, queue: str, device: str, node: str = "n1") -> list[dict[str, Any]]:
    """A pod bound to `node` whose claim holds `device`."""
    pod = objects.pod("ns", name, queue=queue, claim_name=f"{name}-gpus", node_name=node)
    pod["status"] = {"phase": "Running"}
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    return [pod, claim]


def waiting(name: str, queue: str, template: str = "one", tried: bool = True) -> dict[str, Any]:
    pod = objects.pod("ns", name, queue=queue, template=template)
    pod["status"]["conditions"] = [UNSCHEDULABLE] if tried else []
    return pod


def picture_of(*extra: dict[str, Any], config: PictureConfig | None = None) -> ClusterPicture:
    objs = [
        objects.node("n1"),
        objects.gpu_slice("n1", 4),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2)),
        objects.claim_template("ns", "four", objects.claim_spec(CLASS, count=4)),
        objects.queue("a", resources={"gpu": {"quota": 2}}),
        objects.queue("b", resources={"gpu": {"quota": 2}}),
        *[obj for i in range(3) for obj in running(f"a{i}", "a", f"gpu-{i}")],
        *extra,
    ]
    picture = ClusterPicture(config)
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


A3 = waiting("a3", "a")
DEFERS = (
    "free GPUs here go first to a waiting pod of queue 'b', below its fair share (gpu 0 of 1); "
    "queue 'a' (gpu 3 of 3) would borrow them and reclaim would take them back"
)


async def nudged_and_passed(picture: ClusterPicture) -> tuple[list[str], bool]:
    """a3, refused before (say, at a limit since raised): the pods the requeue check would nudge,
    and whether the filter passes a3 on n1."""
    waiting_pods = WaitingPods()
    waiting_pods.refused("ns", "a3", "uid-ns-a3", "a", "queue 'a' was at its limit")
    async with ApiClient() as api:
        writer = StatusWriter(api, picture, waiting_pods, ExtenderMetrics(picture))
        nudged = [entry.name for entry in writer.eligible_now()]
    passed = decide_filter(picture, ExtenderArgs(Pod=A3, NodeNames=["n1"])).result.NodeNames
    return nudged, bool(passed)


@pytest.mark.parametrize(
    ("b_pod", "verdict"),
    [
        # b0 tried and unplaced, fits GPU 3: a3 leaves it to b0.
        (waiting("b0", "b"), DEFERS),
        # b0 not tried by the scheduler yet: it may well take GPU 3 itself; a3 is not held back.
        (waiting("b0", "b", tried=False), ""),
        # b0 asks 2 GPUs: it does not fit the one free, which a3 takes (nothing idles).
        (waiting("b0", "b", template="two"), ""),
        # Nobody of b waits: a3 takes GPU 3.
        (None, ""),
    ],
)
def test_the_filter_keeps_freed_gpus_for_the_owed_queue_only_while_its_pod_waits_and_fits(
    b_pod: dict[str, Any] | None, verdict: str
) -> None:
    picture = picture_of(A3, *([b_pod] if b_pod else []))
    decision = decide_filter(picture, ExtenderArgs(Pod=A3, NodeNames=["n1"]))
    assert decision.admitted
    assert decision.result.FailedNodes.get("n1", "") == verdict
    assert decision.result.NodeNames == ([] if verdict else ["n1"])


@pytest.mark.parametrize(
    ("b_pod", "nudged"),
    [
        # The filter defers a3 on n1, its only node: the requeue check does not say it may go.
        (waiting("b0", "b"), []),
        # The filter passes a3 on n1: so does the requeue check (the queue admits it).
        (waiting("b0", "b", tried=False), ["a3"]),
        (waiting("b0", "b", template="two"), ["a3"]),
        (None, ["a3"]),
    ],
)
async def test_the_requeue_check_nudges_a_refused_pod_only_where_the_filter_would_pass_it(
    b_pod: dict[str, Any] | None, nudged: list[str]
) -> None:
    # a3 was refused before (say, at a limit since raised); its queue admits it now. Nudged while
    # the filter defers it, it would be tried, deferred and left waiting: status and filter agree.
    picture = picture_of(A3, *([b_pod] if b_pod else []))
    assert await nudged_and_passed(picture) == (nudged, bool(nudged))


COLLECTING = PictureConfig(collect_for_owed=True)
# The two-node picture: n1 as above (a0-a2 on GPUs 0-2, GPU 3 free) and n2 with 4 GPUs, a's a4
# and a5 on GPUs 0 and 1 (2 free). b waits with a 4-GPU pod: demand a 6 (5 held, a3 waiting), b
# 4; fair shares a 4, b 4 (capacity 8, quotas 2 / 2). b0 fits no node (1 and 2 GPUs free): n2,
# with the most free, is collected for it (it misses 2 GPUs there, 3 on n1).
TWO_NODES = (
    objects.node("n2"),
    objects.gpu_slice("n2", 4),
    *[obj for i in (4, 5) for obj in running(f"a{i}", "a", f"gpu-{i - 4}", node="n2")],
)
B0_FOUR = waiting("b0", "b", template="four")
COLLECTS = (
    "node collects GPUs for a waiting 4-GPU pod that fits no node yet: free GPUs here go first to "
    "a waiting pod of queue 'b', below its fair share (gpu 0 of 4); queue 'a' (gpu 5 of 4) would "
    "borrow them and reclaim would take them back"
)


@pytest.mark.parametrize(
    ("config", "b_pod", "failed"),
    [
        # Collecting off (the default): a3 may go to either node (b0 fits neither).
        (None, B0_FOUR, {}),
        # On: a3 leaves n2, collected for b0 (a at 5 would go to 6 of 4; reclaim takes it back
        # for b at 0 of 4), and goes to n1, whose one free GPU b0 could not use anyway.
        (COLLECTING, B0_FOUR, {"n2": COLLECTS}),
        # b0 not tried by the scheduler yet: nothing is collected for it.
        (COLLECTING, waiting("b0", "b", template="four", tried=False), {}),
        # b0 asks 2 GPUs: shares a 6, b 2; a3 would bring a to 6 of 6, which reclaim leaves
        # alone: a3 defers nowhere (and b0 fits n2: nothing would be collected for it).
        (COLLECTING, waiting("b0", "b", template="two"), {}),
    ],
)
def test_the_filter_leaves_the_node_collected_for_an_owed_pod_of_several_gpus(
    config: PictureConfig | None, b_pod: dict[str, Any], failed: dict[str, str]
) -> None:
    picture = picture_of(A3, b_pod, *TWO_NODES, config=config)
    decision = decide_filter(picture, ExtenderArgs(Pod=A3, NodeNames=["n1", "n2"]))
    assert decision.admitted
    assert decision.result.FailedNodes == failed
    assert decision.result.NodeNames == [name for name in ("n1", "n2") if name not in failed]


@pytest.mark.parametrize(
    ("config", "nudged"),
    [
        # Off: the filter passes a3 on n1 (b0 fits nowhere): nudged.
        (None, ["a3"]),
        # On, one node: n1 is collected for b0 (1 free, it misses 3), a3's only node: not nudged.
        (COLLECTING, []),
    ],
)
async def test_the_requeue_check_does_not_nudge_a_pod_whose_only_node_is_collected(
    config: PictureConfig | None, nudged: list[str]
) -> None:
    picture = picture_of(A3, B0_FOUR, config=config)
    assert await nudged_and_passed(picture) == (nudged, bool(nudged))


@pytest.mark.parametrize(
    ("argv", "collects"),
    [([], COLLECT_FOR_OWED), (["--collect-for-owed=on"], True), (["--collect-for-owed=off"], False)],
)
def test_the_collect_flag_reaches_the_picture(argv: list[str], collects: bool) -> None:
    assert picture_config(parse_args(argv)).collect_for_owed is collects


def test_the_owed_pod_itself_passes() -> None:
    b0 = waiting("b0", "b")
    picture = picture_of(A3, b0)
    assert decide_filter(picture, ExtenderArgs(Pod=b0, NodeNames=["n1"])).result.NodeNames == ["n1"]


SPECS = [q("a", quota=2), q("b", quota=2)]
CAPACITY = {"gpu": 4.0}
ONE = {"gpu": 1.0}


def snapshot(a_held: float, b_held: float, a_wants: float, b_wants: float) -> FairnessSnapshot:
    usage = {
        "a": QueueUsage(allocated={"gpu": a_held}, requested={"gpu": a_wants}),
        "b": QueueUsage(allocated={"gpu": b_held}, requested={"gpu": b_wants}),
    }
    return FairnessSnapshot.build(SPECS, usage, CAPACITY)


B0 = OwedPod("b0", "b", ONE, GpuDemand(1))


@pytest.mark.parametrize(
    ("a_held", "b_held", "a_wants", "b_wants", "preemptible", "defers"),
    [
        # Shares a 3, b 1 (demand 4 and 1). a at 3 would go to 4: reclaim takes it back for b.
        (3, 0, 1, 1, True, True),
        # The same pod, not preemptible: reclaim would not take it back, so it does not defer.
        (3, 0, 1, 1, False, False),
        # Shares a 2, b 2 (demand 3 and 3); a at 1 goes to 2 of 2, never above: no deference.
        (1, 1, 2, 2, True, False),
        # b at its share (2 of 2, demand 2 held + 1 waiting: shares 2 / 2 with a's 4): not owed.
        (1, 2, 3, 1, True, False),
    ],
)
def test_a_pod_defers_exactly_when_reclaim_would_take_it_back_for_the_owed_pod(
    a_held: float, b_held: float, a_wants: float, b_wants: float, preemptible: bool, defers: bool
) -> None:
    fairness = snapshot(a_held, b_held, a_wants, b_wants)
    owed = owed_pods(fairness, [B0])
    assert defers_to(fairness, "a", ONE, preemptible, owed) == ((B0,) if defers else ())


# The CPU-starved shape (docs/queues.md, "CPU and memory (DRF)"): one node of 8 GPUs and 64
# cores; a's pods ask <1 GPU, 16 cores>, b's <1 GPU, 2 cores>; both want 8 pods. Fair shares:
# GPUs 4 / 4; cores b 16 (all it asks), a the other 48.
HOST_CAPACITY = {"gpu": 8.0, "cpu": 64.0}
A_POD = {"gpu": 1.0, "cpu": 16.0}
B_POD = {"gpu": 1.0, "cpu": 2.0}


def host_snapshot(a_pods: int, b_pods: int) -> FairnessSnapshot:
    usage = {
        "a": QueueUsage(
            allocated={"gpu": a_pods, "cpu": 16.0 * a_pods},
            requested={"gpu": 8 - a_pods, "cpu": 16.0 * (8 - a_pods)},
        ),
        "b": QueueUsage(
            allocated={"gpu": b_pods, "cpu": 2.0 * b_pods},
            requested={"gpu": 8 - b_pods, "cpu": 2.0 * (8 - b_pods)},
        ),
    }
    return FairnessSnapshot.build([q("a"), q("b")], usage, HOST_CAPACITY)


DRF_DEFERS = (
    "free capacity here goes first to a waiting pod of queue 'b', at dominant share 0.00 (gpu 0 of 4); "
    "queue 'a' would go to dominant share 1.33 (cpu 64 of 48), above its fair share, and reclaim would "
    "take it back"
)
B_HOST = OwedPod("b0", "b", B_POD, GpuDemand(1, cpu_milli=2000))


@pytest.mark.parametrize(
    ("a_pods", "b_pods", "a_request", "defers", "why"),
    [
        # a runs 3 pods (3 of 4 GPUs, 48 of 48 cores: D 1); one of its pods just ended. Its next
        # pod would bring it to 4 of 4 GPUs, 64 of 48 cores (D 1.33), from which reclaim's DRF
        # rule takes it back for b (D 0): a ends at 3 / 4, 48 / 48 = 1 > 0. It defers, though the
        # GPU rule alone lets it start (a at its GPU share, not above). Before: it started, and
        # the next reclaim cycle evicted it (churn).
        (3, 0, A_POD, True, DRF_DEFERS),
        # A pod of a asking GPUs only takes none of the cores b needs: a stays at 48 of 48 cores
        # and 4 of 4 GPUs (D 1, not above): it starts.
        (3, 0, {"gpu": 1.0}, False, ""),
        # a at 2 pods (32 of 48 cores): its next ends at 48 of 48, D 1, not above: it starts.
        (2, 0, A_POD, False, ""),
        # b at 4 of 4 GPUs: not owed, whatever the cores: a's pod starts.
        (3, 4, A_POD, False, ""),
    ],
)
def test_a_pod_defers_where_reclaims_drf_rule_would_take_it_back(
    a_pods: int, b_pods: int, a_request: dict[str, float], defers: bool, why: str
) -> None:
    fairness = host_snapshot(a_pods, b_pods)
    owed = owed_pods(fairness, [B_HOST])
    assert defers_to(fairness, "a", a_request, True, owed) == ((B_HOST,) if defers else ())
    if defers:
        assert deference_reason(fairness, "a", a_request, B_HOST) == why


def test_the_most_owed_queue_is_the_one_drf_counts_most_owed() -> None:
    # 8 GPUs, 64 cores; b and c want 4 GPUs each (shares 4 / 4); b asks 16 cores, c 48 (shares
    # 16 / 48). b holds 1 GPU and 14 cores: standings 1/4 = 0.25, 14/16 = 0.88, D(b) = 0.88. c
    # holds 2 GPUs and 8 cores: 2/4 = 0.5, 8/48 = 0.17, D(c) = 0.5. DRF (reclaim's rule 10)
    # counts c the more owed: c's pod is first. (Before: b's, by held over capacity - b
    # 14/64 = 0.22 against c's 2/8 = 0.25 - so deference and reclaim disagreed.)
    usage = {
        "b": QueueUsage(allocated={"gpu": 1.0, "cpu": 14.0}, requested={"gpu": 3.0, "cpu": 2.0}),
        "c": QueueUsage(allocated={"gpu": 2.0, "cpu": 8.0}, requested={"gpu": 2.0, "cpu": 40.0}),
    }
    fairness = FairnessSnapshot.build([q("b"), q("c")], usage, HOST_CAPACITY)
    assert fairness.fair_shares == {"b": {"gpu": 4.0, "cpu": 16.0}, "c": {"gpu": 4.0, "cpu": 48.0}}
    b0, c0 = (OwedPod(f"{name}0", name, B_POD, GpuDemand(1, cpu_milli=2000)) for name in "bc")
    assert [pod.key for pod in owed_pods(fairness, [b0, c0])] == ["c0", "b0"]
    # A queue of higher priority comes first whatever its dominant share (as the ordering has it).
    urgent = FairnessSnapshot.build([QueueSpec("b", priority=1), q("c")], usage, HOST_CAPACITY)
    assert [pod.key for pod in owed_pods(urgent, [b0, c0])] == ["b0", "c0"]


def gpus(name: str, free: int, of: int = 8, cpu: int = 0, model: str = "H100") -> NodeGpus:
    """A node of `of` GPUs, `free` of them wholly free (the rest busy), with `cpu` milli free."""
    return NodeGpus(name, model, (1000,) * free + (0,) * (of - free), cpu_free_milli=cpu)


@pytest.mark.parametrize(
    ("demand", "nodes", "collected"),
    [
        # The most GPUs free wins: n1 misses 4 - 3 = 1 GPU, n0 4 - 2 = 2.
        (GpuDemand(4), [gpus("n0", 2), gpus("n1", 3)], "n1"),
        # A tie on GPUs: the more free CPU (n2, 16 cores against 8).
        (GpuDemand(4), [gpus("n1", 3, cpu=8000), gpus("n2", 3, cpu=16000)], "n2"),
        # A tie on both: the first in the given order.
        (GpuDemand(4), [gpus("n1", 3), gpus("n2", 3)], "n1"),
        # A node too small for the pod (4 GPUs in all, 3 free) is never collected for 8.
        (GpuDemand(8), [gpus("small", 3, of=4), gpus("big", 1)], "big"),
        # Another model than the pod asks: not a candidate, though it has more free.
        (GpuDemand(2, models=frozenset({"H100"})), [gpus("a100", 1, model="A100"), gpus("h", 0)], "h"),
        # A half-free GPU is not a free GPU for whole GPUs: n0 counts 1, n1 2.
        (GpuDemand(4), [NodeGpus("n0", "H100", (500, 500, 1000, 0)), gpus("n1", 2, of=4)], "n1"),
        # No node could ever hold it: none.
        (GpuDemand(8), [gpus("n0", 4, of=4)], ""),
    ],
)
def test_the_node_collected_for_an_owed_pod_misses_the_fewest_gpus(
    demand: GpuDemand, nodes: list[NodeGpus], collected: str
) -> None:
    assert collecting_node(demand, nodes) == collected


B_FOUR = OwedPod("b0", "b", {"gpu": 4.0}, GpuDemand(4))
C_ONE = OwedPod("c0", "c", ONE, GpuDemand(1))


@pytest.mark.parametrize(
    ("owed", "nodes", "collecting"),
    [
        # A 4-GPU pod that fits nowhere (3 and 2 free) gets n0; a 1-GPU pod never (it fits).
        ((B_FOUR, C_ONE), [gpus("n0", 3), gpus("n1", 2)], ["n0", ""]),
        # The 4-GPU pod fits n1 now: plain deference keeps n1 for it, nothing is collected.
        ((B_FOUR,), [gpus("n0", 3), gpus("n1", 4)], [""]),
        # A 1-GPU pod that fits nowhere (all full): the first GPU to free anywhere fits it.
        ((C_ONE,), [gpus("n0", 0), gpus("n1", 0)], [""]),
    ],
)
def test_only_an_owed_pod_of_several_gpus_that_fits_nowhere_gets_a_node_collected(
    owed: tuple[OwedPod, ...], nodes: list[NodeGpus], collecting: list[str]
) -> None:
    assert [pod.collecting for pod in collecting_nodes(owed, nodes)] == collecting
