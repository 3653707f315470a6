"""Workloads in the picture: which pods belong together, and the reservations of admitted gangs.

`WorkloadMap` keeps, per workload (`extender.policy.workloads.workload_of`), the pods that belong
to it, so a filter call learns in O(members) how many of a gang are placed. Batch Jobs are
watched, so an indexed Job's minimum is its spec's. The other owners whose spec states a minimum
(PodGroup, JobSet, the Kubeflow jobs, RayCluster) are custom resources that may not be installed:
the map lists those its gangs name (`wanted`), `extender.controllers.owners` reads each once, and
they are kept while the workload has members. Until one is read - or where it cannot be: CRD not
installed, no permission - the minimum comes from the pod, as the table says.

A **gang reservation** is what admitting a workload's minimum as a unit leaves behind: one slot per
member still to place, each counted as allocated to the queue (in the ledger, under the key
`<workload>#<i>`) and holding GPUs on the node the admission planned for it (an inventory hold
owned by the workload, which its own members see as free and every other pod as taken). As
members are placed (bound, assumed bound, or admitted by a filter whose bind is coming) slots go:
first those on the nodes the members landed on. The reservation ends when the minimum is placed,
or when no member was placed for `hold_s` (a gang the scheduler cannot complete gives back
everything it holds; its placed members stay, it is admitted again from there).

A slot's GPUs can be taken under it: a pod of another scheduler (`default-scheduler` with a claim
of Tessera's DeviceClass, or `nvidia.com/gpu` through its extended-resource mapping) sees no
holds. Such a slot moves to a node where its member fits (`rehold_slots`); when none has room the
reservation ends at once rather than holding the other slots for a member that cannot land, so
the gang is judged again with its true count ("3 placed ... GPUs free for 0 of its 1 missing
pods") and reclaim can serve it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract.kube import mapping, meta, object_key
from extender.picture.demands import is_terminal
from extender.picture.store import ObjectStore, Stored
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.snapshot import occupy
from extender.policy.workloads import JOBSET_LABEL, Workload, plan_gang, workload_of

# How long an admitted gang keeps its reservation without any member being placed.
GANG_HOLD_S = 60.0
# Owner kinds the picture watches (the others are read one by one: `wanted`, `owners`).
WATCHED_OWNERS = frozenset({"Job"})
# An owner that could not be read is asked for again after this long.
UNREADABLE_RETRY_S = 60.0
OwnerRef = tuple[str, str, str]  # (apiVersion, kind, namespace/name)


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
    expires: float = 0.0  # monotonic; renewed whenever a member is placed
    placed: int = 0
    slots: list[str] = field(default_factory=list)  # nodes of the slots held now

    def slot_key(self, index: int) -> str:
        return f"{self.workload.key}#{index}"


class WorkloadMap:
    def __init__(self, store: ObjectStore, hold_s: float = GANG_HOLD_S) -> None:
        self.store = store
        self.hold_s = hold_s
        self.of_pod: dict[str, str] = {}  # pod key -> workload key (pods of gangs only)
        self.members: dict[str, set[str]] = {}
        self.reservations: dict[str, GangReservation] = {}
        # Owner objects read for their spec, by (kind, namespace/name); those to read; those that
        # could not be read, until when; the owner of each gang workload that names one.
        self.owners: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.wanted: set[OwnerRef] = set()
        self.unreadable: dict[OwnerRef, float] = {}
        self._owner_of: dict[str, OwnerRef] = {}
        # The workload of each stored pod as last found (with the object it was found for),
        # while no owner changed: the planners ask for every waiting pod's each cycle.
        self._found: dict[str, tuple[Mapping[str, Any], Workload]] = {}
        store.subscribe("Pod", self._pod_changed, self._relisted)
        store.subscribe("Job", lambda *_: self._found.clear(), lambda _: self._found.clear())

    def workload(self, pod: Mapping[str, Any]) -> Workload:
        key = object_key(pod)
        found = self._found.get(key)
        if found is not None and found[0] is pod:
            return found[1]
        workload = workload_of(pod, self._lookup, self._owned)
        if self.store.get("Pod", key) is pod:  # a pod from a request is not kept
            self._found[key] = pod, workload
        return workload

    def minimum(self, workload: Workload) -> int:
        if workload.minimum is not None:
            return workload.minimum
        return max(len(self.members.get(workload.key, ())), 1)

    def workload_key(self, pod_key: str) -> str:
        return self.of_pod.get(pod_key, "")

    def reserve(self, reservation: GangReservation) -> None:
        reservation.expires = time.monotonic() + self.hold_s
        self.reservations[reservation.workload.key] = reservation

    def expired(self) -> list[str]:
        now = time.monotonic()
        return [key for key, r in self.reservations.items() if r.expires < now]

    def owner_ref(self, pod: Mapping[str, Any], workload: Workload) -> OwnerRef | None:
        """The custom resource to read for the workload's minimum (None: none, or it is watched)."""
        if workload.spec is None or workload.kind in WATCHED_OWNERS or workload.rule == "annotation":
            return None
        api_version, kind, name = workload.spec
        return (api_version, kind, f"{meta(pod).get('namespace')}/{name}")

    def reading(self, pod: Mapping[str, Any], workload: Workload) -> bool:
        """The workload's minimum is about to come from its owner's spec, not read yet."""
        ref = self.owner_ref(pod, workload) if workload.minimum is None else None
        return ref is not None and ref in self.wanted

    def read(self, ref: OwnerRef, obj: Mapping[str, Any] | None) -> None:
        """What reading an owner gave (None: it could not be read; asked for again later)."""
        self.wanted.discard(ref)
        if obj is None:
            self.unreadable[ref] = time.monotonic() + UNREADABLE_RETRY_S
        elif ref in self._owner_of.values():  # a gang still names it
            self.unreadable.pop(ref, None)
            self.owners[ref[1], ref[2]] = obj
            self._found.clear()

    def _lookup(self, kind: str, key: str) -> Mapping[str, Any] | None:
        return self.store.get(kind, key) if kind in WATCHED_OWNERS else self.owners.get((kind, key))

    def _owned(self, kind: str, key: str) -> Sequence[Mapping[str, Any]]:
        """A JobSet's Jobs (they carry its name as a label, like its pods)."""
        if kind != "JobSet":
            return ()
        namespace, _, name = key.partition("/")
        return [
            job
            for job in self.store.kind("Job").values()
            if meta(job).get("namespace") == namespace
            and mapping(meta(job).get("labels")).get(JOBSET_LABEL) == name
        ]

    def _pod_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self._found.pop(key, None)
        previous = self.of_pod.pop(key, "")
        if previous:
            members = self.members.get(previous)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.members[previous]
                    owner = self._owner_of.pop(previous, None)
                    if owner is not None:  # no member left: its owner's spec is not needed
                        self.owners.pop((owner[1], owner[2]), None)
                        self.wanted.discard(owner)
                        self._found.clear()
        if new is None or is_terminal(new):
            return
        workload = self.workload(new)
        if not workload.single:
            self.of_pod[key] = workload.key
            self.members.setdefault(workload.key, set()).add(key)
            ref = self.owner_ref(new, workload)
            if ref is not None:
                self._owner_of[workload.key] = ref
                if (ref[1], ref[2]) not in self.owners and self.unreadable.get(ref, 0.0) <= time.monotonic():
                    self.wanted.add(ref)

    def _relisted(self, keys: set[str]) -> None:
        for key in [k for k in self.of_pod if k not in keys]:
            self._pod_changed(key, None, None)
        self._found = {key: found for key, found in self._found.items() if key in keys}


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
