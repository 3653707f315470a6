"""Gang reservations: what admitting a workload's minimum as a unit leaves behind, kept in line
with its members until they are placed.

The filter admits the members a gang still misses at once (`extender.verbs.admit_gang`) and hands
the picture a `GangReservation`: one slot per member still to place, each counted as allocated to
the queue (a ledger entry under the key `<workload>#<i>`, the members' own pending pods counting
nothing meanwhile: the slots stand for them) and holding GPUs on the node the admission planned
for it (an inventory hold owned by the workload, which its own members see as free and every
other pod as taken). This part is the whole lifecycle:

- **placed count**: a member is placed once the picture counts its GPUs as taken (bound, or its
  claims' devices allocated: the scheduler allocates before it binds), or while it is admitted by
  a filter whose bind is still to come or bound before its devices show (`placed`); a gang's
  `GangState` (`state`) counts exactly those, so it follows its members' binds;
- **slots follow the members**: as members are placed, slots go, first those on the nodes the
  members landed on (`remaining_slots`); a slot whose GPUs a pod of another scheduler took under it
  (`default-scheduler` with a claim of Tessera's DeviceClass, or `nvidia.com/gpu` through its
  extended-resource mapping; it sees no holds) moves to a node where its member fits
  (`rehold_slots`);
- **parts**: of a gang with subgroups, each part counts toward its slots no more than its
  minimum (`toward_minimum`): members above it are elastic, so 5 workers placed of
  "leader=1,workers=4" leave the leader's slot held;
- **the end**: the reservation ends when the minimum is placed; when no member was placed for
  `hold_s` (a gang the scheduler cannot complete gives back everything it holds; its placed members
  stay, it is admitted again from there); or at once when a lost slot fits nowhere, rather than
  holding the other slots for a member that cannot land, so the gang is judged again with its true
  count ("3 placed ... GPUs free for 0 of its 1 missing pods") and reclaim can serve it.

The accounting calls `follow` when it recounts pods: with the pods that changed, it brings the
reservations of their gangs (all of them when GPUs changed hands anywhere) in line, and is told
which pending members count as waiting again.

Worked example (nodes a, b with 2 free GPUs each; a gang of 4 one-GPU members admitted whole):
planned nodes [a, a, b, b], 4 slots, 3 counted against the queue (the admitted 4th is the pod
whose filter admitted the gang: it counts by itself). Members bind to a, a, b: slots [b], placed
3; the 4th binds: the reservation ends, no hold is left.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse
from typing import Any

from extender.picture.demands import PodDemands, claim_names
from extender.picture.inventory import GpuInventory
from extender.picture.ledger import Contribution, QueueLedger
from extender.picture.store import ObjectStore
from extender.picture.workloads import WorkloadMap
from extender.policy.admission import GangState, PartState
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.snapshot import occupy
from extender.policy.workloads import Workload, part_of, plan_gang

log = logging.getLogger(__name__)

# How long an admitted gang keeps its reservation without any member being placed.
GANG_HOLD_S = 60.0


@dataclass
class PartSlots:
    """A part's own slots, in a reservation of parts of different shapes (a CPU-only leader and
    8-GPU workers): held with its members' shape, counted with their fairness vector."""

    minimum: int
    demand: GpuDemand | None  # one member's GPU shape (None: no GPU)
    amounts: Mapping[str, float]  # one member's fairness vector
    nodes: list[str]  # the node planned for each of its members still to place when admitted


@dataclass(frozen=True)
class _Slot:
    node: str
    demand: GpuDemand | None
    amounts: Mapping[str, float]
    counted: bool  # stands for a member not admitted yet: counted against the queue


