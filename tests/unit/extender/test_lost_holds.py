"""A hold another pod took is let go and its pod planned again at once (rule 12 of
extender.policy.reclaim), as worked examples.

First the pure rule (`lost_holds`): which holds of a snapshot have no room left on their node.
Then the live loop: a gang's plan freed two GPUs on node a and holds them for its two members; a
default-scheduler pod (it sees no holds) takes one. Within the next cycle the lost hold is let
go, the member left without GPUs is planned again on node b (a borrower's pod evicted there),
the other member keeps its hold, and the filter admits the gang whole once the victim is gone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.controllers.reclaim import ReclaimLoop, ReclaimOptions
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.placement import GpuDemand
from extender.policy.reclaim import Rules, lost_holds, plan, planning_fork
from extender.policy.snapshot import ClusterSnapshot, HeldGpus
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs
from tests import extender_objects as objects
from tests.unit.extender.test_evictions import FakeEvictionApi, apiserver, counter  # noqa: F401
from tests.unit.extender.test_gangs import job, member
from tests.unit.extender.test_reclaim import NOW, Run, Scenario, Wait, build, q
from tests.unit.extender.test_server import CLASS

WHOLE = ((3, 1000),)  # GPU 3 of n1, whole


def held_snapshot(running: list[Run], holds: list[HeldGpus]) -> ClusterSnapshot:
    """n1 with 4 GPUs, queues a and b; `running` on it, `holds` kept for b's pods."""
    snapshot, _ = build(
        Scenario("lost", {"n1": 4}, [q("a", quota=2), q("b", quota=2)], running, [], set(), {})
    )
    return ClusterSnapshot(
        snapshot.base_nodes, snapshot.running, snapshot.fairness, snapshot.mix, holds=holds
    )


A_ON_0_TO_2 = [Run("a0", "a", "n1"), Run("a1", "a", "n1"), Run("a2", "a", "n1")]  # GPUs 0, 1, 2


def on_gpu_3(key: str, terminating: bool = False) -> Run:
    return Run(key, "a", "n1", milli=1000, gpu=3, terminating=terminating)


@pytest.mark.parametrize(
    ("running", "going", "lost", "b0_on"),
    [
        # GPU 3 is held for b0; a0-a2 hold GPUs 0-2 and x, a pod the hold is not for, runs on
        # GPU 3 (bound by a scheduler that sees no holds): n1 has no room left for b0. The hold
        # is lost; the planning fork places b0 nowhere.
        ([*A_ON_0_TO_2, on_gpu_3("x")], (), ["b0"], None),
        # The pod on GPU 3 is the victim, terminating: its GPU is coming free for b0.
        ([*A_ON_0_TO_2, on_gpu_3("x", terminating=True)], (), [], WHOLE),
        # ... or evicted a moment ago, its deletion not in the picture yet (`going`).
        ([*A_ON_0_TO_2, on_gpu_3("x")], ("x",), [], None),
        # x took GPU 3, but GPU 2 is free: b0 still fits n1 and is kept there, on GPU 2, as the
        # filter keeps it (the DRA allocator may give a held GPU to another held pod).
        ([*A_ON_0_TO_2[:2], on_gpu_3("x")], (), [], ((2, 1000),)),
    ],
    ids=["taken", "victim terminating", "victim just evicted", "room on another GPU"],
)
def test_a_hold_is_lost_when_its_node_has_no_room_left_for_its_pod(
    running: list[Run], going: tuple[str, ...], lost: list[str], b0_on: tuple[tuple[int, int], ...] | None
) -> None:
    snapshot = held_snapshot(running, [HeldGpus("b0", "b", "n1", WHOLE, {"gpu": 1.0})])
    assert [hold.key for hold in lost_holds(snapshot, going)] == lost
    placed = planning_fork(snapshot).running.get("b0")  # (the planning fork knows no `going`)
    assert (placed.gpus if placed is not None else None) == b0_on


