"""How prepared claims share a physical GPU, and the one place that runs GPU sharing commands.

Three strategies:
- Exclusive: a whole GPU for one claim. The allocation already guarantees exclusivity; no command.
- TimeSlicing: several pods (or claims) take turns; ``nvidia-smi`` sets the compute mode to DEFAULT
  and the time-slice interval, and both are reset when the last claim on the GPU goes away.
- MPS: fractions of a GPU. One MPS control daemon per GPU (compute mode EXCLUSIVE_PROCESS); each
  claim's containers get their own pinned-memory limit (= allocated memory) and active-thread
  percentage through environment variables, and the MPS pipe/log directories mounted.

Every real action goes through a ``CommandRunner``. ``ProcessRunner`` executes; ``RecordingRunner``
(the simulated backend's runner) only records, so tests can assert the exact commands.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from contract.gpuconfig import TIMESLICE_INTERVALS, SharingStrategy, TimeSliceInterval

log = logging.getLogger(__name__)

# Where the MPS directories appear inside a container.
MPS_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
MPS_CONTAINER_LOG_DIR = "/var/log/nvidia-mps"
_MIB = 1 << 20


@dataclass(frozen=True)
class GpuShare:
    """What one claim holds on one physical GPU; persisted in the checkpoint."""

    gpu_uuid: str
    device_name: str
    strategy: SharingStrategy
    memory_limit_bytes: int = 0  # MPS only: per-client pinned device memory
    active_thread_percentage: int = 100  # MPS only
    timeslice: TimeSliceInterval = "Default"  # TimeSlicing only


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


class SharingCommandError(RuntimeError):
    """A sharing command failed; the message carries the command and its output."""


class SharingConflict(RuntimeError):
    """A claim asks for a sharing setup that contradicts what other claims on the GPU use."""


class CommandRunner(Protocol):
    async def run(self, command: Command) -> str:
        """Run the command and return its stdout; raise SharingCommandError on failure."""
        ...


class ProcessRunner:
    """Runs sharing commands for real (nvidia-smi, nvidia-cuda-mps-control)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s

    async def run(self, command: Command) -> str:
        log.info("running %s", command.describe())
        try:
            proc = await asyncio.create_subprocess_exec(
                *command.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **dict(command.env)},
            )
            out, _ = await asyncio.wait_for(proc.communicate(command.stdin.encode()), self._timeout_s)
        except (OSError, TimeoutError) as err:
            raise SharingCommandError(f"{command.describe()}: {err}") from err
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise SharingCommandError(f"{command.describe()} exited {proc.returncode}: {text.strip()}")
        return text


@dataclass
class RecordingRunner:
    """Records commands instead of running them (simulated backend). ``fail_when`` injects failures.

    With ``log_path`` each command is also appended there as one JSON line, so a driver running in
    another process can be checked too.
    """

    commands: list[Command] = field(default_factory=list)
    fail_when: Callable[[Command], bool] | None = None
    log_path: Path | None = None

    async def run(self, command: Command) -> str:
        if self.fail_when is not None and self.fail_when(command):
            raise SharingCommandError(f"{command.describe()}: injected failure")
        self.commands.append(command)
        if self.log_path is not None:
            with self.log_path.open("a") as out:
                out.write(json.dumps({"argv": command.argv, "env": dict(command.env)}) + "\n")
        return ""


@dataclass(frozen=True)
class ContainerEdits:
    """What a claim's containers need for its sharing setup (merged into the CDI spec)."""

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path)


class MpsDirs:
    """Per-GPU MPS pipe and log directories on the host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pipe(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "pipe"

    def log(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "log"

    def env(self, gpu_uuid: str) -> tuple[tuple[str, str], ...]:
        return (
            ("CUDA_VISIBLE_DEVICES", gpu_uuid),
            ("CUDA_MPS_PIPE_DIRECTORY", str(self.pipe(gpu_uuid))),
            ("CUDA_MPS_LOG_DIRECTORY", str(self.log(gpu_uuid))),
        )


def setup_commands(share: GpuShare, dirs: MpsDirs) -> list[Command]:
    """Commands that put an idle GPU into the share's strategy."""
    uuid = share.gpu_uuid
    if share.strategy == SharingStrategy.TIME_SLICING:
        return [
            Command(("nvidia-smi", "-i", uuid, "-c", "DEFAULT")),
            Command(
                (
                    "nvidia-smi",
                    "compute-policy",
                    "-i",
                    uuid,
                    "--set-timeslice",
                    str(TIMESLICE_INTERVALS.index(share.timeslice)),
                )
            ),
        ]
    if share.strategy == SharingStrategy.MPS:
        return [
            Command(("nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS")),
            Command(("nvidia-cuda-mps-control", "-d"), env=dirs.env(uuid)),
        ]
    return []


def reset_commands(strategy: SharingStrategy, gpu_uuid: str, dirs: MpsDirs) -> list[Command]:
    """Commands that return a GPU to its default state once no claim uses it."""
    if strategy == SharingStrategy.TIME_SLICING:
        return [Command(("nvidia-smi", "compute-policy", "-i", gpu_uuid, "--set-timeslice", "0"))]
    if strategy == SharingStrategy.MPS:
        return [
            Command(("nvidia-cuda-mps-control",), env=dirs.env(gpu_uuid), stdin="quit\n"),
            Command(("nvidia-smi", "-i", gpu_uuid, "-c", "DEFAULT")),
        ]
    return []


