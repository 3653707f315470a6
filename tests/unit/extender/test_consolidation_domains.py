"""Consolidation freeing one topology domain for a gang that requires it (rule 6), as scenarios:
racks of nodes, running one-GPU pods and a waiting gang in; which pods move, where to, and the
rack freed out. The cluster: racks r1 (n1, n2) and r2 (n3, n4), 4 GPUs each (16 GPUs)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from extender.policy.consolidation import ConsolidationRules, plan_domain_moves, plan_moves
from extender.policy.reclaim import PendingPod
from extender.policy.snapshot import ClusterSnapshot
from tests.unit.extender.test_consolidation import NOW, RULES, Run, Scenario, Wait, build

RACKS = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}
NODES = dict.fromkeys(RACKS, 4)


def spread(counts: dict[str, int], **extra: object) -> list[Run]:
    """One-GPU pods p<node>-<i> on GPUs 0.. of each node; a later index is younger."""
    return [
        Run(f"p{node}-{i}", node, gpu=i, **{"age_s": 3600.0 - i, **extra})  # type: ignore[arg-type]
        for node, count in counts.items()
        for i in range(count)
    ]


def gang_of(size: int, running: list[Run]) -> tuple[ClusterSnapshot, list[PendingPod]]:
    """The snapshot and a gang `size` one-GPU members requiring a rack (workload Job/ns/g)."""
    waits = [Wait(f"g-{i}") for i in range(size)]
    snapshot, pending = build(Scenario("", NODES, running, waits, set(), {}))
    return snapshot, [replace(pod, workload="Job/ns/g", domains=RACKS) for pod in pending]


@dataclass(frozen=True)
class Case:
    name: str
    running: list[Run]
    size: int  # the gang's one-GPU members
    moved: set[str]  # pods moved ({}: no plan)
    domain: str = ""  # the rack freed
    budget: int = 4


CASES = [
    # r1 holds 5 (n1 3, n2 2: 3 free), r2 2 (n3 1, n4 1: 6 free); 8 members: no rack holds 8.
    # r2 lacks 2: its 2 pods move into r1's 3 free GPUs (2 moves); r1 lacks 5 (5 moves).
    Case(
        "the rack short by fewest pods is freed",
        spread({"n1": 3, "n2": 2, "n3": 1, "n4": 1}),
        8,
        {"pn3-0", "pn4-0"},
        "r2",
    ),
    # Both racks hold 3 pods (5 free each); r1's are a 2-GPU pod and a 1-GPU one, r2's three
    # 1-GPU pods: r1 is freed by 2 moves (3 GPUs), r2 would take 3.
    Case(
        "the fewest moves, larger pods first",
        [Run("big", "n1", gpu=0, gpus=2), Run("small", "n2"), *spread({"n3": 2, "n4": 1})],
        8,
        {"big", "small"},
        "r1",
    ),
    # As the first, but r2's pod on n3 started 100 s ago (under the 600 s minimum runtime): r2
    # cannot be freed, and r1 needs 5 moves, more than the 4 of the budget.
    Case(
        "a pod under its minimum runtime stays",
        [*spread({"n1": 3, "n2": 2, "n4": 1}), Run("young", "n3", age_s=100.0)],
        8,
        set(),
    ),
    # The budget allows 1 move: r2 needs 2.
    Case("no more moves than the budget", spread({"n1": 3, "n2": 2, "n3": 1, "n4": 1}), 8, set(), budget=1),
    # r2 holds 6 free for a gang of 6: it fits a rack now; nothing to move (admission places it).
    Case("a gang a rack holds now moves nothing", spread({"n1": 3, "n2": 2, "n3": 1, "n4": 1}), 6, set()),
    # r1 full (8 pods), r2 2 pods: r2's movers have nowhere to go outside r2 (6 free in all).
    Case(
        "movers land outside the freed rack or not at all",
        spread({"n1": 4, "n2": 4, "n3": 1, "n4": 1}),
        8,
        set(),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_rack_is_freed_for_a_gang_that_requires_one(case: Case) -> None:
    snapshot, members = gang_of(case.size, case.running)
    outcome = plan_domain_moves(snapshot.fork(), members, NOW, RULES, case.budget)
    if not case.moved:
        assert outcome is None
        return
    assert outcome is not None
    plan, after = outcome
    assert {move.pod.key for move in plan.moves} == case.moved
    assert plan.domain == case.domain
    # Every mover lands outside the freed rack, every member inside it, all fitting (the fork).
    assert {RACKS[move.to_node] for move in plan.moves} == {"r1", "r2"} - {case.domain}
    assert sorted(key.key for key, _ in plan.members) == [f"g-{i}" for i in range(case.size)]
    assert {RACKS[node] for _, node in plan.members} == {case.domain}
    for member, node in plan.members:
        assert after.running[member.key].node == node
    for move in plan.moves:
        assert move.pod.key not in after.running or after.running[move.pod.key].node == move.to_node
        assert f"out of {case.domain}" in move.message and "gang Job/ns/g" in move.message


def test_the_cycle_plans_moves_for_a_gang_requiring_a_rack_and_none_for_one_without() -> None:
    running = spread({"n1": 3, "n2": 2, "n3": 1, "n4": 1})
    snapshot, members = gang_of(8, running)
    plans = plan_moves(snapshot, members, NOW, RULES)
    assert [(plan.domain, sorted(m.pod.key for m in plan.moves)) for plan in plans] == [
        ("r2", ["pn3-0", "pn4-0"])
    ]
    # The same gang without a required level: moves for it would start none of it; nothing.
    anywhere = [replace(member, domains=None) for member in members]
    assert plan_moves(snapshot, anywhere, NOW, RULES) == []
    # The cycle's moves bound the gang's: 1 move per cycle leaves r2 (2 moves) unserved.
    assert (
        plan_moves(snapshot, members, NOW, ConsolidationRules(min_runtime_s=600, max_moves_per_cycle=1)) == []
    )