@pytest.mark.parametrize(
    ("holds", "claim_left", "lost"),
    [
        # b0 is held on GPU 3. The victim that was there is gone from the picture, but its claim
        # is not deallocated yet: GPU 3 is not free and no pod holds it. Counted as free, b0 is
        # kept (before: lost, and a borrower's replacement took the GPU once it freed).
        ([HeldGpus("b0", "b", "n1", WHOLE, {"gpu": 1.0})], True, []),
        # Without the unaccounted share GPU 3 looks taken: lost (what the snapshot said before).
        ([HeldGpus("b0", "b", "n1", WHOLE, {"gpu": 1.0})], False, ["b0"]),
        # A gang's b0 is held on GPU 3 and b1 on GPU 2 (a0-a1 on 0-1). The scheduler gave b1's
        # claim GPU 3, its bind not seen yet: b0 goes on GPU 3, b1 anywhere on n1 - GPU 2 is free.
        # Neither is lost (before: b0's placement took GPU 2 in the check, and b1's hold was lost).
        (
            [
                HeldGpus("b0", "b", "n1", WHOLE, {"gpu": 1.0}, "Job/ns/b"),
                HeldGpus("b1", "b", "n1", ((2, 1000),), {"gpu": 1.0}, "Job/ns/b"),
            ],
            True,
            [],
        ),
    ],
    ids=["a victim's claim left", "the same, unaccounted not known", "a member's claim before its bind"],
)
def test_a_share_no_pod_of_the_node_holds_takes_no_hold(
    holds: list[HeldGpus], claim_left: bool, lost: list[str]
) -> None:
    running = [*A_ON_0_TO_2[: 4 - len(holds)], on_gpu_3("claim")]
    built = held_snapshot(running, holds)
    snapshot = ClusterSnapshot(
        built.base_nodes,
        {key: pod for key, pod in built.running.items() if key != "claim"},  # its pod is not on n1
        built.fairness,
        built.mix,
        holds=holds,
        unaccounted={"n1": WHOLE} if claim_left else {},
    )
    assert [hold.key for hold in lost_holds(snapshot, ())] == lost


def test_a_pod_going_from_a_node_whose_gpus_left_the_picture_costs_no_hold() -> None:
    """A terminating pod (or one just evicted) whose node's slices are gone - another test's node
    torn down, a node drained - frees nothing when the fork takes it off, and the pass goes on
    (before: KeyError on its node, every reclaim pass failed while it lasted)."""
    running = [*A_ON_0_TO_2, Run("gone", "a", "n9", terminating=True)]
    built, _ = build(
        Scenario("gone", {"n1": 4, "n9": 1}, [q("a", quota=2), q("b", quota=2)], running, [], set(), {})
    )
    snapshot = ClusterSnapshot(
        {name: node for name, node in built.base_nodes.items() if name != "n9"},  # n9's slices gone
        built.running,
        built.fairness,
        built.mix,
        holds=[HeldGpus("b0", "b", "n1", WHOLE, {"gpu": 1.0})],
    )
    assert lost_holds(snapshot, ("gone",)) == []  # GPU 3 of n1 is free for b0
    assert "gone" not in planning_fork(snapshot).running


def gang_pending(index: int) -> dict[str, Any]:
    """A member of Job ja (2 pods, minimum 2) of queue team, which kube-scheduler could not place."""
    pod = member("ja", index)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return pod


