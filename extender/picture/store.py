"""The object store: every watched Kubernetes object, by kind and key, projected to what Tessera reads.

Projection. The picture holds every pod, node, slice and claim of the cluster (100,000 pods at
5000 nodes), so an object is stored as the fields some part of the extender reads, not as the
API sent it: `PROJECTIONS` lists them per kind, one table (docs/extender.md, "The picture's
projection"). A field missing from the table is invisible to every reader of the picture - a new
reader adds its fields there (a unit test checks that each field it needs survives). Strings
short enough to repeat across objects (namespaces, node names, phases, label values, quantities)
are interned as they are copied, so 100,000 pods share one copy of each; those of an object alone
(`OWN`: its name, uid, version, timestamps) are not, as an interned string costs an entry in the
interpreter's table besides itself. What is dropped is mostly `managedFields`, container images,
commands, environment, volumes, probes and per-container status: the bulk of a real object.

Records. Each level of the table (an object, its metadata, spec and status, a container, a
condition) is stored as a `Record`: a read-only mapping with one slot per field of the level, so
readers keep reading `obj["spec"]`, `obj.get("metadata")` and `mapping(...)` as they would a dict,
at a third of a small dict's bytes (a dict of up to 5 keys takes 184 bytes, of 6 to 10 272; a
record 32 plus 8 a field). A record whose level holds nothing of the object's own (a container, a
pod's spec or status, a condition) is shared by every object where it is equal, found by its
values (values are shared or interned already, so by their identity), like lists of them.

It knows nothing of GPUs or queues. It orders updates by resourceVersion (an older version never
overwrites a newer one), remembers which kinds have been listed (`synced`), and tells each
subscriber of a kind what changed: `(key, old, new)`, `old` None for an addition, `new` None for
a removal. A fresh list (`replace`) is announced object by object, then as a whole to the kind's
relist subscribers, so every derived index is kept in step by the part that owns it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Union

import msgspec

from contract.kube import meta, object_key
from contract.names import DEVICE_TYPE_ATTRIBUTE, MODEL_ATTRIBUTE
from extender.memo import remembered

# A stored object: a `Record` for the kinds of `PROJECTIONS`, the JSON object for the others.
Stored = Mapping[str, Any]
Change = Callable[[str, Stored | None, Stored | None], None]  # key, old, new
Relisted = Callable[[set[str]], None]  # the keys of the fresh list


# What is kept of an object: for each field, KEEP (the whole value), SHARE (the whole value, one
# copy for all objects where it is the same: labels of replicas, resources of containers from one
# template, tolerations, a device's capacity) or the fields kept of its value (of each element
# when it is a list of objects); OWN: the value as it came, for values of one object alone (not
# interned); `Entries`: some entries of a map.
KEEP, SHARE, OWN = "keep", "share", "own"


@dataclass(frozen=True)
class Entries:
    """The entries of a map whose name, bare or qualified with a domain (`<domain>/<name>`), is one
    of `names` (a device's attributes: those the inventory reads, not its serial numbers); the map
    kept is shared like a SHARE value."""

    names: frozenset[str]

    def of(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return _SHARED.copy(value)
        return _SHARED.copy({k: v for k, v in value.items() if k.rpartition("/")[2] in self.names})


Keep = Mapping[str, Union[str, Entries, "Keep"]]

METADATA: Keep = {
    **dict.fromkeys(("name", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"), OWN),
    **dict.fromkeys(("namespace", "generation"), KEEP),
    **dict.fromkeys(("labels", "annotations", "ownerReferences", "finalizers"), SHARE),
}
# A claim's owner is its pod, different for every claim: nothing reads it, and sharing values that
# never repeat would only churn the table of shared values.
_CLAIM_METADATA: Keep = {field: how for field, how in METADATA.items() if field != "ownerReferences"}
_CONTAINER: Keep = {"name": SHARE, "resources": SHARE, "restartPolicy": SHARE}
# A pod's claim: by name (its own claim), by template, or the claim generated from a template.
_CLAIM_REF: Keep = {"name": KEEP, "resourceClaimName": OWN, "resourceClaimTemplateName": KEEP}
_CONDITION: Keep = {"type": KEEP, "status": KEEP, "reason": KEEP, "message": KEEP, "lastTransitionTime": KEEP}

_TYPE: Keep = {"apiVersion": KEEP, "kind": KEEP}
_RESULT: Keep = {**dict.fromkeys(("request", "driver", "pool", "device"), KEEP), "consumedCapacity": SHARE}

PROJECTIONS: dict[str, Keep] = {
    "Pod": {
        **_TYPE,
        "metadata": METADATA,
        "spec": {
            **dict.fromkeys(("nodeName", "schedulerName", "priority", "priorityClassName"), KEEP),
            **dict.fromkeys(
                (
                    "preemptionPolicy",
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
            "resourceClaims": _CLAIM_REF,  # contract.kube.pod_claim_refs
        },
        "status": {
            **dict.fromkeys(("phase", "nominatedNodeName", "startTime", "qosClass"), KEEP),
            "resourceClaimStatuses": _CLAIM_REF,
            # The claim kube-scheduler made for the pod's nvidia.com/gpu (extender.picture.demands).
            "extendedResourceClaimStatus": {"resourceClaimName": OWN},
            "conditions": _CONDITION,
        },
    },
    "Node": {
        **_TYPE,
        "metadata": METADATA,
        "spec": {"unschedulable": KEEP, "taints": SHARE},
        "status": {"allocatable": SHARE, "capacity": SHARE},
    },
    "ResourceSlice": {
        **_TYPE,
        "metadata": METADATA,
        "spec": {
            **dict.fromkeys(("driver", "nodeName", "allNodes", "perDeviceNodeSelection"), KEEP),
            **dict.fromkeys(("pool", "nodeSelector"), SHARE),
            # What extender.picture.inventory reads of a device.
            "devices": {
                "name": KEEP,
                "attributes": Entries(frozenset({DEVICE_TYPE_ATTRIBUTE, MODEL_ATTRIBUTE, "profile"})),
                "capacity": SHARE,
                # A MIG placement's counter set and compute slices (partitionable devices).
                "consumesCounters": SHARE,
            },
        },
    },
    "ResourceClaim": {
        **_TYPE,
        "metadata": _CLAIM_METADATA,
        "spec": SHARE,
        "status": {
            # The devices it holds (extender.claims.allocated_devices) and the pods sharing them.
            "allocation": {"devices": {"results": _RESULT}},
            "reservedFor": {"resource": KEEP, "apiGroup": KEEP, "name": OWN, "uid": OWN},
        },
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
_SHARED_LIMIT = 4096
# Distinct records (and lists of records) remembered for sharing; past this the table starts over.
_RECORDS_LIMIT = 16384
# Record classes per level of a projection (one per set of fields present; see `_Level`).
_CLASSES_LIMIT = 32
_intern = sys.intern
_encode = msgspec.json.encode


class _Shared:
    """Hash-consing of JSON values: one object per distinct value (stored objects are never mutated)."""

    def __init__(self) -> None:
        self.table: dict[bytes, Any] = {}

    def copy(self, value: Any) -> Any:
        """`value` with each dict and list inside replaced by the shared copy of an equal one.

        A value is looked up by its JSON before it is copied: one seen before (the labels of
        replicas, the resources of containers from one template) costs one encoding, no walk.
        """
        if isinstance(value, str):
            return _intern(value) if len(value) <= _INTERNED_LENGTH else value
        if not isinstance(value, dict | list):
            return value
        key = _encode(value)
        if len(key) > _SHARED_BYTES:
            return self._copy_inside(value)
        return remembered(self.table, key, _SHARED_LIMIT, lambda: self._copy_inside(value))

    def _copy_inside(self, value: dict[str, Any] | list[Any]) -> Any:
        if isinstance(value, dict):
            return {_intern(k): self.copy(v) for k, v in value.items()}
        return [self.copy(v) for v in value]


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


_ABSENT: Any = object()  # the value of a record's slot for a field the object does not have


class Record(Mapping[str, Any]):
    """One projected level of a stored object: a read-only mapping of the fields present.

    Subclassed per level of `PROJECTIONS` and set of fields present (`_Level.record_class`), with
    a slot per field.
    """

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _getters: dict[str, Callable[[Any], Any]] = {}
    # The class of every field of its level, which may hold `_ABSENT` (the others hold only fields present).
    _sparse = False

    def __getitem__(self, key: str) -> Any:
        getter = self._getters.get(key)
        value = _ABSENT if getter is None else getter(self)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        getter = self._getters.get(key)
        value = _ABSENT if getter is None else getter(self)
        return default if value is _ABSENT else value

    def __contains__(self, key: object) -> bool:
        getter = self._getters.get(key) if isinstance(key, str) else None
        return getter is not None and getter(self) is not _ABSENT

    def __iter__(self) -> Iterator[str]:
        if not self._sparse:
            return iter(self._fields)
        return (field for field in self._fields if self._getters[field](self) is not _ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self) if self._sparse else len(self._fields)

    def __repr__(self) -> str:
        return repr(dict(self))


Setter = Callable[[Any, Any], None]


class _Level:
    """How one level of a projection is stored: its record classes.

    A record class has a slot for each field present, so there is one class per set of fields
    present (a few per level in practice); past `_CLASSES_LIMIT` of them the level's class with
    every field takes the rest, absent fields holding `_ABSENT`.
    """

    def __init__(self, keep: Keep, name: str) -> None:
        self.name = name
        self.fields = tuple(keep)
        self.classes: dict[tuple[str, ...], tuple[type[Record], list[Setter]]] = {}
        self.record_class(self.fields)
        self.inner: dict[str, _Level | Entries | str] = {
            field: _Level(inner, f"{name}.{field}") if isinstance(inner, Mapping) else inner
            for field, inner in keep.items()
        }

    def record_class(self, fields: tuple[str, ...]) -> tuple[type[Record], list[Setter]]:
        """The record class for these fields present, and its slots' setters."""
        found = self.classes.get(fields)
        if found is None:
            if len(self.classes) >= _CLASSES_LIMIT:
                return self.classes[self.fields]
            slots = tuple(f"f{i}" for i in range(len(fields)))
            namespace = {"__slots__": slots, "_fields": fields, "_sparse": fields == self.fields}
            record: type[Record] = type(f"Record[{self.name}]", (Record,), namespace)
            record._getters = dict(zip(fields, map(attrgetter, slots), strict=True))
            found = self.classes[fields] = record, [getattr(record, slot).__set__ for slot in slots]
        return found


class _Records:
    """Hash-consing of records (and lists of records) whose values are shared already."""

    def __init__(self) -> None:
        self.table: dict[tuple[object, ...], Any] = {}

    def share(self, value: Any, values: Iterable[Any]) -> Any:
        # Values are compared by identity (they are interned or shared); other scalars by value
        # and type (True and 1 are equal in Python, not in JSON).
        key = (type(value), *(v if type(v) is str else (type(v), v) if _scalar(v) else id(v) for v in values))
        return remembered(self.table, key, _RECORDS_LIMIT, lambda: value)


def _scalar(value: Any) -> bool:
    return value is None or type(value) in (int, float, bool)


_RECORDS = _Records()


def _keep(value: Any, level: _Level) -> tuple[Any, bool]:
    """The kept value, and whether it holds nothing of its object's own (`OWN` values), so that an
    equal one of another object is the same: such records and lists of them are shared."""
    if isinstance(value, list):
        items = [_keep(v, level) for v in value]
        kept_items = [item for item, _ in items]
        if all(shareable for _, shareable in items):
            return _RECORDS.share(kept_items, kept_items), True
        return kept_items, False
    if not isinstance(value, dict):
        return _copy(value), True
    kept: dict[str, Any] = {}
    shareable = True
    for field, inner in level.inner.items():
        if field in value:
            if isinstance(inner, _Level):
                kept[field], inner_shareable = _keep(value[field], inner)
                shareable = shareable and inner_shareable
            elif isinstance(inner, Entries):
                kept[field] = inner.of(value[field])
            elif inner == OWN:
                kept[field] = value[field]
                shareable = False
            elif inner == KEEP:
                kept[field] = _copy(value[field])
            else:
                kept[field] = _SHARED.copy(value[field])
    record_class, setters = level.record_class(tuple(kept))
    record = object.__new__(record_class)
    values = [kept.get(field, _ABSENT) for field in record_class._fields]
    for set_value, field_value in zip(setters, values, strict=True):
        set_value(record, field_value)
    if shareable:
        return _RECORDS.share(record, values), True
    return record, False


_LEVELS = {kind: _Level(keep, kind) for kind, keep in PROJECTIONS.items()}


def project(kind: str, obj: Mapping[str, Any]) -> Stored:
    """The fields of `obj` that the picture keeps (`PROJECTIONS`), as records; the whole object
    for other kinds."""
    level = _LEVELS.get(kind)
    if level is None:
        return obj
    projected: Stored = _keep(obj, level)[0]
    return projected


def resource_version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(meta(obj).get("resourceVersion", ""))
    except ValueError:
        return None


class ObjectStore:
    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = tuple(kinds)
        self.objects: dict[str, dict[str, Stored]] = {kind: {} for kind in self.kinds}
        self.synced: set[str] = set()
        self._on_change: dict[str, list[Change]] = {kind: [] for kind in self.kinds}
        self._on_relist: dict[str, list[Relisted]] = {kind: [] for kind in self.kinds}

    def subscribe(self, kind: str, on_change: Change, on_relist: Relisted | None = None) -> None:
        self._on_change[kind].append(on_change)
        if on_relist is not None:
            self._on_relist[kind].append(on_relist)

    def kind(self, kind: str) -> dict[str, Stored]:
        return self.objects[kind]

    def get(self, kind: str, key: str) -> Stored | None:
        return self.objects[kind].get(key)

    def ready(self) -> bool:
        return len(self.synced) == len(self.kinds)

    def apply(self, kind: str, event_type: str, event_obj: Mapping[str, Any]) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED); False when it was older than what is held."""
        obj = project(kind, event_obj)
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

    def replace(self, kind: str, items: Iterable[Stored], projected: bool = False) -> None:
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

    def _announce(self, kind: str, key: str, old: Stored | None, new: Stored | None) -> None:
        for on_change in self._on_change[kind]:
            on_change(key, old, new)
