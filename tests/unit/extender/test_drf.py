"""DRF in reclaim (`extender.policy.drf`, rule 10 of `extender.policy.reclaim`): a GPU pod that
fits no node for CPU or memory, as declarative cases - dominant shares, the rule's verdicts, the
planner's plans, and the live picture's planner inputs. The arithmetic is in the comments.

The shape of issue 25: one node, 8 GPUs, 64 cores. a's 4 pods of <1 GPU, 16 cores> hold every
core; b's pods of <1 GPU, 2 cores> wait next to 4 idle GPUs. Both want 8 GPUs: GPU shares 4 / 4,
a holds exactly its GPU share, so the GPU rule (rule 1) takes nothing. Cores: b asks for 16 (8
pods) and is given them, a the other 48.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from contract.names import GPU_MILLI
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.drf import dominant_share, drf_refusal, host_starved
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import PendingPod, Rules, plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod
from tests import extender_objects as objects
from tests.unit.extender.pictures import supply

NOW = 10_000.0
CORES = 64.0
GPUS = 8.0
GIB = 2.0**30
MEMORY = 512 * GIB


def spec(name: str, parent: str | None = None, gpu_quota: float | None = None) -> QueueSpec:
    return QueueSpec(name, parent=parent, quota={"gpu": gpu_quota} if gpu_quota is not None else {})


@dataclass(frozen=True)
class Standing:
    """A queue's GPUs and cores, held and waited for."""

    gpu: float = 0.0
    cpu: float = 0.0
    wants_gpu: float = 0.0
    wants_cpu: float = 0.0
    memory: float = 0.0
    wants_memory: float = 0.0


def fairness_of(standings: dict[str, Standing], specs: list[QueueSpec] | None = None) -> FairnessSnapshot:
    usage = {
        name: QueueUsage(
            {"gpu": s.gpu, "cpu": s.cpu, "memory": s.memory},
            {"gpu": s.wants_gpu, "cpu": s.wants_cpu, "memory": s.wants_memory},
        )
        for name, s in standings.items()
    }
    queues = specs if specs is not None else [spec(name) for name in standings]
    return FairnessSnapshot.build(queues, usage, {"gpu": GPUS, "cpu": CORES, "memory": MEMORY})


# a runs 4 pods (4 GPUs, 64 cores) and waits with 4; b waits with 8 (8 GPUs, 16 cores).
STARVED = {"a": Standing(4, 64, 4, 64), "b": Standing(0, 0, 8, 16)}
# After one of a's pods went for one of b's: a 3 GPUs, 48 cores; b 1 GPU, 2 cores.
SERVED = {"a": Standing(3, 48, 5, 80), "b": Standing(1, 2, 7, 14)}


@pytest.mark.parametrize(
    ("standings", "specs", "queue", "expected"),
    [
        # GPU shares 4 / 4; cores: b asks 16, a the other 48. a: max(4/4, 64/48) = 1.33.
        (STARVED, None, "a", 64 / 48),
        (STARVED, None, "b", 0.0),  # holds nothing
        # a: max(3/4, 48/48) = 1 (at its share of cores); b: max(1/4, 2/16) = 0.25.
        (SERVED, None, "a", 1.0),
        (SERVED, None, "b", 0.25),
        # Quotas: a (gpu quota 6), b (quota 2), both wanting 8 GPUs: GPU shares 6 / 2; a stands at
        # 4/6 GPUs and still 64/48 cores: the CPU decides, 1.33.
        (STARVED, [spec("a", gpu_quota=6), spec("b", gpu_quota=2)], "a", 64 / 48),
    ],
)
def test_dominant_share_is_the_largest_of_held_over_fair_share(
    standings: dict[str, Standing], specs: list[QueueSpec] | None, queue: str, expected: float
) -> None:
    assert dominant_share(fairness_of(standings, specs), queue) == pytest.approx(expected)


def test_a_resource_held_beyond_a_zero_share_is_infinitely_over() -> None:
    # c holds 2 cores with a cpu limit of 0 (set after they were placed): its demand is capped
    # at 0, so its fair share of cores is 0 and 2 held over 0 is infinitely over. d holds
    # nothing: 0, whatever its share.
    queues = [QueueSpec("c", limit={"cpu": 0.0}), spec("d")]
    usage = {"c": QueueUsage({"cpu": 2.0}, {}), "d": QueueUsage({}, {"gpu": 1.0})}
    fairness = FairnessSnapshot.build(queues, usage, {"gpu": GPUS, "cpu": CORES})
    assert math.isinf(dominant_share(fairness, "c"))
    assert dominant_share(fairness, "d") == 0.0


ONE_GPU_TWO_CORES = {"gpu": 1.0, "cpu": 2.0}
A_POD = {"gpu": 1.0, "cpu": 16.0}


