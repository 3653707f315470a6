"""The object store: every watched Kubernetes object, by kind and key, exactly as the API sent it.

It knows nothing of GPUs or queues. It orders updates by resourceVersion (an older version never
overwrites a newer one), remembers which kinds have been listed (`synced`), and tells each
subscriber of a kind what changed: `(key, old, new)`, `old` None for an addition, `new` None for
a removal. A fresh list (`replace`) is announced object by object, then as a whole to the kind's
relist subscribers, so every derived index is kept in step by the part that owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from contract.kube import meta, object_key
from extender.kubeapi import JsonObject

Change = Callable[[str, JsonObject | None, JsonObject | None], None]  # key, old, new
Relisted = Callable[[set[str]], None]  # the keys of the fresh list


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

    def replace(self, kind: str, items: Iterable[JsonObject]) -> None:
        """A fresh list of a kind (first sync or relist after 410): what is gone is dropped."""
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