@dataclass
class GangReservation:
    """A workload admitted whole: slots for the members still to place."""

    workload: Workload
    queue: str
    amounts: Mapping[str, float]  # one member's fairness vector
    demand: GpuDemand | None  # one member's GPU shape (None: no GPU)
    preemptible: bool  # its members are (not: its slots count as non-preemptible use)
    nodes: Sequence[str]  # the node planned for each member still to place when admitted
    target: int  # placed members at which the reservation is complete (the minimum)
    # The required topology level and the domain of it the members are kept in ("": none;
    # `extender.policy.topology`): the filter passes them only that domain's nodes.
    level: str = ""
    domain: str = ""
    # Of a gang whose parts ask their own levels (`level` and `domain` are then ""): part -> the
    # (level, domain) it was planned in, and the nodes planned for its members, the only ones
    # the filter passes them (so no part takes GPUs held for another); a part not named: anywhere.
    part_domains: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    part_nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Of a gang whose parts differ in shape: part -> its slots (`demand`, `amounts` and `nodes`
    # above are then the asking pod's and unused); a part not named has none to hold.
    part_slots: Mapping[str, PartSlots] = field(default_factory=dict)
    expires: float = 0.0  # monotonic; renewed whenever a member is placed
    placed: int = 0
    slots: list[str] = field(default_factory=list)  # nodes of the slots held now

    def slot_key(self, index: int) -> str:
        return f"{self.workload.key}#{index}"


def holds_for_itself(gang: GangState) -> bool:
    """Whether the pod of `gang` (its workload's state) asks for itself, not as a member of a gang
    reservation: a pod alone, or an elastic member above its part's minimum (the reservation and
    the gang's GPU holds are for the minimum)."""
    return gang.workload.single or gang.elastic


def split_by_reservation(
    reservation: GangReservation | None,
    names: list[str],
    part: str,
    nodes_in: Callable[[str, str], Collection[str]],
) -> tuple[list[str], dict[str, str]]:
    """The candidates `names` inside the domain a reserved gang's member is kept in - of a gang
    planned by parts, the nodes planned for its part (`part`) - and the others with why
    (`nodes_in(level, domain)`: a topology domain's nodes). Split in C: thousands of names, and
    the per-kind work then runs on the domain's few."""
    if reservation is None:
        return names, {}
    if reservation.part_nodes or reservation.part_domains:
        planned = reservation.part_nodes.get(part)
        level, domain = reservation.part_domains.get(part, ("", ""))
        if planned is not None:
            inside = planned.__contains__
            where = f" in {level} {domain}" if domain else ""
            on = f"on {', '.join(sorted(planned))}{where}"
        elif domain:  # (a part without GPUs, kept in the others' domain: any node of it)
            inside = nodes_in(level, domain).__contains__
            on = f"in {level} {domain}"
        else:  # (a part with nothing missing when the gang was admitted, or without a level)
            return names, {}
        reason = f"part {part} of gang {reservation.workload.key} is placed {on}"
    elif reservation.domain:
        inside = nodes_in(reservation.level, reservation.domain).__contains__
        reason = f"gang {reservation.workload.key} is placed in {reservation.level} {reservation.domain}"
    else:
        return names, {}
    return list(filter(inside, names)), dict.fromkeys(filterfalse(inside, names), reason)


class GangReservations:
    """The reservations of gangs admitted whole, and their members' placed counts."""

    def __init__(
        self,
        store: ObjectStore,
        demands: PodDemands,
        inventory: GpuInventory,
        workloads: WorkloadMap,
        ledger: QueueLedger,
        admitted: Mapping[str, float],
        hold_s: float = GANG_HOLD_S,
    ) -> None:
        """`admitted`: the pods a filter admitted whose bind has not come yet (the accounting's
        reservations of single pods, pod key -> expiry), read as they change."""
        self.store = store
        self.demands = demands
        self.inventory = inventory
        self.workloads = workloads
        self.ledger = ledger
        self.admitted = admitted
        self.hold_s = hold_s
        self._reservations: dict[str, GangReservation] = {}
        self._due: set[str] = set()  # workloads whose reservation may have to follow its members
        self._ended: set[str] = set()  # pending members of reservations that ended, to recount
        self._inventory_seen = -1  # the inventory's version when the reservations were last followed

    # ---- questions ---------------------------------------------------------------------------

    def reserved(self, workload: str) -> bool:
        """The workload is admitted as a unit and its reservation holds slots."""
        return workload in self._reservations

    def reservation(self, workload: str) -> GangReservation | None:
        return self._reservations.get(workload)

    def reserved_workloads(self) -> list[str]:
        return list(self._reservations)

    def state(self, pod: Mapping[str, Any]) -> GangState:
        """The pod's workload as admission reads it: its minimum, members, how many are placed,
        whether it is reserved (as the last `follow` left the reservations)."""
        workload = self.workloads.workload(pod)
        if workload.single:
            return GangState(workload, 1, 1, 0)
        members = self.workloads.members.get(workload.key, set())
        landed, admitted = self.placed(members)
        parts = self._part_states(workload, members) if workload.parts else ()
        return GangState(
            workload,
            self.workloads.minimum(workload),
            len(members),
            len(landed) + admitted,
            workload.key in self._reservations,
            self.workloads.reading(pod, workload),
            parts,
            part_of(pod) if parts else "",
        )

    def placed(self, members: Iterable[str]) -> tuple[list[str], int]:
        """Where a gang's members are: the nodes of those whose GPUs the picture sees taken, and
        how many more are admitted - by a filter whose bind is still to come, or bound before
        their claims' devices show - (they count by themselves already, but their slots keep
        holding GPUs until the picture sees theirs: a gang's GPUs are never free to others in
        between)."""
        landed: list[str] = []
        admitted = 0
        for key in members:
            pod = self.store.get("Pod", key)
            node = self._gpus_node(key, pod) if pod is not None else ""
            if node:
                landed.append(node)
            elif key in self.admitted or (pod is not None and self.inventory.pod_node(key, pod)):
                admitted += 1
        return landed, admitted

    def _by_part(self, members: Iterable[str]) -> dict[str, list[str]]:
        """A gang's members by their part (`part_of`)."""
        by_part: dict[str, list[str]] = {}
        for key in sorted(members):
            pod = self.store.get("Pod", key)
            if pod is not None:
                by_part.setdefault(part_of(pod), []).append(key)
        return by_part

    def _part_states(self, workload: Workload, members: Iterable[str]) -> tuple[PartState, ...]:
        by_part = self._by_part(members)
        states: list[PartState] = []
        for name, minimum in workload.parts:
            keys = by_part.get(name, [])
            landed, admitted = self.placed(keys)
            states.append(PartState(name, minimum, len(keys), len(landed) + admitted, self._request_of(keys)))
        return tuple(states)

    def _request_of(self, keys: Iterable[str]) -> Mapping[str, float]:
        """One member's fairness vector, as its queue counts it (the first counted); {} for none."""
        contributions = self.ledger.contributions
        return next((contributions[key].amounts for key in keys if key in contributions), {})

    def toward_minimum(self, workload: Workload, members: Iterable[str]) -> tuple[list[str], int]:
        """`placed`, counting of each part no more than its minimum: members above it are elastic
        and take no slot (5 workers placed of "leader=1,workers=4" count 4; the leader's slot
        stays held)."""
        if not workload.parts:
            return self.placed(members)
        by_part = self._by_part(members)
        landed: list[str] = []
        admitted = 0
        for name, minimum in workload.parts:
            part_landed, part_admitted = self.placed(by_part.get(name, []))
            kept = part_landed[:minimum]
            landed.extend(kept)
            admitted += min(part_admitted, minimum - len(kept))
        return landed, admitted

    def _gpus_node(self, key: str, pod: Mapping[str, Any]) -> str:
        """The node where the picture counts the pod's GPUs as taken: where it is bound, or where
        its claims' devices are (the scheduler allocates them before it binds); "" when neither."""
        demand = self.demands.of(pod)
        node = self.inventory.pod_node(key, pod)
        if demand.classic_gpus or not demand.gpu_requests:
            return node
        held = self.inventory.held_devices(demand.namespace, claim_names(pod))
        if not held:
            return ""
        return node or held[0][1].node

    # ---- changes -----------------------------------------------------------------------------

    def reserve(self, reservation: GangReservation) -> list[str]:
        """A workload's minimum admitted as a unit: its slots are held from the next `follow`.
        Returns its members, to recount (pending, they count nothing of their own now)."""
        reservation.expires = time.monotonic() + self.hold_s
        workload = reservation.workload.key
        self._reservations[workload] = reservation
        self._due.add(workload)
        return list(self.workloads.members.get(workload, ()))

    def follow(self, recounted: Iterable[str], everything: bool = False) -> set[str]:
        """Bring the reservations in line with their members: those that expired end; those of
        the gangs of the `recounted` pods follow them - all of them when `everything` (the ledger
        was cleared) or when GPUs changed hands somewhere (a slot's may have been taken by a pod
        outside its gang). Returns the pending members of reservations that ended: they count
        as waiting again."""
        now = time.monotonic()
        for workload in [k for k, r in self._reservations.items() if r.expires < now]:
            self._follow(workload, end=True)
        if everything or (self._reservations and self.inventory.version != self._inventory_seen):
            self._due.update(self._reservations)
        else:
            of_pod = self.workloads.of_pod
            self._due.update(of_pod[key] for key in recounted if key in of_pod)
        for workload in self._due:
            self._follow(workload)
        self._due.clear()
        self._inventory_seen = self.inventory.version  # (the holds just made moved it too)
        ended, self._ended = self._ended, set()
        return ended

    def _follow(self, workload: str, end: bool = False) -> None:
        """Bring one reservation's slots (ledger entries and GPU holds) in line with its members."""
        reservation = self._reservations.get(workload)
        if reservation is None:
            return
        members = self.workloads.members.get(workload, set())
        landed, admitted = self.toward_minimum(reservation.workload, members)
        now = time.monotonic()
        placed = len(landed) + admitted
        if placed > reservation.placed:  # progress: the scheduler is completing the gang
            reservation.expires = now + self.hold_s
        reservation.placed = placed
        if end:
            slots: list[_Slot] | None = []
        elif reservation.part_slots:
            slots = self._part_slots(reservation, members)
        else:
            slots = self._whole_slots(reservation, landed, placed)
        if slots is None:
            # Slots whose GPUs a pod of another scheduler took fit nowhere now: the reservation
            # ends now, not when it expires, and the gang is judged again.
            log.info("gang %s: GPUs held for its members were taken by others; judged again", workload)
            slots = []
        for index in range(len(reservation.slots)):
            self.ledger.put(reservation.slot_key(index), None)
            self.inventory.release_hold(reservation.slot_key(index))
        reservation.slots = [slot.node for slot in slots]
        if not slots:
            del self._reservations[workload]
            self._ended.update(members)
            return
        for index, slot in enumerate(slots):
            key = reservation.slot_key(index)
            if slot.counted:
                self.ledger.put(
                    key,
                    Contribution(
                        reservation.queue, "allocated", slot.amounts, preemptible=reservation.preemptible
                    ),
                )
            if slot.node and slot.demand is not None:
                self.inventory.hold(key, slot.node, slot.demand, reservation.expires - now, owner=workload)

    def _whole_slots(
        self, reservation: GangReservation, landed: list[str], placed: int
    ) -> list[_Slot] | None:
        """The slots of a gang whose members are alike: the planned nodes no member landed on, up to
        the minimum; those beyond the placed-or-admitted count are counted against the queue."""
        nodes = remaining_slots(reservation.nodes, landed, reservation.target - len(landed))
        held = self._reheld(reservation, nodes, reservation.demand)
        if held is None:
            return None
        if held != nodes:
            reservation.nodes = [*landed, *held]  # the plan its next members follow
        counted = max(reservation.target - placed, 0)  # slots not standing for an admitted member
        return [
            _Slot(node, reservation.demand, reservation.amounts, i < counted) for i, node in enumerate(held)
        ]

    def _part_slots(self, reservation: GangReservation, members: Iterable[str]) -> list[_Slot] | None:
        """The slots of a gang of parts of different shapes, part by part as `_whole_slots`: a
        member takes a slot of its own part only, each part counting up to its minimum."""
        by_part = self._by_part(members)
        slots: list[_Slot] = []
        for name, part in reservation.part_slots.items():
            landed, admitted = self.placed(by_part.get(name, []))
            landed = landed[: part.minimum]
            nodes = remaining_slots(part.nodes, landed, part.minimum - len(landed))
            held = self._reheld(reservation, nodes, part.demand)
            if held is None:
                return None
            if held != nodes:
                part.nodes = [*landed, *held]
            counted = max(part.minimum - len(landed) - admitted, 0)
            slots += [_Slot(node, part.demand, part.amounts, i < counted) for i, node in enumerate(held)]
        return slots

    def _reheld(
        self, reservation: GangReservation, nodes: list[str], demand: GpuDemand | None
    ) -> list[str] | None:
        """`nodes` once slots of shape `demand` whose GPUs were taken under them moved (`rehold_slots`)."""
        if not nodes or demand is None:
            return nodes
        workload = reservation.workload.key
        return rehold_slots(
            nodes,
            demand,
            self.inventory.node_gpus,
            lambda node: self.inventory.supply_for("", node, workload),
            self.store.kind("Node"),
        )


def remaining_slots(planned: Iterable[str], landed: Iterable[str], count: int) -> list[str]:
    """The planned nodes still held once members landed on `landed`: a member that landed on a
    planned node takes that slot; the rest are cut from the end, down to `count`."""
    taken = Counter(landed)
    left: list[str] = []
    for node in planned:
        if taken[node] > 0:
            taken[node] -= 1
        else:
            left.append(node)
    return left[: max(count, 0)]


_NO_MIX = WorkloadMix(demands=())


def rehold_slots(
    slots: Sequence[str],
    demand: GpuDemand,
    free_of: Callable[[str], NodeGpus],
    spare_of: Callable[[str], NodeGpus],
    nodes: Iterable[str],
) -> list[str] | None:
    """The slots' nodes once those whose GPUs were taken under them are moved to nodes with room
    (binpack, `plan_gang`); None when they cannot all be held any more. `free_of(node)`: the GPUs
    no pod takes there (holds aside: a slot is lost to pods, not to holds made after it);
    `spare_of(node)`: those not held for others either, where a lost slot may go.

    Slots on a, a, b, b; a pod of another scheduler took one of b's two GPUs; c has 2 free:
    a and a still fit, one b fits, the other b moves to c -> [a, a, b, c]. No room anywhere -> None.
    """
    free: dict[str, NodeGpus] = {}
    kept: list[str] = []
    lost = 0
    for node in slots:
        if not node:  # (a member without GPUs holds nothing)
            kept.append(node)
            continue
        after = occupy(free.get(node) or free_of(node), demand, _NO_MIX)
        if after is None:
            lost += 1
        else:
            free[node] = after[0]
            kept.append(node)
    if not lost:
        return list(slots)
    spare = {node: spare_of(node) for node in nodes}
    for node in kept:  # the kept slots' GPUs are not spare
        after = occupy(spare[node], demand, _NO_MIX) if node in spare else None
        if after is not None:
            spare[node] = after[0]
    moved = plan_gang(list(spare.values()), demand, lost)
    return kept + moved if len(moved) == lost else None
