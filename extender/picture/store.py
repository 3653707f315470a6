"""The object store: every watched Kubernetes object, by kind and key, projected to what Tessera reads.

Projection. The picture holds every pod, node, slice and claim of the cluster (100,000 pods at
5000 nodes), so an object is stored as the fields some part of the extender reads, not as the
API sent it: `PROJECTIONS` lists them per kind, one table (docs/extender.md, "The picture's
projection"). A field missing from the table is invisible to every reader of the picture - a new
reader adds its fields there (a unit test checks that each field it needs survives). Strings
short enough to repeat across objects (namespaces, node names, phases, label values, quantities)
are interned as they are copied, so 100,000 pods share one copy of each. What is dropped is mostly
`managedFields`, container images, commands, environment, volumes, probes and per-container
status: the bulk of a real object.

It knows nothing of GPUs or queues. It orders updates by resourceVersion (an older version never
overwrites a newer one), remembers which kinds have been listed (`synced`), and tells each
subscriber of a kind what changed: `(key, old, new)`, `old` None for an addition, `new` None for
a removal. A fresh list (`replace`) is announced object by object, then as a whole to the kind's
relist subscribers, so every derived index is kept in step by the part that owns it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

import msgspec

from contract.kube import meta, object_key
from extender.kubeapi import JsonObject

Change = Callable[[str, JsonObject | None, JsonObject | None], None]  # key, old, new
Relisted = Callable[[set[str]], None]  # the keys of the fresh list


# What is kept of an object: for each field, KEEP (the whole value), SHARE (the whole value, one
# copy for all objects where it is the same: labels of replicas, resources of containers from one
# template, tolerations, a device's capacity) or the fields kept of its value (of each element
# when it is a list of objects).
KEEP, SHARE = "keep", "share"
Keep = Mapping[str, Union[str, "Keep"]]

METADATA: Keep = {
    **dict.fromkeys(
        (
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
        ),
        KEEP,
    ),
    **dict.fromkeys(("labels", "annotations", "ownerReferences", "finalizers"), SHARE),
}
_CONTAINER: Keep = {"name": SHARE, "resources": SHARE, "restartPolicy": SHARE}
_CONDITION: Keep = {"type": KEEP, "status": KEEP, "reason": KEEP, "message": KEEP, "lastTransitionTime": KEEP}

_TYPE: Keep = {"apiVersion": KEEP, "kind": KEEP}

PROJECTIONS: dict[str, Keep] = {
    "Pod": {
        **_TYPE,
        "metadata": METADATA,
        "spec": {
            **dict.fromkeys(("nodeName", "schedulerName", "priority", "priorityClassName"), KEEP),
            **dict.fromkeys(
                (
                    "preemptionPolicy",
                    "resourceClaims",
                    "resources",  # pod-level resources
                    "overhead",
                    "tolerations",
                    "nodeSelector",
                    "affinity",
                    "schedulingGroup",  # the gang's PodGroup (extender.policy.workloads)
                    "schedulingGates",  # the admission gate (extender.controllers.gates)
                ),
                SHARE,
            ),
            "containers": _CONTAINER,
            "initContainers": _CONTAINER,
        },
        "status": {
            **dict.fromkeys(("phase", "nominatedNodeName", "startTime", "qosClass"), KEEP),
            "resourceClaimStatuses": SHARE,
            "conditions": _CONDITION,
        },
    },
    "Node": {
        **_TYPE,
        "metadata": METADATA,
        "spec": {"unschedulable": KEEP, "taints": SHARE},
        "status": {"allocatable": SHARE, "capacity": SHARE},
    },
    "ResourceSlice": {**_TYPE, "metadata": METADATA, "spec": SHARE},
    "ResourceClaim": {
        **_TYPE,
        "metadata": METADATA,
        "spec": SHARE,
        "status": {"allocation": SHARE, "reservedFor": SHARE},
    },
    "ResourceClaimTemplate": {**_TYPE, "metadata": METADATA, "spec": KEEP},
    "DeviceClass": {**_TYPE, "metadata": METADATA, "spec": KEEP},
    "Queue": {**_TYPE, "metadata": METADATA, "spec": KEEP, "status": KEEP},
}

# Strings up to this length are interned: names, namespaces, phases, quantities, label values.
_INTERNED_LENGTH = 64
# Shared values are found by their JSON; values larger than this are rarely repeated.
_SHARED_BYTES = 1024
# Distinct values remembered for sharing; past this the table starts over (values already shared
# stay shared), so unique values cost a bounded amount.
_SHARED_LIMIT = 16384
_intern = sys.intern
_encode = msgspec.json.encode


class _Shared:
    """Hash-consing of JSON values: one object per distinct value (stored objects are never mutated)."""

    def __init__(self) -> None:
        self.table: dict[bytes, Any] = {}

    def copy(self, value: Any) -> Any:
        """`value` with each dict and list inside replaced by the shared copy of an equal one."""
        if isinstance(value, str):
            return _intern(value) if len(value) <= _INTERNED_LENGTH else value
        if isinstance(value, dict):
            value = {_intern(k): self.copy(v) for k, v in value.items()}
        elif isinstance(value, list):
            value = [self.copy(v) for v in value]
        else:
            return value
        key = _encode(value)
        if len(key) > _SHARED_BYTES:
            return value
        shared = self.table.get(key)
        if shared is None:
            if len(self.table) >= _SHARED_LIMIT:
                self.table.clear()
            shared = self.table[key] = value
        return shared


_SHARED = _Shared()


def _copy(value: Any) -> Any:
    """A kept value, with its short strings (keys and values) interned."""
    if isinstance(value, str):
        return _intern(value) if len(value) <= _INTERNED_LENGTH else value
    if isinstance(value, dict):
        return {_intern(k): _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _keep(value: Any, keep: Keep) -> Any:
    if isinstance(value, list):
        return [_keep(v, keep) for v in value]
    if not isinstance(value, dict):
        return _copy(value)
    kept = {}
    for field, inner in keep.items():
        if field in value:
            if inner == KEEP:
                kept[field] = _copy(value[field])
            elif inner == SHARE:
                kept[field] = _SHARED.copy(value[field])
            else:
                kept[field] = _keep(value[field], inner)  # type: ignore[arg-type]
    return kept


def project(kind: str, obj: JsonObject) -> JsonObject:
    """The fields of `obj` that the picture keeps (`PROJECTIONS`); the whole object for other kinds."""
    keep = PROJECTIONS.get(kind)
    if keep is None:
        return obj
    projected: JsonObject = _keep(obj, keep)
    return projected


def resource_version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(meta(obj).get("resourceVersion", ""))
    except ValueError:
        return None


class ObjectStore:
    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = tuple(kinds)
        self.objects: dict[str, dict[str, JsonObject]] = {kind: {} for kind in self.kinds}
        self.synced: set[str] = set()
        self._on_change: dict[str, list[Change]] = {kind: [] for kind in self.kinds}
        self._on_relist: dict[str, list[Relisted]] = {kind: [] for kind in self.kinds}

    def subscribe(self, kind: str, on_change: Change, on_relist: Relisted | None = None) -> None:
        self._on_change[kind].append(on_change)
        if on_relist is not None:
            self._on_relist[kind].append(on_relist)

    def kind(self, kind: str) -> dict[str, JsonObject]:
        return self.objects[kind]

    def get(self, kind: str, key: str) -> JsonObject | None:
        return self.objects[kind].get(key)

    def ready(self) -> bool:
        return len(self.synced) == len(self.kinds)

    def apply(self, kind: str, event_type: str, obj: JsonObject) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED); False when it was older than what is held."""
        obj = project(kind, obj)
        key = object_key(obj)
        store = self.objects[kind]
        old = store.get(key)
        if event_type == "DELETED":
            if old is None:
                return True
            del store[key]
            self._announce(kind, key, old, None)
            return True
        if old is not None:
            old_rv, new_rv = resource_version(old), resource_version(obj)
            if old_rv is not None and new_rv is not None and new_rv < old_rv:
                return False
        store[key] = obj
        self._announce(kind, key, old, obj)
        return True

    def replace(self, kind: str, items: Iterable[JsonObject], projected: bool = False) -> None:
        """A fresh list of a kind (first sync or relist after 410): what is gone is dropped.

        `projected`: the items are `project`ed already (the watcher does it page by page, so a
        list of 100,000 whole pods is never held at once).
        """
        if not projected:
            items = (project(kind, obj) for obj in items)
        fresh = {object_key(obj): obj for obj in items}
        store = self.objects[kind]
        for key, old in list(store.items()):
            del store[key]
            self._announce(kind, key, old, None)
        for key, obj in fresh.items():
            store[key] = obj
            self._announce(kind, key, None, obj)
        self.synced.add(kind)
        keys = set(fresh)
        for relisted in self._on_relist[kind]:
            relisted(keys)

    def _announce(self, kind: str, key: str, old: JsonObject | None, new: JsonObject | None) -> None:
        for on_change in self._on_change[kind]:
            on_change(key, old, new)
