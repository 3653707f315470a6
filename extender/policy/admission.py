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
2. a gang not admitted yet with fewer pods than its minimum - or than any part's minimum, for a
   gang with parts - waits for its controller to create them (`gang_incomplete`); a pod above its
   part's minimum waits for the gang to be admitted by the others (`gang_elastic`);
3. a gang admitted as a unit whose reservation still holds slots for members to place is admitted
   (`gang`: the unit was judged already, its slots are counted against the queue), unless the pod
   is beyond its part's minimum: that one is elastic and judged alone (4);
4. the queue (`FairnessSnapshot.admit`) is asked for `ahead` plus the pods asked at once: a gang
   not admitted yet asks for its missing members (minimum - placed) together, each asking what
   this pod asks - of a gang with parts, each part's missing members what a member of that part
   asks (a CPU-only leader and 8-GPU workers differ); anything else for itself. Refused by a
   limit on the queue's path (`over_limit`), by a quota for a pod that is not preemptible -
   against the non-preemptible use of the path (`over_quota`) - or by an unusable queue
   (`unknown_queue`, `invalid_queue`, `not_leaf`).

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
nothing listed; a default-scheduler pod takes one held GPU, its hold goes: 1 listed. A gang's
pods above their part's minimum are not listed (they wait for the gang to be admitted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from extender.policy.fairness import AdmissionDecision, FairnessSnapshot, Resources
from extender.policy.workloads import Workload

GANG_READING = "gang_reading"
GANG_INCOMPLETE = "gang_incomplete"
GANG = "gang"  # a gang's member admitted with the unit that was judged whole
GANG_ELASTIC = "gang_elastic"  # a member above its part's minimum, its gang not admitted yet
# A gang admitted by its queue whose missing members do not all fit (yet), and one with a required
# topology level that no domain of it holds whole (yet): the placement's refusals, the filter's.
GANG_NO_FIT = "gang_no_fit"
GANG_NO_DOMAIN = "gang_no_domain"
# ... and one that no domain of its required level could hold even with all its GPUs free.
GANG_DOMAIN_TOO_SMALL = "gang_domain_too_small"


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
class PartState:
    """One part (subgroup) of a gang, counted on its own."""

    name: str
    minimum: int
    members: int  # its pods that exist
    placed: int  # as `GangState.placed`, its members only
    # One member's fairness vector (parts may differ: a CPU-only leader, 8-GPU workers); empty
    # when none of its pods is counted yet (its queue is then asked what the asking pod asks).
    request: Mapping[str, float] = field(default_factory=dict)

    @property
    def missing(self) -> int:
        return max(self.minimum - self.placed, 0)

    def text(self) -> str:
        return f"part {self.name}: minimum {self.minimum}, {self.placed} placed, {self.members} present"


