"""NVIDIA GPUs described by a small YAML file (a "GPU profile"), so everything runs without a GPU:
the NVIDIA device profile's simulated discovery (``--backend simulated``).

Tests (and the simulated node agent) flip a device's health with ``set_health``; every
``watch_health`` iterator then yields the new inventory, exactly as NVML discovery does on an
XID error.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dra_driver.devices.model import Gpu, MigDevice, MigPlacement
from dra_driver.profiles.common import PARTITION_POLL_S, MemorySize, load_settings_file
from dra_driver.profiles.nvidia.attributes import nvidia_attributes
from dra_driver.profiles.nvidia.mig import SimulatedInstances, SimulatedMigState, simulated_mig_uuid
from dra_driver.profiles.nvidia.migtables import mig_layout

PROFILE_DIR = Path(__file__).resolve().parent / "nodes"
_UUID_NAMESPACE = uuid.UUID("6f1c1f0e-6a43-4e0f-9b1e-746573736572")


class MigSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    profile: str = Field(min_length=1)
    memory: MemorySize


class PlacedMigSpec(BaseModel):
    """An instance an administrator made on a GPU whose partitions the driver makes on demand."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    profile: str = Field(min_length=1)
    start: int = Field(ge=0)


class GpuGroupSpec(BaseModel):
    """``count`` identical GPUs; the profile lists groups in minor-number order."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    count: int = Field(default=1, ge=1, le=64)
    product_name: str = Field(alias="productName", min_length=1)
    brand: str = "Nvidia"
    architecture: str = Field(min_length=1)
    cuda_compute_capability: str = Field(alias="cudaComputeCapability", pattern=r"^\d+\.\d+$")
    memory: MemorySize
    # Present means MIG mode is on: a list of the instances an administrator made, or "dynamic":
    # none made, the driver makes them on demand (the product must be in the placement tables).
    mig: list[MigSpec] | Literal["dynamic"] | None = None
    # With mig: dynamic, instances an administrator made by hand (GPU instance ids 1, 2, ... in
    # this order, each with compute instance 0): the driver publishes them and leaves them alone.
    made_by_admin: list[PlacedMigSpec] = Field(default_factory=list, alias="madeByAdmin")
    gpus_per_pcie_root: int = Field(default=2, alias="gpusPerPcieRoot", ge=1)

    @model_validator(mode="after")
    def _known_placements(self) -> Self:
        if self.mig == "dynamic" and mig_layout(self.product_name, self.memory) is None:
            raise ValueError(
                f"mig: dynamic needs a GPU with known MIG placements (A100 40GB/80GB, H100 80GB, "
                f"H200), not {self.product_name}"
            )
        if self.made_by_admin and self.mig != "dynamic":
            raise ValueError("madeByAdmin lists instances of a GPU with mig: dynamic")
        self.admin_placements()  # each known, none overlapping
        return self

    def admin_placements(self) -> list[MigPlacement]:
        layout = mig_layout(self.product_name, self.memory)
        placements: list[MigPlacement] = []
        taken: set[int] = set()
        for made in self.made_by_admin:
            assert layout is not None  # mig: dynamic, checked above
            placement = layout.placement(made.profile, made.start)
            if placement is None:
                raise ValueError(
                    f"madeByAdmin: {self.product_name} has no placement {made.profile} at {made.start}"
                )
            slices = set(range(placement.start, placement.start + placement.memory_slices))
            if slices & taken:
                raise ValueError(f"madeByAdmin: {made.profile} at {made.start} overlaps another instance")
            taken |= slices
            placements.append(placement)
        return placements


class ProfileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    description: str = ""
    driver_version: str = Field(alias="driverVersion", min_length=1)
    cuda_driver_version: str = Field(alias="cudaDriverVersion", min_length=1)
    gpus: list[GpuGroupSpec] = Field(min_length=1)
    # How long a simulated nvidia-smi mig command takes to return after it changed the GPU (a
    # real one takes tens of ms to seconds): a window in which a driver can die with the change
    # made and not recorded, for crash tests.
    mig_command_seconds: float = Field(default=0.0, alias="migCommandSeconds", ge=0, le=60)


def _stable_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, '/'.join(str(p) for p in parts))}"


def build_inventory(spec: ProfileSpec, seed: str) -> list[Gpu]:
    """Expand a profile into GPUs; ``seed`` (the node name) keeps UUIDs unique across fake nodes."""
    gpus: list[Gpu] = []
    for group in spec.gpus:
        for _ in range(group.count):
            index = len(gpus)
            bus = (0x18 + 8 * index) % 0x100
            root = (0x10 * (index // group.gpus_per_pcie_root)) % 0x100
            gpu_uuid = _stable_uuid("GPU", seed, index)
            migs = tuple(
                MigDevice(
                    gi=position + 1,
                    ci=0,
                    profile=mig.profile,
                    uuid=_stable_uuid("MIG", gpu_uuid, position),
                    memory_bytes=mig.memory,
                )
                for position, mig in enumerate(group.mig if isinstance(group.mig, list) else ())
            ) + tuple(
                MigDevice(
                    gi=position + 1,
                    ci=0,
                    profile=placement.profile,
                    # as the simulated nvidia-smi names the instance's device (the same ids)
                    uuid=simulated_mig_uuid(gpu_uuid, position + 1, 0),
                    memory_bytes=placement.memory_bytes,
                    placement_start=placement.start,
                )
                for position, placement in enumerate(group.admin_placements())
            )
            layout = mig_layout(group.product_name, group.memory) if group.mig == "dynamic" else None
            gpus.append(
                Gpu(
                    minor=index,
                    index=index,
                    uuid=gpu_uuid,
                    product_name=group.product_name,
                    pci_bus_id=f"0000:{bus:02x}:00.0",
                    memory_bytes=group.memory,
                    mig_enabled=group.mig is not None,
                    mig_devices=migs,
                    mig_layout=layout,
                    pcie_root=f"pci0000:{root:02x}",
                    simulated=True,
                    attributes=nvidia_attributes(
                        brand=group.brand,
                        architecture=group.architecture,
                        cuda_compute_capability=group.cuda_compute_capability,
                        driver_version=spec.driver_version,
                        cuda_driver_version=spec.cuda_driver_version,
                    ),
                )
            )
    return gpus


def load_profile(path: Path) -> ProfileSpec:
    """Read and validate a profile; a bare name like ``h100x8`` means a shipped profile."""
    if not path.suffix and not path.exists():
        path = PROFILE_DIR / f"{path}.yaml"
    return load_settings_file(path, ProfileSpec, "GPU profile")


class SimulatedDiscovery:
    """GPUs from a profile, held in memory; health changes come from ``set_health``.

    Given the simulated GPUs' MIG state file (``mig_state``: the driver's, which its simulated
    ``nvidia-smi`` changes), the GPUs whose partitions are made on demand list the instances it
    holds, as NVML lists every instance there is, and every ``watch_health`` iterator also yields
    when they change (the file is read every ``PARTITION_POLL_S``): an instance an administrator
    made or destroyed after the start is published. Without it they list the profile's
    ``madeByAdmin`` instances."""

    def __init__(self, gpus: list[Gpu], mig_command_s: float = 0.0, mig_state: Path | None = None) -> None:
        self._gpus = {gpu.minor: gpu for gpu in gpus}
        self.mig_command_s = mig_command_s
        self._mig_state = SimulatedMigState(mig_state, gpus) if mig_state is not None else None
        self._version = 0
        self._changed = asyncio.Event()

    @classmethod
    def from_file(
        cls, profile: Path, node_name: str = "", mig_state: Path | None = None
    ) -> SimulatedDiscovery:
        spec = load_profile(profile)
        return cls(build_inventory(spec, seed=node_name or str(profile)), spec.mig_command_seconds, mig_state)

    def inventory(self) -> list[Gpu]:
        return self._with_instances(self._instances())

    def _instances(self) -> SimulatedInstances | None:
        return self._mig_state.read() if self._mig_state is not None else None

    def _with_instances(self, instances: SimulatedInstances | None) -> list[Gpu]:
        gpus = [self._gpus[minor] for minor in sorted(self._gpus)]
        if instances is None or self._mig_state is None:
            return gpus
        return [
            replace(gpu, mig_devices=self._mig_state.mig_devices(instances, gpu))
            if gpu.mig_layout is not None
            else gpu
            for gpu in gpus
        ]

    def set_health(self, minor: int, healthy: bool, message: str = "") -> None:
        """Mark one GPU healthy or not and wake every ``watch_health`` iterator."""
        if minor not in self._gpus:
            raise KeyError(f"no simulated GPU with minor {minor}")
        self._gpus[minor] = replace(self._gpus[minor], healthy=healthy, health_message=message)
        self._version += 1
        # Swap the event before setting it so later waits block until the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def watch_health(self) -> AsyncGenerator[list[Gpu], None]:
        # The starting point is taken now, not at the first iteration, so a change between this
        # call and the consumer's first ``anext`` is still delivered.
        return self._changes_after(self._version, self._instances())

    async def _changes_after(
        self, seen: int, listed: SimulatedInstances | None
    ) -> AsyncGenerator[list[Gpu], None]:
        poll_s = PARTITION_POLL_S if self._mig_state is not None else None
        while True:
            # A change made while the consumer was busy is caught by the version, not the event.
            if self._version == seen:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), poll_s)
            instances = self._instances()
            if self._version == seen and instances == listed:
                continue
            seen, listed = self._version, instances
            yield self._with_instances(instances)
