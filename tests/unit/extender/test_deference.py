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

from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.deference import OwedPod, defers_to, owed_pods
from extender.policy.fairness import FairnessSnapshot, QueueUsage
from extender.policy.placement import GpuDemand
from extender.status import StatusWriter, WaitingPods
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs
from tests import extender_objects as objects
from tests.unit.extender.test_reclaim import q

CLASS = "gpu.tessera.dev"
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def running(name: str, queue: str, device: str) -> list[dict[str, Any]]:
    """A pod bound to n1 whose claim holds `device`."""
    pod = objects.pod("ns", name, queue=queue, claim_name=f"{name}-gpus", node_name="n1")
    pod["status"] = {"phase": "Running"}
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[("n1", device, None)])
    return [pod, claim]


def waiting(name: str, queue: str, template: str = "one", tried: bool = True) -> dict[str, Any]:
    pod = objects.pod("ns", name, queue=queue, template=template)
    pod["status"]["conditions"] = [UNSCHEDULABLE] if tried else []
    return pod


def picture_of(*extra: dict[str, Any]) -> ClusterPicture:
    objs = [
        objects.node("n1"),
        objects.gpu_slice("n1", 4),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2)),
        objects.queue("a", resources={"gpu": {"quota": 2}}),
        objects.queue("b", resources={"gpu": {"quota": 2}}),
        *[obj for i in range(3) for obj in running(f"a{i}", "a", f"gpu-{i}")],
        *extra,
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


A3 = waiting("a3", "a")
DEFERS = (
    "free GPUs here go first to a waiting pod of queue 'b', below its fair share (gpu 0 of 1); "
    "queue 'a' (gpu 3 of 3) would borrow them and reclaim would take them back"
)


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
    waiting_pods = WaitingPods()
    waiting_pods.refused("ns", "a3", "uid-ns-a3", "a", "queue 'a' was at its limit")
    async with ApiClient() as api:
        writer = StatusWriter(api, picture, waiting_pods, ExtenderMetrics(picture))
        assert [entry.name for entry in writer.eligible_now()] == nudged
    passed = decide_filter(picture, ExtenderArgs(Pod=A3, NodeNames=["n1"])).result.NodeNames
    assert bool(passed) == bool(nudged)


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
