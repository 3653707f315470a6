"""The admission rule, pure: may a pod, or the workload it belongs to, go now?

One function (`admit`) of a workload's ask and the fairness snapshot, called by everything that
asks: the filter (`extender.verbs`), the admission gate and its controller (`extender.admission`,
`extender.controllers.gates`), Queue status's requeue check (`extender.status`), the picture's
waiting list for the planners (`waiting_list`, through `ClusterPicture.waiting_pods`) and the
simulator (`tessera.simulate.queues`). A rule changed here is changed everywhere, and the message
a user reads is the one the filter acted on.

The ask (`Ask`): its queue, one pod's fairness vector (`fairness_vector`), whether the pod is
preemptible, its gang (`GangState`) and what its queue's pods already in the scheduler's hands ask
for (`ahead`, the gate's: admitted before it). Checked in order, the first that refuses wins:

1. a gang not admitted yet whose minimum is still being read from its owner's spec waits
   (`gang_reading`);
2. a gang not admitted yet with fewer pods than its minimum waits for its controller to create
   them (`gang_incomplete`);
3. a gang admitted as a unit whose reservation still holds slots for members to place is admitted
   (`gang`: the unit was judged already, its slots are counted against the queue);
4. the queue (`FairnessSnapshot.admit`) is asked for `ahead` plus the pods asked at once: a gang
   not admitted yet asks for its missing members (minimum - placed) together, each asking what
   this pod asks; anything else for itself. Refused by a limit on the queue's path
   (`over_limit`), by a quota for a pod that is not preemptible - against the non-preemptible use
   of the path (`over_quota`) - or by an unusable queue (`unknown_queue`, `invalid_queue`,
   `not_leaf`).

Limit 4 GPUs, 2 held, 2 waiting ungated ahead: a pod of 1 is refused (2 + 2 + 1 > 4). A gang of
minimum 4 one-GPU pods, nothing placed, limit 4: refused with 3 pods present (incomplete),
admitted with 4 (4 x 1 = 4 <= 4); at limit 2 refused (4 > 2) with the numbers.

The waiting list (`waiting_list`): the pending pods the planners may make room for, in the order
given (the scheduler's: priority, then creation): those the rule admits and no GPUs are held for
yet; of a gang not admitted, judged once at its first pod, as many of its waiting pods as it
misses beyond those GPUs are held for, marked with the workload (the planner serves them all or
none; the held ones are in place in its fork already). So a gang whose holds cover its missing
pods is not listed, and one that lost a hold (another pod took the GPUs: reclaim let it go,
`extender.policy.reclaim.lost_holds`) lists only the pods left without GPUs, planned again at
once rather than after the other holds expire. Gang of minimum 4, nothing placed, holds for 4:
nothing listed; a default-scheduler pod takes one held GPU, its hold goes: 1 listed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.policy.fairness import AdmissionDecision, FairnessSnapshot, Resources
from extender.policy.workloads import Workload

GANG_READING = "gang_reading"
GANG_INCOMPLETE = "gang_incomplete"
GANG = "gang"  # a gang's member admitted with the unit that was judged whole


def gpu_amounts(model: str, amount: float) -> dict[str, float]:
    """A GPU amount counted both in "gpu" and, when the model is known, in "gpu/<model>"."""
    return {"gpu": amount, f"gpu/{model}": amount} if model else {"gpu": amount}


def add_amounts(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for resource, amount in amounts.items():
        into[resource] = into.get(resource, 0.0) + amount


def fairness_vector(cpu: float, memory: float, gpus: Iterable[tuple[str, float]] = ()) -> dict[str, float]:
    """What a pod (or a node) counts in its queue: cpu in cores, memory in bytes, and each of its
    GPU amounts (model, GPUs; a fraction as its share) in "gpu" and "gpu/<model>" (model ""
    unknown: "gpu" only). Zero amounts are left out. The picture's accounting and the simulator
    both count with it."""
    amounts: dict[str, float] = {"cpu": cpu, "memory": memory}
    for model, amount in gpus:
        add_amounts(amounts, gpu_amounts(model, amount))
    return {resource: amount for resource, amount in amounts.items() if amount > 0}


@dataclass(frozen=True)
class GangState:
    """A pod's workload as admission reads it (the pod alone: `workload.single`)."""

    workload: Workload
    minimum: int
    members: int  # its pods that exist, gated or not (at creation: with the pod being created)
    placed: int  # members bound, or admitted by a filter whose bind is still to come
    reserved: bool = False  # admitted as a unit: its reservation holds slots for members to place
    reading: bool = False  # its minimum is about to be read from its owner's spec

    @property
    def admitted(self) -> bool:
        """Its minimum is placed, or admitted as a unit and being placed: members go pod by pod."""
        return self.workload.single or self.placed >= self.minimum or self.reserved

    @property
    def missing(self) -> int:
        """The pods its queue must take at once: those of its minimum not placed."""
        return max(self.minimum - self.placed, 0)


