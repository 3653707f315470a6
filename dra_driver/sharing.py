"""How prepared claims share a physical device, and the one place that runs sharing commands.

Three strategies (``contract.gpuconfig.SharingStrategy``):
- Exclusive: a whole device for one claim. The allocation already guarantees exclusivity.
- TimeSlicing: several pods (or claims) take turns on the device.
- MPS: fractions of a device, each claim's containers with their own limits.

What a strategy takes on a device is the profile's (``DeviceProfile.sharing``: NVIDIA's
``nvidia-smi`` and MPS daemon); this module keeps which claims use each device and how, sets a
device up for its first claim, resets it after its last, and refuses a claim whose setup
contradicts the others'. Every command goes through a ``CommandRunner``: ``ProcessRunner``
executes; ``RecordingRunner`` (simulated devices) only records, so tests can assert the exact
commands.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from contract.gpuconfig import SharingStrategy, TimeSliceInterval
from dra_driver.devices.profile import SharingSetup
from dra_driver.devices.share import Command, ContainerEdits, GpuShare, SharingCommandError

log = logging.getLogger(__name__)


class SharingConflict(RuntimeError):
    """A claim asks for a sharing setup that contradicts what other claims on the GPU use."""


class CommandRunner(Protocol):
    async def run(self, command: Command) -> str:
        """Run the command and return its stdout; raise SharingCommandError on failure."""
        ...


class ProcessRunner:
    """Runs sharing commands for real."""

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
    """Records commands instead of running them (simulated devices). ``fail_when`` injects failures.

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


@dataclass
class _GpuUse:
    strategy: SharingStrategy
    timeslice: TimeSliceInterval
    claims: set[str] = field(default_factory=set)


class SharingManager:
    """Tracks which claims use each GPU and how; sets a GPU up for its first claim, resets after its last."""

    def __init__(self, runner: CommandRunner, setup: SharingSetup) -> None:
        self._runner = runner
        self._setup = setup
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
        return bool(self._setup.setup_commands(share))

    async def acquire(self, claim_uid: str, share: GpuShare) -> ContainerEdits:
        use = self._gpus.get(share.gpu_uuid)
        others = (use.claims - {claim_uid}) if use else set()
        if use is not None and others:
            self._check_compatible(share, use, len(others))
            use.claims.add(claim_uid)
        else:
            self._setup.prepare_host(share)
            for command in self._setup.setup_commands(share):
                await self._runner.run(command)
            self._gpus[share.gpu_uuid] = _GpuUse(share.strategy, share.timeslice, {claim_uid})
        return self._setup.container_edits(share)

    async def release(self, claim_uid: str, share: GpuShare, keep: AbstractSet[str] = frozenset()) -> None:
        """Drop the claim and reset the GPU if nobody else uses it; see ``release_claims``."""
        await self.release_claims({claim_uid: (share,)}, keep)

    async def release_claims(
        self, shares_by_claim: Mapping[str, Sequence[GpuShare]], keep: AbstractSet[str] = frozenset()
    ) -> None:
        """Drop the claims, then reset each GPU nobody uses any more once per strategy the claims
        held on it (GPUs concurrently), except the GPUs in ``keep`` (in use by something the
        driver cannot account for: resetting them could break a running pod). Repeatable, never
        raises.

        Reset failures are logged, not raised: an unprepare that can never finish would pin the
        pod's claim forever, and the next claim's setup puts the GPU into a known state anyway.
        """
        strategies: dict[str, set[SharingStrategy]] = {}
        for claim_uid, shares in shares_by_claim.items():
            for share in shares:
                use = self._gpus.get(share.gpu_uuid)
                if use is not None:
                    use.claims.discard(claim_uid)
                strategies.setdefault(share.gpu_uuid, set()).add(share.strategy)
        idle = {
            gpu_uuid: held
            for gpu_uuid, held in strategies.items()
            if not self.users(gpu_uuid) and gpu_uuid not in keep
        }
        for gpu_uuid in strategies.keys() & keep:
            if not self.users(gpu_uuid):
                log.error(
                    "GPU %s is not reset: a claim the driver cannot account for may still use it", gpu_uuid
                )
        # Also reached for a claim whose setup a crash interrupted: the GPU may be half set up.
        await asyncio.gather(*(self.reset_idle(gpu_uuid, held) for gpu_uuid, held in sorted(idle.items())))

    async def reset_idle(self, gpu_uuid: str, strategies: Iterable[SharingStrategy]) -> None:
        """Reset a GPU no claim uses from each of ``strategies``; never raises."""
        if self.users(gpu_uuid):
            return
        self._gpus.pop(gpu_uuid, None)
        for strategy in sorted(strategies):
            for command in self._setup.reset_commands(strategy, gpu_uuid):
                try:
                    await self._runner.run(command)
                except SharingCommandError as err:
                    log.warning("resetting GPU %s: %s", gpu_uuid, err)
            await asyncio.to_thread(self._setup.clean_host, strategy, gpu_uuid)

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
