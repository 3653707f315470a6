"""What `tessera up --demo` shows: queues against their fair shares and GPUs filling (pure).

Built from the cluster's own objects as the API returns them - Queue status written by the
extender, ResourceSlices published by the driver, ResourceClaims allocated by kube-scheduler and
the pods holding them - so the picture on screen is the cluster's, not the demo's bookkeeping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.kube import mapping, meta, sequence
from contract.names import DEFAULT_QUEUE, MEMORY_CAPACITY, QUEUE_LABEL
from contract.quantity import parse_quantity
from extender.claims import allocated_devices

QUARTERS = 4  # a GPU is drawn as four cells: the smallest fraction the demo shows
FREE_CELL = "·"
WITHIN_QUOTA, BEYOND_QUOTA, OWED = "█", "▒", "░"
TIME_SLICED_CLASS = "timesliced-gpu.tessera.dev"


@dataclass(frozen=True)
class QueueRow:
    """One queue's GPU numbers, as its spec and the extender-written status say."""

    name: str
    quota: float | None
    limit: float | None
    weight: float
    priority: int
    allocated: float
    fair_share: float
    pending: float
    evicted: int
    reclaimed: int


@dataclass(frozen=True)
class GpuUse:
    """What one queue holds of one GPU: quarters (1-4), and whether it is a time-sliced share."""

    queue: str
    quarters: int
    time_sliced: bool


@dataclass(frozen=True)
class Gpu:
    node: str
    device: str
    uses: tuple[GpuUse, ...]

    @property
    def used_quarters(self) -> int:
        return min(QUARTERS, sum(use.quarters for use in self.uses))


@dataclass(frozen=True)
class Frame:
    """Everything one screen shows."""

    heading: str
    queues: tuple[QueueRow, ...]
    gpus: tuple[Gpu, ...]

    @property
    def capacity(self) -> int:
        return len(self.gpus)

    @property
    def gpus_in_use(self) -> float:
        return sum(gpu.used_quarters for gpu in self.gpus) / QUARTERS

    def queue(self, name: str) -> QueueRow:
        for row in self.queues:
            if row.name == name:
                return row
        raise KeyError(f"no queue {name!r} in the cluster")


def _gpu_amount(resources: Mapping[str, Any], key: str) -> float | None:
    value = mapping(resources.get("gpu")).get(key)
    return parse_quantity(value) if value is not None else None


def _status_gpu(status: Mapping[str, Any], field: str) -> float:
    value = mapping(status.get(field)).get("gpu")
    return parse_quantity(value) if value is not None else 0.0


def queue_rows(queues: Sequence[Mapping[str, Any]]) -> tuple[QueueRow, ...]:
    rows = []
    for queue in queues:
        spec, status = mapping(queue.get("spec")), mapping(queue.get("status"))
        resources = mapping(spec.get("resources"))
        weight = _gpu_amount(resources, "overQuotaWeight")
        rows.append(
            QueueRow(
                name=str(meta(queue).get("name", "")),
                quota=_gpu_amount(resources, "quota"),
                limit=_gpu_amount(resources, "limit"),
                weight=1.0 if weight is None else weight,
                priority=int(spec.get("priority") or 0),
                allocated=_status_gpu(status, "allocated"),
                fair_share=_status_gpu(status, "fairShare"),
                pending=_status_gpu(status, "requested"),
                evicted=int(status.get("evictedPods") or 0),
                reclaimed=int(status.get("reclaimedPods") or 0),
            )
        )
    return tuple(sorted(rows, key=lambda row: row.name))


