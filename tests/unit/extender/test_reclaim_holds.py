"""Holds name the GPUs freed (rule 7 of extender.policy.reclaim), as declarative scenarios.

Planner cases: nodes, queues, running and waiting pods (and GPUs already held) in; per plan, its
victims and the devices it holds for each pod it serves (node, GPU index, thousandths), with what
it needs and evicts. Then the live picture: the filter keeps exactly a hold's shares from other
pods, and passes a held pod only its hold's node. The arithmetic of each case is in its comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.fairness import QueueSpec
from extender.policy.placement import GpuDemand
from extender.policy.reclaim import Plan, Rules, plan
from extender.policy.snapshot import ClusterSnapshot, HeldGpus
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs
from tests import extender_objects as objects
from tests.unit.extender.pictures import supply
from tests.unit.extender.test_reclaim import NOW, Run, Scenario, Wait, a_runs, build, q

Devices = tuple[tuple[int, int], ...]  # (GPU index, thousandths)


@dataclass(frozen=True)
class Served:
    """One plan: the pods it evicts, and for each pod it serves the node and GPUs held for it."""

    evicted: set[str]
    holds: dict[str, tuple[str, Devices]]
    needed: float  # GPUs, all the pods it serves
    evicted_gpus: float


@dataclass(frozen=True)
class HoldCase:
    name: str
    nodes: dict[str, int]
    queues: list[QueueSpec]
    running: list[Run]
    pending: list[Wait]
    plans: list[Served]
    held: list[tuple[Wait, str, Devices]] = field(default_factory=list)  # waiting pods GPUs are held for


def half(key: str, queue: str = "b") -> Wait:
    return Wait(key, queue, milli=500)


def b_halves(count: int, start: int = 0) -> list[Wait]:
    return [half(f"b{i}") for i in range(start, start + count)]


def on(node: str, gpu: int, milli: int = 500) -> tuple[str, Devices]:
    return node, ((gpu, milli),)


CASES = [
    # One node of 4 GPUs; a (quota 2) borrowed all 4 while b (quota 2) was idle. b submits 4
    # half-GPU pods: fair shares 2 / 2, b needs 2 GPUs. Victims go newest first: a3 on GPU 3.
    # Plan 1 evicts a3 (1 GPU) for b0, which takes half of GPU 3; b1 fits the other half only
    # because of that plan: it rides on it (held there too): needed 0.5 + 0.5 = 1.0 = evicted.
    # Plan 2 does the same with a2 on GPU 2 for b2 and b3. 2 evictions for 2 GPUs; a ends at 2.
    # (Before: holds were "half a GPU somewhere on n1", packed onto one GPU, so the other freed
    # GPU went whole to a's evicted pod and a third eviction - of that same pod - followed.)
    HoldCase(
        "4 halves: 2 evictions for 2 GPUs",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=a_runs(4, "n1"),
        pending=b_halves(4),
        plans=[
            Served({"a3"}, {"b0": on("n1", 3), "b1": on("n1", 3)}, 1.0, 1.0),
            Served({"a2"}, {"b2": on("n1", 2), "b3": on("n1", 2)}, 1.0, 1.0),
        ],
    ),
    # A half and two quarters share the one GPU evicted for the first of them:
    # 0.5 + 0.25 + 0.25 = 1.0 needed for 1 evicted.
    HoldCase(
        "a half and two quarters ride on one GPU",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=a_runs(4, "n1"),
        pending=[half("h"), Wait("q1", "b", milli=250), Wait("q2", "b", milli=250)],
        plans=[Served({"a3"}, {"h": on("n1", 3), "q1": on("n1", 3, 250), "q2": on("n1", 3, 250)}, 1.0, 1.0)],
    ),
    # Only a pod whose queue could have had a plan of its own rides. b waits for a half and for
    # an L4 GPU (none here: no plan), demand 1.5, so fair shares are b 1.5, a 2.5; a holds 4.
    # a's own half-GPU pod lands on the other half of GPU 3 in the fork (the scheduler would put
    # it there) but nothing is held for it: a is above its share. The plan serves b0 alone,
    # 1 GPU for 0.5 (one victim no bigger than a whole GPU: rule 4's exception).
    HoldCase(
        "a pod of a queue above its share does not ride",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=a_runs(4, "n1"),
        pending=[half("b0"), Wait("b-l4", "b", model="L4"), half("a-half", "a")],
        plans=[Served({"a3"}, {"b0": on("n1", 3)}, 0.5, 1.0)],
    ),
    # GPUs held for a pod are its own in the next cycle. GPU 3 of n1 is held whole for b0 (its
    # victim gone); a (quota 1) holds GPUs 0-2, c (quota 2) waits for one GPU. Without the hold
    # in the fork, c0 would "fit" GPU 3 and nothing would be planned, while the filter keeps
    # GPU 3 for b0: c would wait forever. With it, c0 fits nowhere and a2 is evicted for it.
    HoldCase(
        "a held GPU is no free GPU for the next cycle",
        nodes={"n1": 4},
        queues=[q("a", quota=1), q("b", quota=1), q("c", quota=2)],
        running=a_runs(3, "n1"),
        pending=[Wait("c0", "c")],
        held=[(Wait("b0", "b"), "n1", ((3, 1000),))],
        plans=[Served({"a2"}, {"c0": on("n1", 2, 1000)}, 1.0, 1.0)],
    ),
]


def snapshot_with_holds(case: HoldCase) -> tuple[ClusterSnapshot, list[Any]]:
    """The case's snapshot: held pods count as waiting in their queues, as the picture counts a
    pod not bound yet, and are not handed to the planner as waiting (the picture leaves them out)."""
    waiting = case.pending + [wait for wait, _, _ in case.held]
    snapshot, pending = build(Scenario(case.name, case.nodes, case.queues, case.running, waiting, set(), {}))
    held_keys = {wait.key for wait, _, _ in case.held}
    holds = [
        HeldGpus(wait.key, wait.queue, node, devices, {"gpu": wait.gpus * wait.milli / 1000})
        for wait, node, devices in case.held
    ]
    with_holds = ClusterSnapshot(
        snapshot.base_nodes, snapshot.running, snapshot.fairness, snapshot.mix, holds=holds
    )
    return with_holds, [p for p in pending if p.key not in held_keys]


def described(done: Plan) -> Served:
    return Served(
        {e.pod.key for e in done.evictions},
        {hold.key: (hold.node, hold.gpus) for hold in done.holds},
        done.gpus_needed,
        done.gpus_evicted,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_plan_holds_the_gpus_it_frees_for_the_pods_it_serves(case: HoldCase) -> None:
    snapshot, pending = snapshot_with_holds(case)
    plans = plan(snapshot, pending, NOW, Rules())
    assert [described(done) for done in plans] == case.plans


@pytest.mark.parametrize(("nodes", "a_pods", "halves"), [(1, 4, 4), (2, 16, 16), (4, 32, 24)])
def test_half_gpu_pods_cost_one_eviction_per_two_of_them(nodes: int, a_pods: int, halves: int) -> None:
    # `nodes` nodes of 8 GPUs (4 for one node), a borrowed every GPU, b's share is half: b's
    # `halves` half-GPU pods need halves / 2 GPUs, and get them for halves / 2 evictions of
    # distinct pods, every plan at evicted/needed 1.0 (before: up to 2.0, 15 evictions for 16
    # halves, pods evicted up to 4 times - in the simulator, which replays these plans).
    per_node = a_pods // nodes
    names = {f"n{i}": per_node for i in range(nodes)}
    running = [run for i in range(nodes) for run in a_runs(per_node, f"n{i}", start=i * per_node)]
    case = HoldCase(
        "halves", names, [q("a", quota=a_pods / 2), q("b", quota=a_pods / 2)], running, b_halves(halves), []
    )
    snapshot, pending = snapshot_with_holds(case)
    # Every half in one cycle: the per-queue cap (16 pods by default) would leave 24's last 8 to
    # the next cycle.
    plans = plan(
        snapshot, pending, NOW, Rules(max_evictions=32, max_trials=1024, max_pending_per_queue=halves)
    )
    victims = [e.pod.key for done in plans for e in done.evictions]
    assert len(victims) == len(set(victims)) == halves // 2
    assert all(done.ratio == 1.0 for done in plans)
    assert sorted(key for done in plans for key in done.served) == sorted(p.key for p in pending)


def test_a_lone_fraction_keeps_the_rest_of_its_gpu_for_its_queue() -> None:
    # 1 node x 4 GPUs, a borrowed all 4, b (quota 2) waits with one quarter-GPU pod and an L4 pod
    # (no L4 here: no plan, but it makes b's share 1.25, a's 2.75). The least eviction is a
    # whole GPU: a3 (GPU 3) for 0.25 (rule 4's exception; a ends 0.25 owed, less than b's 1.25).
    # The other 750 thousandths of GPU 3 are kept for b's next fractions (rule 11).
    case = HoldCase(
        "a lone quarter",
        {"n1": 4},
        [q("a", quota=2), q("b", quota=2)],
        a_runs(4, "n1"),
        [Wait("bq0", "b", milli=250), Wait("b-l4", "b", model="L4")],
        [],
    )
    snapshot, pending = snapshot_with_holds(case)
    (done,) = plan(snapshot, pending, NOW, Rules())
    assert described(done) == Served({"a3"}, {"bq0": on("n1", 3, 250)}, 0.25, 1.0)
    assert done.rests == (HeldGpus("b/rest/n1/3", "b", "n1", ((3, 750),), for_queue=True),)


def test_a_pod_that_may_not_ride_leaves_the_rest_to_the_plans_queue() -> None:
    # The case "a pod of a queue above its share does not ride": a3 (GPU 3) goes for b0's half;
    # a's own half lands on GPU 3's other half in the fork, but a is above its share: that half
    # is kept for b (before: a's half used it up in the fork, nothing was kept, and the plan
    # stayed at 1 GPU for 0.5 when b's next half came).
    case = next(c for c in CASES if c.name == "a pod of a queue above its share does not ride")
    snapshot, pending = snapshot_with_holds(case)
    (done,) = plan(snapshot, pending, NOW, Rules())
    assert done.rests == (HeldGpus("b/rest/n1/3", "b", "n1", ((3, 500),), for_queue=True),)


@pytest.mark.parametrize(
    ("queue", "evicted"),
    [
        # b's next quarter takes the rest kept for b: no eviction (before: a2 went, 1 GPU for
        # 0.25 again, evicted/needed 4.0 twice for what one GPU serves).
        ("b", set()),
        # c's quarter (c owed 1 GPU) may not: the rest is b's, so a2 goes for it.
        ("c", {"a2"}),
    ],
)
def test_the_next_fraction_of_the_queue_takes_the_rest_kept_for_it(queue: str, evicted: set[str]) -> None:
    # The cycle after the lone quarter's plan: a3 still terminating on GPU 3, b's first quarter
    # held there (250), the rest (750) kept for b; a holds GPUs 0-2. One more quarter of `queue`
    # waits, and an L4 pod of it (no plan: it makes the queue owed more than a pod; a, at 3,
    # is above its share of about 2.5 either way).
    case = HoldCase(
        "the next quarter",
        {"n1": 4},
        [q("a", quota=1), q("b", quota=1), q("c", quota=1)],
        [*a_runs(3, "n1"), Run("a3", "a", "n1", terminating=True)],
        [Wait("next", queue, milli=250), Wait(f"{queue}-l4", queue, model="L4")],
        [],
        held=[(Wait("bq0", "b", milli=250), "n1", ((3, 250),))],
    )
    snapshot, pending = snapshot_with_holds(case)
    rest = HeldGpus("b/rest/n1/3", "b", "n1", ((3, 750),), for_queue=True)
    kept = ClusterSnapshot(
        snapshot.base_nodes,
        snapshot.running,
        snapshot.fairness,
        snapshot.mix,
        holds=[*snapshot.holds.values(), rest],
    )
    assert [{e.pod.key for e in done.evictions} for done in plan(kept, pending, NOW, Rules())] == (
        [evicted] if evicted else []
    )


# ---- the live picture: what the filter keeps and passes -------------------------------------

CLASS = "gpu.tessera.dev"


def picture_of(*extra: dict[str, Any]) -> ClusterPicture:
    """Nodes n1 and n2, 2 shareable 80Gi GPUs each, idle; queues a and b."""
    picture = ClusterPicture()
    objs = [
        objects.node("n1"),
        objects.node("n2"),
        objects.gpu_slice("n1", 2, shareable=True),
        objects.gpu_slice("n2", 2, shareable=True),
        objects.device_class(CLASS),
        objects.claim_template("ns", "whole", objects.claim_spec(CLASS)),
        objects.claim_template("ns", "half", objects.claim_spec(CLASS, memory="40Gi")),
        objects.queue("a", resources={"gpu": {"quota": 2}}),
        objects.queue("b", resources={"gpu": {"quota": 2}}),
        *extra,
    ]
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


@pytest.mark.parametrize(
    ("holds", "for_others", "for_b0"),
    [
        # Halves held on GPUs 0 and 1 of n1: others see half of each free, so a whole-GPU pod
        # does not fit (before: both halves were kept on one GPU, the other shown free whole).
        ([("ns/b0", 0), ("ns/b1", 1)], (500, 500), (1000, 500)),
        # Both halves on GPU 1: GPU 0 stays free for anyone.
        ([("ns/b0", 1), ("ns/b1", 1)], (1000, 0), (1000, 500)),
    ],
)
def test_a_hold_keeps_exactly_its_devices_from_other_pods(
    holds: list[tuple[str, int]], for_others: tuple[int, ...], for_b0: tuple[int, ...]
) -> None:
    picture = picture_of()
    for key, gpu in holds:
        picture.hold(key, "n1", GpuDemand(1, 500), 60.0, gpus=((gpu, 500),))
    assert supply(picture, "ns/other", "n1").free_milli == for_others
    assert supply(picture, "ns/b0", "n1").free_milli == for_b0


def test_a_held_pod_passes_only_its_holds_node_and_others_not_its_gpus() -> None:
    # n1's GPU 0 is held whole for b0 (a plan freed it); both nodes are idle otherwise.
    # b0 fits both nodes but is passed n1 only: the GPUs freed for it, not n2's, which the
    # planner counted on for others. A whole-GPU pod of a still fits n1 (GPU 1) and n2.
    b0 = objects.pod("ns", "b0", queue="b", template="whole")
    other = objects.pod("ns", "a0", queue="a", template="whole")
    picture = picture_of(b0, other)
    picture.hold("ns/b0", "n1", GpuDemand(1), 60.0, gpus=((0, 1000),))
    held = decide_filter(picture, ExtenderArgs(Pod=b0, NodeNames=["n1", "n2"]))
    assert held.result.NodeNames == ["n1"]
    assert held.result.FailedNodes == {"n2": "GPUs are held for this pod on node n1"}
    assert supply(picture, "ns/a0", "n1").free_milli == (0, 1000)
    unheld = decide_filter(picture, ExtenderArgs(Pod=other, NodeNames=["n1", "n2"]))
    assert unheld.result.NodeNames == ["n1", "n2"]


def test_the_pictures_snapshot_hands_the_planner_its_holds() -> None:
    # b0 waits (its queue counts it waiting: its vector moves to allocated when the planning fork
    # places it); GPU 1 of n2 is held for it.
    b0 = objects.pod("ns", "b0", queue="b", template="half")
    picture = picture_of(b0)
    picture.hold("ns/b0", "n2", GpuDemand(1, 500), 60.0, gpus=((1, 500),))
    (hold,) = picture.snapshot().holds.values()
    assert (hold.key, hold.queue, hold.node, hold.gpus) == ("ns/b0", "b", "n2", ((1, 500),))
    assert hold.resources["gpu"] == 0.5


def test_a_hold_whose_gpu_another_pod_got_keeps_its_share_on_another_gpu() -> None:
    # Plans freed n1's GPU 0 for b0 and GPU 1 for b1; kube-scheduler's DRA allocator gave b1 GPU 0
    # (the devices are its choice), and b1's bind ended its hold. b0's GPU is taken, so its hold
    # keeps GPU 1, the one still free: a pod of a sees nothing free on n1 (before: GPU 1 shown
    # free, a's replacement took it and b0 waited for a GPU no plan would free again).
    bound = objects.pod("ns", "b1", queue="b", claim_name="b1-gpu", node_name="n1")
    claim = objects.claim("ns", "b1-gpu", objects.claim_spec(CLASS), allocated=[("n1", "gpu-0", None)])
    picture = picture_of(bound, claim)
    picture.hold("ns/b0", "n1", GpuDemand(1), 60.0, gpus=((0, 1000),))
    assert picture.node_gpus("n1").free_milli == (0, 1000)
    assert supply(picture, "ns/a0", "n1").free_milli == (0, 0)
    assert supply(picture, "ns/b0", "n1").free_milli == (0, 1000)


def test_the_rest_of_a_freed_gpu_is_kept_for_its_queue_in_the_filter() -> None:
    # A plan freed n1's GPU 0 for a half of b; its other half is kept for queue b (rule 11). Any
    # half-GPU pod of b is passed n1 (GPU 0's rest is its queue's), a's is not: n1 shows a
    # nothing free on GPU 0 and it goes to GPU 1 or n2 (before the queue's rest, a's half took
    # GPU 0's rest and b's next half needed another eviction). The planner sees the rest too.
    b1 = objects.pod("ns", "b1", queue="b", template="half")
    a1 = objects.pod("ns", "a1", queue="a", template="half")
    picture = picture_of(b1, a1)
    picture.hold("b/rest/n1/0", "n1", GpuDemand(1, 500), 60.0, gpus=((0, 500),), queue="b")
    assert supply(picture, "ns/b1", "n1", queue="b").free_milli == (1000, 1000)
    assert supply(picture, "ns/a1", "n1", queue="a").free_milli == (500, 1000)
    assert decide_filter(picture, ExtenderArgs(Pod=b1, NodeNames=["n1"])).result.NodeNames == ["n1"]
    (rest,) = picture.snapshot().holds.values()
    assert rest == HeldGpus("b/rest/n1/0", "b", "n1", ((0, 500),), for_queue=True)