def bound(name: str, queue: str | None, node: str, device: str) -> list[dict[str, Any]]:
    """A running pod of `queue` with its own claim allocated to `device` on `node`."""
    claim = objects.claim("ns", f"{name}-gpu", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    pod = objects.pod("ns", name, queue=queue, claim_name=f"{name}-gpu", node_name=node)
    pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    return [claim, pod]


def picture_of(*extra: dict[str, Any]) -> ClusterPicture:
    """Nodes a and b of 2 GPUs each; queues team (quota 2), side (quota 1), other (none)."""
    objs = [
        *objects.two_nodes_of_two_gpus(CLASS),
        objects.queue("team", resources={"gpu": {"quota": 2}}),
        objects.queue("side", resources={"gpu": {"quota": 1}}),
        objects.queue("other"),
        job("ja", 2),
        gang_pending(0),
        gang_pending(1),
        *bound("o-0", "other", "b", "gpu-0"),
        *bound("o-1", "other", "b", "gpu-1"),
        *extra,
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


async def test_a_gang_whose_held_gpu_another_scheduler_took_is_planned_again_in_the_next_cycle(
    apiserver: tuple[FakeEvictionApi, ApiClient],  # noqa: F811
) -> None:
    fake, api = apiserver
    # A cycle before, reclaim freed node a's 2 GPUs for the gang ja (2 members, minimum 2) and
    # holds GPU 0 for ja-0, GPU 1 for ja-1; other's o-0 and o-1 borrow node b. Then a pod of
    # queue side, bound by a scheduler that sees no holds, takes gpu-1 of a.
    picture = picture_of(*bound("x", "side", "a", "gpu-1"))
    workload = "Job/ns/ja"
    for index in range(2):
        picture.hold(f"ns/ja-{index}", "a", GpuDemand(1), 90.0, owner=workload, gpus=((index, 1000),))
    # Fair shares of the 4 GPUs: team 2 (its quota), side 1, other the 1 left. team counts ja-0
    # on its hold (1 of 2: owed a whole pod); other holds 2 of 1 and ends at 1 without one of
    # its pods, less owed than team is (rule 1: 1 - 1 = 0 > -1).
    loop = ReclaimLoop(api, picture, ExtenderMetrics(picture), ReclaimOptions())
    (chosen,) = await loop.run_once()
    # ja-1's hold is let go; ja-1 alone is planned again, on b, where one of other's pods goes.
    (victim,) = [eviction.pod for eviction in chosen.evictions]
    assert (chosen.pod.key, chosen.node, victim.key in {"ns/o-0", "ns/o-1"}) == ("ns/ja-1", "b", True)
    assert fake.calls == [victim.key.split("/")[1]]
    moved = picture.held_for("ns/ja-1")
    assert moved is not None and (moved.node, moved.gpus) == ("b", victim.gpus)
    kept = picture.held_for("ns/ja-0")
    assert kept is not None and (kept.node, kept.gpus) == ("a", ((0, 1000),))
    assert ("ja-1", "HoldLost") in fake.events
    assert counter(loop.metrics, "tessera_reclaim_holds_lost_total") == 1

    # The victim gone, the gang's 2 members fit whole - ja-0 on a's GPU 0, ja-1 on b's freed GPU
    # - and the filter admits it as a unit: never 1 placed and 1 pending for want of a GPU.
    claim, pod = bound(victim.key.split("/")[1], "other", "b", "")
    for kind, gone in (("Pod", pod), ("ResourceClaim", claim)):
        picture.apply(kind, "DELETED", {**gone, "metadata": {**gone["metadata"], "resourceVersion": "9"}})
    decision = decide_filter(picture, ExtenderArgs(Pod=gang_pending(0), NodeNames=["a", "b"]))
    assert (decision.result.NodeNames, decision.admitted) == (["a"], True), decision.message
    assert decision.gang is not None and sorted(decision.gang.nodes) == ["a", "b"]


async def test_a_gang_member_given_its_neighbours_held_gpu_loses_no_hold(
    apiserver: tuple[FakeEvictionApi, ApiClient],  # noqa: F811
) -> None:
    fake, api = apiserver
    # Reclaim freed node a's 2 GPUs for the gang ja and holds GPU 0 for ja-0, GPU 1 for ja-1.
    # The scheduler's DRA allocator, which sees no holds, gave ja-0's claim gpu-1; ja-0's bind
    # has not reached the picture (no nodeName yet). (Live, 1 run in 5 under load: both holds
    # were let go, a borrower's replacement pods took the GPUs, and two more of its pods were
    # evicted for the gang.)
    claim = objects.claim("ns", "ja-0-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-1", None)])
    allocated = gang_pending(0)
    allocated["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "ja-0-gpus"}]
    picture = picture_of(claim)
    picture.apply(
        "Pod", "MODIFIED", {**allocated, "metadata": {**allocated["metadata"], "resourceVersion": "5"}}
    )
    for index in range(2):
        picture.hold(f"ns/ja-{index}", "a", GpuDemand(1), 90.0, owner="Job/ns/ja", gpus=((index, 1000),))
    assert picture.snapshot().unaccounted == {"a": ((1, 1000),)}  # held by a claim of no pod on a
    loop = ReclaimLoop(api, picture, ExtenderMetrics(picture), ReclaimOptions())
    assert await loop.run_once() == []
    assert (fake.calls, fake.events) == ([], [])
    assert counter(loop.metrics, "tessera_reclaim_holds_lost_total") == 0
    assert [picture.held_for(f"ns/ja-{index}") is not None for index in range(2)] == [True, True]


def test_a_gang_planned_again_stays_in_the_domain_of_its_held_members() -> None:
    # Racks r1 (n1) and r2 (n2), 2 GPUs each; a gang of 2 of b that must share a rack. g0 is
    # held on n2's GPU 0; g1's hold was lost to x (a pod of a) on n2's GPU 1. a (quota 2) holds
    # 3: x and two pods on n1; b (quota 2) counts g0 on its hold: 1 of 2, owed a whole pod.
    # Both racks have a victim of a (surplus 1, ending at 0 > -1), and r1 sorts first; but g0 is
    # in r2, so g1 is planned there: x goes (a plan on n1 would split the gang across racks).
    workload = "Job/ns/g"
    running = [Run("a0", "a", "n1"), Run("a1", "a", "n1"), Run("x", "a", "n2", milli=1000, gpu=1)]
    waiting = [Wait("g0", "b", workload=workload), Wait("g1", "b", workload=workload)]  # b waits for 2
    scenario = Scenario(
        "racks", {"n1": 2, "n2": 2}, [q("a", quota=2), q("b", quota=2)], running, waiting, set(), {}
    )
    built, pending = build(scenario)
    held = HeldGpus("g0", "b", "n2", ((0, 1000),), {"gpu": 1.0}, workload)
    snapshot = ClusterSnapshot(built.base_nodes, built.running, built.fairness, built.mix, holds=[held])
    racks = {"n1": "r1", "n2": "r2"}
    listed = [replace(pod, domains=racks) for pod in pending if pod.key == "g1"]  # g0 is held for
    (chosen,) = plan(snapshot, listed, NOW, Rules())
    assert (chosen.pod.key, chosen.node, [e.pod.key for e in chosen.evictions]) == ("g1", "n2", ["x"])