def _natural(text: str) -> tuple[object, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def gpus(
    slices: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    driver: str,
) -> tuple[Gpu, ...]:
    """Every GPU the driver publishes, with the queues holding it (by the claims' allocations)."""
    memory: dict[tuple[str, str], int] = {}
    node_of: dict[tuple[str, str], str] = {}
    for item in slices:
        spec = mapping(item.get("spec"))
        if spec.get("driver") != driver:
            continue
        pool = str(mapping(spec.get("pool")).get("name", ""))
        for device in sequence(spec.get("devices")):
            device = mapping(device)
            key = (pool, str(device.get("name", "")))
            capacity = mapping(mapping(device.get("capacity")).get(MEMORY_CAPACITY)).get("value")
            memory[key] = int(parse_quantity(capacity)) if capacity is not None else 0
            node_of[key] = str(spec.get("nodeName") or pool)
    queue_of_pod = {
        str(meta(pod).get("uid", "")): str(mapping(meta(pod).get("labels")).get(QUEUE_LABEL, DEFAULT_QUEUE))
        for pod in pods
    }
    uses: dict[tuple[str, str], list[GpuUse]] = {key: [] for key in memory}
    for claim in claims:
        holders = [
            queue_of_pod.get(str(mapping(ref).get("uid", "")), "?")
            for ref in sequence(mapping(claim.get("status")).get("reservedFor"))
        ]
        if not holders:
            continue
        requests = sequence(mapping(mapping(claim.get("spec")).get("devices")).get("requests"))
        time_sliced = any(
            mapping(mapping(r).get("exactly")).get("deviceClassName") == TIME_SLICED_CLASS for r in requests
        )
        for device in allocated_devices(claim):
            key = (device.pool, device.device)
            if key not in uses:
                continue
            quarters = QUARTERS
            if device.consumed_memory is not None and memory[key] > 0:
                quarters = max(1, min(QUARTERS, round(QUARTERS * device.consumed_memory / memory[key])))
            uses[key].append(GpuUse(holders[0], quarters, time_sliced))
    return tuple(
        Gpu(node_of[key], key[1], tuple(sorted(uses[key], key=lambda use: use.queue)))
        for key in sorted(memory, key=lambda key: (_natural(node_of[key]), _natural(key[1])))
    )


# ---- rendering ----


def _amount(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def queue_letters(queues: Sequence[QueueRow]) -> dict[str, str]:
    """One capital letter per queue for the GPU map: team-a is A, default is D, when still free."""
    letters: dict[str, str] = {}
    for row in queues:
        team, _, suffix = row.name.rpartition("-")
        preferred = suffix[-1:] if team else row.name[:1]
        candidates = [preferred.upper(), *(c.upper() for c in row.name if c.isalpha()), *"XYZWVUTSRQ"]
        letters[row.name] = next((c for c in candidates if c.isalpha() and c not in letters.values()), "?")
    return letters


def _cells(gpus: float) -> int:
    return int(gpus + 0.5)  # half a GPU or more draws a cell


def _bar(row: QueueRow, width: int) -> str:
    """Allocated within quota, allocated beyond it, and fair share not yet held; one cell a GPU."""
    held = _cells(row.allocated)
    within = min(held, _cells(row.quota or 0))
    owed = max(0, _cells(row.fair_share) - held)
    bar = WITHIN_QUOTA * within + BEYOND_QUOTA * (held - within) + OWED * owed
    return bar[:width].ljust(width)


def _state(row: QueueRow) -> str:
    if row.pending > 0 and row.allocated + 1e-9 < row.fair_share:
        return f"below its fair share by {row.fair_share - row.allocated:g}: reclaiming"
    parts = []
    if row.quota is not None and row.allocated > row.quota + 1e-9:
        parts.append(f"borrows {row.allocated - row.quota:g} beyond quota")
    if row.pending > 0:
        at_limit = row.limit is not None and row.allocated + 1e-9 >= row.limit
        parts.append(f"{row.pending:g} waiting" + (" (at its limit)" if at_limit else ""))
    return ", ".join(parts)


def _gpu_cells(gpu: Gpu, letters: Mapping[str, str]) -> str:
    cells = ""
    for use in gpu.uses:
        letter = letters.get(use.queue, "?")
        cells += (letter.lower() if use.time_sliced else letter) * use.quarters
    return cells[:QUARTERS].ljust(QUARTERS, FREE_CELL)


def render(frame: Frame) -> list[str]:
    letters = queue_letters(frame.queues)
    width = max(frame.capacity, 1)
    lines = [frame.heading, ""]
    lines.append(
        f"{'QUEUE':<9}{'QUOTA':>6}{'LIMIT':>6}{'WEIGHT':>7}{'ALLOC':>7}{'FAIR':>6}{'WAIT':>6}  "
        f"{'GPUs: ' + WITHIN_QUOTA + ' quota ' + BEYOND_QUOTA + ' borrowed ' + OWED + ' owed'}"
    )
    for row in frame.queues:
        numbers = (
            f"{_amount(row.quota):>6}{_amount(row.limit):>6}{row.weight:>7g}"
            f"{row.allocated:>7g}{row.fair_share:>6g}{row.pending:>6g}"
        )
        lines.append(f"{row.name:<9}{numbers}  {_bar(row, width)}  {_state(row)}".rstrip())
    lines.append("")
    legend = "  ".join(f"{letters[row.name]} {row.name}" for row in frame.queues)
    lines.append(f"GPUs in use {frame.gpus_in_use:g}/{frame.capacity}   {legend}   lowercase: time-sliced")
    by_node: dict[str, list[Gpu]] = {}
    for gpu in frame.gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    for node, node_gpus in by_node.items():
        lines.append(f"  {node:<12}" + " ".join(_gpu_cells(gpu, letters) for gpu in node_gpus))
    return lines
