"""The planners' shortcuts give the answers of the long way: the eviction bound that spares a node
search (`fewest_evictions`), the possible victims' nodes kept per snapshot (`victim_nodes`), the
fork's fairness tree that shares the queues' structure (`FairnessSnapshot.with_usage`), and
consolidation's movers and the sets of them that make room, kept for a cycle (`_Movers`), and
the first fitting node looked for from where a demand fit last (`Search.fits_somewhere`).

Worked examples first, then differential tests on random clusters: plans with the shortcut equal
plans without it, budget included."""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from itertools import combinations
from typing import Any

import pytest

from contract.names import GPU_MILLI
from extender.policy import reclaim
from extender.policy.consolidation import (
    ConsolidationRules,
    MovePlan,
    _Group,
    _group_rank,
    _Movers,
    is_mover,
    plan_moves,
)
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix, fits
from extender.policy.reclaim import Budget, PendingPod, Plan, Rules, Search, fewest_evictions, plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod, mover_order
from tests.unit.extender.test_snapshot import counted

NOW = 10_000.0
Making = tuple[str, GpuDemand, list[RunningPod]]
QUEUES = [
    QueueSpec("root"),
    QueueSpec("a", parent="root", quota={"gpu": 4.0}),
    QueueSpec("b", parent="root", quota={"gpu": 8.0}),
    QueueSpec("c", quota={"gpu": 4.0}),
]


def snapshot_of(
    nodes: dict[str, tuple[int, ...]], pods: list[RunningPod], waiting: str = "abc"
) -> ClusterSnapshot:
    """Nodes with these free shares per GPU, these pods running, usage counted from them; the
    `waiting` queues wait for a GPU."""
    allocated: dict[str, float] = {}
    for pod in pods:
        allocated[pod.queue] = allocated.get(pod.queue, 0.0) + pod.resources.get("gpu", 0.0)
    usage = {
        s.name: QueueUsage({"gpu": allocated.get(s.name, 0.0)}, {"gpu": float(s.name in waiting)})
        for s in QUEUES
    }
    capacity = {"gpu": float(sum(len(free) for free in nodes.values()))}
    return ClusterSnapshot(
        {name: NodeGpus(name, "h100", free) for name, free in nodes.items()},
        {pod.key: pod for pod in pods},
        FairnessSnapshot.build(QUEUES, usage, capacity),
        WorkloadMix(demands=()),
    )


def running(key: str, node: str, *gpus: tuple[int, int], queue: str = "a", **extra: object) -> RunningPod:
    amount = sum(milli for _, milli in gpus) / GPU_MILLI
    return RunningPod(key, queue, node, gpus, {"gpu": amount}, started=NOW - 3600, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("free", "pods", "demand", "bound"),
    [
        # Fits already: nothing to evict.
        ((1000, 0), [((1, 1000),)], GpuDemand(1, 1000), 0),
        # 2 GPUs wanted, both held whole by one pod each: 1 + 1 = 2 pods.
        ((0, 0), [((0, 1000),), ((1, 1000),)], GpuDemand(2, 1000), 2),
        # 2 GPUs wanted, GPU 0 by halves (2 pods), GPU 1 whole (1): 2 + 1 = 3 pods.
        ((0, 0), [((0, 500),), ((0, 500),), ((1, 1000),)], GpuDemand(2, 1000), 3),
        # 1 GPU wanted: the cheaper GPU, 1 pod (the whole one).
        ((0, 0), [((0, 500),), ((0, 500),), ((1, 1000),)], GpuDemand(1, 1000), 1),
        # Half a GPU wanted on GPU 0 held by 3 quarters and a quarter free: the 250 short is
        # one quarter's eviction; GPU 1 (whole) also costs 1: bound 1.
        ((250, 0), [((0, 250),), ((0, 250),), ((0, 250),), ((1, 1000),)], GpuDemand(1, 500), 1),
        # 2 GPUs wanted, one pod holds both: costs 1 + 1 = 2, but one pod counts on 2 GPUs:
        # ceil(2 / 2) = 1.
        ((0, 0), [((0, 1000), (1, 1000))], GpuDemand(2, 1000), 1),
        # A GPU nobody holds that is not free (a partition, a classic GPU): no eviction frees it.
        ((0, 1000), [((1, 0),)], GpuDemand(2, 1000), math.inf),
    ],
)
def test_fewest_evictions(
    free: tuple[int, ...], pods: list[tuple[tuple[int, int], ...]], demand: GpuDemand, bound: float
) -> None:
    snapshot = snapshot_of({"n": free}, [running(f"p{i}", "n", *gpus) for i, gpus in enumerate(pods)])
    assert fewest_evictions(snapshot, "n", demand) == bound


