"""Consolidation plans as declarative scenarios: fragmented nodes, running and waiting pods in;
moves (which pod, from where, to where) and the served pod's node out. The arithmetic of each case
is in its comment. GPU shares are in thousandths (500 = half a GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from contract.names import GPU_MILLI, MOVABLE_ANNOTATION
from extender.picture.running import is_movable
from extender.policy.consolidation import ConsolidationRules, MovePlan, plan_drain, plan_moves
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import Budget, Eviction, PendingPod, Plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod

NOW = 10_000.0
RULES = ConsolidationRules(min_runtime_s=600)


@dataclass(frozen=True)
class Run:
    """A running pod holding `milli` of GPU `gpu` of `node` (or `gpus` whole GPUs from `gpu` on)."""

    key: str
    node: str
    gpu: int = 0
    milli: int = GPU_MILLI
    gpus: int = 1
    queue: str = "a"
    age_s: float = 3600.0
    movable: bool = True
    preemptible: bool = True
    terminating: bool = False
    priority: int = 0
    cpu: int = 0  # CPU milli


@dataclass(frozen=True)
class Wait:
    key: str
    gpus: int = 1
    milli: int = GPU_MILLI
    queue: str = "a"
    preemptible: bool = True
    cpu: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: dict[str, int]  # node -> GPUs
    running: list[Run]
    pending: list[Wait]
    moved: set[str]
    served: dict[str, str]  # pending pod -> node made room on
    rules: ConsolidationRules = RULES
    queues: list[QueueSpec] = field(default_factory=lambda: [QueueSpec("a", quota={"gpu": 100})])
    cpu: dict[str, int] = field(default_factory=dict)  # node -> CPU milli (tracked where given)


def halves(count: int, node: str, start: int = 0, **extra: object) -> list[Run]:
    """Half-GPU pods h<i>, one per GPU from GPU 0; a higher index is younger."""
    return [
        Run(f"h{i}", node, gpu=i - start, milli=500, **{"age_s": 3600.0 - i, **extra})  # type: ignore[arg-type]
        for i in range(start, start + count)
    ]


def build(case: Scenario) -> tuple[ClusterSnapshot, list[PendingPod]]:
    free = {node: [GPU_MILLI] * count for node, count in case.nodes.items()}
    running: dict[str, RunningPod] = {}
    allocated: dict[str, float] = {}
    requested: dict[str, float] = {}
    for run in case.running:
        held = tuple((run.gpu + i, run.milli) for i in range(run.gpus))
        for index, milli in held:
            free[run.node][index] -= milli
        amount = run.gpus * run.milli / GPU_MILLI
        allocated[run.queue] = allocated.get(run.queue, 0.0) + amount
        running[run.key] = RunningPod(
            run.key,
            run.queue,
            run.node,
            held,
            {"gpu": amount},
            priority=run.priority,
            preemptible=run.preemptible,
            started=NOW - run.age_s,
            terminating=run.terminating,
            movable=run.movable,
            cpu_milli=run.cpu,
        )
    pending = []
    for wait in case.pending:
        amount = wait.gpus * wait.milli / GPU_MILLI
        requested[wait.queue] = requested.get(wait.queue, 0.0) + amount
        pending.append(
            PendingPod(
                wait.key,
                wait.queue,
                GpuDemand(wait.gpus, wait.milli, cpu_milli=wait.cpu),
                {"gpu": amount},
                preemptible=wait.preemptible,
            )
        )
    usage = {
        spec.name: QueueUsage({"gpu": allocated.get(spec.name, 0.0)}, {"gpu": requested.get(spec.name, 0.0)})
        for spec in case.queues
    }
    fairness = FairnessSnapshot.build(case.queues, usage, {"gpu": float(sum(case.nodes.values()))})
    cpu_used = {n: sum(run.cpu for run in case.running if run.node == n) for n in case.nodes}
    nodes = {
        n: NodeGpus(n, "H100", tuple(f), case.cpu[n] - cpu_used[n], host_tracked=True)
        if n in case.cpu
        else NodeGpus(n, "H100", tuple(f))
        for n, f in free.items()
    }
    return ClusterSnapshot(nodes, running, fairness, WorkloadMix(demands=())), pending


def replay(snapshot: ClusterSnapshot, plans: list[MovePlan]) -> ClusterSnapshot:
    """The cluster after the plans, asserting that every served pod and every mover fits."""
    after = snapshot.fork()
    for done in plans:
        for move in done.moves:
            after.evict(move.pod.key)
        if done.pod is not None:
            arriving = RunningPod(done.pod.key, done.pod.queue, "", (), done.pod.resources)
            assert after.place(arriving, done.pod.demand, done.node), f"{done.pod.key} does not fit"
        for move in done.moves:
            demand = GpuDemand(len(move.pod.gpus), move.pod.gpus[0][1])
            assert after.place(move.pod, demand, move.to_node), (
                f"{move.pod.key} does not fit on {move.to_node}"
            )
    return after


SCENARIOS = [
    # One node, four GPUs each half used: 2 GPUs free in pieces, a whole-GPU pod fits nowhere.
    # Moving one half (the newest, h3) onto another half frees a whole GPU: one move.
    Scenario(
        "one half moves so a whole GPU comes free",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w")],
        moved={"h3"},
        served={"w": "n1"},
    ),
    # The same over two nodes of two GPUs: still one move (the mover may change node).
    Scenario(
        "moves cross nodes",
        nodes={"n1": 2, "n2": 2},
        running=halves(2, "n1") + halves(2, "n2", start=2),
        pending=[Wait("w")],
        moved={"h3"},
        served={"w": "n2"},
    ),
    # A 2-GPU pod on a node of four half-used GPUs: two halves move onto the other two. Fewest
    # moves, not more.
    Scenario(
        "a 2-GPU pod takes two moves",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w", gpus=2)],
        moved={"h2", "h3"},
        served={"w": "n1"},
    ),
    # A 3-GPU pod on n1 (four halves) needs three of them moved (one onto n1's last half, two
    # onto n2's halves held by pods that may not move): over the per-pod bound of 2.
    Scenario(
        "no more moves per pod than the bound",
        nodes={"n1": 4, "n2": 2},
        running=halves(4, "n1") + halves(2, "n2", start=4, movable=False),
        pending=[Wait("w", gpus=3)],
        moved=set(),
        served={},
    ),
    Scenario(
        "with a bound of 3, the 3-GPU pod gets its three moves",
        nodes={"n1": 4, "n2": 2},
        running=halves(4, "n1") + halves(2, "n2", start=4, movable=False),
        pending=[Wait("w", gpus=3)],
        moved={"h1", "h2", "h3"},
        served={"w": "n1"},
        rules=ConsolidationRules(min_runtime_s=600, max_moves_per_pod=3),
    ),
    # Two GPUs each 3/4 used: half a GPU free in all, a whole GPU can never be made.
    Scenario(
        "no move when the pod would still not fit",
        nodes={"n1": 2},
        running=[Run("q0", "n1", gpu=0, milli=750), Run("q1", "n1", gpu=1, milli=750)],
        pending=[Wait("w")],
        moved=set(),
        served={},
    ),
    # One-GPU nodes cannot hold a 2-GPU pod, however the halves are moved.
    Scenario(
        "no move for a pod no node is big enough for",
        nodes={"n1": 1, "n2": 1, "n3": 1},
        running=[Run("h0", "n1", milli=500), Run("h1", "n2", milli=500)],
        pending=[Wait("w", gpus=2)],
        moved=set(),
        served={},
    ),
    # A whole pod of b fits on the free GPU: the scheduler places it, nothing moves.
    Scenario(
        "nothing moves for a pod that fits",
        nodes={"n1": 3},
        running=halves(2, "n1"),
        pending=[Wait("w")],
        moved=set(),
        served={},
    ),
    # n1: a quarter on GPU 0 and a half on GPU 1; n2's GPU is 1/4 used by a pod that may not move.
    # Moving either frees a GPU of n1 (one move each way): the quarter goes, not the half.
    Scenario(
        "small fractions move before big pods",
        nodes={"n1": 2, "n2": 1},
        running=[
            Run("quarter", "n1", gpu=0, milli=250, age_s=4000),
            Run("half", "n1", gpu=1, milli=500, age_s=5000),
            Run("fixed", "n2", milli=250, movable=False),
        ],
        pending=[Wait("w")],
        moved={"quarter"},
        served={"w": "n1"},
    ),
    # Two whole-GPU pods wait on 4 half-used GPUs: each needs one move, and the cycle allows one.
    Scenario(
        "no more moves per cycle than the bound",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w0"), Wait("w1")],
        moved={"h3"},
        served={"w0": "n1"},
        rules=ConsolidationRules(min_runtime_s=600, max_moves_per_cycle=1),
    ),
    # Both get their move when the cycle allows two: h3 onto h0's GPU (the first of the equal
    # halves), w0 on GPU 3; then h2 (h3 moved once is not moved again) onto h1's, w1 on GPU 2.
    Scenario(
        "every plan is applied before the next",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w0"), Wait("w1")],
        moved={"h3", "h2"},
        served={"w0": "n1", "w1": "n1"},
    ),
    # b holds 0 with fair share 2 and waits; a would borrow beyond its share of 2 with a third
    # GPU: reclaim would take it back, so nothing is moved for a.
    Scenario(
        "nothing moves for a borrower while another queue waits below its share",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w"), Wait("b0", gpus=4, queue="b")],
        moved=set(),
        served={},
        queues=[QueueSpec("a", quota={"gpu": 2}), QueueSpec("b", quota={"gpu": 2})],
    ),
    # a's limit is 2.5 and it holds 2: a whole GPU more would pass it, so nothing moves.
    Scenario(
        "nothing moves for a pod its queue's limit refuses",
        nodes={"n1": 4},
        running=halves(4, "n1"),
        pending=[Wait("w")],
        moved=set(),
        served={},
        queues=[QueueSpec("a", quota={"gpu": 2}, limit={"gpu": 2.5})],
    ),
]

UNMOVABLE: dict[str, dict[str, Any]] = {
    "not owned by a controller that recreates it (or opted out)": {"movable": False},
    "not preemptible": {"preemptible": False},
    "younger than the minimum runtime": {"age_s": 60.0},
}


@pytest.mark.parametrize("case", SCENARIOS, ids=lambda c: c.name)
def test_consolidation_scenario(case: Scenario) -> None:
    snapshot, pending = build(case)
    before = {name: node.free_milli for name, node in snapshot.nodes.items()}
    plans = plan_moves(snapshot, pending, NOW, case.rules)
    moved = [m.pod.key for p in plans for m in p.moves]
    assert len(moved) == len(set(moved)), "a pod is moved twice"
    assert set(moved) == case.moved
    assert {p.pod.key: p.node for p in plans if p.pod} == case.served
    assert all(m.message for p in plans for m in p.moves)
    replay(snapshot, plans)  # the served pods and every mover fit
    assert {name: node.free_milli for name, node in snapshot.nodes.items()} == before


@pytest.mark.parametrize("extra", UNMOVABLE.values(), ids=list(UNMOVABLE))
def test_a_pod_that_may_not_move_stays(extra: dict[str, Any]) -> None:
    case = Scenario("", {"n1": 4}, halves(4, "n1", **extra), [Wait("w")], set(), {})
    snapshot, pending = build(case)
    assert plan_moves(snapshot, pending, NOW, RULES) == []


def test_a_pinned_pod_stays_and_the_next_best_moves() -> None:
    # h3 (the newest) would move, but its last move was blocked (a PodDisruptionBudget): h2 goes.
    snapshot, pending = build(Scenario("", {"n1": 4}, halves(4, "n1"), [Wait("w")], set(), {}))
    plans = plan_moves(snapshot, pending, NOW, RULES, pinned={"h3"})
    assert [m.pod.key for p in plans for m in p.moves] == ["h2"]


@pytest.mark.parametrize(("trials", "moved", "cut_off"), [(1, ["h3"], 0), (0, [], 1)])
def test_consolidation_stops_at_its_work_budget(trials: int, moved: list[str], cut_off: int) -> None:
    # Four halves on four GPUs, w waits for a whole GPU: moving h3 (one set of one mover, the
    # first tried) makes room - one trial. With no trial left w is cut off and counted.
    snapshot, pending = build(Scenario("", {"n1": 4}, halves(4, "n1"), [Wait("w")], set(), {}))
    work = Budget(trials)
    plans = plan_moves(snapshot, pending, NOW, RULES, work=work)
    assert [m.pod.key for p in plans for m in p.moves] == moved
    assert work.cut_off == cut_off


def test_no_trial_for_movers_that_would_stay_where_the_cpu_is_short() -> None:
    # n1, the only node: 2 GPUs, 4000 CPU, all taken by a and b (500 milli and 2000 CPU each); w
    # wants a whole GPU and 2000 CPU. Neither mover fits another node, so it would stay on n1
    # beside w: 2000 (w) + 2000 (a mover) > 2000 free with one mover off, 2000 + 4000 > 4000 with
    # both off. No set of movers may land, and none is tried on a fork: the budget stays whole.
    case = Scenario(
        "",
        {"n1": 2},
        [Run("a", "n1", gpu=0, milli=500, cpu=2000), Run("b", "n1", gpu=1, milli=500, cpu=2000)],
        [Wait("w", cpu=2000)],
        set(),
        {},
        cpu={"n1": 4000},
    )
    snapshot, pending = build(case)
    work = Budget(10)
    assert plan_moves(snapshot, pending, NOW, RULES, work=work) == []
    assert (work.trials, work.cut_off) == (10, 0)


def test_a_terminating_pod_counts_as_gone() -> None:
    # h3 is already being deleted: its GPU is whole again once it goes, so nothing moves.
    running = [*halves(3, "n1"), Run("h3", "n1", gpu=3, milli=500, terminating=True)]
    snapshot, pending = build(Scenario("", {"n1": 4}, running, [Wait("w")], set(), {}))
    assert plan_moves(snapshot, pending, NOW, RULES) == []


def test_consolidation_serves_what_reclaim_did_not() -> None:
    # Two whole pods wait on four half-used GPUs; reclaim's plan of the cycle served w0 on n1
    # (say, by evicting h0 and h1 of another queue): consolidation plans only for w1.
    snapshot, pending = build(Scenario("", {"n1": 4}, halves(4, "n1"), [Wait("w0"), Wait("w1")], set(), {}))
    evictions = tuple(Eviction(snapshot.running[k], "reclaimed") for k in ("h0", "h1"))
    reclaimed = Plan("reclaim", pending[0], "n1", evictions, 1.0, 1.0)
    plans = plan_moves(snapshot, pending, NOW, RULES, served=[reclaimed])
    # After reclaim: GPU 0 is w0's, GPU 1 is whole and free: w1 fits without a move.
    assert plans == []
    # Without reclaim's plan both need moves.
    assert [p.pod.key for p in plan_moves(snapshot, pending, NOW, RULES) if p.pod] == ["w0", "w1"]


def test_drain_empties_the_node_whose_pods_can_all_move() -> None:
    # n1: a half that may not move. n2: a whole pod and a half, both movable; they fit on n1's
    # free GPU and n1's other half, so n2 empties. n1 stays (its pod may not move).
    running = [
        Run("fixed", "n1", gpu=0, milli=500, movable=False),
        Run("whole", "n2", gpu=0),
        Run("half", "n2", gpu=1, milli=500),
    ]
    snapshot, _ = build(Scenario("", {"n1": 2, "n2": 2}, running, [], set(), {}))
    plans = plan_drain(snapshot, NOW, RULES, nodes=1)
    assert [(p.goal, p.node, p.gpus_freed) for p in plans] == [("drain", "n2", 2.0)]
    assert {m.pod.key: m.to_node for m in plans[0].moves} == {"whole": "n1", "half": "n1"}
    after = replay(snapshot, plans)
    assert after.pods_on("n2") == []


def test_drain_takes_the_cheapest_node_first_and_no_more_than_asked() -> None:
    # Three 2-GPU nodes: n1 holds 1.5 GPUs, n2 0.5, n3 1: n2 empties first (onto n1's half).
    # Asked for one node only.
    running = [
        Run("a", "n1", gpu=0),
        Run("b", "n1", gpu=1, milli=500),
        Run("c", "n2", gpu=0, milli=500),
        Run("d", "n3", gpu=0),
    ]
    snapshot, _ = build(Scenario("", {"n1": 2, "n2": 2, "n3": 2}, running, [], set(), {}))
    plans = plan_drain(snapshot, NOW, RULES, nodes=1)
    assert [p.node for p in plans] == ["n2"]
    assert {m.pod.key: m.to_node for m in plans[0].moves} == {"c": "n1"}


def test_drain_leaves_a_node_whose_pods_fit_nowhere_else() -> None:
    # Two 1-GPU nodes each fully used: nothing can move anywhere.
    running = [Run("a", "n1"), Run("b", "n2")]
    snapshot, _ = build(Scenario("", {"n1": 1, "n2": 1}, running, [], set(), {}))
    assert plan_drain(snapshot, NOW, RULES, nodes=2) == []


def test_drain_avoids_nodes_it_is_told_to() -> None:
    # n2 is being emptied already (held): n1's half may not go there, and n2 is not planned again.
    running = [Run("a", "n1", milli=500), Run("b", "n2", milli=500)]
    snapshot, _ = build(Scenario("", {"n1": 1, "n2": 1}, running, [], set(), {}))
    assert plan_drain(snapshot, NOW, RULES, nodes=1, avoid={"n2"}) == []
    assert [p.node for p in plan_drain(snapshot, NOW, RULES, nodes=1)] == ["n1"]


@pytest.mark.parametrize(
    ("owner", "annotations", "movable"),
    [
        ("ReplicaSet", {}, True),
        ("Job", {}, True),
        ("StatefulSet", {}, True),
        ("DaemonSet", {}, False),  # recreated on the same node: moving it frees nothing
        (None, {}, False),  # a bare pod is gone for good once evicted
        ("ReplicaSet", {MOVABLE_ANNOTATION: "false"}, False),
    ],
)
def test_movable_pods_are_recreated_by_their_controller(
    owner: str | None, annotations: dict[str, str], movable: bool
) -> None:
    references = [{"kind": owner, "name": "x", "uid": "u", "controller": True}] if owner else []
    pod = {"metadata": {"name": "p", "ownerReferences": references, "annotations": annotations}}
    assert is_movable(pod) is movable
