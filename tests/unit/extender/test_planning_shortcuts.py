"""The planners' shortcuts give the answers of the long way: the eviction bound that spares a node
search (`fewest_evictions`), the possible victims' nodes kept per snapshot (`victim_nodes`), the
fork's fairness tree that shares the queues' structure (`FairnessSnapshot.with_usage`),
consolidation's movers and the sets of them that make room, kept for a cycle (`_Movers`) and
from one cycle to the next (`NodeRooms`), the movers per node kept by the live picture
(`ClusterSnapshot.movers`, `movers_on`), and the first fitting node looked for from where a
demand fit last (`Search.fits_somewhere`).

Worked examples first, then differential tests on random clusters: plans with the shortcut equal
plans without it, budget included; what is kept from snapshot to snapshot equals what a pass
over every pod (or a fresh picture) finds, after random pod and node events."""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable
from dataclasses import replace
from itertools import combinations
from typing import Any

import pytest

from contract.names import DRIVER_NAME, GPU_MILLI, MOVABLE_ANNOTATION
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy import reclaim
from extender.policy.consolidation import (
    ConsolidationRules,
    Making,
    MovePlan,
    NodeRooms,
    _Group,
    _group_rank,
    _Movers,
    _Room,
    is_mover,
    plan_moves,
)
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix, fits
from extender.policy.reclaim import Budget, FitIndex, PendingPod, Plan, Rules, Search, fewest_evictions, plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod, could_move, keep_movers, mover_order
from tests import extender_objects as objects
from tests.unit.extender.test_snapshot import counted

NOW = 10_000.0
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
    return snapshot_from({name: NodeGpus(name, "h100", free) for name, free in nodes.items()}, pods, waiting)


