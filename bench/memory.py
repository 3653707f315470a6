"""Benchmark 4: resident memory of the extender holding a large cluster picture.

The extender app (the real ``ClusterPicture`` fed the objects a watch would deliver, decoded from
JSON) is started
in its own process with the picture loaded; its RSS is compared with the do-nothing extender
process of the same run, which imports the same code but holds no picture.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hotpath import ServerProcess


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