def random_case(rng: random.Random) -> tuple[ClusterSnapshot, list[PendingPod], Rules]:
    """Up to 6 nodes of 4 or 8 GPUs filled by whole pods (1-2 GPUs) and halves of queues a, b, c
    (most of them movable); pending pods of every queue asking for 1-8 GPUs or a half; a small
    random budget."""
    nodes: dict[str, tuple[int, ...]] = {}
    pods: list[RunningPod] = []
    for n in range(rng.randint(1, 6)):
        name = f"n{n}"
        free = [GPU_MILLI] * rng.choice((4, 8))
        for index in range(len(free)):
            roll = rng.random()
            if roll < 0.08:
                continue
            queue = rng.choice("abc")
            if roll < 0.45:
                for half in range(rng.choice((1, 2))):  # one half alone: fragments to consolidate
                    pods.append(
                        running(
                            f"{name}-{index}-{half}",
                            name,
                            (index, 500),
                            queue=queue,
                            movable=rng.random() < 0.8,
                        )
                    )
                free[index] = 1000 - 500 * (half + 1)
            elif roll < 0.7 and index + 1 < len(free) and free[index + 1] == GPU_MILLI:
                pods.append(
                    running(
                        f"{name}-{index}", name, (index, 1000), (index + 1, 1000), queue=queue, movable=True
                    )
                )
                free[index] = free[index + 1] = 0
            elif free[index]:
                pods.append(
                    running(
                        f"{name}-{index}", name, (index, 1000), queue=queue, preemptible=rng.random() < 0.9
                    )
                )
                free[index] = 0
        nodes[name] = tuple(free)
    pending = []
    for i in range(rng.randint(1, 8)):
        count = rng.choice((1, 1, 2, 4, 8))
        milli = rng.choice((500, GPU_MILLI)) if count == 1 else GPU_MILLI
        pending.append(
            PendingPod(
                f"w{i}",
                rng.choice("abc"),
                GpuDemand(count, milli),
                {"gpu": count * milli / GPU_MILLI},
                rng.randint(0, 2),
            )
        )
    rules = Rules(
        max_evictions=rng.randint(1, 12), max_trials=rng.randint(1, 20), node_trials=rng.randint(1, 6)
    )
    if rng.random() < 0.5:  # one queue waits, for one GPU or a half: what consolidation serves
        queue = rng.choice("abc")
        pending = [
            PendingPod(p.key, queue, GpuDemand(1, p.demand.milli), {"gpu": p.demand.milli / GPU_MILLI})
            for p in pending
        ]
        return snapshot_of(nodes, pods, queue), pending, rules
    return snapshot_of(nodes, pods), pending, rules


def outcome(snapshot: ClusterSnapshot, pending: list[PendingPod], rules: Rules) -> tuple[object, ...]:
    work = Budget(rules.max_trials)
    plans = plan(snapshot, pending, NOW, rules, work)
    return (plans, work.trials, work.cut_off, work.refused)


@pytest.mark.parametrize("seed", range(300))
def test_the_eviction_bound_changes_no_plan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Plans (victims, messages, nodes) and the budget's accounts with the bound, then without it
    # (a bound of 0 searches every node); the bound never exceeds the evictions of a plan found.
    snapshot, pending, rules = random_case(random.Random(seed))
    shortcut = outcome(snapshot, pending, rules)
    with monkeypatch.context() as patched:
        patched.setattr(reclaim, "fewest_evictions", lambda *_: 0)
        assert outcome(snapshot, pending, rules) == shortcut
    for done in shortcut[0]:  # type: ignore[attr-defined]
        on_node = [e for e in done.evictions if e.pod.node == done.node]
        assert fewest_evictions(snapshot, done.node, done.pod.demand) <= len(on_node)


@pytest.mark.parametrize("seed", range(100))
def test_victim_nodes_of_forks_equal_a_pass_over_their_pods(seed: int) -> None:
    # Random evictions, placements and spared pods on forks of forks; after each, the nodes of
    # possible victims per queue equal those of a pass over the fork's running pods.
    rng = random.Random(seed)
    snapshot, _, _ = random_case(rng)
    assert snapshot.victim_nodes() == counted(snapshot)
    fork = snapshot
    for _ in range(12):
        if rng.random() < 0.3:
            fork = fork.fork()
        keys = sorted(fork.running)
        roll = rng.random()
        if keys and roll < 0.4:
            fork.evict(rng.choice(keys))
        elif keys and roll < 0.6:
            fork.spare([rng.choice(keys)])
        else:
            node = rng.choice(sorted(fork.nodes))
            arriving = running(f"new{rng.random()}", "", queue=rng.choice("abc"))
            fork.place(arriving, GpuDemand(1, rng.choice((500, GPU_MILLI))), node)
        assert fork.victim_nodes() == counted(fork)
    assert snapshot.victim_nodes() == counted(snapshot)


def test_a_forks_fairness_tree_shares_the_queues_and_sums_its_own_usage() -> None:
    # Queue a holds 2 GPUs; a fork evicts one: a's subtree and root's fall to 1, the shares stay.
    snapshot = snapshot_of({"n": (0, 0)}, [running("p0", "n", (0, 1000)), running("p1", "n", (1, 1000))])
    fork = snapshot.fork()
    fork.evict("p1")
    tree, base = fork.fairness.tree, snapshot.fairness.tree
    assert tree.children is base.children and tree.broken is base.broken
    assert (tree.subtree("a", "allocated", "gpu"), tree.subtree("root", "allocated", "gpu")) == (1.0, 1.0)
    assert base.subtree("root", "allocated", "gpu") == 2.0
    assert fork.fairness.fair_shares == snapshot.fairness.fair_shares


