"""Benchmark 4: resident memory of the extender holding a large cluster picture.

The extender app (the real ``ClusterPicture`` fed the objects a watch would deliver, decoded from
JSON) is started
in its own process with the picture loaded; its RSS is compared with the do-nothing extender
process of the same run, which imports the same code but holds no picture.

Where the bytes go (``python -m bench.memory [--nodes N --pods P]``, in process): the picture is
loaded as the server loads it, then its parts are walked - every container, string, number and
object reachable from each, counted once, for the first part that reaches it (the store's kinds
first, then what the other parts derive from them, then the running pods of a planner's
snapshot) - and what the allocator holds besides (the sharing tables, interned strings) is the
rest of what `tracemalloc` counted while loading.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from extender.picture.accounting import QueueAccounting
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.picture.demands import PodDemands
from extender.picture.inventory import GpuInventory
from extender.picture.store import ObjectStore, project
from extender.picture.workloads import WorkloadMap
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import ServerProcess
from .picture import Picture, build_picture, load_picture


@dataclass(frozen=True)
class MemoryRow:
    nodes: int
    pods: int
    objects: int  # Kubernetes objects in the picture (nodes, slices, pods, claims, ...)
    rss_mib: float
    floor_rss_mib: float

    @property
    def ratio(self) -> float:
        return self.rss_mib / self.floor_rss_mib

    @property
    def bytes_per_object(self) -> float:
        return (self.rss_mib - self.floor_rss_mib) * 2**20 / self.objects


def run_memory(nodes: int, pods: int) -> MemoryRow:
    floor = ServerProcess("floor", 0, 0)
    floor.stop()
    extender = ServerProcess("tessera", nodes, pods)
    extender.stop()
    return MemoryRow(nodes, pods, extender.objects, extender.rss_mib, floor.rss_mib)


# The picture's parts: a walk from one stops at the others (they are reached through listeners).
_PARTS = (ObjectStore, PodDemands, GpuInventory, QueueAccounting, WorkloadMap, ClusterPicture)
_CODE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)


class _Walk:
    """Sizes of everything reachable, each object counted once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def size(self, roots: Iterable[Any]) -> int:
        total = 0
        stack = list(roots)
        while stack:
            obj = stack.pop()
            if id(obj) in self.seen or isinstance(obj, _CODE) or obj is None:
                continue
            self.seen.add(id(obj))
            total += sys.getsizeof(obj)
            if isinstance(obj, dict):
                stack.extend(obj.keys())
                stack.extend(obj.values())
            elif isinstance(obj, list | tuple | set | frozenset):
                stack.extend(obj)
            elif not isinstance(obj, str | bytes | int | float):
                if hasattr(obj, "__dict__"):
                    stack.extend(v for v in vars(obj).values() if not isinstance(v, _PARTS))
                for cls in type(obj).__mro__:
                    slots = cls.__dict__.get("__slots__", ())
                    for slot in (slots,) if isinstance(slots, str) else slots:
                        if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                            stack.append(getattr(obj, slot))
        return total


def breakdown(nodes: int, pods: int) -> tuple[int, list[tuple[str, int, int]]]:
    """Objects in the picture, and (part, objects it stands for, bytes) as the docstring says."""
    built = build_picture(nodes, pods)
    pages = {
        kind: [msgspec.json.encode(items[i : i + 500]) for i in range(0, len(items), 500)]
        for kind, items in built.objects.items()
    }
    pending = built.pending_pods
    del built
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    objects = {
        kind: [project(kind, obj) for page in kind_pages for obj in msgspec.json.decode(page)]
        for kind, kind_pages in pages.items()
    }
    counts = {kind: len(items) for kind, items in objects.items()}
    picture = load_picture(Picture(objects, [], pending), projected=True)
    objects.clear()
    running = picture.snapshot().running
    gc.collect()
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    walk = _Walk()
    parts = picture.parts()
    walk.seen.add(id(vars(parts["store"])["objects"]))  # (its kinds are weighed one by one below)
    rows: list[tuple[str, int, int]] = []
    big = ("Pod", "ResourceClaim", "Node", "ResourceSlice")
    for kind in big:
        rows.append((f"store: {kind}", counts[kind], walk.size([picture.kind(kind)])))
    others = [picture.kind(k) for k in WATCHED_PATHS if k not in big]
    rows.append(
        (
            "store: other kinds",
            sum(counts.get(k, 0) for k in WATCHED_PATHS if k not in big),
            walk.size(others),
        )
    )
    for name in ("pod demands", "GPU inventory", "queue accounting", "workloads"):
        part = parts[name]
        rows.append((name, 0, walk.size(v for v in vars(part).values() if not isinstance(v, _PARTS))))
    rows.append(("running pods (planners' snapshot)", len(running), walk.size([running, vars(picture)])))
    rows.append(("other (sharing tables, interned strings)", 0, total - sum(size for _, _, size in rows)))
    return sum(counts.values()), rows


def breakdown_table(objects: int, rows: list[tuple[str, int, int]]) -> str:
    body = [
        [name, f"{size / 2**20:.1f}", f"{size / objects:.0f}", f"{size / count:.0f}" if count else "-"]
        for name, count, size in rows
    ]
    total = sum(size for _, _, size in rows)
    body.append(["total", f"{total / 2**20:.1f}", f"{total / objects:.0f}", "-"])
    return format_table(["part", "MiB", "bytes/object", "bytes each"], body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (50 nodes, 400 pods)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.pods = 50, 400
    objects, rows = breakdown(args.nodes, args.pods)
    print(f"{args.nodes} nodes, {args.pods} pods, {objects} objects in the picture")
    print(breakdown_table(objects, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