def container_edits(share: GpuShare, dirs: MpsDirs) -> ContainerEdits:
    if share.strategy != SharingStrategy.MPS:
        return ContainerEdits()
    limit_mib = max(1, share.memory_limit_bytes // _MIB)
    return ContainerEdits(
        env={
            "CUDA_MPS_PIPE_DIRECTORY": MPS_CONTAINER_PIPE_DIR,
            "CUDA_MPS_LOG_DIRECTORY": MPS_CONTAINER_LOG_DIR,
            # Device ordinal 0: the container sees exactly this GPU.
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share.active_thread_percentage),
        },
        mounts=(
            (str(dirs.pipe(share.gpu_uuid)), MPS_CONTAINER_PIPE_DIR),
            (str(dirs.log(share.gpu_uuid)), MPS_CONTAINER_LOG_DIR),
        ),
    )


@dataclass
class _GpuUse:
    strategy: SharingStrategy
    timeslice: TimeSliceInterval
    claims: set[str] = field(default_factory=set)


class SharingManager:
    """Tracks which claims use each GPU and how; sets a GPU up for its first claim, resets after its last."""

    def __init__(self, runner: CommandRunner, mps_root: Path) -> None:
        self._runner = runner
        self._dirs = MpsDirs(mps_root)
        self._gpus: dict[str, _GpuUse] = {}

    def restore(self, shares_by_claim: Mapping[str, Sequence[GpuShare]]) -> None:
        """Rebuild the usage picture from the checkpoint after a restart (no commands run)."""
        self._gpus.clear()
        for claim_uid, shares in shares_by_claim.items():
            for share in shares:
                use = self._gpus.setdefault(share.gpu_uuid, _GpuUse(share.strategy, share.timeslice))
                use.claims.add(claim_uid)

    def users(self, gpu_uuid: str) -> frozenset[str]:
        use = self._gpus.get(gpu_uuid)
        return frozenset(use.claims) if use else frozenset()

    def needs_setup(self, claim_uid: str, share: GpuShare) -> bool:
        """Whether acquiring ``share`` would run commands (the GPU is not yet used by other claims)."""
        use = self._gpus.get(share.gpu_uuid)
        if use is not None and use.claims - {claim_uid}:
            return False
        return bool(setup_commands(share, self._dirs))

    async def acquire(self, claim_uid: str, share: GpuShare) -> ContainerEdits:
        use = self._gpus.get(share.gpu_uuid)
        others = (use.claims - {claim_uid}) if use else set()
        if use is not None and others:
            self._check_compatible(share, use, len(others))
            use.claims.add(claim_uid)
        else:
            if share.strategy == SharingStrategy.MPS:
                self._dirs.pipe(share.gpu_uuid).mkdir(parents=True, exist_ok=True)
                self._dirs.log(share.gpu_uuid).mkdir(parents=True, exist_ok=True)
            for command in setup_commands(share, self._dirs):
                await self._runner.run(command)
            self._gpus[share.gpu_uuid] = _GpuUse(share.strategy, share.timeslice, {claim_uid})
        return container_edits(share, self._dirs)

    async def release(self, claim_uid: str, share: GpuShare) -> None:
        """Drop the claim and reset the GPU if nobody else uses it; repeatable, never raises.

        Reset failures are logged, not raised: an unprepare that can never finish would pin the
        pod's claim forever, and the next claim's setup puts the GPU into a known state anyway.
        """
        use = self._gpus.get(share.gpu_uuid)
        if use is not None:
            use.claims.discard(claim_uid)
            if use.claims:
                return
        # Also reached for a claim whose setup a crash interrupted: the GPU may be half set up.
        for command in reset_commands(share.strategy, share.gpu_uuid, self._dirs):
            try:
                await self._runner.run(command)
            except SharingCommandError as err:
                log.warning("resetting GPU %s: %s", share.gpu_uuid, err)
        if share.strategy == SharingStrategy.MPS:
            await asyncio.to_thread(shutil.rmtree, self._dirs.root / share.gpu_uuid, ignore_errors=True)
        self._gpus.pop(share.gpu_uuid, None)

    @staticmethod
    def _check_compatible(share: GpuShare, use: _GpuUse, other_count: int) -> None:
        if share.strategy == SharingStrategy.EXCLUSIVE or use.strategy == SharingStrategy.EXCLUSIVE:
            raise SharingConflict(
                f"GPU {share.gpu_uuid} is held by {other_count} other claim(s) as {use.strategy}; "
                f"{share.strategy} cannot share it"
            )
        if share.strategy != use.strategy:
            raise SharingConflict(
                f"GPU {share.gpu_uuid} is shared with {use.strategy} by {other_count} other claim(s); "
                f"this claim asks for {share.strategy}"
            )
        if share.strategy == SharingStrategy.TIME_SLICING and share.timeslice != use.timeslice:
            raise SharingConflict(
                f"GPU {share.gpu_uuid} is time-sliced with interval {use.timeslice} by {other_count} "
                f"other claim(s); this claim asks for {share.timeslice}"
            )