@dataclass(frozen=True)
class Verdict:
    name: str
    standings: dict[str, Standing]
    reclaimer: str
    victim: str
    refusal: str  # '' when allowed; else a part of the refusal's text
    specs: list[QueueSpec] | None = None
    request: dict[str, float] = field(default_factory=lambda: dict(ONE_GPU_TWO_CORES))
    taken: dict[str, float] = field(default_factory=lambda: dict(A_POD))


VERDICTS = [
    # b (D 0) takes one of a's pods (D 1.33): a ends at max(3/4, 48/48) = 1 > 0, and b ends at
    # 1 of its 4 GPUs, within its GPU share.
    Verdict("the CPU hog gives to the starved queue", STARVED, "b", "a", ""),
    # Back the other way: a is at its dominant share (1), not below it.
    Verdict(
        "the hog is not below its dominant share",
        SERVED,
        "a",
        "b",
        "queue 'a' is not below its dominant share (dominant share 1.00 (",
        request=A_POD,
        taken=ONE_GPU_TWO_CORES,
    ),
    # A victim within its share of everything is safe: c holds 2 of its 4 GPUs and 16 of its
    # 32 cores (D 0.5) while b waits with 4 GPUs' and 16 cores' worth.
    Verdict(
        "a queue within its share keeps its pods",
        {"c": Standing(2, 16, 2, 16), "b": Standing(0, 0, 4, 16)},
        "b",
        "c",
        "queue 'c' is not above its dominant share",
    ),
    # Never inverts. GPU shares 4 / 4 (a wants 8, b 4); cores: b asks 24 and gets them, a 40.
    # a holds 4 GPUs and 48 cores: D max(4/4, 48/40) = 1.2; b holds 3 GPUs: D 0.75. Taking a
    # pod of <1 GPU, 24 cores> leaves a at max(3/4, 24/40) = 0.75, no more than b now: refused.
    Verdict(
        "the victim would end no better off than the reclaimer",
        {"a": Standing(4, 48, 4, 48), "b": Standing(3, 0, 1, 24)},
        "b",
        "a",
        "no more than queue 'b' now",
        taken={"gpu": 1.0, "cpu": 24.0},
    ),
    # The reclaimer stays within its GPU share: b asks for one pod only, GPU shares a 4 (what it
    # holds and wants), b 1. b at 0 of 1 + 1 = 1, within; a (cores 64 of 62: D 1.03) ends at
    # max(3/4, 48/62) = 0.77 > 0: allowed. (The GPU rule, comparing GPU surpluses, refuses it:
    # a would end 1 GPU below its share, as owed as b is.)
    Verdict(
        "a single pod is served too", {"a": Standing(4, 64, 0, 0), "b": Standing(0, 0, 1, 2)}, "b", "a", ""
    ),
    # A 2-GPU pod of b with a GPU share of 1 would take b above its GPU share: a GPU reclaim
    # could take it back, so DRF does not give it.
    Verdict(
        "no GPUs beyond the reclaimer's share",
        {"a": Standing(4, 64, 0, 0), "b": Standing(0, 0, 1, 2)},
        "b",
        "a",
        "queue 'b' would end above its fair share of gpu (0 + 2 of 1)",
        request={"gpu": 2.0, "cpu": 2.0},
    ),
    # b's dominant share 0.5 is made by memory (b holds 64Gi of its 128Gi share); a pod of
    # <1 GPU, 2 cores> and no memory leaves it there: no rise for b, no max-min step. Refused.
    Verdict(
        "the pod must raise the reclaimer's dominant share",
        {"a": Standing(4, 64, 4, 64), "b": Standing(0, 0, 8, 16, memory=64 * GIB, wants_memory=64 * GIB)},
        "b",
        "a",
        "the pod would not raise the dominant share of queue 'b'",
    ),
    # A hierarchy: org-x (a hog `x1` and a light `x2`) and b at the root. x1 holds 4 GPUs and
    # 48 cores, x2 nothing; org-x's share of cores is 64 - 16 = 48: it stands at 48 / 48, at its
    # share, though x1 is over its own (x2 asks for cores too). b and x1 diverge at the root,
    # where org-x is not above its dominant share: nothing for b from x1.
    Verdict(
        "compared where the paths diverge",
        {
            "x1": Standing(4, 48, 0, 0),
            "x2": Standing(0, 0, 0, 8),
            "b": Standing(0, 0, 4, 16),
            "org-x": Standing(),
        },
        "b",
        "x1",
        "queue 'org-x' is not above its dominant share",
        specs=[spec("org-x"), spec("x1", "org-x"), spec("x2", "org-x"), spec("b")],
    ),
]


@pytest.mark.parametrize("case", VERDICTS, ids=lambda c: c.name)
def test_drf_refusal(case: Verdict) -> None:
    fairness = fairness_of(case.standings, case.specs)
    refusal = drf_refusal(fairness, case.reclaimer, case.request, case.victim, case.taken)
    if case.refusal:
        assert case.refusal in refusal
    else:
        assert refusal == ""