def moves_case(
    seed: int,
) -> tuple[ClusterSnapshot, list[PendingPod], ConsolidationRules, list[Plan], set[str], set[str]]:
    """A random cluster, its waiting pods, consolidation rules, and the rest of `plan_moves`'
    arguments: reclaim's plans of the cycle, random nodes avoided and pods pinned."""
    rng = random.Random(seed)
    snapshot, pending, rules = random_case(rng)
    reclaimed = plan(snapshot, pending, NOW, rules)
    moves = ConsolidationRules(
        min_runtime_s=rng.choice((0.0, 3600.0)),
        max_moves_per_pod=rng.randint(1, 3),
        max_moves_per_cycle=rng.randint(1, 6),
        max_candidates=rng.randint(2, 8),
        max_trials=rng.randint(1, 30),
    )
    avoid = {n for n in snapshot.nodes if rng.random() < 0.2}
    pinned = {k for k in snapshot.running if rng.random() < 0.1}
    return snapshot, pending, moves, reclaimed, avoid, pinned


def planned_moves(seed: int) -> tuple[list[MovePlan], int, int, int]:
    snapshot, pending, moves, reclaimed, avoid, pinned = moves_case(seed)
    work = Budget(moves.max_trials)
    done = plan_moves(snapshot, pending, NOW, moves, reclaimed, avoid, pinned, work)
    return done, work.trials, work.cut_off, work.refused


def test_the_random_clusters_call_for_moves() -> None:
    assert sum(len(planned_moves(seed)[0]) for seed in range(300)) > 50


@pytest.mark.parametrize("seed", range(300))
def test_the_movers_kept_for_a_cycle_change_no_move_plan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Move plans with the movers and the nodes making room kept from one waiting pod to the next,
    # then found again for every waiting pod the long way (a pass over every running pod, every
    # set of every node tried): the same plans and budget.
    def making_room(self: _Movers, fork: ClusterSnapshot, waiting: PendingPod) -> list[Making]:
        now, rules, avoid, pinned = chosen[id(self)]
        movers: dict[str, list[RunningPod]] = {}
        for pod in fork.running.values():
            if pod.node not in avoid and pod.key not in pinned and is_mover(pod, now, rules):
                movers.setdefault(pod.node, []).append(pod)
        nodes = []
        for node in sorted(movers):
            demand = waiting.demand_on(fork.gpu_memory.get(node, 0))
            candidates = sorted(movers[node], key=mover_order)[: rules.max_candidates]
            if fork.fits_without(node, demand, candidates):
                nodes.append((node, demand, candidates))
        return nodes

    def groups(
        self: _Movers, fork: ClusterSnapshot, _: PendingPod, nodes: list[Making], count: int
    ) -> list[_Group]:
        return sorted(
            (_group_rank(group, node), node, demand, group)
            for node, demand, candidates in nodes
            for group in combinations(candidates, count)
            if fork.fits_without(node, demand, group)
        )

    chosen: dict[int, tuple[float, ConsolidationRules, Collection[str], Collection[str]]] = {}
    kept = _Movers.__init__

    def init(self: _Movers, *args: Any) -> None:
        chosen[id(self)] = args[1:5]
        kept(self, *args)

    monkeypatch.setattr(_Movers, "__init__", init)
    kept_for_the_cycle = planned_moves(seed)
    monkeypatch.setattr(_Movers, "making_room", making_room)
    monkeypatch.setattr(_Movers, "groups", groups)
    assert planned_moves(seed) == kept_for_the_cycle


@pytest.mark.parametrize("seed", range(200))
def test_a_fitting_node_looked_for_from_where_the_demand_fit_last_is_the_first_by_name(seed: int) -> None:
    # Pods placed where they fit (nodes lose room) and pods evicted (their nodes, touched, gain
    # room), in random turns; each pod's node is the first by name where it fits, as a look at
    # every node in order finds.
    rng = random.Random(seed)
    snapshot, _, _ = random_case(rng)
    fork = snapshot.fork()
    search = Search(fork)
    for step in range(40):
        if rng.random() < 0.25 and fork.running:
            key = rng.choice(sorted(fork.running))
            search.touched.append(fork.evict(key).node)
            continue
        count = rng.choice((1, 1, 2))
        milli = rng.choice((250, 500, GPU_MILLI)) if count == 1 else GPU_MILLI
        waiting = PendingPod(f"new{step}", "a", GpuDemand(count, milli), {"gpu": count * milli / GPU_MILLI})
        first = next((name for name in sorted(fork.nodes) if fits(fork.nodes[name], waiting.demand)), None)
        assert search.fits_somewhere(fork, waiting) == first
        if first is not None:
            fork.place(running(waiting.key, ""), waiting.demand, first)
