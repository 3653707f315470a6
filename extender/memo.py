"""Bounded memos the extender's parts share: a table whose value is computed on a miss and that
starts over at a size limit (`remembered`), and per-key tables of values by node shape
(`ShapeMemo`). Plain dictionaries with a bound on memory; no part of the project below them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar, cast

# What a lookup finds when the key is not there (None may be a value).
MISSING = object()
K = TypeVar("K")
V = TypeVar("V")


def remembered(cache: dict[K, V], key: K, limit: int, compute: Callable[[], V]) -> V:
    """`cache[key]`, computed on a miss; the cache starts over once it holds `limit` values (a
    bound on memory that costs one recomputation per value still in use)."""
    found = cache.get(key, MISSING)  # one lookup: a tuple key's hash is not cached
    if found is not MISSING:
        return cast(V, found)
    if len(cache) >= limit:
        cache.clear()
    value = cache[key] = compute()
    return value


class ShapeMemo(Generic[K, V]):
    """A bounded memo of values per key (a demand) and node shape, as one table per key: a caller
    that asks about many nodes for one key fetches its table once, then each node costs one
    dictionary lookup by shape (`put` stores a value computed on a miss). At most `limit`
    values in all: past that the memo starts over (a table a caller still holds keeps working,
    unseen by later callers)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tables: dict[K, dict[str, V]] = {}
        self.size = 0

    def table(self, key: K) -> dict[str, V]:
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = {}
        return table

    def put(self, table: dict[str, V], shape: str, value: V) -> V:
        if self.size >= self.limit:
            self.tables.clear()
            self.size = 0
        table[shape] = value
        self.size += 1
        return value