@pytest.mark.parametrize(
    ("free_gpus", "cpu_free", "demand", "expected"),
    [
        ((1000,) * 4, 0, GpuDemand(1, cpu_milli=2000), True),  # GPUs free, no core
        ((1000,) * 4, 2000, GpuDemand(1, cpu_milli=2000), False),  # it fits
        ((0,) * 4, 0, GpuDemand(1, cpu_milli=2000), False),  # no GPU either: rule 1's case
        ((1000,) * 4, 0, GpuDemand(0, cpu_milli=2000), False),  # no GPU pod
    ],
)
def test_host_starved(free_gpus: tuple[int, ...], cpu_free: int, demand: GpuDemand, expected: bool) -> None:
    node = NodeGpus("n", "", free_gpus, cpu_free_milli=cpu_free, host_tracked=True)
    assert host_starved(node, demand) is expected


# ---- the planner ----------------------------------------------------------------------------


def starved_node(a_pods: int = 4, a_cores: int = 16) -> tuple[ClusterSnapshot, list[PendingPod]]:
    """One node, 8 GPUs, 64 cores (tracked); a runs `a_pods` pods of <1 GPU, `a_cores` cores>
    (a3 the newest) and waits with 4 more; b waits with 8 pods of <1 GPU, 2 cores>."""
    cores = a_pods * a_cores
    node = NodeGpus(
        "n1",
        "",
        (0,) * a_pods + (GPU_MILLI,) * (8 - a_pods),
        cpu_free_milli=64_000 - cores * 1000,
        memory_free_mib=512 * 1024,
        host_tracked=True,
    )
    a_vector = {"gpu": 1.0, "cpu": float(a_cores)}
    running = {
        f"a{i}": RunningPod(
            f"a{i}", "a", "n1", ((i, GPU_MILLI),), a_vector, started=NOW - 3600 + i, cpu_milli=a_cores * 1000
        )
        for i in range(a_pods)
    }
    usage = {
        "a": QueueUsage({"gpu": a_pods, "cpu": cores}, {"gpu": 4.0, "cpu": 4.0 * a_cores}),
        "b": QueueUsage({}, {"gpu": 8.0, "cpu": 16.0}),
    }
    fairness = FairnessSnapshot.build([spec("a"), spec("b")], usage, {"gpu": GPUS, "cpu": CORES})
    waiting = [
        PendingPod(f"b{i}", "b", GpuDemand(1, cpu_milli=2000), dict(ONE_GPU_TWO_CORES), created=NOW - 60 + i)
        for i in range(8)
    ]
    return ClusterSnapshot({"n1": node}, running, fairness, WorkloadMix(demands=())), waiting


def test_the_starved_queue_reclaims_cores_from_the_cpu_hog() -> None:
    # b0 fits the free GPUs, not the cores (0 free). Rule 1 refuses every victim (a at 4 of 4
    # GPUs); DRF takes a3, the newest: 16 cores free, b0 placed, its hold keeping 1 GPU and its
    # 2 cores. b1..b4 then take the 4 GPUs that were free already and 8 of the 14 cores left:
    # placed, no plan needed. b5 finds no GPU, and a at D = 1 (3/4 GPUs, 48/48 cores) gives
    # nothing more: one eviction.
    snapshot, waiting = starved_node()
    plans = plan(snapshot, waiting, NOW, Rules())
    assert [(p.goal, p.pod.key, [e.pod.key for e in p.evictions]) for p in plans] == [("drf", "b0", ["a3"])]
    (done,) = plans
    assert [(h.key, h.node, h.cpu_milli) for h in done.holds] == [("b0", "n1", 2000)]
    assert "short of CPU or memory" in done.evictions[0].message
    assert "dominant share 1.33 (cpu 64 of 48)" in done.evictions[0].message


def test_a_gpu_only_cluster_gets_no_drf_plan() -> None:
    # The same pods without cores (a node that does not track them): b's pods fit the 4 free
    # GPUs - nothing to reclaim, as before.
    snapshot, waiting = starved_node(a_cores=0)
    assert plan(snapshot, waiting, NOW, Rules()) == []


# ---- the live picture hands the planner what it needs ---------------------------------------

