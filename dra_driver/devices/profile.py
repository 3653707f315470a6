"""The device profile: the one interface through which the driver meets a vendor's devices.

A profile answers four questions, and nothing else in the driver knows a vendor:

- discovery (``discovery``): the node's devices with their attributes and memory, for the
  ResourceSlices and for prepare; health, as a stream of whole inventories;
- container edits for a device (``device_nodes``) and for a claim (``claim_edits``: environment
  such as ``NVIDIA_VISIBLE_DEVICES``, nodes every container of the vendor needs);
- which sharing strategies it can set up (``strategies``; a claim asking for another is refused);
- the sharing setup itself (``sharing``): the commands that put a device into a strategy and back,
  the host state a share needs, and a share's container edits;
- partitions made on demand (``partitioner``: MIG instances), for a profile whose discovery
  reports devices with a ``mig_layout``, and what a container holding a MIG device needs; None
  for a profile that makes none.

Profiles are built by name from ``dra_driver.profiles``' registry (the ``--backend`` flag).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Protocol

from contract.gpuconfig import SharingStrategy
from dra_driver.devices.model import Gpu, MigInstance, NodeDevice
from dra_driver.devices.share import (
    Command,
    ContainerEdits,
    GpuShare,
    MigPartition,
    PlacedInstance,
    RunCommand,
)


class BackendUnavailable(RuntimeError):
    """The chosen profile cannot run here (no NVML library, no driver, unreadable settings...)."""


class Discovery(Protocol):
    def inventory(self) -> list[Gpu]:
        """The node's devices now, ordered by minor number."""
        ...

    def watch_health(self) -> AsyncGenerator[list[Gpu], None]:
        """Yields the whole inventory again each time a device's health or the device set changes.

        Use as ``async for gpus in discovery.watch_health(): ...``. Changes are counted from the
        call, so call it before reading the initial ``inventory()`` to miss nothing.
        """
        ...


class SharingSetup(Protocol):
    """A profile's sharing commands and host state, bound to the driver's state directory."""

    def setup_commands(self, share: GpuShare) -> list[Command]:
        """Commands that put an idle device into the share's strategy."""
        ...

    def reset_commands(self, strategy: SharingStrategy, gpu_uuid: str) -> list[Command]:
        """Commands that return a device to its default state once no claim uses it."""
        ...

    def prepare_host(self, share: GpuShare) -> None:
        """Host state the setup commands need (directories...), made before they run."""
        ...

    def clean_host(self, strategy: SharingStrategy, gpu_uuid: str) -> None:
        """Remove what ``prepare_host`` made, after the reset; never raises."""
        ...

    def container_edits(self, share: GpuShare) -> ContainerEdits:
        """What the claim's containers need for this share."""
        ...


class Partitioner(Protocol):
    """Makes and destroys a device's partitions (MIG instances); the driver records a partition
    before it is made and after."""

    async def instances(self, gpu_uuid: str) -> tuple[PlacedInstance, ...]:
        """The GPU instances on the device now, with their placements (none: an empty tuple)."""
        ...

    async def create(self, gpu_uuid: str, partition: MigPartition) -> MigPartition:
        """The GPU instance at the partition's placement and its compute instance; the partition
        with their ids and the MIG device's uuid."""
        ...

    async def destroy(self, gpu_uuid: str, partition: MigPartition) -> None:
        """Whatever exists of the partition at its placement (found on the device, not from the
        recorded ids); nothing there is nothing to do."""
        ...

    async def instance_edits(self, instance: MigInstance) -> ContainerEdits:
        """What a container holding the MIG device needs besides its GPU's nodes (NVIDIA: the
        capability nodes of its GPU and compute instance); raises OSError when they cannot be
        read."""
        ...


class DeviceProfile(Protocol):
    @property
    def name(self) -> str:
        """The registry name it was built under (for messages)."""
        ...

    @property
    def discovery(self) -> Discovery: ...

    @property
    def simulated(self) -> bool:
        """The devices are not real: sharing commands are recorded, not run."""
        ...

    @property
    def strategies(self) -> frozenset[SharingStrategy]:
        """The sharing strategies ``sharing`` can set up; Exclusive is always among them."""
        ...

    def device_nodes(self, gpu: Gpu) -> tuple[str, ...]:
        """The device nodes a container holding ``gpu`` (or one of its MIG devices) needs."""
        ...

    def claim_edits(self, devices: Sequence[NodeDevice]) -> ContainerEdits:
        """Claim-wide edits for a claim of ``devices`` (environment, the vendor's common nodes)."""
        ...

    def sharing(self, state_dir: Path) -> SharingSetup:
        """The sharing setup, keeping its host state under ``state_dir``."""
        ...

    def partitioner(self, run: RunCommand, state_dir: Path) -> Partitioner | None:
        """The partitioner running its commands through ``run`` (None: the profile makes no
        partitions); a simulated one keeps its devices' partitions under ``state_dir``."""
        ...
