"""Reclaim and preemption plans as declarative scenarios: nodes, queues, running and pending pods
in; evictions and placements out. The arithmetic of each case is in its comment."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from contract.names import GPU_MILLI
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import Budget, PendingPod, Rules, plan, reclaim_refusal
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
                wait.key, wait.queue, GpuDemand(wait.gpus, wait.milli, models), {"gpu": amount}, wait.priority
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
    # b holds 2 = its fair share 2 (a wants 6 of 8 with quota 6): taking one of b's GPUs for a is
    # refused, the message naming b and the arithmetic.
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
    assert refusal == "queue 'b' would fall below its fair share (gpu 2 - 1 < 2)"


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
    # A pod that asks for the model is checked on it too.
    refusal = reclaim_refusal(fairness, "b", {"gpu": 1.0, model: 1.0}, "a", {"gpu": 1.0, model: 1.0})
    assert refusal.startswith(f"queue 'b' would go above its fair share ({model}")


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