@dataclass(frozen=True)
class Ask:
    """What a pod asks of admission."""

    queue: str
    request: Resources  # one pod's fairness vector
    preemptible: bool = True
    gang: GangState | None = None  # None: the pod alone
    # What its queue's pods admitted before it ask and usage does not count yet (the gate's pods
    # in the scheduler's hands; for a gang, without its own: they are in its missing demand).
    ahead: Resources = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        """Judged with its gang, as a unit (a gang not admitted yet)."""
        return self.gang is not None and not self.gang.admitted

    @property
    def pods(self) -> int:
        """How many pods like this one its queue must take to let it go."""
        return self.gang.missing if self.gang is not None and self.whole else 1

    def total(self) -> dict[str, float]:
        """What the queue is asked for: `ahead`, plus `pods` times the request."""
        total = dict(self.ahead)
        add_amounts(total, {resource: amount * self.pods for resource, amount in self.request.items()})
        return total


def gang_text(gang: GangState, what: str) -> str:
    return (
        f"workload {gang.workload.key} (minimum {gang.minimum} pods, {gang.placed} placed, "
        f"{gang.members} present) {what}"
    )


def admit(view: FairnessSnapshot, ask: Ask) -> AdmissionDecision:
    """The admission rule (see the module docstring): admitted, or refused with the reason (its
    numbers) and a reason code in `kind`."""
    gang = ask.gang
    if gang is not None and ask.whole:
        if gang.reading:
            spec = gang.workload.spec
            owner = f"{spec[1]} {spec[2]}" if spec else "owner"
            text = f"workload {gang.workload.key} waits for its minimum: reading the spec of its {owner}"
            return AdmissionDecision(False, text, GANG_READING)
        if gang.members < gang.minimum:  # its controller has not created all of them yet
            text = gang_text(gang, f"waits for its pods: {gang.members} of its minimum {gang.minimum} exist")
            return AdmissionDecision(False, text, GANG_INCOMPLETE)
    elif gang is not None and gang.reserved and gang.placed < gang.minimum:
        return AdmissionDecision(True, gang_text(gang, "is being placed"), GANG)
    decision = view.admit(ask.queue, ask.total(), preemptible=ask.preemptible)
    if decision.admit or gang is None or not ask.whole:
        return decision
    text = gang_text(
        gang, f"starts whole or not at all; its {ask.pods} missing pods together: {decision.reason}"
    )
    return AdmissionDecision(False, text, decision.kind)


@dataclass(frozen=True)
class Waiting:
    """A pending pod, for the waiting list."""

    key: str
    ask: Ask
    held: bool = False  # GPUs are held for it already


@dataclass(frozen=True)
class Listed:
    """A pod of the waiting list: what it asked, and its gang's workload when it is served whole."""

    waiting: Waiting
    workload: str = ""  # "": served alone


def waiting_list(view: FairnessSnapshot, waiting: Sequence[Waiting]) -> list[Listed]:
    """The waiting pods the planners may serve (see the module docstring), in the given order.

    Pods alone that ask alike (queue, request, preemptible, nothing ahead) are judged once."""
    listed: list[Listed] = []
    left: dict[str, int] = {}  # gang workload -> its pods still to list (0: none)
    held = Counter(  # gang workload -> its pods GPUs are held for
        entry.ask.gang.workload.key
        for entry in waiting
        if entry.held and entry.ask.gang is not None and entry.ask.whole
    )
    alike: dict[tuple[object, ...], bool] = {}
    for entry in waiting:
        ask = entry.ask
        if ask.gang is not None and ask.whole:
            workload = ask.gang.workload.key
            if workload not in left:
                unheld = ask.pods - held[workload]
                left[workload] = unheld if unheld > 0 and admit(view, ask).admit else 0
            if left[workload] > 0 and not entry.held:
                left[workload] -= 1
                listed.append(Listed(entry, workload))
            continue
        if entry.held:
            continue
        if ask.ahead or (ask.gang is not None and ask.gang.reserved):
            admitted = admit(view, ask).admit
        else:  # judged by the queue alone
            signature = (ask.queue, ask.preemptible, *sorted(ask.request.items()))
            if signature not in alike:
                alike[signature] = admit(view, ask).admit
            admitted = alike[signature]
        if admitted:
            listed.append(Listed(entry))
    return listed
