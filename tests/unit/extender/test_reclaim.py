"""Reclaim and preemption plans as declarative scenarios: nodes, queues, running and pending pods
in; evictions and placements out. The arithmetic of each case is in its comment."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from contract.names import GPU_MILLI
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import (
    Budget,
    PendingPod,
    Plan,
    Rules,
    plan,
    reclaim_refusal,
    serving_order,
    takes_past_quota,
)
from extender.policy.snapshot import ClusterSnapshot, RunningPod

NOW = 10_000.0


@dataclass(frozen=True)
class Run:
    """A running pod: `gpus` whole GPUs, or `milli` of one GPU (then `gpu` says which)."""

    key: str
    queue: str
    node: str
    gpus: int = 1
    milli: int = 0
    gpu: int = 0
    priority: int = 0
    age_s: float = 3600.0
    preemptible: bool = True
    terminating: bool = False


@dataclass(frozen=True)
class Wait:
    key: str
    queue: str
    gpus: int = 1
    milli: int = GPU_MILLI
    priority: int = 0
    model: str = ""
    age_s: float = 0.0  # how long it has waited (created at NOW - age_s)
    workload: str = ""  # a gang waiting whole


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: dict[str, int]  # node -> whole GPUs
    queues: list[QueueSpec]
    running: list[Run]
    pending: list[Wait]
    evicted: set[str]
    served: dict[str, str]  # pending pod -> node its plan reserves
    rules: Rules = field(default_factory=Rules)
    models: dict[str, str] = field(default_factory=dict)  # node -> GPU model


def q(name: str, parent: str | None = None, quota: float | None = None) -> QueueSpec:
    return QueueSpec(name, parent=parent, quota={"gpu": quota} if quota is not None else {})


def build(case: Scenario) -> tuple[ClusterSnapshot, list[PendingPod]]:
    free = {node: [GPU_MILLI] * count for node, count in case.nodes.items()}
    running: dict[str, RunningPod] = {}
    allocated: dict[str, float] = {}
    requested: dict[str, float] = {}
    for run in case.running:
        held: tuple[tuple[int, int], ...]
        if run.milli:
            held = ((run.gpu, run.milli),)
        else:
            whole = [i for i, f in enumerate(free[run.node]) if f == GPU_MILLI][: run.gpus]
            held = tuple((i, GPU_MILLI) for i in whole)
        for index, milli in held:
            free[run.node][index] -= milli
        amount = sum(m for _, m in held) / GPU_MILLI
        allocated[run.queue] = allocated.get(run.queue, 0.0) + amount
        running[run.key] = RunningPod(
            run.key,
            run.queue,
            run.node,
            held,
            {"gpu": amount},
            run.priority,
            run.preemptible,
            NOW - run.age_s,
            run.terminating,
        )
    pending = []
    for wait in case.pending:
        amount = wait.gpus * wait.milli / GPU_MILLI
        requested[wait.queue] = requested.get(wait.queue, 0.0) + amount
        models = frozenset({wait.model}) if wait.model else frozenset()
        pending.append(
            PendingPod(
                wait.key,
                wait.queue,
                GpuDemand(wait.gpus, wait.milli, models),
                {"gpu": amount},
                wait.priority,
                NOW - wait.age_s,
                workload=wait.workload,
            )
        )
    usage = {
        spec.name: QueueUsage({"gpu": allocated.get(spec.name, 0.0)}, {"gpu": requested.get(spec.name, 0.0)})
        for spec in case.queues
    }
    fairness = FairnessSnapshot.build(case.queues, usage, {"gpu": float(sum(case.nodes.values()))})
    nodes = {n: NodeGpus(n, case.models.get(n, ""), tuple(f)) for n, f in free.items()}
    return ClusterSnapshot(nodes, running, fairness, WorkloadMix(demands=())), pending


def a_runs(count: int, node: str, start: int = 0, **extra: object) -> list[Run]:
    """`count` one-GPU pods of queue a on `node`; a higher index is younger."""
    return [Run(f"a{i}", "a", node, age_s=3600.0 - i, **extra) for i in range(start, start + count)]  # type: ignore[arg-type]


SCENARIOS = [
    # 2 x 4 GPUs, a and b quota 4 each. a borrowed all 8 while b was idle; b now waits for 4.
    # Fair shares 4 / 4: the 4 newest of a's pods go, one per pending pod of b.
    Scenario(
        "borrowed GPUs come back",
        nodes={"n1": 4, "n2": 4},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=a_runs(4, "n1") + a_runs(4, "n2", start=4),
        pending=[Wait(f"b{i}", "b") for i in range(4)],
        evicted={"a4", "a5", "a6", "a7"},
        served={"b0": "n2", "b1": "n2", "b2": "n2", "b3": "n2"},
    ),
    # a holds 7 of 8, fair share 4 (b waits for 4); b's first pod fits the free GPU, so reclaim
    # takes 3: a ends at exactly its fair share 4, never below.
    Scenario(
        "the victim queue stays at its fair share",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=a_runs(7, "n1"),
        pending=[Wait(f"b{i}", "b") for i in range(5)],
        evicted={"a4", "a5", "a6"},
        served={"b1": "n1", "b2": "n1", "b3": "n1"},
    ),
    # Same, but a's pods started 60 s ago and a's reclaimMinRuntime is 600 s: nothing yet.
    Scenario(
        "reclaimMinRuntime is respected",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=[Run(f"a{i}", "a", "n1", age_s=60) for i in range(4)],
        pending=[Wait("b0", "b")],
        evicted=set(),
        served={},
        rules=Rules(reclaim_min_runtime_s={"a": 600}),
    ),
    # a's pods are not preemptible (e.g. inference above the priority threshold): never evicted.
    Scenario(
        "pods that are not preemptible stay",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=[Run(f"a{i}", "a", "n1", preemptible=False) for i in range(4)],
        pending=[Wait("b0", "b")],
        evicted=set(),
        served={},
    ),
    # b's fair share is 2 (quota 2, a wants 6 of the rest) and b already holds 2: a third GPU for
    # b would put it above its share, so nothing is taken from a.
    Scenario(
        "the reclaiming queue does not go above its own fair share",
        nodes={"n1": 8},
        queues=[q("a", quota=6), q("b", quota=2)],
        running=[*a_runs(6, "n1"), Run("b0", "b", "n1"), Run("b1", "b", "n1")],
        pending=[Wait("b2", "b")],
        evicted=set(),
        served={},
    ),
    # org-a (quota 4: a1 quota 2, a2 quota 2) and org-b (quota 4: b1) on 8 GPUs. b1 holds 2 and
    # wants no more; a2 holds 6; a1 waits for 2. org-b fair 2, org-a 6; within org-a: a1 2, a2 4.
    # The paths diverge at org-a: a2 (6 > 4) gives 2 to a1; b1 (at its share) keeps its GPUs.
    Scenario(
        "queues are compared where their paths diverge",
        nodes={"n1": 8},
        queues=[
            q("org-a", quota=4),
            q("a1", "org-a", quota=2),
            q("a2", "org-a", quota=2),
            q("org-b", quota=4),
            q("b1", "org-b", quota=4),
        ],
        running=[Run(f"x{i}", "a2", "n1", age_s=100 + i) for i in range(6)]
        + [Run("y0", "b1", "n1", age_s=1), Run("y1", "b1", "n1", age_s=2)],
        pending=[Wait("w0", "a1"), Wait("w1", "a1")],
        evicted={"x0", "x1"},
        served={"w0": "n1", "w1": "n1"},
    ),
    # A 2-GPU pod of b, and a runs only 2-GPU pods: one victim of 2 GPUs (ratio 1).
    Scenario(
        "a multi-GPU pod takes one victim of its size",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=[Run("a0", "a", "n1", gpus=2), Run("a1", "a", "n1", gpus=2, age_s=10)],
        pending=[Wait("b0", "b", gpus=2)],
        evicted={"a1"},
        served={"b0": "n1"},
    ),
    # b wants 0.6 of a GPU; each GPU holds two halves of a. Freeing 0.6 takes both halves of one
    # GPU: 1.0 evicted for 0.6 needed is a ratio of 1.67 > 1.1 with two victims: refused.
    Scenario(
        "never more than 1.1 times what is needed",
        nodes={"n1": 2},
        queues=[q("a", quota=1), q("b", quota=1)],
        running=[Run(f"h{i}", "a", "n1", milli=500, gpu=i // 2) for i in range(4)],
        pending=[Wait("b0", "b", milli=600)],
        evicted=set(),
        served={},
    ),
    # b wants a quarter GPU; a's only pod holds all 8 GPUs. One victim is allowed past the 1.1
    # ratio only when it is no bigger than the whole GPUs needed (1 here): 8 for 0.25 is refused.
    Scenario(
        "a big pod is never evicted for a small one",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=[Run("big", "a", "n1", gpus=8)],
        pending=[Wait("b0", "b", milli=250)],
        evicted=set(),
        served={},
    ),
    # The same with b wanting half a GPU: one half of a goes (ratio 1).
    Scenario(
        "a fraction takes a fraction",
        nodes={"n1": 2},
        queues=[q("a", quota=1), q("b", quota=1)],
        running=[Run(f"h{i}", "a", "n1", milli=500, gpu=i // 2, age_s=100 - i) for i in range(4)],
        pending=[Wait("b0", "b", milli=500)],
        evicted={"h3"},
        served={"b0": "n1"},
    ),
    # a's newest pod is already terminating: its GPU is as good as free, so b's pod waits for it
    # and nothing more is evicted.
    Scenario(
        "nothing is evicted for GPUs already coming free",
        nodes={"n1": 4},
        queues=[q("a", quota=2), q("b", quota=2)],
        running=[*a_runs(3, "n1"), Run("a3", "a", "n1", age_s=1, terminating=True)],
        pending=[Wait("b0", "b")],
        evicted=set(),
        served={},
    ),
    # b waits for an H100; a borrows 4 H100s and 4 T4s. Only H100 pods of a are victims.
    Scenario(
        "only GPUs of the model the pod asks for are taken",
        nodes={"h": 4, "t": 4},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=a_runs(4, "h") + a_runs(4, "t", start=4),
        pending=[Wait("b0", "b", model="H100")],
        evicted={"a3"},
        served={"b0": "h"},
        models={"h": "H100", "t": "T4"},
    ),
    # Priority within a queue: a is within its fair share (holds 4 of 4, nobody else waits for
    # more); its priority-50 pod evicts a's lowest-priority pod, not b's.
    Scenario(
        "a higher-priority pod preempts its own queue's lowest-priority pod",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=[Run(f"a{i}", "a", "n1", priority=10 * i) for i in range(4)]
        + [Run(f"b{i}", "b", "n1") for i in range(4)],
        pending=[Wait("urgent", "a", priority=50)],
        evicted={"a0"},
        served={"urgent": "n1"},
    ),
    # At most max_evictions per cycle: 2 here, for 4 pending pods of b.
    Scenario(
        "a cap on evictions per cycle",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=a_runs(8, "n1"),
        pending=[Wait(f"b{i}", "b") for i in range(4)],
        evicted={"a6", "a7"},
        served={"b0": "n1", "b1": "n1"},
        rules=Rules(max_evictions=2),
    ),
]


@pytest.mark.parametrize("case", SCENARIOS, ids=lambda c: c.name)
def test_reclaim_scenario(case: Scenario) -> None:
    snapshot, pending = build(case)
    before = {name: node.free_milli for name, node in snapshot.nodes.items()}
    plans = plan(snapshot, pending, NOW, case.rules)
    evicted = [e.pod.key for p in plans for e in p.evictions]
    assert len(evicted) == len(set(evicted)), "a pod is evicted twice"
    assert set(evicted) == case.evicted
    assert {p.pod.key: p.node for p in plans} == case.served
    for p in plans:
        assert p.ratio <= 1.1 or len(p.evictions) == 1
        assert all(e.message for e in p.evictions)
    # Planning worked on a fork: the snapshot is as it was.
    assert {name: node.free_milli for name, node in snapshot.nodes.items()} == before


def test_refusal_names_the_queue_and_the_numbers() -> None:
    # b holds 2 = its fair share 2 (a wants 6 of 8 with quota 6): b is no borrower, so taking one
    # of b's GPUs for a is refused, the message naming b and the numbers.
    snapshot, _ = build(
        Scenario(
            "",
            nodes={"n1": 8},
            queues=[q("a", quota=6), q("b", quota=2)],
            running=[*a_runs(5, "n1"), Run("b0", "b", "n1"), Run("b1", "b", "n1")],
            pending=[Wait("a9", "a")],
            evicted=set(),
            served={},
        )
    )
    refusal = reclaim_refusal(snapshot.fairness, "a", {"gpu": 1}, "b", {"gpu": 1})
    assert refusal == "queue 'b' is not above its fair share (gpu 2 of 2)"


def test_a_node_that_tracks_cpu_gives_it_back_on_eviction() -> None:
    # One node, 2 GPUs and 16 cores, the simulator's kind (CPU and memory tracked). a's two pods
    # hold both GPUs and 8 cores each, so no core is free; b (quota 1) waits for 1 GPU + 8 cores.
    # Evicting a1 frees its GPU *and* its 8 cores: b fits. (Before the fork gave back only GPUs,
    # b never fitted and reclaim planned nothing.) The placement then takes b's cores again.
    cores = 8000
    node = NodeGpus("n1", "", (0, 0), cpu_free_milli=0, memory_free_mib=0, host_tracked=True)
    running = {
        key: RunningPod(
            key, "a", "n1", ((i, GPU_MILLI),), {"gpu": 1.0}, started=NOW - 3600 + i, cpu_milli=cores
        )
        for i, key in enumerate(("a0", "a1"))
    }
    usage = {"a": QueueUsage({"gpu": 2.0}, {}), "b": QueueUsage({}, {"gpu": 1.0})}
    fairness = FairnessSnapshot.build([q("a", quota=1), q("b", quota=1)], usage, {"gpu": 2.0})
    snapshot = ClusterSnapshot({"n1": node}, running, fairness, WorkloadMix(demands=()))
    waiting = PendingPod("b0", "b", GpuDemand(1, cpu_milli=cores), {"gpu": 1.0})

    plans = plan(snapshot, [waiting], NOW, Rules())

    assert [(p.pod.key, p.node, [e.pod.key for e in p.evictions]) for p in plans] == [("b0", "n1", ["a1"])]
    fork = snapshot.fork()
    fork.evict("a1")
    assert fork.nodes["n1"].cpu_free_milli == cores
    fork.place(RunningPod("b0", "b", "", (), {"gpu": 1.0}), GpuDemand(1, cpu_milli=cores), "n1")
    assert fork.nodes["n1"].cpu_free_milli == 0
    assert snapshot.nodes["n1"].cpu_free_milli == 0  # the snapshot itself is untouched


def test_a_pod_presumed_placed_in_the_cycle_is_no_victim() -> None:
    # n1 has 4 GPUs; x0 holds one and is protected by x's reclaimMinRuntime. Quotas a 1, b 1,
    # x 1, demands a 3, b 1, x 1: shares a 2, b 1, x 1. a (below its share, first by name) has
    # three pods that fit the 3 free GPUs: the planner presumes the scheduler places them, and a
    # then holds 3 > 2. b0 fits nowhere and is owed 1 GPU - but a's pods are still pending: evicting
    # one would only delete it. (Before, a0 was planned as b0's victim.) Nothing is planned; once
    # a's pods run, a later cycle may reclaim one of them.
    snapshot, pending = build(
        Scenario(
            "",
            nodes={"n1": 4},
            queues=[q("a", quota=1), q("b", quota=1), q("x", quota=1)],
            running=[Run("x0", "x", "n1", age_s=10)],
            pending=[Wait("a0", "a"), Wait("a1", "a"), Wait("a2", "a"), Wait("b0", "b")],
            evicted=set(),
            served={},
        )
    )
    assert plan(snapshot, pending, NOW, Rules(reclaim_min_runtime_s={"x": 600})) == []


def test_a_victims_model_resource_does_not_block_a_pod_that_takes_any_model() -> None:
    # Running pods hold gpu and gpu/<model>; b's pending pod asks for gpu only. a holds 8 of the
    # model and is the only queue using it, so its fair share of the model is 8: checking a
    # against that would refuse every reclaim. Only the resources b's pod asks for count.
    model = "gpu/NVIDIA H100 80GB HBM3"
    usage = {
        "a": QueueUsage({"gpu": 8.0, model: 8.0}, {}),
        "b": QueueUsage({}, {"gpu": 4.0}),
    }
    fairness = FairnessSnapshot.build([q("a", quota=4), q("b", quota=4)], usage, {"gpu": 8.0, model: 8.0})
    assert fairness.fair_shares["a"][model] == 8.0
    assert reclaim_refusal(fairness, "b", {"gpu": 1.0}, "a", {"gpu": 1.0, model: 1.0}) == ""
    # A pod that asks for the model is checked on it too: b's share of it is 0 (b never asked).
    refusal = reclaim_refusal(fairness, "b", {"gpu": 1.0, model: 1.0}, "a", {"gpu": 1.0, model: 1.0})
    assert refusal == f"queue 'b' is not below its fair share ({model} 0 of 0)"


@pytest.mark.parametrize(
    ("max_trials", "served", "cut_off"),
    [
        # Each of b's pods fits no node and needs one eviction; its search tries the 2 nodes
        # holding a's pods (one trial each), most free first: b0 costs 2 trials, b1 2, b2 2.
        (6, ["b0", "b1", "b2"], 0),  # 6 trials: all three searched to the end
        (4, ["b0", "b1"], 1),  # 2 + 2 trials, none left for b2: cut off, reported
        # b1 gets 1 trial: its plan on the first node is kept (found before the budget ran out);
        # b2 gets none.
        (3, ["b0", "b1"], 1),
        (0, [], 3),  # no work allowed: every waiting pod is cut off
    ],
)
def test_a_cycle_stops_at_its_work_budget_and_counts_what_it_cut_off(
    max_trials: int, served: list[str], cut_off: int
) -> None:
    # Two full nodes of 2 GPUs, all held by a (quota 0: borrowing), b (quota 4) waits with 3
    # single-GPU pods: each may reclaim one of a's pods (rule 1: b 0 + 1 <= its share, a stays at
    # or above its share of 1 without it).
    snapshot, pending = build(
        Scenario(
            "",
            nodes={"n1": 2, "n2": 2},
            queues=[q("a", quota=0), q("b", quota=4)],
            running=[*a_runs(2, "n1"), Run("a8", "a", "n2"), Run("a9", "a", "n2")],
            pending=[Wait("b0", "b"), Wait("b1", "b"), Wait("b2", "b")],
            evicted=set(),
            served={},
        )
    )
    work = Budget(max_trials)
    plans = plan(snapshot, pending, NOW, Rules(max_trials=max_trials), work)
    assert [p.pod.key for p in plans] == served
    assert work.cut_off == cut_off
    assert work.trials == 0 or cut_off == 0


# ---- the reclaim rule: every move makes things fairer, in whole pods ----------------------------
#
# A queue's surplus is what its subtree holds minus its fair share (negative: it is owed). A pod
# of R may take `taken` from a pod of V when, with R' and V' the queues where their paths diverge,
# every queue from R up to R' is owed, every queue from V up to V' has a surplus, and each of
# those ends owed less than R' is now. (Before: V's side had to stay at or above its share, which
# fractional shares never allow for a whole GPU.)


def standing(
    held: dict[str, float], shares: dict[str, float], parents: dict[str, str] | None = None
) -> FairnessSnapshot:
    """Queues holding `held` GPUs with the fair shares given (as a planner's fork reads them)."""
    parents = parents or {}
    specs = [QueueSpec(name, parent=parents.get(name)) for name in shares]
    usage = {name: QueueUsage({"gpu": held.get(name, 0.0)}, {}) for name in shares}
    return FairnessSnapshot(
        tuple(specs), usage, {"gpu": sum(held.values())}, {n: {"gpu": s} for n, s in shares.items()}
    )


ORG = {"a": "org", "b": "org"}  # org (a, b) and c at the root
DEPTS = {"a1": "dept-a", "a2": "dept-a", "b1": "dept-b", "b2": "dept-b"}  # two departments

REFUSALS = [
    # (case, held, shares, parents, reclaimer, victim, GPUs taken, refusal ('' = allowed))
    # c owed 1 (0 of 1); a 0.5 above (2 of 1.5) ends 0.5 below (1 of 1.5): less owed than c was.
    # The old rule refused it: 2 - 1 < 1.5.
    (
        "owed a GPU, from a queue half a GPU above",
        {"a": 2, "b": 2, "c": 0},
        {"a": 1.5, "b": 1.5, "c": 1},
        None,
        "c",
        "a",
        1,
        "",
    ),
    # r owed 0.5 (1 of 1.5); v 1 above (2.5 of 1.5) ends at its share: 0 < 0.5 owed.
    (
        "owed half a GPU, from a queue a GPU above",
        {"r": 1, "v": 2.5},
        {"r": 1.5, "v": 1.5},
        None,
        "r",
        "v",
        1,
        "",
    ),
    # v 0.5 above would end 0.5 below, as owed as r is now: a swap, no fairer (and its reverse
    # would be allowed by the same numbers: ping-pong).
    (
        "owed half a GPU, from a queue half a GPU above",
        {"r": 1, "v": 2},
        {"r": 1.5, "v": 1.5},
        None,
        "r",
        "v",
        1,
        "queue 'v' would end 0.5 below its fair share (gpu 2 - 1 of 1.5), no less than queue 'r' is now "
        "(1 of 1.5): no fairer",
    ),
    # The newcomer among 3 queues holding 3 of 9 GPUs each: shares 9 / 4 = 2.25. A victim ends 0.25
    # below (2 of 2.25), the newcomer was 2.25 below; at 2 of 2.25 itself, it would be a swap.
    ("the newcomer", {"d": 0, "v": 3}, {"d": 2.25, "v": 2.25}, None, "d", "v", 1, ""),
    (
        "the newcomer 0.25 below",
        {"d": 2, "v": 3},
        {"d": 2.25, "v": 2.25},
        None,
        "d",
        "v",
        1,
        "queue 'v' would end 0.25 below its fair share (gpu 3 - 1 of 2.25), no less than queue 'd' is now "
        "(2 of 2.25): no fairer",
    ),
    # Only an owed queue reclaims, only from one above its share.
    (
        "a reclaimer at its share",
        {"r": 2, "v": 5},
        {"r": 2, "v": 2},
        None,
        "r",
        "v",
        1,
        "queue 'r' is not below its fair share (gpu 2 of 2)",
    ),
    (
        "a victim at its share",
        {"r": 0, "v": 2},
        {"r": 2, "v": 2},
        None,
        "r",
        "v",
        1,
        "queue 'v' is not above its fair share (gpu 2 of 2)",
    ),
    # All the victim's GPUs count: r owed 2; v 1 above gives a 2-GPU pod, ends 1 below (fairer),
    # or a 3-GPU pod, ends 2 below (no fairer).
    ("a 2-GPU victim", {"r": 0, "v": 3}, {"r": 2, "v": 2}, None, "r", "v", 2, ""),
    (
        "a 3-GPU victim",
        {"r": 0, "v": 3},
        {"r": 2, "v": 2},
        None,
        "r",
        "v",
        3,
        "queue 'v' would end 2 below its fair share (gpu 3 - 3 of 2), no less than queue 'r' is now "
        "(0 of 2): no fairer",
    ),
    # A hierarchy: 4 GPUs, shares org 3 (a 1.5, b 1.5), c 1. c and a diverge at the root: c owed 1;
    # org (4 of 3) ends at its share, a (2 of 1.5) 0.5 below, both less owed than c was.
    (
        "c from a, across the root",
        {"a": 2, "b": 2, "c": 0, "org": 0},
        {"org": 3, "a": 1.5, "b": 1.5, "c": 1},
        ORG,
        "c",
        "a",
        1,
        "",
    ),
    # a (1 of 1.5, owed) against c (1 of 1): they diverge at the root, where org (3 of 3) is owed
    # nothing: not from outside org. Inside org, b (2 of 1.5) would end as owed as a: no fairer.
    (
        "a from c, across the root",
        {"a": 1, "b": 2, "c": 1, "org": 0},
        {"org": 3, "a": 1.5, "b": 1.5, "c": 1},
        ORG,
        "a",
        "c",
        1,
        "queue 'org' is not below its fair share (gpu 3 of 3)",
    ),
    (
        "a from b, inside org",
        {"a": 1, "b": 2, "c": 1, "org": 0},
        {"org": 3, "a": 1.5, "b": 1.5, "c": 1},
        ORG,
        "a",
        "b",
        1,
        "queue 'b' would end 0.5 below its fair share (gpu 2 - 1 of 1.5), no less than queue 'a' is now "
        "(1 of 1.5): no fairer",
    ),
    # org above its share (4 of 3) but b at its own (1 of 1, a 3 of 2): b gives nothing, a does.
    (
        "c from b at its share inside a borrowing org",
        {"a": 3, "b": 1, "c": 0, "org": 0},
        {"org": 3, "a": 2, "b": 1, "c": 1},
        ORG,
        "c",
        "b",
        1,
        "queue 'b' is not above its fair share (gpu 1 of 1)",
    ),
    (
        "c from a above its share inside a borrowing org",
        {"a": 3, "b": 1, "c": 0, "org": 0},
        {"org": 3, "a": 2, "b": 1, "c": 1},
        ORG,
        "c",
        "a",
        1,
        "",
    ),
    # Two departments of 4 (leaves 2 each); b1 is owed a whole GPU (1 of 2) in dept-b, owed half
    # (3.5 of 4), and dept-a holds 4.5 (a1 3, a2 1.5). a1's GPU leaves dept-a 0.5 owed (3.5 of 4),
    # exactly as owed as dept-b is now - a swap where the paths diverge, no inversion - and a1 at
    # its share; below them b1 goes from 1 owed to 0, and nothing on either path ends as owed as
    # b1 is now (1). The lowest surplus of the queues moved, b1's -1, rises to -0.5: fairer. The
    # rule before compared dept-a with dept-b only, and refused it ("no fairer"): b1 waited.
    (
        "a leaf owed a GPU in a department owed half: a swap of the departments",
        {"a1": 3, "a2": 1.5, "b1": 1, "b2": 2.5, "dept-a": 0, "dept-b": 0},
        {"dept-a": 4, "dept-b": 4, "a1": 2, "a2": 2, "b1": 2, "b2": 2},
        DEPTS,
        "b1",
        "a1",
        1,
        "",
    ),
    # The same departments, b1 owed 2 (0 of 2), b2 at 3.5: a 2-GPU victim of a1 would leave dept-a
    # 1.5 owed (2.5 of 4), less than b1's 2, but more than dept-b's 0.5 now: the departments would
    # change places, inverted where the paths diverge.
    (
        "a leaf owed 2 GPUs in a department owed half: no inversion of the departments",
        {"a1": 3, "a2": 1.5, "b1": 0, "b2": 3.5, "dept-a": 0, "dept-b": 0},
        {"dept-a": 4, "dept-b": 4, "a1": 2, "a2": 2, "b1": 2, "b2": 2},
        DEPTS,
        "b1",
        "a1",
        2,
        "queue 'dept-a' would end 1.5 below its fair share (gpu 4.5 - 2 of 4), more than queue 'dept-b' "
        "is now (3.5 of 4): inverted where their paths diverge",
    ),
    # A leaf owed half a GPU in that department compares with its own deficit, 0.5: a1 ending at
    # its share is fine, dept-a ending 0.5 owed is not (no less owed than b1 is now).
    (
        "a leaf owed half a GPU in a department owed half",
        {"a1": 3, "a2": 1.5, "b1": 1.5, "b2": 2, "dept-a": 0, "dept-b": 0},
        {"dept-a": 4, "dept-b": 4, "a1": 2, "a2": 2, "b1": 2, "b2": 2},
        DEPTS,
        "b1",
        "a1",
        1,
        "queue 'dept-a' would end 0.5 below its fair share (gpu 4.5 - 1 of 4), no less than queue 'b1' is "
        "now (1.5 of 2): no fairer",
    ),
]


@pytest.mark.parametrize(
    ("held", "shares", "parents", "reclaimer", "victim", "taken", "refusal"),
    [row[1:] for row in REFUSALS],
    ids=[f"{row[0]}: {row[4]} from {row[5]}" for row in REFUSALS],
)
def test_a_reclaim_leaves_the_victim_less_owed_than_the_reclaimer_was(
    held: dict[str, float],
    shares: dict[str, float],
    parents: dict[str, str] | None,
    reclaimer: str,
    victim: str,
    taken: float,
    refusal: str,
) -> None:
    fairness = standing(held, shares, parents)
    assert reclaim_refusal(fairness, reclaimer, {"gpu": 1.0}, victim, {"gpu": taken}) == refusal


def after(case: Scenario, plans: list[Plan]) -> Scenario:
    """The next cycle's state: the plans' victims waiting again, their pods running (just started)."""
    evicted = {e.pod.key for p in plans for e in p.evictions}
    served = {p.pod.key: p.node for p in plans}
    waits = {w.key: w for w in case.pending}
    return replace(
        case,
        running=[r for r in case.running if r.key not in evicted]
        + [Run(key, waits[key].queue, node, gpus=waits[key].gpus, age_s=0) for key, node in served.items()],
        pending=[w for w in case.pending if w.key not in served]
        + [Wait(r.key, r.queue, gpus=r.gpus, age_s=r.age_s) for r in case.running if r.key in evicted],
    )


def older(queue: str, count: int, start: int = 0) -> list[Wait]:
    """`count` waiting one-GPU pods of `queue`, each older than any pod of the scenario's others."""
    return [Wait(f"{queue}{i}", queue, age_s=100_000.0 - i) for i in range(start, start + count)]


def runs(queue: str, count: int, node: str, age_s: float) -> list[Run]:
    """`count` one-GPU pods of `queue` on `node`, the higher index the younger."""
    return [Run(f"{queue}{i}", queue, node, age_s=age_s - i) for i in range(count)]


FAIRER = [
    # 4 GPUs; a and b hold 2 each and wait for 2 more, c waits for 1 (no quotas): shares c 1, a 1.5,
    # b 1.5. c is owed 1; a's newest pod goes (a ends at 1 of 1.5, 0.5 below: less owed than c
    # was). Before: both victims would fall below 1.5, nothing was evicted, c waited.
    Scenario(
        "fractional shares: a queue owed a GPU is served",
        nodes={"n1": 4},
        queues=[q("a"), q("b"), q("c")],
        running=runs("a", 2, "n1", age_s=100) + runs("b", 2, "n1", age_s=200),
        pending=[*older("a", 2, start=2), *older("b", 2, start=2), Wait("c0", "c")],
        evicted={"a1"},
        served={"c0": "n1"},
    ),
    # The same one level down: org (a, b) and c at the root; shares org 3 (a 1.5, b 1.5), c 1.
    # Where c and a diverge (the root) org holds 4 of 3: it ends at its share, a 0.5 below.
    Scenario(
        "fractional shares in a hierarchy",
        nodes={"n1": 4},
        queues=[q("org"), q("a", "org"), q("b", "org"), q("c")],
        running=runs("a", 2, "n1", age_s=100) + runs("b", 2, "n1", age_s=200),
        pending=[*older("a", 2, start=2), *older("b", 2, start=2), Wait("c0", "c")],
        evicted={"a1"},
        served={"c0": "n1"},
    ),
    # The newcomer d among a, b, c holding 3 of 9 GPUs each (all want more): shares 2.25. d0 takes
    # c's newest pod (c ends 0.25 below; d was 2.25 below), d1 one of b's (c, at 2 of 2.25, has no
    # surplus left; d was 1.25 below); d2 would leave a 0.25 below, as owed as d is then: waits.
    Scenario(
        "the newcomer among n queues holding k GPUs each (share nk/(n+1) > k - 1)",
        nodes={"n1": 9},
        queues=[q("a"), q("b"), q("c"), q("d")],
        running=runs("a", 3, "n1", age_s=300) + runs("b", 3, "n1", age_s=200) + runs("c", 3, "n1", age_s=100),
        pending=[*older("a", 3, start=3), *older("b", 3, start=3), *older("c", 3, start=3)]
        + [Wait(f"d{i}", "d", age_s=3 - i) for i in range(3)],
        evicted={"c2", "b2"},
        served={"d0": "n1", "d1": "n1"},
    ),
    # Two departments (churn at t=23003 in small): 8 GPUs, all queues want more, shares dept-a 4,
    # dept-b 4, each leaf 2. a1 holds 3, a2 1.5, b1 1, b2 2.5 (none of it preemptible: inside
    # dept-b nothing may go). b1 is owed 1 (1 of 2), dept-b only 0.5 (3.5 of 4). a1's newest GPU
    # leaves dept-a 0.5 owed (3.5 of 4), as owed as dept-b is now (a swap of the departments, no
    # inversion), a1 at its share, b1 at its share: the most owed queue moved, b1 at -1, ends at
    # 0. Before, where the paths diverge dept-a would end no less owed than dept-b: refused, and
    # b1 waited for a GPU to free by itself.
    Scenario(
        "a leaf owed a GPU in a department owed half takes it from the other department",
        nodes={"n1": 8},
        queues=[
            q("dept-a"),
            q("dept-b"),
            q("a1", "dept-a"),
            q("a2", "dept-a"),
            q("b1", "dept-b"),
            q("b2", "dept-b"),
        ],
        running=[
            Run("a2-half", "a2", "n1", milli=500, gpu=7, age_s=400),
            Run("b2-half", "b2", "n1", milli=500, gpu=7, age_s=50, preemptible=False),
            *runs("a1", 3, "n1", age_s=300),
            Run("a2-0", "a2", "n1", age_s=400),
            Run("b1-0", "b1", "n1", age_s=400),
            Run("b2-0", "b2", "n1", age_s=400, preemptible=False),
            Run("b2-1", "b2", "n1", age_s=400, preemptible=False),
        ],
        pending=[
            *older("a1", 2, start=3),
            *older("a2", 2, start=1),
            *older("b2", 2, start=2),
            Wait("b1-1", "b1"),
        ],
        evicted={"a12"},
        served={"b1-1": "n1"},
    ),
    # 5 GPUs; quotas r 1.5, v 1.5, w 2; r holds 1 and wants 1 more, v holds 2.5 (a half and two
    # whole GPUs), w holds 1.5 and wants no more. Guarantees 1.5 each, the 0.5 left split between
    # r and v: shares r 1.75, v 1.75, w 1.5. r is owed 0.75, less than its pod: before, 1 + 1 >
    # 1.75 made its goal "preempt" and nothing was planned. v's newest whole pod goes: v ends 0.25
    # below (1.5 of 1.75), less owed than r's 0.75. With a wait of 300 s configured, r1 has waited
    # it (rule 9: a queue owed less than its pod reclaims only after that wait - by default never;
    # see PARTLY_OWED).
    Scenario(
        "a queue owed less than a pod takes it from a queue further above its share",
        nodes={"n1": 5},
        queues=[q("r", quota=1.5), q("v", quota=1.5), q("w", quota=2)],
        running=[
            Run("v0", "v", "n1", milli=500, gpu=0, age_s=300),
            Run("w0", "w", "n1", milli=500, gpu=0, age_s=300),
            Run("v1", "v", "n1", age_s=200),
            Run("v2", "v", "n1", age_s=100),
            Run("r0", "r", "n1", age_s=100),
            Run("w1", "w", "n1", age_s=300),
        ],
        pending=[Wait("r1", "r", age_s=300)],
        evicted={"v2"},
        served={"r1": "n1"},
        rules=Rules(partly_owed_wait_s=300),
    ),
]

# Rule 9: a pod of a queue owed less than the pod itself reclaims only once it has waited
# `partly_owed_wait_s` (here 300 s; by default never); until then GPUs that free go to it first
# (deference), so a small fairness gain costs no work. The state of the row above: r owed 0.75
# (1 of 1.75), r1 asks 1.
_PARTLY = FAIRER[-1]
PARTLY_OWED = [
    # The default wait (inf): not even after a day.
    replace(
        _PARTLY,
        name="partly owed, default wait, waited a day: no eviction",
        pending=[Wait("r1", "r", age_s=86_400)],
        evicted=set(),
        served={},
        rules=Rules(),
    ),
    # Waited 0 s: 0.75 owed < 1 asked, nothing is evicted yet. Before: v2 went at once.
    replace(
        _PARTLY,
        name="partly owed, waited 0 s: no eviction yet",
        pending=[Wait("r1", "r")],
        evicted=set(),
        served={},
    ),
    # 299 s < 300 s: still waiting for a GPU to free.
    replace(
        _PARTLY,
        name="partly owed, waited 299 s: no eviction yet",
        pending=[Wait("r1", "r", age_s=299)],
        evicted=set(),
        served={},
    ),
    # 300 s: the wait is over, reclaim as rule 1 allows (v2, as in the row above).
    replace(_PARTLY, name="partly owed, waited 300 s: reclaims", pending=[Wait("r1", "r", age_s=300)]),
    # The wait turned off (--partly-owed-wait-s 0): reclaims at once, as before rule 9.
    replace(
        _PARTLY,
        name="partly owed, no wait configured: reclaims at once",
        pending=[Wait("r1", "r")],
        rules=Rules(partly_owed_wait_s=0),
    ),
    # A queue owed a whole pod does not wait: c owed 1 (0 of 1) asks 1, served at 0 s (FAIRER[0]).
    replace(FAIRER[0], name="owed a whole pod, waited 0 s: reclaims at once"),
    # Fair share over time moves r's share: the wait never opens, whatever it is set to (0 here,
    # and a day waited): 0.75 owed < 1 asked, nothing is evicted. Before: v2 went at once, as in
    # the row "no wait configured" - the storm of history-week without a min runtime (814
    # evictions).
    replace(
        _PARTLY,
        name="partly owed, no wait configured, history moves its share: no eviction",
        pending=[Wait("r1", "r", age_s=86_400)],
        evicted=set(),
        served={},
        rules=Rules(partly_owed_wait_s=0, history_moves=frozenset({"r"})),
    ),
    # History moves other queues' shares only (on in another subtree): r keeps its wait of 0 and
    # reclaims at once, as in the row "no wait configured". Before, any queue's history closed
    # every queue's wait.
    replace(
        _PARTLY,
        name="partly owed, no wait configured, history elsewhere: reclaims at once",
        pending=[Wait("r1", "r")],
        rules=Rules(partly_owed_wait_s=0, history_moves=frozenset({"elsewhere"})),
    ),
    # History on, owed a whole pod (c owed 1, asks 1): reclaims at once, as without history.
    replace(
        FAIRER[0],
        name="owed a whole pod, history on: reclaims at once",
        rules=Rules(partly_owed_wait_s=0, history_moves=frozenset({"c"})),
    ),
]


@pytest.mark.parametrize("case", PARTLY_OWED, ids=lambda c: c.name)
def test_a_queue_owed_less_than_its_pod_waits_before_it_reclaims(case: Scenario) -> None:
    test_reclaim_scenario(case)


# Rule 13: a pod of a queue owed a whole pod reclaims only once it has waited `whole_owed_wait_s`
# (here 20 s); until then GPUs that free go to it first (deference), so a GPU that frees by itself
# within the wait serves it and no work is lost. The state of FAIRER[0]: 4 GPUs, a and b hold 2
# each, c holds 0 of its share 1 and asks 1 - owed a whole pod.
_WHOLE = replace(FAIRER[0], rules=Rules(whole_owed_wait_s=20))
WHOLE_OWED = [
    # Waited 0 s < 20 s: nothing is evicted yet. Before: a1 went at once.
    replace(_WHOLE, name="owed a whole pod, waited 0 s of 20: no eviction yet", evicted=set(), served={}),
    # 19 s < 20 s: still waiting for a GPU to free.
    replace(
        _WHOLE,
        name="owed a whole pod, waited 19 s of 20: no eviction yet",
        pending=[*_WHOLE.pending[:-1], Wait("c0", "c", age_s=19)],
        evicted=set(),
        served={},
    ),
    # 20 s: the wait is over; rule 1 as before (a1: a ends 0.5 owed, less than c's 1).
    replace(
        _WHOLE,
        name="owed a whole pod, waited 20 s of 20: reclaims",
        pending=[*_WHOLE.pending[:-1], Wait("c0", "c", age_s=20)],
    ),
    # Preemption within a queue is not reclaim and does not wait: an urgent pod of a queue within
    # its share evicts its own lower-priority pod at once (a holds 2 of its quota 2, asks 1 more at
    # priority 1000: its newest priority-0 pod a1 goes).
    Scenario(
        "the whole-owed wait does not delay preemption within a queue",
        nodes={"n1": 2},
        queues=[q("a", quota=2)],
        running=runs("a", 2, "n1", age_s=100),
        pending=[Wait("u0", "a", priority=1000)],
        evicted={"a1"},
        served={"u0": "n1"},
        rules=Rules(whole_owed_wait_s=20),
    ),
]


@pytest.mark.parametrize("case", WHOLE_OWED, ids=lambda c: c.name)
def test_a_queue_owed_a_whole_pod_waits_before_it_reclaims(case: Scenario) -> None:
    test_reclaim_scenario(case)


# Rule 16: a pod of a queue owed a whole pod that has waited `ratio_after_s` (here 30 s) with no
# plan within rule 4's ratio takes the smallest plan beyond it. 4 GPUs; a (quota 2) borrows them
# with two 2-GPU pods, b (quota 2) waits with two 1-GPU pods: shares 2 / 2, b owed 2. Rule 1
# allows a1 (a ends at 2 - 2 = 0 surplus, above b's -2), but 2 GPUs evicted for 1 needed is
# refused by rule 4 (ratio 2, a victim bigger than the pod): b waits for a GPU to free.
_BIG_ONLY = Scenario(
    "owed a whole pod, only bigger victims, no patience: no eviction",
    nodes={"n1": 4},
    queues=[q("a", quota=2), q("b", quota=2)],
    running=[Run("a0", "a", "n1", gpus=2, age_s=200), Run("a1", "a", "n1", gpus=2, age_s=100)],
    pending=[Wait("b0", "b", age_s=30), Wait("b1", "b", age_s=29)],
    evicted=set(),
    served={},
)
_PATIENT = replace(_BIG_ONLY, rules=Rules(ratio_after_s=30))
BEYOND_RATIO = [
    _BIG_ONLY,
    # Waited 29 s < 30 s: still waiting for a GPU to free.
    replace(
        _PATIENT,
        name="owed a whole pod, waited 29 s of 30: no eviction yet",
        pending=[Wait("b0", "b", age_s=29), Wait("b1", "b", age_s=28)],
    ),
    # 30 s: the newest of a's 2-GPU pods goes for b0 (2 GPUs for 1); b1, below the 30 s, takes the
    # other GPU freed, with no plan of its own.
    replace(
        _PATIENT,
        name="owed a whole pod, waited 30 s of 30: the smallest bigger victim goes",
        evicted={"a1"},
        served={"b0": "n1"},
    ),
    # A plan within the ratio comes first, patience or not: a's 1-GPU pod on n2 goes, not a 2-GPU one.
    replace(
        _PATIENT,
        name="past the patience, a victim of the pod's size still comes first",
        nodes={"n1": 4, "n2": 1},
        running=[*_BIG_ONLY.running, Run("a2", "a", "n2", age_s=300)],
        evicted={"a2"},
        served={"b0": "n2"},
    ),
    # Not for fractions: b waits with four halves (2 GPUs, owed 2), past the patience; a 2-GPU
    # victim for half a GPU is beyond rule 4's exception (one victim of at most 1 GPU): nothing.
    replace(
        _PATIENT,
        name="past the patience, a fraction still takes no bigger victim",
        pending=[Wait(f"b{i}", "b", milli=500, age_s=30) for i in range(4)],
    ),
]


@pytest.mark.parametrize("case", BEYOND_RATIO, ids=lambda c: c.name)
def test_a_queue_owed_a_whole_pod_takes_a_bigger_victim_after_its_patience(case: Scenario) -> None:
    test_reclaim_scenario(case)


BACKLOGS = [
    # 8 GPUs; a (quota 4) holds 8 and has `backlog` older pods waiting; b (quota 4) waits for 1:
    # shares b 1, a 7. b is the most owed queue: planned first whatever a's backlog. Before, the 64
    # oldest waiting pods were all a's: b was not looked at.
    Scenario(
        f"a borrower's backlog of {backlog} older pods hides no starved queue",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=runs("a", 8, "n1", age_s=200_000),
        pending=[*older("a", backlog, start=8), Wait("b0", "b")],
        evicted={"a7"},
        served={"b0": "n1"},
    )
    for backlog in (64, 2000)
] + [
    # 2 x 8 GPUs; a (quota 8) holds 16 and has 60 older pods waiting; b (quota 8) waits with a gang
    # of 8 (shares 8 / 8). The gang is planned whole: a's 8 newest pods (all on n2) go, one per
    # member. Before, 60 + 4 members filled the window of 64: 4 members were planned, which cannot
    # start without the other 4.
    Scenario(
        "a gang behind a borrower's backlog is planned whole",
        nodes={"n1": 8, "n2": 8},
        queues=[q("a", quota=8), q("b", quota=8)],
        running=[
            replace(r, node="n1" if i < 8 else "n2") for i, r in enumerate(runs("a", 16, "n1", 200_000))
        ],
        pending=[*older("a", 60, start=16)]
        + [Wait(f"g{i}", "b", age_s=8 - i, workload="Job/ns/gang") for i in range(8)],
        evicted={f"a{i}" for i in range(8, 16)},
        served={f"g{i}": "n2" for i in range(8)},
    ),
    # 8 GPUs; a (quota 4) holds 5, b (quota 4) holds 3 and waits with 16 older 2-GPU pods and a
    # 1-GPU pod: shares 4 / 4. b is owed 1: less than a 2-GPU pod (rule 9: those wait for
    # capacity), a whole 1-GPU pod - a's newest goes (a ends at its share, 0 owed < 1). Before,
    # the 16 2-GPU pods filled b's 16 places in the cycle's order and the 1-GPU pod was never
    # tried: b stayed owed a pod until capacity freed.
    Scenario(
        "a queue owed a GPU behind 16 of its own 2-GPU pods gets its 1-GPU pod planned",
        nodes={"n1": 8},
        queues=[q("a", quota=4), q("b", quota=4)],
        running=runs("a", 5, "n1", age_s=200_000) + [Run(f"b-run{i}", "b", "n1") for i in range(3)],
        pending=[Wait(f"b-pair{i}", "b", gpus=2, age_s=100_000.0 - i) for i in range(16)]
        + [Wait("b-one", "b")],
        evicted={"a4"},
        served={"b-one": "n1"},
    ),
]


@pytest.mark.parametrize("case", FAIRER + BACKLOGS, ids=lambda c: c.name)
def test_reclaim_serves_every_starved_queue(case: Scenario) -> None:
    test_reclaim_scenario(case)


@pytest.mark.parametrize("case", FAIRER, ids=lambda c: c.name)
def test_the_next_cycle_undoes_nothing(case: Scenario) -> None:
    # The plan carried out, its victims waiting again: every queue's surplus in the next state is
    # where the rule leaves it, so no reclaim is fairer, the reverse one least of all.
    snapshot, pending = build(case)
    first = plan(snapshot, pending, NOW, case.rules)
    assert first
    snapshot, pending = build(after(case, first))
    assert plan(snapshot, pending, NOW, case.rules) == []


@pytest.mark.parametrize("case", [c for c in SCENARIOS if c.served], ids=lambda c: c.name)
def test_no_pod_served_is_a_victim_of_the_next_cycle(case: Scenario) -> None:
    # Where a cycle may rightly plan more (its eviction cap was reached), none of it undoes this one.
    snapshot, pending = build(case)
    first = plan(snapshot, pending, NOW, case.rules)
    snapshot, pending = build(after(case, first))
    served = {p.pod.key for p in first}
    assert served
    assert not served & {e.pod.key for p in plan(snapshot, pending, NOW, case.rules) for e in p.evictions}


@pytest.mark.parametrize(
    ("per_queue", "limit", "order"),
    [
        # b is below its fair share (3 of 8 GPUs, holding 0), a above (holds 8 of 5): b first. In b:
        # b2 (priority 5), then by age the gang g (g0, g1: one unit), b0, b1. a's pods are older
        # than all of b's, and come after them.
        (16, 1024, ["b2", "g0", "g1", "b0", "b1", "a0", "a1", "a2", "a3", "a4"]),
        (2, 1024, ["b2", "g0", "g1", "a0", "a1"]),  # 2 units per queue: the gang is one
        (1, 2, ["b2", "a0"]),
        (16, 2, ["b2", "g0", "g1"]),  # 2 units in all: the gang whole, never split
        (1, 1, ["b2"]),
    ],
)
def test_serving_order_takes_each_queues_head_most_owed_queue_first(
    per_queue: int, limit: int, order: list[str]
) -> None:
    usage = {"a": QueueUsage({"gpu": 8.0}, {"gpu": 5.0}), "b": QueueUsage({}, {"gpu": 5.0})}
    fairness = FairnessSnapshot.build([q("a", quota=4), q("b", quota=4)], usage, {"gpu": 8.0})
    assert fairness.order()[0] == "b"

    def pod(key: str, queue: str, created: float, priority: int = 0, workload: str = "") -> PendingPod:
        return PendingPod(key, queue, GpuDemand(1), {"gpu": 1.0}, priority, created, workload=workload)

    pending = [
        *(pod(f"a{i}", "a", float(i)) for i in range(5)),
        pod("b1", "b", 11.0),
        pod("g1", "b", 6.0, workload="Job/ns/g"),
        pod("b0", "b", 10.0),
        pod("g0", "b", 5.0, workload="Job/ns/g"),
        pod("b2", "b", 20.0, priority=5),
    ]
    assert [p.key for p in serving_order(fairness, pending, per_queue, limit)] == order


def surpluses(held: dict[str, float], shares: dict[str, float], parents: dict[str, str]) -> list[float]:
    """Every queue's surplus (its subtree's GPUs minus its fair share), sorted: the potential
    every reclaim rule 1 allows raises, lexicographically (the module docstring's argument)."""
    subtree = dict.fromkeys(shares, 0.0)
    for leaf, gpus in held.items():
        queue: str | None = leaf
        while queue is not None:
            subtree[queue] += gpus
            queue = parents.get(queue)
    return sorted(subtree[name] - share for name, share in shares.items())


@pytest.mark.parametrize("seed", range(20))
def test_no_sequence_of_reclaims_comes_back_to_where_it_started(seed: int) -> None:
    # Two departments of three leaves, 24 GPUs, shares dept 12 and leaves 4, with random holdings in
    # halves. Moves of half, one or two GPUs between random leaves, each made only when rule 1
    # allows it, raise the sorted surpluses of all queues every time - departments and leaves
    # alike - so no state comes back, whatever the order of the moves.
    rng = random.Random(seed)
    parents = {f"{d}{i}": f"dept-{d}" for d in "ab" for i in range(3)}
    shares = {"dept-a": 12.0, "dept-b": 12.0} | dict.fromkeys(parents, 4.0)
    held = dict.fromkeys(parents, 0.0)
    for _ in range(48):
        held[rng.choice(sorted(parents))] += 0.5
    seen = {tuple(sorted(held.items()))}
    moves = 0
    for _ in range(400):
        reclaimer, victim = rng.sample(sorted(parents), 2)
        gpus = rng.choice([0.5, 1.0, 2.0])
        if held[victim] < gpus:
            continue
        fairness = standing(held | dict.fromkeys(shares.keys() - held.keys(), 0.0), shares, parents)
        if reclaim_refusal(fairness, reclaimer, {"gpu": gpus}, victim, {"gpu": gpus}):
            continue
        potential = surpluses(held, shares, parents)
        held = held | {reclaimer: held[reclaimer] + gpus, victim: held[victim] - gpus}
        assert surpluses(held, shares, parents) > potential, (reclaimer, victim, gpus)
        state = tuple(sorted(held.items()))
        assert state not in seen
        seen.add(state)
        moves += 1
    assert moves > 0


@pytest.mark.parametrize(
    ("queue", "held", "gpus", "past"),
    [
        # dept (quota 4) has leaves x (quota 2) and y (quota 2); y holds 1.
        ("x", 1.0, 1.0, False),  # x at 2 of 2, dept at 3 of 4
        ("x", 2.0, 1.0, True),  # x at 3 of 2: past its own quota
        ("x", 1.0, 0.5, False),  # a half: x at 1.5 of 2
        ("x", 1.5, 0.5, False),  # x exactly at its quota of 2 is not past it
        ("y", 1.0, 1.0, False),  # y at 2 of 2, dept at 1 + 2 = 3 of 4
        ("z", 0.0, 1.0, True),  # z: no GPU quota, so 0; any GPU is past it
    ],
)
def test_a_pod_taking_its_queue_past_its_quota(queue: str, held: float, gpus: float, past: bool) -> None:
    specs = [
        QueueSpec("dept", quota={"gpu": 4}),
        QueueSpec("x", parent="dept", quota={"gpu": 2}),
        QueueSpec("y", parent="dept", quota={"gpu": 2}),
        QueueSpec("z"),
    ]
    usage = {
        "x": QueueUsage({"gpu": held if queue == "x" else 1.0}, {}),
        "y": QueueUsage({"gpu": 1.0}, {}),
        "z": QueueUsage({"gpu": held if queue == "z" else 0.0}, {}),
    }
    fairness = FairnessSnapshot(specs, usage, {"gpu": 8}, {})
    assert takes_past_quota(fairness, queue, {"gpu": gpus, "gpu/H100": gpus}) is past


def test_a_leaf_within_its_quota_in_a_department_past_its_own() -> None:
    # dept quota 2 over leaves of quota 2 each (the department guarantees less than its
    # leaves): x at 0 + 1 of 2 is within its quota, but dept goes to 2 + 1 = 3 of 2.
    specs = [
        QueueSpec("dept", quota={"gpu": 2}),
        QueueSpec("x", parent="dept", quota={"gpu": 2}),
        QueueSpec("y", parent="dept", quota={"gpu": 2}),
    ]
    usage = {"x": QueueUsage({}, {}), "y": QueueUsage({"gpu": 2.0}, {})}
    assert takes_past_quota(FairnessSnapshot(specs, usage, {"gpu": 4}, {}), "x", {"gpu": 1.0})
