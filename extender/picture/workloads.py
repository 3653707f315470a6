"""Workloads in the picture: which pods belong together.

`WorkloadMap` keeps, per workload (`extender.policy.workloads.workload_of`), the pods that belong
to it, so a filter call learns in O(members) how many of a gang are placed. Batch Jobs are
watched, so an indexed Job's minimum is its spec's. The other owners whose spec states a minimum
(PodGroup, JobSet, the Kubeflow jobs, RayCluster) are custom resources that may not be installed:
the map lists those its gangs name (`wanted`), `extender.controllers.owners` reads each once, and
they are kept while the workload has members. Until one is read - or where it cannot be: CRD not
installed, no permission - the minimum comes from the pod, as the table says.

A gang's reservation (what admitting it whole leaves behind) is kept by `extender.picture.gangs`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from contract.kube import mapping, meta, object_key
from extender.picture.demands import is_terminal
from extender.picture.store import ObjectStore, Stored
from extender.policy.workloads import JOBSET_LABEL, Workload, workload_of

# Owner kinds the picture watches (the others are read one by one: `wanted`, `owners`).
WATCHED_OWNERS = frozenset({"Job"})
# An owner that could not be read is asked for again after this long.
UNREADABLE_RETRY_S = 60.0
OwnerRef = tuple[str, str, str]  # (apiVersion, kind, namespace/name)


class WorkloadMap:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.of_pod: dict[str, str] = {}  # pod key -> workload key (pods of gangs only)
        self.members: dict[str, set[str]] = {}
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