@dataclass(frozen=True)
class GangState:
    """A pod's workload as admission reads it (the pod alone: `workload.single`).

    With parts (`workload.parts`), each is counted on its own: the gang is admitted once every
    part has its minimum placed (5 workers placed and no leader is not "leader=1,workers=4"), it
    misses the sum of what each part misses, and a member of a part already at its minimum is
    elastic even while the rest of the gang is being placed."""

    workload: Workload
    minimum: int
    members: int  # its pods that exist, gated or not (at creation: with the pod being created)
    placed: int  # members bound, or admitted by a filter whose bind is still to come
    reserved: bool = False  # admitted as a unit: its reservation holds slots for members to place
    reading: bool = False  # its minimum is about to be read from its owner's spec
    parts: tuple[PartState, ...] = ()  # in the order the workload states them
    part: str = ""  # the part of the pod asking

    @property
    def admitted(self) -> bool:
        """Its minimum is placed, or admitted as a unit and being placed: members go pod by pod."""
        return self.workload.single or self.reserved or self.missing == 0

    @property
    def missing(self) -> int:
        """The pods its queue must take at once: those of its minimum (of each part's) not placed."""
        if self.parts:
            return sum(part.missing for part in self.parts)
        return max(self.minimum - self.placed, 0)

    @property
    def elastic(self) -> bool:
        """The asking pod is beyond its part's minimum (a part not stated has none): once the gang
        is admitted it goes pod by pod, on GPUs not held for the gang."""
        if not self.parts:
            return False
        mine = next((part for part in self.parts if part.name == self.part), None)
        return mine is None or mine.missing == 0

    def with_pod_created(self) -> GangState:
        """The gang with the asking pod counted as a member (the gate judges a pod being created,
        not in the picture yet): in the gang, and in its part."""
        parts = tuple(
            replace(part, members=part.members + 1) if part.name == self.part else part for part in self.parts
        )
        return replace(self, members=self.members + 1, parts=parts)

    def missing_request(self, asking: Resources) -> dict[str, float]:
        """What its missing pods ask together: of each part, its missing pods times its member's
        request (`asking`, the asking pod's, for a part with none counted); without parts,
        missing times `asking`. Leader=1 (1 CPU), workers=4 (8 GPUs each), nothing placed: 1
        CPU + 32 GPUs, not 5 times either pod's."""
        total: dict[str, float] = {}
        for part in self.parts or (PartState("", self.minimum, self.members, self.placed, asking),):
            request = part.request or asking
            add_amounts(total, {resource: amount * part.missing for resource, amount in request.items()})
        return total

    def short_parts(self) -> list[PartState]:
        """The parts with fewer pods than their minimum."""
        return [part for part in self.parts if part.members < part.minimum]


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

    def asked(self) -> dict[str, float]:
        """What the pods asked at once ask: the request - of a gang judged whole, its missing
        pods' requests, each part's own (`GangState.missing_request`)."""
        if self.gang is not None and self.whole:
            return self.gang.missing_request(self.request)
        return dict(self.request)

    def total(self) -> dict[str, float]:
        """What the queue is asked for: `ahead` plus `asked`."""
        total = dict(self.ahead)
        add_amounts(total, self.asked())
        return total


def gang_text(gang: GangState, what: str) -> str:
    return (
        f"workload {gang.workload.key} (minimum {gang.minimum} pods, {gang.placed} placed, "
        f"{gang.members} present) {what}"
    )


def unplaced_part_text(gang: GangState, fitting: int) -> str:
    """Which part a gang's plan leaves short when only `fitting` of its missing pods fit: the
    room goes to the parts in their order, and the first part it does not cover is named ("": no
    parts, or all fit). Leader=1, workers=4, nothing placed, room for 4: the leader fits, workers
    get 3 -> "part workers: minimum 4, 0 placed, 4 present; room for 3 of its 4 missing"."""
    for part in gang.parts:
        if fitting < part.missing:
            return f"{part.text()}; room for {fitting} of its {part.missing} missing"
        fitting -= part.missing
    return ""


def short_part_text(gang: GangState) -> str:
    """What a gang with parts waits for its controller to create: each short part's count."""
    return "; ".join(f"{part.text()}: waits for its pods" for part in gang.short_parts())


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
        if gang.short_parts():  # enough pods, but not of each part
            return AdmissionDecision(False, gang_text(gang, short_part_text(gang)), GANG_INCOMPLETE)
        if gang.elastic:  # the gang is admitted by the members of its minimum, not by this one
            mine = next((part.text() for part in gang.parts if part.name == gang.part), f"part {gang.part!r}")
            text = gang_text(
                gang,
                f"is not admitted yet; this pod is above its part's minimum ({mine}): "
                "it goes once the gang is",
            )
            return AdmissionDecision(False, text, GANG_ELASTIC)
    elif gang is not None and gang.reserved and gang.missing > 0 and not gang.elastic:
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
            if ask.gang.elastic:  # above its part's minimum: the gang is judged at the others
                continue
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