def snapshot_from(
    nodes: dict[str, NodeGpus],
    pods: Iterable[RunningPod],
    waiting: str = "abc",
    movers: dict[str, tuple[RunningPod, ...]] | None = None,
    gpu_memory: dict[str, int] | None = None,
) -> ClusterSnapshot:
    """`snapshot_of` with the nodes as they are (and the movers per node when kept, the memory of
    the nodes' GPUs when known)."""
    allocated: dict[str, float] = {}
    for pod in pods:
        allocated[pod.queue] = allocated.get(pod.queue, 0.0) + pod.resources.get("gpu", 0.0)
    usage = {
        s.name: QueueUsage({"gpu": allocated.get(s.name, 0.0)}, {"gpu": float(s.name in waiting)})
        for s in QUEUES
    }
    capacity = {"gpu": float(sum(len(node.free_milli) for node in nodes.values()))}
    return ClusterSnapshot(
        nodes,
        {pod.key: pod for pod in pods},
        FairnessSnapshot.build(QUEUES, usage, capacity),
        WorkloadMix(demands=()),
        gpu_memory,
        movers=movers,
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


def assert_kept_as_a_pass(snapshot: ClusterSnapshot, fork: ClusterSnapshot) -> None:
    """The fork's possible victims' nodes and movers per node as a pass over its running pods
    finds them; the nodes it did not change (`changed_nodes`) as in `snapshot`, with its pods."""
    assert fork.victim_nodes() == counted(fork)
    by_pass = movers_by_pass(fork)
    assert {node: fork.movers_on(node) for node in fork.nodes if fork.movers_on(node)} == by_pass
    changed = fork.changed_nodes()
    for node in set(snapshot.nodes) - changed:
        assert fork.nodes[node] is snapshot.nodes[node]
        assert sorted(map(str, fork.pods_on(node))) == sorted(map(str, snapshot.pods_on(node)))


@pytest.mark.parametrize("seed", range(100))
def test_victim_nodes_and_movers_of_forks_equal_a_pass_over_their_pods(seed: int) -> None:
    # Random evictions, placements and spared pods on forks of forks; after each, the nodes of
    # possible victims per queue and the movers per node equal those of a pass over the fork's
    # running pods, and the nodes it did not change are those of the snapshot.
    rng = random.Random(seed)
    snapshot, _, _ = random_case(rng)
    assert_kept_as_a_pass(snapshot, snapshot)
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
            arriving = running(f"new{rng.random()}", "", queue=rng.choice("abc"), movable=rng.random() < 0.5)
            fork.place(arriving, GpuDemand(1, rng.choice((500, GPU_MILLI))), node)
        assert_kept_as_a_pass(snapshot, fork)
    assert_kept_as_a_pass(snapshot, snapshot)


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


def random_moves_rules(rng: random.Random, min_runtime_s: float) -> ConsolidationRules:
    """Consolidation rules with small random bounds, and no minimum runtime or `min_runtime_s`."""
    return ConsolidationRules(
        min_runtime_s=rng.choice((0.0, min_runtime_s)),
        max_moves_per_pod=rng.randint(1, 3),
        max_moves_per_cycle=rng.randint(1, 6),
        max_candidates=rng.randint(2, 8),
        max_trials=rng.randint(1, 30),
    )


def moves_case(
    seed: int,
) -> tuple[ClusterSnapshot, list[PendingPod], ConsolidationRules, list[Plan], set[str], set[str]]:
    """A random cluster, its waiting pods, consolidation rules, and the rest of `plan_moves`'
    arguments: reclaim's plans of the cycle, random nodes avoided and pods pinned."""
    rng = random.Random(seed)
    snapshot, pending, rules = random_case(rng)
    reclaimed = plan(snapshot, pending, NOW, rules)
    moves = random_moves_rules(rng, 3600.0)
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


def the_long_way(monkeypatch: pytest.MonkeyPatch, compare: bool = False) -> None:
    """From now on, consolidation finds the movers and the nodes making room for every waiting
    pod the long way: a pass over every running pod, every set of every node tried. With
    `compare`, the kept way still answers, and each of its answers is checked against the long
    way's (a node that does not make room listed, for one, changes no plan)."""
    kept_making_room, kept_groups = _Movers.making_room, _Movers.groups

    def making_room(self: _Movers, fork: ClusterSnapshot, waiting: PendingPod) -> list[Making]:
        now, rules, avoid, pinned = chosen[id(self)]
        movers: dict[str, list[RunningPod]] = {}
        for pod in fork.running.values():
            if pod.node not in avoid and pod.key not in pinned and is_mover(pod, now, rules):
                movers.setdefault(pod.node, []).append(pod)
        nodes: list[Making] = []
        for node in sorted(movers):
            demand = waiting.demand_on(fork.gpu_memory.get(node, 0))
            candidates = sorted(movers[node], key=mover_order)[: rules.max_candidates]
            if fork.fits_without(node, demand, candidates):
                nodes.append((node, demand, candidates))
        if not compare:
            return nodes
        answer = kept_making_room(self, fork, waiting)
        assert [(n, d, tuple(c)) for n, d, c in answer] == [(n, d, tuple(c)) for n, d, c in nodes]
        return answer

    def groups(
        self: _Movers, fork: ClusterSnapshot, waiting: PendingPod, nodes: list[Making], count: int
    ) -> list[_Group]:
        found = sorted(
            (_group_rank(group, node), node, demand, group)
            for node, demand, candidates in nodes
            for group in combinations(candidates, count)
            if fork.fits_without(node, demand, group)
        )
        if not compare:
            return found
        answer = kept_groups(self, fork, waiting, nodes, count)
        assert answer == found
        return answer

    chosen: dict[int, tuple[float, ConsolidationRules, Collection[str], Collection[str]]] = {}
    kept = _Movers.__init__

    def init(self: _Movers, *args: Any) -> None:
        chosen[id(self)] = args[1:5]
        kept(self, *args)

    monkeypatch.setattr(_Movers, "__init__", init)
    monkeypatch.setattr(_Movers, "making_room", making_room)
    monkeypatch.setattr(_Movers, "groups", groups)


@pytest.mark.parametrize("seed", range(300))
def test_the_movers_kept_for_a_cycle_change_no_move_plan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Move plans with the movers and the nodes making room kept from one waiting pod to the next,
    # then found again for every waiting pod the long way: the same plans and budget.
    with monkeypatch.context() as patched:
        the_long_way(patched, compare=True)  # each answer of the kept way as the long way's
        kept_for_the_cycle = planned_moves(seed)
    the_long_way(monkeypatch)
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


def formed_rooms(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes consolidation forms a `_Room` for from now on, in turn."""
    formed: list[str] = []
    form = _Room.__init__

    def counted_init(self: _Room, supply: NodeGpus, *args: Any) -> None:
        formed.append(supply.name)
        form(self, supply, *args)

    monkeypatch.setattr(_Room, "__init__", counted_init)
    return formed


def test_rooms_are_formed_again_only_on_nodes_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nodes n0, n1, n2 of 2 GPUs: two movable halves on GPU 0, GPU 1 held whole by a pod that may
    # not move. Movers must have run 600 s; h2b started 100 s before the first cycle.
    rules = ConsolidationRules(min_runtime_s=600.0)
    pods = [running(f"h{n}{side}", f"n{n}", (0, 500), movable=True) for n in range(3) for side in "ab"]
    pods = [replace(p, started=NOW - 100) if p.key == "h2b" else p for p in pods]
    pods += [running(f"w{n}", f"n{n}", (1, 1000)) for n in range(3)]
    nodes = {f"n{n}": NodeGpus(f"n{n}", "h100", (0, 0)) for n in range(3)}
    movers = dict(snapshot_from(nodes, pods).movers())
    rooms, formed = NodeRooms(), formed_rooms(monkeypatch)

    def cycle(at: float, snapshot: ClusterSnapshot) -> list[str]:
        formed.clear()
        plan_moves(snapshot, [], at, rules, rooms=rooms)
        return sorted(formed)

    # First cycle: every node with movers gets a room. n2's candidates: h2a only (h2b ran 100 s).
    assert cycle(NOW, snapshot_from(nodes, pods, movers=dict(movers))) == ["n0", "n1", "n2"]
    assert [pod.key for pod in rooms.room("n2").candidates] == ["h2a"]  # type: ignore[union-attr]
    # A minute later the picture hands out the same nodes and movers: no room is formed again.
    assert cycle(NOW + 60, snapshot_from(nodes, pods, movers=dict(movers))) == []
    # h1b is gone: n1's GPUs (500 free on GPU 0) and movers changed, n1 alone is formed again.
    gone = next(pod for pod in pods if pod.key == "h1b")
    keep_movers(movers, gone, -1)
    pods.remove(gone)
    nodes["n1"] = NodeGpus("n1", "h100", (500, 0))
    assert cycle(NOW + 60, snapshot_from(nodes, pods, movers=dict(movers))) == ["n1"]
    # At NOW + 600, h2b has run 700 s: n2's candidates grew, n2 alone is formed again (the
    # newest first: h2b, then h2a).
    assert cycle(NOW + 600, snapshot_from(nodes, pods, movers=dict(movers))) == ["n2"]
    assert [pod.key for pod in rooms.room("n2").candidates] == ["h2b", "h2a"]  # type: ignore[union-attr]
    # n0's GPUs turn out to be of 40 GiB (a fraction's share there changes): n0 alone again.
    sizes = {"n0": 40 * GIB}
    assert cycle(NOW + 600, snapshot_from(nodes, pods, movers=dict(movers), gpu_memory=sizes)) == ["n0"]
    # A whole GPU fits each node with its candidates off (GPU 0 free). Then n0's halves are gone:
    # n0 has no movers, no room (none formed), and no longer counts for the whole GPU.
    whole = PendingPod("w", "a", GpuDemand(1, GPU_MILLI), {"gpu": 1.0})
    assert sorted(rooms.passing((whole.demand, None), whole)) == ["n0", "n1", "n2"]
    for gone in [pod for pod in pods if pod.key in ("h0a", "h0b")]:
        keep_movers(movers, gone, -1)
        pods.remove(gone)
    nodes["n0"] = NodeGpus("n0", "h100", (GPU_MILLI, 0))
    assert cycle(NOW + 600, snapshot_from(nodes, pods, movers=dict(movers), gpu_memory=sizes)) == []
    assert rooms.room("n0") is None
    assert sorted(rooms.passing((whole.demand, None), whole)) == ["n1", "n2"]


def movers_by_pass(snapshot: ClusterSnapshot) -> dict[str, tuple[RunningPod, ...]]:
    """Per node, the running pods that could be moved, in consolidation's order: by a pass over
    every running pod."""
    movers: dict[str, list[RunningPod]] = {}
    for pod in snapshot.running.values():
        if could_move(pod):
            movers.setdefault(pod.node, []).append(pod)
    return {node: tuple(sorted(pods, key=mover_order)) for node, pods in movers.items()}


GIB = 2**30


def random_pending(rng: random.Random, step: int) -> list[PendingPod]:
    """1-6 waiting pods of random queues, asking for a half, 1 or 2 GPUs, or 40 GiB of a GPU's
    memory (a half of an 80 GiB GPU, a whole 40 GiB one)."""
    pending = []
    for i in range(rng.randint(1, 6)):
        key, queue = f"w{step}-{i}", rng.choice("abc")
        if rng.random() < 0.4:
            pending.append(PendingPod(key, queue, GpuDemand(1, 500), {"gpu": 0.5}, fraction_memory=40 * GIB))
            continue
        count = rng.choice((1, 1, 2))
        milli = rng.choice((500, GPU_MILLI)) if count == 1 else GPU_MILLI
        pending.append(PendingPod(key, queue, GpuDemand(count, milli), {"gpu": count * milli / GPU_MILLI}))
    return pending


def next_cycle(
    rng: random.Random, snapshot: ClusterSnapshot, movers: dict[str, tuple[RunningPod, ...]], now: float
) -> ClusterSnapshot:
    """The picture a while later, as the live picture hands it out: random pods gone or placed
    (movable or not, of random ages); pods turned terminating, movable or not, preemptible or not
    (their GPUs as they were); a node added or gone with its pods; a node's GPUs found to be of
    40 or 80 GiB. Nodes and pods left alone are the same objects, and `movers` is kept with
    `keep_movers`, as the picture keeps it."""
    fork = snapshot.fork()
    for step in range(rng.randint(0, 5)):
        keys = sorted(fork.running)
        if keys and rng.random() < 0.4:
            fork.evict(rng.choice(keys))
            continue
        count = rng.choice((1, 1, 2))
        milli = rng.choice((500, GPU_MILLI)) if count == 1 else GPU_MILLI
        new = RunningPod(
            f"p{now:.0f}-{step}",
            rng.choice("abc"),
            "",
            (),
            {"gpu": count * milli / GPU_MILLI},
            started=now - rng.choice((0.0, 600.0, 3600.0)),
            movable=rng.random() < 0.8,
        )
        fork.place(new, GpuDemand(count, milli), rng.choice(sorted(fork.nodes)))
    nodes, pods = dict(fork.nodes), dict(fork.running)
    for key in sorted(pods):
        roll = rng.random()
        if roll < 0.05:
            pods[key] = replace(pods[key], terminating=True)
        elif roll < 0.1:
            pods[key] = replace(pods[key], movable=not pods[key].movable)
        elif roll < 0.13:
            pods[key] = replace(pods[key], preemptible=not pods[key].preemptible)
    roll = rng.random()
    if roll < 0.1:
        name = f"x{now:.0f}"
        nodes[name] = NodeGpus(name, "h100", (GPU_MILLI,) * 4)
    elif roll < 0.2 and len(nodes) > 1:
        gone = rng.choice(sorted(nodes))
        del nodes[gone]
        pods = {key: pod for key, pod in pods.items() if pod.node != gone}
    for key in sorted(snapshot.running.keys() | pods.keys()):
        before, after = snapshot.running.get(key), pods.get(key)
        if before is not after:
            if before is not None:
                keep_movers(movers, before, -1)
            if after is not None:
                keep_movers(movers, after, 1)
    memory = {name: size for name, size in snapshot.gpu_memory.items() if name in nodes}
    for name in sorted(nodes):
        if rng.random() < 0.2:
            memory[name] = rng.choice((40, 80)) * GIB
    return snapshot_from(nodes, pods.values(), movers=dict(movers), gpu_memory=memory)


def reclaim_and_budget(
    snapshot: ClusterSnapshot, pending: list[PendingPod], now: float, rules: Rules, fit_index: FitIndex | None
) -> tuple[Any, ...]:
    work = Budget(rules.max_trials)
    done = plan(snapshot, pending, now, rules, work, fit_index)
    return done, work.trials, work.cut_off, work.refused


def moves_and_budget(
    snapshot: ClusterSnapshot,
    pending: list[PendingPod],
    now: float,
    rules: ConsolidationRules,
    reclaimed: list[Plan],
    avoid: set[str],
    pinned: set[str],
    rooms: NodeRooms | None,
) -> tuple[object, ...]:
    work = Budget(rules.max_trials)
    done = plan_moves(snapshot, pending, now, rules, reclaimed, avoid, pinned, work, rooms)
    return done, work.trials, work.cut_off, work.refused


@pytest.mark.parametrize("seed", range(150))
def test_rooms_kept_from_cycle_to_cycle_change_no_move_plan(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Six cycles on a cluster that changes between them (`next_cycle`), time going on (pods come
    # of age), the rules changed now and then, random pinned pods and avoided nodes. Each cycle's
    # move plans and budget with the `NodeRooms` kept from the cycles before equal those found
    # the long way (each answer checked); reclaim's plans with a `FitIndex` kept from the cycles
    # before equal those of a look at every node, and so does the first node where random
    # demands fit; the movers per node kept from cycle to cycle equal a pass over the pods.
    rng = random.Random(seed)
    snapshot, pending, reclaim_rules = random_case(rng)
    movers = dict(snapshot.movers())
    rules = random_moves_rules(rng, 1800.0)
    rooms, fit_index, now = NodeRooms(), FitIndex(), NOW
    for step in range(6):
        if step:
            now += rng.choice((0.0, 600.0, 1800.0))
            snapshot = next_cycle(rng, snapshot, movers, now)
            pending = random_pending(rng, step)
            if rng.random() < 0.15:
                rules = replace(rules, max_candidates=rng.randint(2, 8))
        assert dict(snapshot.movers()) == movers_by_pass(snapshot)
        # Reclaim with where demands fit kept from the cycles before, and by a look at every node.
        kept = reclaim_and_budget(snapshot, pending, now, reclaim_rules, fit_index)
        assert kept == reclaim_and_budget(snapshot, pending, now, reclaim_rules, None)
        reclaimed = kept[0]
        fork, search = snapshot.fork(), Search(snapshot, fit_index)
        for waiting in random_pending(rng, step):
            sizes = fork.gpu_memory
            first = next(
                (n for n in sorted(fork.nodes) if fits(fork.nodes[n], waiting.demand_on(sizes.get(n, 0)))),
                None,
            )
            assert search.fits_somewhere(fork, waiting) == first
        avoid = {n for n in snapshot.nodes if rng.random() < 0.2}
        pinned = {k for k in snapshot.running if rng.random() < 0.1}
        planning = snapshot.fork()  # the reclaim loop spares pods on the snapshot itself
        planning.spare([k for k in sorted(snapshot.running) if rng.random() < 0.05])

        arguments = (planning, pending, now, rules, reclaimed, avoid, pinned)
        with monkeypatch.context() as patched:
            the_long_way(patched, compare=True)
            with_rooms = moves_and_budget(*arguments, rooms)
        with monkeypatch.context() as patched:
            the_long_way(patched)
            assert moves_and_budget(*arguments, None) == with_rooms


def test_the_cycles_call_for_moves_and_reuse_rooms(monkeypatch: pytest.MonkeyPatch) -> None:
    # The random cycles above are worth running: they make move plans, and most rooms of a cycle
    # after the first are kept ones.
    formed = formed_rooms(monkeypatch)
    planned = formed_later = 0
    for seed in range(60):
        rng = random.Random(seed)
        snapshot, pending, _ = random_case(rng)
        movers, rooms, now = dict(snapshot.movers()), NodeRooms(), NOW
        rules = ConsolidationRules(min_runtime_s=0.0)
        for step in range(6):
            if step:
                now += 600.0
                snapshot = next_cycle(rng, snapshot, movers, now)
                pending = random_pending(rng, step)
            formed.clear()
            planned += len(plan_moves(snapshot, pending, now, rules, rooms=rooms))
            formed_later += len(formed) if step else 0
    assert planned > 30
    assert formed_later < 60 * 5 * 3  # fewer than every node of every cycle after the first


CLASS = "gpu.tessera.dev"
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "uid-rs", "controller": True}


def bound_pod(name: str, node: str, device: str, rng: random.Random) -> list[dict[str, Any]]:
    """A pod of a random queue bound to `node` holding `device` (whole or half), owned by a
    ReplicaSet or not, started at a random time, and its claim."""
    pod = objects.pod("ns", name, queue=rng.choice(("team-a", "team-b")), template="one", node_name=node)
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    pod["status"]["startTime"] = f"2026-12-01T{rng.randint(0, 23):02d}:00:00Z"
    if rng.random() < 0.7:
        pod["metadata"]["ownerReferences"] = [OWNER]
    memory = rng.choice((None, "40Gi"))
    spec = objects.claim_spec(CLASS, memory=memory) if memory else objects.claim_spec(CLASS)
    return [pod, objects.claim("ns", f"{name}-gpus", spec, allocated=[(node, device, memory)])]


def modified(pod: dict[str, Any], **meta: Any) -> dict[str, Any]:
    """The pod with these metadata fields set (None: removed)."""
    metadata = {key: value for key, value in {**pod["metadata"], **meta}.items() if value is not None}
    return {**pod, "metadata": metadata}


@pytest.mark.parametrize("seed", range(40))
def test_the_movers_the_picture_keeps_equal_those_of_a_fresh_picture(seed: int) -> None:
    # Random pod and node events on a live picture: pods bound, deleted, turned terminating, their
    # owner or their movable annotation changed; nodes added (some with classic GPUs, which get
    # one pod), deleted.
    # After each, the movers per node the picture kept from snapshot to snapshot equal those of
    # a fresh picture over the same objects, and those of a pass over the snapshot's pods.
    rng = random.Random(seed)
    live = ClusterPicture()
    base = [
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team-a", resources={"gpu": {"quota": 4}}),
        objects.queue("team-b", resources={"gpu": {"quota": 4}}),
        objects.node("a"),
        objects.gpu_slice("a", 4, shareable=True),
    ]
    for kind in WATCHED_PATHS:
        live.replace(kind, [o for o in base if o["kind"] == kind])

    def fresh() -> ClusterPicture:
        again = ClusterPicture()
        for kind in WATCHED_PATHS:
            again.replace(kind, list(live.kind(kind).values()))
        return again

    nodes = ["a"]
    for step in range(25):
        pods = sorted(live.kind("Pod"))
        roll = rng.random()
        if roll < 0.4 or not pods:
            node = rng.choice(nodes)
            if node.startswith("c"):  # a node of classic GPUs: one pod (which holds which is unknown)
                nodes.remove(node)
                pod = objects.pod("ns", f"p{step}", queue="team-a", node_name=node, classic_gpus=1)
                live.apply("Pod", "ADDED", modified(pod, ownerReferences=[OWNER]))
            else:
                pod, claim = bound_pod(f"p{step}", node, f"gpu-{rng.randint(0, 3)}", rng)
                live.apply("ResourceClaim", "ADDED", claim)
                live.apply("Pod", "ADDED", pod)
        elif roll < 0.55:
            live.apply("Pod", "DELETED", live.kind("Pod")[rng.choice(pods)])
        elif roll < 0.65:
            pod = dict(live.kind("Pod")[rng.choice(pods)])
            live.apply("Pod", "MODIFIED", modified(pod, deletionTimestamp="2026-12-01T10:00:00Z"))
        elif roll < 0.75:
            pod = dict(live.kind("Pod")[rng.choice(pods)])
            owners = None if pod["metadata"].get("ownerReferences") else [OWNER]
            live.apply("Pod", "MODIFIED", modified(pod, ownerReferences=owners))
        elif roll < 0.85:
            pod = dict(live.kind("Pod")[rng.choice(pods)])
            live.apply(
                "Pod",
                "MODIFIED",
                modified(pod, annotations={MOVABLE_ANNOTATION: rng.choice(("false", "true"))}),
            )
        elif roll < 0.95:
            name = f"{rng.choice('bc')}{step}"
            nodes.append(name)
            if name.startswith("c"):
                live.apply("Node", "ADDED", objects.node(name, classic_gpus=2))
            else:
                live.apply("Node", "ADDED", objects.node(name))
                live.apply("ResourceSlice", "ADDED", objects.gpu_slice(name, 4, shareable=True))
        elif len(nodes) > 1:
            name = nodes.pop(rng.randrange(1, len(nodes)))
            live.apply("Node", "DELETED", live.kind("Node")[name])
            gone = live.kind("ResourceSlice").get(f"{name}-{DRIVER_NAME}")
            if gone is not None:
                live.apply("ResourceSlice", "DELETED", gone)
        ours = live.snapshot()
        theirs = fresh().snapshot()
        assert dict(ours.movers()) == dict(theirs.movers()) == movers_by_pass(ours)
