"""The one admission rule (`extender.policy.admission`) as worked examples: a workload's ask against
the fairness snapshot -> admitted, or refused with a reason code and the numbers.

Every case: queue `team` (quota 4 GPUs, limit as the row says) alone on a cluster of 8 GPUs; `held`
GPUs allocated, `guaranteed` of them held by non-preemptible pods, `waits` more wanted (4 unless
said: its fair share is what it holds and wants, up to the limit and the 8 GPUs); one-GPU pods."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from extender.policy.admission import (
    Ask,
    GangState,
    Waiting,
    admit,
    fairness_vector,
    waiting_list,
)
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.workloads import Workload

POD = Workload("Pod/ns/p", "Pod", "p", 1, "pod")


def view(
    limit: float | None = None, held: float = 0.0, guaranteed: float = 0.0, waits: float = 4.0
) -> FairnessSnapshot:
    spec = QueueSpec("team", quota={"gpu": 4}, limit={} if limit is None else {"gpu": limit})
    usage = {"team": QueueUsage({"gpu": held}, {"gpu": waits}, {"gpu": guaranteed})}
    return FairnessSnapshot.build([spec], usage, {"gpu": 8})


def gang(
    minimum: int, members: int, placed: int = 0, reserved: bool = False, reading: bool = False
) -> GangState:
    spec = ("kubeflow.org/v1", "PyTorchJob", "pt") if reading else None
    workload = Workload("Job/ns/j" if not reading else "PyTorchJob/ns/pt", "Job", "j", minimum, "test", spec)
    return GangState(workload, minimum, members, placed, reserved, reading)


@dataclass(frozen=True)
class Case:
    name: str
    view: FairnessSnapshot
    ask: Ask
    admitted: bool
    kind: str
    words: str  # in the reason, with its numbers


ONE = {"gpu": 1.0}

CASES = [
    # A pod alone: 2 + 1 <= 4 (limit), within its fair share (quota 4).
    Case("alone, within", view(4, 2), Ask("team", ONE), True, "within_fair_share", "within its limits"),
    # What its queue's pods ahead ask counts first: 2 held + 2 ahead + 1 = 5 > 4.
    Case(
        "alone, with pods ahead past the limit",
        view(4, 2),
        Ask("team", ONE, ahead={"gpu": 2}),
        False,
        "over_limit",
        "gpu allocated 2 + request 3 would exceed its limit (4)",
    ),
    # A gang whose minimum is still being read from its owner waits for it, whatever the room.
    Case(
        "gang, minimum being read",
        view(),
        Ask("team", ONE, gang=gang(1, 1, reading=True)),
        False,
        "gang_reading",
        "workload PyTorchJob/ns/pt waits for its minimum: reading the spec of its PyTorchJob pt",
    ),
    # 3 of its minimum 4 exist: it waits for its controller, whatever the room.
    Case(
        "gang, incomplete",
        view(),
        Ask("team", ONE, gang=gang(4, 3)),
        False,
        "gang_incomplete",
        "(minimum 4 pods, 0 placed, 3 present) waits for its pods: 3 of its minimum 4 exist",
    ),
    # Complete, nothing placed: its 4 missing pods together, 0 + 4 x 1 = 4 <= 4.
    Case(
        "gang, whole within the limit",
        view(4),
        Ask("team", ONE, gang=gang(4, 4)),
        True,
        "within_fair_share",
        "",
    ),
    # At limit 2: 0 + 4 > 2, all of it waits, with the numbers of the whole.
    Case(
        "gang, whole past the limit",
        view(2),
        Ask("team", ONE, gang=gang(4, 4)),
        False,
        "over_limit",
        "starts whole or not at all; its 4 missing pods together: "
        "queue 'team': gpu allocated 0 + request 4 would exceed its limit (2)",
    ),
    # 2 of 4 placed (they are in `held`): the 2 missing, 2 + 2 x 1 = 4 <= 4.
    Case(
        "gang, its missing members only",
        view(4, 2),
        Ask("team", ONE, gang=gang(4, 5, 2)),
        True,
        "within_fair_share",
        "",
    ),
    # Admitted as a unit, 1 of 4 placed: its reservation's slots are counted in `held` (4 of 4),
    # so the queue is full - and the members being placed go (the unit was judged).
    Case(
        "gang, being placed",
        view(4, 4),
        Ask("team", ONE, gang=gang(4, 4, 1, reserved=True)),
        True,
        "gang",
        "(minimum 4 pods, 1 placed, 4 present) is being placed",
    ),
    # Its minimum placed: a member beyond it (elastic) goes alone, 4 + 1 > 4.
    Case(
        "gang, elastic member alone",
        view(4, 4),
        Ask("team", ONE, gang=gang(4, 5, 4)),
        False,
        "over_limit",
        "gpu allocated 4 + request 1 would exceed its limit (4)",
    ),
    # Not preemptible, the queue's 4 GPUs (its quota) held by its own preemptible pods: the quota
    # guarantees non-preemptible work, 0 + 1 <= 4; admitted beyond its fair share (4: nothing
    # else waits) ...
    Case(
        "not preemptible, queue full of its own preemptible pods",
        view(None, 4, 0, waits=0),
        Ask("team", ONE, preemptible=False),
        True,
        "borrowing",
        "within its quota for non-preemptible pods",
    ),
    # ... but held by non-preemptible pods: 4 + 1 > 4.
    Case(
        "not preemptible, quota taken by non-preemptible pods",
        view(None, 4, 4),
        Ask("team", ONE, preemptible=False),
        False,
        "over_quota",
        "gpu non-preemptible allocated 4 + request 1 would exceed its quota (4)",
    ),
    # A non-preemptible gang: 3 non-preemptible held + its 2 missing = 5 > 4.
    Case(
        "not preemptible gang, its missing members past the quota",
        view(None, 3, 3),
        Ask("team", ONE, preemptible=False, gang=gang(2, 2)),
        False,
        "over_quota",
        "its 2 missing pods together: queue 'team': gpu non-preemptible allocated 3 + request 2",
    ),
    Case(
        "unknown queue", view(), Ask("nobody", ONE), False, "unknown_queue", "queue 'nobody' does not exist"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_admission_rule(case: Case) -> None:
    decision = admit(case.view, case.ask)
    assert (decision.admit, decision.kind) == (case.admitted, case.kind), decision.reason
    assert case.words in decision.reason


def test_the_pods_a_gang_asks_for_at_once() -> None:
    # Minimum 4, 1 placed: 3 missing; ahead 1 GPU: the queue is asked for 1 + 3 x 2 = 7.
    ask = Ask("team", {"gpu": 2.0}, gang=gang(4, 4, 1), ahead={"gpu": 1.0})
    assert (ask.whole, ask.pods, ask.total()) == (True, 3, {"gpu": 7.0})
    # Its minimum placed: a member goes alone.
    alone = Ask("team", {"gpu": 2.0}, gang=gang(4, 5, 4))
    assert (alone.whole, alone.pods, alone.total()) == (False, 1, {"gpu": 2.0})


def waiting(key: str, gang_state: GangState | None = None, held: bool = False, gpus: float = 1.0) -> Waiting:
    return Waiting(key, Ask("team", {"gpu": gpus}, gang=gang_state), held)


def test_the_waiting_list() -> None:
    # Limit 6, 3 held. A pod of 1 (3 + 1 <= 6) and one of 4 (3 + 4 > 6): the first only.
    # A gang of minimum 2 with 3 waiting: 2 missing, 3 + 2 <= 6, its first 2 listed with the
    # workload. A pod GPUs are held for already: not listed again.
    complete = gang(2, 3)
    found = waiting_list(
        view(6, 3),
        [
            waiting("one"),
            waiting("four", gpus=4),
            waiting("g0", complete),
            waiting("g1", complete),
            waiting("g2", complete),
            waiting("held", held=True),
        ],
    )
    assert [(listed.waiting.key, listed.workload) for listed in found] == [
        ("one", ""),
        ("g0", "Job/ns/j"),
        ("g1", "Job/ns/j"),
    ]


@pytest.mark.parametrize(
    ("held", "listed"),
    [
        # A gang of minimum 4, nothing placed: 4 missing. Holds for all 4: nothing to plan.
        ({"g0", "g1", "g2", "g3"}, []),
        # A pod of another scheduler took g3's GPUs, and reclaim let its hold go: 4 - 3 held =
        # 1 left without GPUs, listed with the workload (planned at once; before: not listed
        # while any member was held, until the other holds expired 90 s later).
        ({"g0", "g1", "g2"}, ["g3"]),
        # Two holds lost: the two members without GPUs, served together or not at all.
        ({"g0", "g2"}, ["g1", "g3"]),
        # No hold: all 4 (the gang judged whole, 4 x 1 <= 6).
        (set(), ["g0", "g1", "g2", "g3"]),
    ],
)
def test_a_gang_lists_only_its_members_no_gpus_are_held_for(held: set[str], listed: list[str]) -> None:
    four = gang(4, 4)
    found = waiting_list(view(6), [waiting(f"g{i}", four, held=f"g{i}" in held) for i in range(4)])
    assert [(entry.waiting.key, entry.workload) for entry in found] == [(key, "Job/ns/j") for key in listed]


@pytest.mark.parametrize(
    ("cpu", "memory", "gpus", "vector"),
    [
        # 4 cores, 32 bytes, one H100: counted in "gpu" and "gpu/H100".
        (4.0, 32.0, [("H100", 1.0)], {"cpu": 4.0, "memory": 32.0, "gpu": 1.0, "gpu/H100": 1.0}),
        # Two devices of different models held: 0.5 + 1 = 1.5 GPUs.
        (1.0, 0.0, [("L4", 0.5), ("H100", 1.0)], {"cpu": 1.0, "gpu": 1.5, "gpu/L4": 0.5, "gpu/H100": 1.0}),
        # Model unknown (a pod that may land on several): "gpu" only; no GPU: none.
        (0.5, 8.0, [("", 2.0)], {"cpu": 0.5, "memory": 8.0, "gpu": 2.0}),
        (0.5, 8.0, [], {"cpu": 0.5, "memory": 8.0}),
    ],
)
def test_the_fairness_vector(
    cpu: float, memory: float, gpus: list[tuple[str, float]], vector: dict[str, float]
) -> None:
    assert fairness_vector(cpu, memory, gpus) == vector
