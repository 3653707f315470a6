"""Rule 14 of extender.policy.reclaim: a pod whose replica has been evicted
`max_victim_evictions` times is no victim again (`spent_victims`), and the live loop's counts
follow an evicted pod to its replacement (`ReplicaEvictions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from extender.controllers.reclaim import REMEMBER_EVICTIONS_S, ReplicaEvictions
from extender.policy.reclaim import Rules, plan, spent_victims
from tests.unit.extender.test_reclaim import FAIRER, NOW, Wait, build


@dataclass(frozen=True)
class Budget:
    name: str
    evictions: dict[str, int]  # pod -> evictions of its replica so far
    limit: int  # rules.max_victim_evictions
    evicted: set[str]


# FAIRER[0]: 4 GPUs on n1; a and b hold 2 each (a1 the newest, then a0, b1, b0), c holds 0 of its
# share 1 and asks 1. Shares a 1.5, b 1.5: either gives a GPU (ending 0.5 owed < c's 1), the
# newest first (a1, which ran 99 s: also the least work lost).
BUDGETS = [
    # No budget (0, the default): a1 goes, however often it went before - today's plan.
    Budget("no budget: the newest goes, evicted 5 times before", {"a1": 5}, 0, {"a1"}),
    # K = 3, a1 evicted twice: 2 < 3, still a victim.
    Budget("within its budget: still a victim", {"a1": 2}, 3, {"a1"}),
    # K = 3, a1 evicted 3 times: spent; the next newest, a0 (a at 2 of 1.5 still gives), goes.
    Budget("spent: the next newest goes instead", {"a1": 3}, 3, {"a0"}),
    # a0 and a1 spent: b's newest, b1 (b at 2 of 1.5 gives as a did).
    Budget("a queue's pods all spent: another queue's go", {"a0": 3, "a1": 4}, 3, {"b1"}),
    # Every candidate spent: nothing is evicted, c waits for a GPU to free.
    Budget("every candidate spent: nothing goes", {"a0": 3, "a1": 3, "b0": 3, "b1": 3}, 3, set()),
    # K = 1: one eviction spends a pod.
    Budget("a budget of one", {"a1": 1}, 1, {"a0"}),
]


@pytest.mark.parametrize("case", BUDGETS, ids=lambda c: c.name)
def test_a_pod_evicted_its_budget_is_no_victim_again(case: Budget) -> None:
    rules = replace(FAIRER[0].rules, max_victim_evictions=case.limit)
    snapshot, pending = build(FAIRER[0])
    snapshot.spare(
        spent_victims(snapshot.running.values(), lambda pod: case.evictions.get(pod.key, 0), rules)
    )
    plans = plan(snapshot, pending, NOW, rules)
    assert {e.pod.key for p in plans for e in p.evictions} == case.evicted
    assert {p.pod.key for p in plans} == ({"c0"} if case.evicted else set())


def test_no_budget_spares_nothing() -> None:
    snapshot, _ = build(FAIRER[0])
    assert spent_victims(snapshot.running.values(), lambda _: 100, Rules()) == []


def pod(name: str, created: str, owner: str = "", index: str | None = None) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name, "namespace": "ns", "creationTimestamp": created}
    if owner:
        metadata["ownerReferences"] = [
            {"kind": "Job", "name": owner, "uid": f"uid-{owner}", "controller": True}
        ]
    if index is not None:
        metadata["annotations"] = {"batch.kubernetes.io/job-completion-index": index}
    return {"metadata": metadata}


EVICTED_AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z
BEFORE, AFTER, LATER = "2025-12-31T23:59:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:00:09Z"


@pytest.mark.parametrize(
    ("evicted", "then", "counts"),
    [
        # A Job's pod j-0 evicted (its second time: count 1 before): its replacement j-1, created
        # after the eviction, inherits 2.
        ({"ns/j-0": pod("j-0", BEFORE, "j")}, {"ns/j-1": pod("j-1", AFTER, "j")}, {"ns/j-1": 2}),
        # Two pods created after it: the first created is the replacement (j-2 at :05, j-1 at :09).
        (
            {"ns/j-0": pod("j-0", BEFORE, "j")},
            {"ns/j-1": pod("j-1", LATER, "j"), "ns/j-2": pod("j-2", AFTER, "j")},
            {"ns/j-2": 2},
        ),
        # A pod of the Job created before the eviction is not its replacement.
        ({"ns/j-0": pod("j-0", BEFORE, "j")}, {"ns/j-1": pod("j-1", BEFORE, "j")}, {}),
        # Another controller's new pod inherits nothing.
        ({"ns/j-0": pod("j-0", BEFORE, "j")}, {"ns/k-1": pod("k-1", AFTER, "k")}, {}),
        # An Indexed Job: the replacement carries the evicted pod's index (1), not the first new pod.
        (
            {"ns/j-1-x": pod("j-1-x", BEFORE, "j", "1")},
            {"ns/j-0-y": pod("j-0-y", AFTER, "j", "0"), "ns/j-1-y": pod("j-1-y", LATER, "j", "1")},
            {"ns/j-1-y": 2},
        ),
        # A StatefulSet's pod comes back under its own name: it inherits as well.
        ({"ns/s-0": pod("s-0", BEFORE, "s")}, {"ns/s-0": pod("s-0", AFTER, "s")}, {"ns/s-0": 2}),
        # A pod without a controller does not come back: its count goes with it.
        ({"ns/bare": pod("bare", BEFORE)}, {"ns/new": pod("new", AFTER)}, {}),
    ],
)
def test_a_replacement_inherits_its_evicted_pods_count(
    evicted: dict[str, dict[str, object]], then: dict[str, dict[str, object]], counts: dict[str, int]
) -> None:
    replicas = ReplicaEvictions()
    ((key, victim),) = evicted.items()
    replicas.counts[key] = 1  # evicted once before, as a replacement of an earlier pod
    replicas.evicted(key, victim, EVICTED_AT)
    replicas.follow(then, EVICTED_AT + 10)
    assert replicas.counts == counts
    assert replicas.replica_of == dict.fromkeys(counts, key)


def test_a_replacement_not_seen_within_the_memory_inherits_nothing() -> None:
    replicas = ReplicaEvictions()
    replicas.evicted("ns/j-0", pod("j-0", BEFORE, "j"), EVICTED_AT)
    replicas.follow({}, EVICTED_AT + REMEMBER_EVICTIONS_S)  # forgotten
    replicas.follow({"ns/j-1": pod("j-1", AFTER, "j")}, EVICTED_AT + REMEMBER_EVICTIONS_S + 1)
    assert replicas.counts == {}


@dataclass(frozen=True)
class Lead:
    name: str
    lead_s: float  # rules.victim_lead_s
    waited_s: float  # how long c0 has waited
    evicted: set[str]
    per_wait: float = 0.0  # rules.victim_lead_per_wait


# Rule 15, on FAIRER[0] again: a1 started 99 s before NOW, a0 100 s, b1 199 s, b0 200 s; c0 began
# to wait `waited_s` before NOW. A victim must have started at most `lead_s` before that.
LEADS = [
    # No lead set (inf, the default): a1 goes, as in FAIRER[0].
    Lead("no lead: the newest goes", math.inf, 0, {"a1"}),
    # 60 s, c0 waiting since NOW: a1 started 99 s before it began to wait (99 > 60), the others
    # earlier still: nothing goes, c0 waits for a GPU to free.
    Lead("every candidate started too long before the wait", 60, 0, set()),
    # 60 s, c0 waiting since NOW - 40: a1 started 59 s before that (59 <= 60): a1 goes; it loses
    # its 99 s, at most the lead plus the wait (60 + 40).
    Lead("a victim started within the lead of the wait", 60, 40, {"a1"}),
    # 0 s: only pods that started while c0 waited. Waiting 50 s: every one started before that.
    Lead("no lead, waited 50 s: nothing started during the wait", 0, 50, set()),
    # Waiting 150 s: a1 (99 s ago) and a0 (100 s ago) started during the wait; the newest goes.
    Lead("no lead, waited 150 s: a pod started during the wait goes", 0, 150, {"a1"}),
    # Growing by 1 s per second waited: 40 s waited, lead 40, a1 started 59 s before the wait:
    # nothing yet. 50 s waited, lead 50: a1 (49 s before) and a0 (50 s) are within it; a1 goes,
    # having run 99 s, at most the lead plus the wait (50 + 50).
    Lead("a growing lead, waited 40 s: nothing yet", 0, 40, set(), per_wait=1),
    Lead("a growing lead, waited 50 s: within it", 0, 50, {"a1"}, per_wait=1),
]


@pytest.mark.parametrize("case", LEADS, ids=lambda c: c.name)
def test_a_victim_started_long_before_the_wait_is_not_taken(case: Lead) -> None:
    scenario = replace(FAIRER[0], pending=[*FAIRER[0].pending[:-1], Wait("c0", "c", age_s=case.waited_s)])
    snapshot, pending = build(scenario)
    plans = plan(snapshot, pending, NOW, Rules(victim_lead_s=case.lead_s, victim_lead_per_wait=case.per_wait))
    assert {e.pod.key for p in plans for e in p.evictions} == case.evicted
