"""The share model: what a claim holds on a device (persisted in the checkpoint), the commands a
profile runs to set a device up for it, and the container edits that come with a device or a
share (merged into the claim's CDI spec)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from contract.gpuconfig import SharingStrategy, TimeSliceInterval


@dataclass(frozen=True)
class MigPartition:
    """A MIG instance a claim holds: where it is (its placement) and, once made, its GPU and
    compute instance ids and MIG device uuid. Recorded before each step that creates a part of
    it and after, so a crash is undone from the record alone."""

    profile: str
    profile_id: int
    start: int
    memory_slices: int
    gpu_instance: int | None = None
    compute_instance: int | None = None
    uuid: str = ""

    def overlaps(self, instance: PlacedInstance) -> bool:
        """Whether ``instance`` covers any memory slice of this partition's placement."""
        return (
            instance.start < self.start + self.memory_slices
            and self.start < instance.start + instance.memory_slices
        )


@dataclass(frozen=True)
class PlacedInstance:
    """A GPU instance as its device lists it (``nvidia-smi mig -lgi``): its id and placement."""

    gpu_instance: int
    profile_id: int
    start: int
    memory_slices: int


@dataclass(frozen=True)
class GpuShare:
    """What one claim holds on one physical GPU; persisted in the checkpoint."""

    gpu_uuid: str
    device_name: str
    strategy: SharingStrategy
    memory_limit_bytes: int = 0  # MPS only: per-client pinned device memory
    active_thread_percentage: int = 100  # MPS only
    timeslice: TimeSliceInterval = "Default"  # TimeSlicing only
    partition: MigPartition | None = None  # a MIG instance made for the claim (Exclusive)


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdin: str = ""

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        text = " ".join(self.argv)
        if self.stdin:
            text = f"echo {self.stdin.strip()!r} | {text}"
        return f"{env} {text}" if env else text


# Runs a command and returns its stdout (the driver's CommandRunner.run).
RunCommand = Callable[[Command], Awaitable[str]]


class SharingCommandError(RuntimeError):
    """A sharing command failed; the message carries the command and its output."""


class PartitionNotMade(SharingCommandError):
    """Making a partition failed before any of it was made (its placement taken, say): there is
    nothing of it to undo, and what is at its placement belongs to someone else."""


@dataclass(frozen=True)
class CharDevice:
    """A character device node named with its numbers (NVIDIA's MIG capability nodes, whose minor
    the driver reads when the instance exists), so the runtime needs no host node to stat."""

    path: str
    major: int
    minor: int


@dataclass(frozen=True)
class ContainerEdits:
    """What a claim's containers need besides its devices' own nodes: environment, device nodes
    (by path, or with their numbers) and bind mounts (host path, container path)."""

    env: Mapping[str, str] = field(default_factory=dict)
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    char_devices: tuple[CharDevice, ...] = ()
