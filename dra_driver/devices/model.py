"""What discovery knows about the devices of one node: plain, immutable data shared by every
device profile.

A ``Gpu`` is one physical device as every profile describes it (identity, memory, health, MIG
partitions); what only its vendor knows (NVIDIA's CUDA compute capability, driver versions...)
comes in ``attributes``, already in ResourceSlice form, and is published as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# One ResourceSlice attribute value: {"string": ...}, {"int": ...}, {"bool": ...} or {"version": ...}.
DeviceAttribute = Mapping[str, str | int | bool]


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance plus compute instance) carved out of a physical GPU."""

    gi: int
    ci: int
    profile: str  # e.g. "1g.10gb"
    uuid: str
    memory_bytes: int
    # The first memory slice of its GPU instance, when discovery knows it: where it sits among
    # the placements of a partitionable GPU.
    placement_start: int | None = None


@dataclass(frozen=True)
class MigPlacement:
    """One place a MIG profile can be created on a GPU: its GPU instance profile and the memory
    slices it covers (``start`` .. ``start + memory_slices - 1``). Compute slices are taken from
    the same start (a profile never has more compute than memory slices), so two placements
    overlap in compute only if they overlap in memory."""

    profile: str  # e.g. "3g.40gb"
    profile_id: int  # the GPU instance profile id (``nvidia-smi mig -lgip``)
    start: int
    memory_slices: int
    compute_slices: int
    memory_bytes: int


@dataclass(frozen=True)
class MigLayout:
    """A GPU whose MIG partitions are made on demand: its slices and every placement its
    profiles allow (the full-GPU placement among them)."""

    memory_slices: int  # 8 on A100/H100/H200
    compute_slices: int  # 7 on A100/H100/H200
    placements: tuple[MigPlacement, ...]

    def placement(self, profile: str, start: int | None) -> MigPlacement | None:
        """The placement of ``profile`` at memory slice ``start``; None when there is none (or
        the start is unknown)."""
        return next((p for p in self.placements if (p.profile, p.start) == (profile, start)), None)

    @property
    def full(self) -> MigPlacement:
        """The placement covering the whole GPU (7g): what the whole-GPU device is made as."""
        return max(self.placements, key=lambda p: (p.memory_slices, p.compute_slices))


@dataclass(frozen=True)
class Gpu:
    """One physical device as seen by the driver."""

    minor: int
    index: int
    uuid: str
    product_name: str
    pci_bus_id: str
    memory_bytes: int
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    # MIG mode on and its placements known: partitions can be made on demand (else None).
    mig_layout: MigLayout | None = None
    healthy: bool = True
    health_message: str = ""
    pcie_root: str = ""  # e.g. "pci0000:00"; empty when unknown
    # A simulated device has no device node behind it (no /dev/nvidia<minor>, /dev/nvidiactl...).
    simulated: bool = False
    # The vendor's own attributes (name -> ResourceSlice value), published beside the common ones.
    attributes: Mapping[str, DeviceAttribute] = field(default_factory=dict)


@dataclass(frozen=True)
class MigInstance:
    """A MIG device that exists: the GPU it is carved from and its GPU and compute instance ids
    (what a profile needs to name the device's own nodes)."""

    gpu_uuid: str
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True)
class NodeDevice:
    """A device this node publishes, with what prepare needs to hand it to a container."""

    name: str
    uuid: str
    memory_bytes: int  # as published: floored to whole MiB
    device_nodes: tuple[str, ...]
    is_mig: bool = False
    # A placement of a partitionable GPU: prepare creates the instance (``uuid`` is the GPU's
    # until then).
    placement: MigPlacement | None = None
    # A MIG device that exists already (made by someone else than this driver).
    instance: MigInstance | None = None