CLASS = "gpu.tessera.dev"
STARTED = 1_767_225_600.0  # 2026-01-01T00:00:00Z
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def live_picture(a_pods: int = 4) -> ClusterPicture:
    """Node n1 (64 cores, 8 GPUs); a's pods of 16 cores run on GPUs 0-3; b's 4 pods of 2 cores
    wait, tried by the scheduler."""
    objs: list[dict[str, Any]] = [
        objects.node("n1", cpu="64"),
        objects.gpu_slice("n1", 8),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("a"),
        objects.queue("b"),
    ]
    for i in range(a_pods):
        pod = objects.pod("ns", f"a{i}", queue="a", claim_name=f"a{i}-gpu", node_name="n1", cpu="16")
        pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
        claim = objects.claim(
            "ns", f"a{i}-gpu", objects.claim_spec(CLASS), allocated=[("n1", f"gpu-{i}", None)]
        )
        objs += [pod, claim]
    for i in range(4):  # b wants 4 GPUs: shares 4 / 4
        waiting = objects.pod("ns", f"b{i}", queue="b", template="one", cpu="2")
        waiting["status"]["conditions"] = [UNSCHEDULABLE]
        objs.append(waiting)
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


def test_the_reclaim_loops_inputs_carry_cpu_and_the_plan_frees_it() -> None:
    # What the reclaim loop hands `plan` (extender/controllers/reclaim.py: `picture.snapshot()`,
    # `picture.waiting_pods()`): n1 tracks its cores (0 free: 4 x 16), a's pods give back 16
    # each, b's pods ask for 2, and the fairness capacity has the 64 cores. So the live loop
    # makes the simulator's plan: one of a's pods goes for b's first pod.
    picture = live_picture()
    snapshot, waiting = picture.snapshot(), picture.waiting_pods()
    now = STARTED + 3600.0  # a's pods started an hour ago
    node = snapshot.nodes["n1"]
    assert (node.host_tracked, node.cpu_free_milli, node.free_milli.count(GPU_MILLI)) == (True, 0, 4)
    assert {pod.cpu_milli for pod in snapshot.running.values()} == {16_000}
    assert [(p.key, p.demand.cpu_milli) for p in waiting][:1] == [("ns/b0", 2000)]
    assert snapshot.fairness.capacity["cpu"] == CORES
    assert dominant_share(snapshot.fairness, "a") > 1 > dominant_share(snapshot.fairness, "b")
    plans = plan(snapshot, waiting, now, Rules())
    assert [(p.goal, p.pod.key, len(p.evictions)) for p in plans] == [("drf", "ns/b0", 1)]
    assert plans[0].evictions[0].pod.queue == "a"


def test_a_hold_keeps_the_cpu_of_the_pod_it_is_for() -> None:
    # A DRF plan evicted a3 for b0: 16 cores free on n1 (3 x 16 held), GPU 3 held for b0 with
    # b0's 2 cores (the controller passes the plan's `HeldGpus.demand`). Another pod sees 14
    # cores free - a3's replacement (16) does not fit there and cannot take back what was freed
    # for b0 - and b0 sees all 16. (Before, a hold kept GPUs only: the hog's pod took the cores
    # back and b0 did not fit.)
    picture = live_picture(a_pods=3)
    picture.hold("ns/b0", "n1", GpuDemand(1, cpu_milli=2000), 60.0, gpus=((3, GPU_MILLI),))
    assert supply(picture, "ns/a3", "n1").cpu_free_milli == 14_000
    assert supply(picture, "ns/b0", "n1").cpu_free_milli == 16_000
    (held,) = picture.snapshot().holds.values()
    assert (held.key, held.cpu_milli) == ("ns/b0", 2000)  # what the planning fork places


def test_a_gpu_plans_hold_keeps_gpus_only() -> None:
    # One node, 2 GPUs, no core free: a (quota 1) holds both GPUs and 8 cores each; b (quota 1)
    # waits for 1 GPU + 8 cores. Rule 1 evicts a1 (its GPU and cores): a GPU plan, whose hold
    # keeps the GPU only, as before rule 10 (keeping CPU in every hold changed the churn runs).
    node = NodeGpus("n1", "", (0, 0), cpu_free_milli=0, memory_free_mib=0, host_tracked=True)
    running = {
        key: RunningPod(
            key, "a", "n1", ((i, GPU_MILLI),), {"gpu": 1.0}, started=NOW - 3600 + i, cpu_milli=8000
        )
        for i, key in enumerate(("a0", "a1"))
    }
    usage = {"a": QueueUsage({"gpu": 2.0}, {}), "b": QueueUsage({}, {"gpu": 1.0})}
    fairness = FairnessSnapshot.build([spec("a", gpu_quota=1), spec("b", gpu_quota=1)], usage, {"gpu": 2.0})
    snapshot = ClusterSnapshot({"n1": node}, running, fairness, WorkloadMix(demands=()))
    (done,) = plan(
        snapshot, [PendingPod("b0", "b", GpuDemand(1, cpu_milli=8000), {"gpu": 1.0})], NOW, Rules()
    )
    assert (done.goal, [e.pod.key for e in done.evictions]) == ("reclaim", ["a1"])
    assert [(h.key, h.cpu_milli, h.memory_mib) for h in done.holds] == [("b0", 0, 0)]
