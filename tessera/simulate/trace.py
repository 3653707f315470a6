"""Loading workloads: the Alibaba GPU trace (openb, 2023) CSV format.

Nodes CSV: ``sn,cpu_milli,memory_mib,gpu,model``. Pods CSV: ``name,cpu_milli,memory_mib,num_gpu,
gpu_milli[,gpu_spec,qos,pod_phase,creation_time,...]``. Pods are returned in file order; the replay
decides the arrival order (``packing.arrival_order``), so a file with time columns and the same file
without them give the same shuffled replay.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.names import GPU_MILLI
from extender.policy.placement import GpuDemand, placement_demand

TRACE_DIR_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023",
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "alibaba-gpu-v2023",
)
NODES_FILE = "openb_node_list_gpu_node.csv"
DEFAULT_PODS_FILE = "openb_pod_list_default.csv"


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class SimNode:
    name: str
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class SimPod:
    name: str
    demand: GpuDemand
    creation_time: int | None = None  # None: the file has no creation_time (or this row leaves it empty)
    scheduled_time: int | None = None  # None: never scheduled in the trace (or no such column)
    deletion_time: int | None = None

    @property
    def gpu_milli(self) -> int:
        return self.demand.total_milli


def default_trace_dir() -> Path | None:
    for candidate in TRACE_DIR_CANDIDATES:
        if (candidate / NODES_FILE).is_file():
            return candidate
    return None


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, Mapping[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [column for column in required if column not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        yield from enumerate(reader, start=2)


def _int(path: Path, line: int, row: Mapping[str, str], column: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r} is not an integer: {raw!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column!r} is negative: {value}")
    return value


def load_nodes(path: Path) -> list[SimNode]:
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        nodes.append(
            SimNode(
                name=row["sn"],
                model=row["model"].strip(),
                gpus=_int(path, line, row, "gpu"),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def _demand(path: Path, line: int, row: Mapping[str, str]) -> GpuDemand:
    count = _int(path, line, row, "num_gpu")
    milli = _int(path, line, row, "gpu_milli") if count else GPU_MILLI
    if count and milli == 0:
        raise TraceError(f"{path}:{line}: num_gpu={count} with gpu_milli=0")
    if count > 1 and milli != GPU_MILLI:
        raise TraceError(f"{path}:{line}: a {count}-GPU pod must ask for whole GPUs, got gpu_milli={milli}")
    if milli > GPU_MILLI:
        raise TraceError(f"{path}:{line}: gpu_milli {milli} is above 1000")
    spec = (row.get("gpu_spec") or "").strip()
    gpus = GpuDemand(count, milli, frozenset(model for model in spec.split("|") if model)) if count else None
    return placement_demand(gpus, _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib"))


def _optional_int(path: Path, line: int, row: Mapping[str, str], column: str) -> int | None:
    return _int(path, line, row, column) if (row.get(column) or "").strip() else None


def load_pods(path: Path) -> list[SimPod]:
    """Pods in file order (see the module docstring for why not in arrival order)."""
    pods = [
        SimPod(
            name=row["name"],
            demand=_demand(path, line, row),
            creation_time=_optional_int(path, line, row, "creation_time"),
            scheduled_time=_optional_int(path, line, row, "scheduled_time"),
            deletion_time=_optional_int(path, line, row, "deletion_time"),
        )
        for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    ]
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods
