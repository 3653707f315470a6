"""MIG instances made and destroyed on demand with ``nvidia-smi mig``, and the simulated GPUs'
answer to the same commands.

Making a partition is one command: the GPU instance at the allocated placement with its default
compute instance spanning it (``-cgi <profile id>:<start> -C``); the driver records the partition
before it and, with the ids the command printed, after it (the preparer's checkpoint). Destroying
never needs the recorded ids: it lists the GPU instances (``-lgi``), takes the one at the
partition's placement and profile (and id, when recorded), destroys its compute instances and
then it; nothing there is nothing to do. So undoing a partition whose creation a crash interrupted
(ids never recorded) leaves no orphaned instance, and a GPU instance whose compute instance was
never made (``-C`` failing after the GPU instance) goes too.

``instances`` lists the GPU instances with their placements (the preparer checks a placement is
free before it records and makes a partition there). A create that fails having made nothing
(its placement taken, say) is ``PartitionNotMade``: its undo does not go looking at the
placement, where the instance found is someone else's.

``SimulatedSmi`` answers these commands for simulated GPUs (after recording them like every
sharing command) from a small state file (``SimulatedMigState``), the "hardware" that outlives a
driver crash and that another process (an administrator's ``nvidia-smi`` in a test) may change
too, so it is read at every command and changed under a lock: instance ids are the lowest free,
a placement overlapping an instance is refused as on a real GPU; the GPUs start with the
instances an administrator made (``madeByAdmin``), and each instance's capability files come and
go with it (``migcaps.SimulatedCapabilities``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dra_driver.devices.model import Gpu, MigDevice, MigInstance
from dra_driver.devices.share import (
    Command,
    ContainerEdits,
    MigPartition,
    PartitionNotMade,
    PlacedInstance,
    RunCommand,
    SharingCommandError,
)
from dra_driver.profiles.nvidia.migcaps import CapabilityFileError, MigCapabilities, SimulatedCapabilities

_CREATED_GI = re.compile(r"created GPU instance ID\s+(\d+)")
_CREATED_CI = re.compile(r"created compute instance ID\s+(\d+)")
# A row of ``nvidia-smi mig -lgi``: GPU, name, profile id, instance id, placement start:size.
_GI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|", re.MULTILINE)
_UUID_NAMESPACE = uuid.UUID("6f1c1f0e-6a43-4e0f-9b1e-746573736572")

InstanceUuid = Callable[[str, int, int], Awaitable[str]]


def _smi(gpu_uuid: str, *args: str) -> Command:
    return Command(("nvidia-smi", "mig", "-i", gpu_uuid, *args))


def parse_gpu_instances(listing: str) -> list[PlacedInstance]:
    return [
        PlacedInstance(int(gi), int(profile_id), int(start), int(size))
        for _gpu, _name, profile_id, gi, start, size in _GI_ROW.findall(listing)
    ]


def _created(pattern: re.Pattern[str], output: str, command: Command) -> int:
    found = pattern.search(output)
    if found is None:
        raise SharingCommandError(f"{command.describe()}: no instance id in its output {output.strip()!r}")
    return int(found.group(1))


class NvidiaMig:
    """The NVIDIA profile's partitioner: ``nvidia-smi mig`` through the driver's command runner;
    a made instance's MIG device uuid from ``instance_uuid`` (NVML, or the simulated GPUs); a MIG
    device's capability nodes read by ``capabilities`` (``migcaps``)."""

    def __init__(
        self,
        run: RunCommand,
        instance_uuid: InstanceUuid,
        capabilities: MigCapabilities,
        gpus: Sequence[Gpu],
    ) -> None:
        self._run = run
        self._instance_uuid = instance_uuid
        self._capabilities = capabilities
        self._gpus = {gpu.uuid: gpu for gpu in gpus}

    async def instance_edits(self, instance: MigInstance) -> ContainerEdits:
        gpu = self._gpus.get(instance.gpu_uuid)
        if gpu is None:
            raise CapabilityFileError(f"GPU {instance.gpu_uuid} is not on this node")
        if gpu.simulated:  # names no node, as it names no /dev/nvidia<minor>
            return ContainerEdits()
        nodes = await asyncio.to_thread(
            self._capabilities.device_nodes, gpu.minor, instance.gpu_instance, instance.compute_instance
        )
        return ContainerEdits(char_devices=nodes)

    async def create(self, gpu_uuid: str, partition: MigPartition) -> MigPartition:
        command = _smi(gpu_uuid, "-cgi", f"{partition.profile_id}:{partition.start}", "-C")
        try:
            output = await self._run(command)
        except SharingCommandError as err:
            if _CREATED_GI.search(str(err)):  # -C failed after the GPU instance was made
                raise
            raise PartitionNotMade(str(err)) from None
        gpu_instance = _created(_CREATED_GI, output, command)
        compute_instance = _created(_CREATED_CI, output, command)
        device_uuid = await self._instance_uuid(gpu_uuid, gpu_instance, compute_instance)
        return replace(
            partition, gpu_instance=gpu_instance, compute_instance=compute_instance, uuid=device_uuid
        )

    async def instances(self, gpu_uuid: str) -> tuple[PlacedInstance, ...]:
        try:
            listing = await self._run(_smi(gpu_uuid, "-lgi"))
        except SharingCommandError as err:
            if "No GPU instances found" in str(err):  # a real nvidia-smi exits non-zero for none
                return ()
            raise
        return tuple(parse_gpu_instances(listing))

    async def destroy(self, gpu_uuid: str, partition: MigPartition) -> None:
        """Whatever exists of the partition at its placement: its compute instances, then its GPU
        instance. Raises SharingCommandError when a command fails (the caller logs it)."""
        for row in await self.instances(gpu_uuid):
            if (row.profile_id, row.start, row.memory_slices) != (
                partition.profile_id,
                partition.start,
                partition.memory_slices,
            ):
                continue
            if partition.gpu_instance is not None and row.gpu_instance != partition.gpu_instance:
                continue  # not the instance this claim made
            gi = str(row.gpu_instance)
            # A GPU instance whose compute instance was never made has none to destroy.
            with contextlib.suppress(SharingCommandError):
                await self._run(_smi(gpu_uuid, "-gi", gi, "-dci"))
            await self._run(_smi(gpu_uuid, "-gi", gi, "-dgi"))


# ---- the simulated GPUs' nvidia-smi ----


@dataclass
class _SimulatedInstance:
    profile_id: int
    profile: str
    start: int
    size: int
    compute_instances: list[int]


SimulatedInstances = dict[str, dict[int, _SimulatedInstance]]  # GPU uuid -> GPU instance id -> it


def simulated_mig_uuid(gpu_uuid: str, gpu_instance: int, compute_instance: int) -> str:
    """The MIG device uuid of a simulated GPU's compute instance (stable: derived from its ids)."""
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/{gpu_instance}/{compute_instance}')}"


class SimulatedMigState:
    """The simulated GPUs' MIG instances: their state file, the "hardware" that outlives a driver
    crash and that every process changing them shares (the driver, an administrator's
    ``nvidia-smi`` in a test). Each change is read, made and written under an exclusive lock on
    the file (``flock``), each read under a shared one, so no change is lost or half read. A file
    not yet written holds the instances an administrator made (``madeByAdmin``)."""

    def __init__(self, state_file: Path, gpus: Sequence[Gpu]) -> None:
        self.path = state_file
        self._gpus = {gpu.uuid: gpu for gpu in gpus}

    def read(self) -> SimulatedInstances:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return self._made_by_admin()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._parse(fd)
        finally:
            os.close(fd)  # and with it the lock

    @contextlib.contextmanager
    def changing(self) -> Iterator[SimulatedInstances]:
        """The instances to change in place; written back when the block ends without an error."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            state = self._parse(fd)
            yield state
            raw = {gpu: {str(gi): vars(i) for gi, i in instances.items()} for gpu, instances in state.items()}
            data = json.dumps(raw, sort_keys=True).encode()
            # Over the old bytes, then cut to length: never emptied first (on ext4 a file
            # truncated to nothing is flushed to disk at close, a millisecond or more a command).
            # Unsynced: it stands for the GPU's state, which a driver crash leaves as it is.
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _parse(self, fd: int) -> SimulatedInstances:
        raw = os.pread(fd, os.fstat(fd).st_size, 0)
        if not raw:
            return self._made_by_admin()
        return {
            gpu: {int(gi): _SimulatedInstance(**instance) for gi, instance in instances.items()}
            for gpu, instances in json.loads(raw).items()
        }

    def _made_by_admin(self) -> SimulatedInstances:
        """The GPUs as they start: with the instances an administrator made (their placement
        known) on the GPUs whose partitions are made on demand."""
        state: SimulatedInstances = {}
        for gpu in self._gpus.values():
            if gpu.mig_layout is None:
                continue
            for mig in gpu.mig_devices:
                placement = gpu.mig_layout.placement(mig.profile, mig.placement_start)
                if placement is not None:
                    state.setdefault(gpu.uuid, {})[mig.gi] = _SimulatedInstance(
                        placement.profile_id,
                        placement.profile,
                        placement.start,
                        placement.memory_slices,
                        [mig.ci],
                    )
        return state

    def mig_devices(self, state: SimulatedInstances, gpu: Gpu) -> tuple[MigDevice, ...]:
        """The MIG devices of ``gpu`` in ``state`` as NVML lists them: one per compute instance,
        with its placement."""
        return tuple(
            MigDevice(
                gi=gi,
                ci=ci,
                profile=instance.profile,
                uuid=simulated_mig_uuid(gpu.uuid, gi, ci),
                memory_bytes=_placement_memory(gpu, instance),
                placement_start=instance.start,
            )
            for gi, instance in sorted(state.get(gpu.uuid, {}).items())
            for ci in sorted(instance.compute_instances)
        )


def _placement_memory(gpu: Gpu, instance: _SimulatedInstance) -> int:
    placement = gpu.mig_layout.placement(instance.profile, instance.start) if gpu.mig_layout else None
    return placement.memory_bytes if placement is not None else 0


class SimulatedSmi:
    """``nvidia-smi mig`` for simulated GPUs: each command is first handed to ``record`` (the
    driver's recording runner: logged, failures injected), then answered from the state file
    (``SimulatedMigState``), read again at each command since another process may change it."""

    def __init__(
        self,
        state_file: Path,
        gpus: Sequence[Gpu],
        record: RunCommand,
        command_s: float = 0.0,
        capabilities: SimulatedCapabilities | None = None,
    ) -> None:
        self._state = SimulatedMigState(state_file, gpus)
        self._capabilities = capabilities  # the capability files of the instances, kept current
        self._record = record
        self._command_s = command_s  # how long a command takes to return after its change
        self._gpus = {gpu.uuid: gpu for gpu in gpus}

    def instances(self) -> dict[str, dict[int, tuple[str, int, list[int]]]]:
        """GPU uuid -> GPU instance id -> (profile, start, compute instance ids), as the state
        file says now (a driver in another process may have changed it): for tests."""
        return {
            gpu: {gi: (i.profile, i.start, list(i.compute_instances)) for gi, i in instances.items()}
            for gpu, instances in self._state.read().items()
            if instances
        }

    async def instance_uuid(self, gpu_uuid: str, gpu_instance: int, compute_instance: int) -> str:
        return simulated_mig_uuid(gpu_uuid, gpu_instance, compute_instance)

    async def run(self, command: Command) -> str:
        await self._record(command)
        argv = command.argv
        if argv[:3] != ("nvidia-smi", "mig", "-i") or len(argv) < 5:
            return ""
        gpu_uuid, args = argv[3], list(argv[4:])
        gpu = self._gpus.get(gpu_uuid)
        if gpu is None or gpu.mig_layout is None:
            raise SharingCommandError(f"{command.describe()}: GPU {gpu_uuid} is not in MIG mode")
        if args == ["-lgi"]:
            return self._list(gpu, self._state.read().get(gpu_uuid, {}))
        try:
            with self._state.changing() as state:
                output = self._answer(gpu, state.setdefault(gpu_uuid, {}), args)
        except ValueError as err:  # refused: nothing changed, nothing written
            raise SharingCommandError(f"{command.describe()} exited 1: {err}") from None
        if self._command_s:
            await asyncio.sleep(self._command_s)
        return output

    def _answer(self, gpu: Gpu, instances: dict[int, _SimulatedInstance], args: list[str]) -> str:
        if args[0] == "-cgi":
            profile_id, start = (int(part) for part in args[1].split(":"))
            output, gi = self._create_gpu_instance(gpu, instances, profile_id, start)
            self._capability(gpu, gi, None, made=True)
            if args[2:] != ["-C"]:
                return output
            instances[gi].compute_instances.append(0)  # the default one, spanning the instance
            self._capability(gpu, gi, 0, made=True)
            return output + (
                f"Successfully created compute instance ID  0 on GPU {gpu.index:2d} GPU instance ID "
                f"{gi:2d} using profile MIG {instances[gi].profile} (ID  0)\n"
            )
        gi = int(args[1])
        instance = instances.get(gi)
        if args[0] != "-gi" or instance is None:
            raise ValueError(f"No GPU instance found with ID {args[1]}")
        if args[2] == "-dci":
            if not instance.compute_instances:
                raise ValueError("No compute instances found")
            for ci in instance.compute_instances:
                self._capability(gpu, gi, ci, made=False)
            instance.compute_instances.clear()
            return (
                f"Successfully destroyed compute instance ID  0 from GPU {gpu.index:2d} "
                f"GPU instance ID {gi:2d}\n"
            )
        if args[2] == "-dgi":
            if instance.compute_instances:
                raise ValueError("In use by another client: destroy its compute instances first")
            del instances[gi]
            self._capability(gpu, gi, None, made=False)
            return f"Successfully destroyed GPU instance ID {gi:2d} from GPU {gpu.index:2d}\n"
        raise ValueError(f"unsupported: {' '.join(args)}")

    def _capability(self, gpu: Gpu, gi: int, ci: int | None, *, made: bool) -> None:
        if self._capabilities is not None:
            change = self._capabilities.add if made else self._capabilities.remove
            change(gpu.minor, gi, ci)

    @staticmethod
    def _create_gpu_instance(
        gpu: Gpu, instances: dict[int, _SimulatedInstance], profile_id: int, start: int
    ) -> tuple[str, int]:
        assert gpu.mig_layout is not None
        placement = next(
            (p for p in gpu.mig_layout.placements if (p.profile_id, p.start) == (profile_id, start)), None
        )
        if placement is None:
            raise ValueError(f"Invalid placement {profile_id}:{start}")
        wanted = set(range(start, start + placement.memory_slices))
        for gi, other in instances.items():
            if wanted & set(range(other.start, other.start + other.size)):
                raise ValueError(f"Insufficient Resources: placement {start} overlaps GPU instance {gi}")
        gi = next(n for n in range(1, 64) if n not in instances)
        instances[gi] = _SimulatedInstance(profile_id, placement.profile, start, placement.memory_slices, [])
        output = (
            f"Successfully created GPU instance ID {gi:2d} on GPU {gpu.index:2d} using profile MIG "
            f"{placement.profile} (ID {profile_id:2d})\n"
        )
        return output, gi

    @staticmethod
    def _list(gpu: Gpu, instances: dict[int, _SimulatedInstance]) -> str:
        rows = [
            f"| {gpu.index:3d}  MIG {i.profile:<14} {i.profile_id:4d} {gi:8d} {i.start:8d}:{i.size:<6}|"
            for gi, i in sorted(instances.items())
        ]
        if not rows:
            return "No GPU instances found: Not Found\n"
        header = "| GPU   Name             Profile  Instance   Placement  |\n|" + "=" * 55 + "|\n"
        return "+" + "-" * 55 + "+\n| GPU instances:" + " " * 40 + "|\n" + header + "\n".join(rows) + "\n"
