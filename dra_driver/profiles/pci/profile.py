"""A generic PCI accelerator profile (``--backend pci``): the smallest profile the seam allows.

Discovery reads sysfs: every PCI device under ``sysfsRoot`` (``/sys/bus/pci/devices``) whose
``vendor`` file holds ``vendorId`` (and whose ``class`` starts with ``classPrefix``, when given)
is one device, numbered in bus-id order at start and in order of appearance after; its device
nodes are ``<devRoot>/<nodeSubsystem>/<name>`` for each entry of its sysfs ``<nodeSubsystem>/``
directory (the kernel's accel class: ``/dev/accel/accel0``). All devices have the configured
``memory``. Health is presence: every ``pollIntervalSeconds`` sysfs is read again, and a device
that left it keeps its name and is reported unhealthy until it is back.

Container edits: the devices' nodes, and ``visibleDevicesEnv`` set to their PCI bus ids (comma
separated). No sharing commands: a device is held whole (Exclusive); a claim asking for MPS or
time-slicing, or for a fraction of a device, is refused with the reason, and the driver publishes
whole devices only, so the scheduler does not hand out fractions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.gpuconfig import SharingStrategy
from dra_driver.devices.attributes import string_attribute
from dra_driver.devices.model import Gpu, NodeDevice
from dra_driver.devices.profile import BackendUnavailable
from dra_driver.devices.share import Command, ContainerEdits, GpuShare, RunCommand
from dra_driver.profiles.common import SYSFS_PCI_DEVICES, MemorySize, load_settings_file, pcie_root_of

GONE_MESSAGE = "gone from sysfs"
STRATEGIES = frozenset({SharingStrategy.EXCLUSIVE})


class PciSettings(BaseModel):
    """The profile's settings file (YAML, camelCase keys)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    vendor_id: str = Field(alias="vendorId", pattern=r"^0x[0-9a-f]{4}$")
    class_prefix: str = Field(default="", alias="classPrefix", pattern=r"^(0x[0-9a-f]{2,6})?$")
    product_name: str = Field(default="", alias="productName", max_length=64)
    memory: MemorySize
    node_subsystem: str = Field(default="accel", alias="nodeSubsystem", pattern=r"^[a-z0-9_-]+$")
    visible_devices_env: str = Field(alias="visibleDevicesEnv", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    sysfs_root: Path = Field(default=SYSFS_PCI_DEVICES, alias="sysfsRoot")
    dev_root: Path = Field(default=Path("/dev"), alias="devRoot")
    poll_interval_s: float = Field(default=10.0, alias="pollIntervalSeconds", gt=0)

    @field_validator("vendor_id", "class_prefix", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value  # sysfs writes lowercase hex


def load_settings(path: Path) -> PciSettings:
    return load_settings_file(path, PciSettings, "pci profile settings")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return ""


class PciDiscovery:
    """The matching PCI devices, read from sysfs on every ``inventory()``."""

    def __init__(self, settings: PciSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()  # inventory() runs on the health poll's thread too
        self._known: dict[str, Gpu] = {}  # bus id -> device, in order of first sight
        self._nodes: dict[str, tuple[str, ...]] = {}  # uuid (= bus id) -> device nodes
        if not settings.sysfs_root.is_dir():
            raise BackendUnavailable(f"no PCI devices directory at {settings.sysfs_root}")

    def _matching(self) -> list[Path]:
        wanted = self._settings
        return [
            device_dir
            for device_dir in sorted(wanted.sysfs_root.iterdir())
            if _read(device_dir / "vendor") == wanted.vendor_id
            and _read(device_dir / "class").startswith(wanted.class_prefix)
        ]

    def _read_device(self, device_dir: Path, minor: int) -> Gpu:
        bus_id = device_dir.name
        vendor, device = _read(device_dir / "vendor"), _read(device_dir / "device")
        return Gpu(
            minor=minor,
            index=minor,
            uuid=bus_id,
            product_name=self._settings.product_name or f"PCI {vendor}:{device}",
            pci_bus_id=bus_id,
            memory_bytes=self._settings.memory,
            pcie_root=pcie_root_of(device_dir),
            attributes={"vendorID": string_attribute(vendor), "deviceID": string_attribute(device)},
        )

    def _node_paths(self, device_dir: Path) -> tuple[str, ...]:
        subsystem = self._settings.node_subsystem
        try:
            names = sorted(entry.name for entry in (device_dir / subsystem).iterdir())
        except OSError:
            return ()
        return tuple(str(self._settings.dev_root / subsystem / name) for name in names)

    def inventory(self) -> list[Gpu]:
        present = self._matching()
        with self._lock:
            seen_now: set[str] = set()
            for device_dir in present:
                bus_id = device_dir.name
                minor = self._known[bus_id].minor if bus_id in self._known else len(self._known)
                self._known[bus_id] = self._read_device(device_dir, minor)
                self._nodes[bus_id] = self._node_paths(device_dir)
                seen_now.add(bus_id)
            gpus = [
                gpu if bus_id in seen_now else replace(gpu, healthy=False, health_message=GONE_MESSAGE)
                for bus_id, gpu in self._known.items()
            ]
        return sorted(gpus, key=lambda gpu: gpu.minor)

    def device_nodes(self, gpu_uuid: str) -> tuple[str, ...]:
        with self._lock:
            return self._nodes.get(gpu_uuid, ())

    def watch_health(self) -> AsyncGenerator[list[Gpu], None]:
        # The starting point is read now, so a change before the first ``anext`` is delivered.
        return self._changes_after(self.inventory())

    async def _changes_after(self, seen: list[Gpu]) -> AsyncGenerator[list[Gpu], None]:
        while True:
            await asyncio.sleep(self._settings.poll_interval_s)
            now = await asyncio.to_thread(self.inventory)
            if now != seen:
                seen = now
                yield now


class NoSharing:
    """Devices held whole: nothing to set up, reset or add for a share."""

    def setup_commands(self, share: GpuShare) -> list[Command]:
        return []

    def reset_commands(self, strategy: SharingStrategy, gpu_uuid: str) -> list[Command]:
        return []

    def prepare_host(self, share: GpuShare) -> None:
        return None

    def clean_host(self, strategy: SharingStrategy, gpu_uuid: str) -> None:
        return None

    def container_edits(self, share: GpuShare) -> ContainerEdits:
        return ContainerEdits()


class PciProfile:
    def __init__(self, settings: PciSettings, name: str = "pci") -> None:
        self._name = name
        self._settings = settings
        self._discovery = PciDiscovery(settings)

    @property
    def name(self) -> str:
        return self._name

    @property
    def discovery(self) -> PciDiscovery:
        return self._discovery

    @property
    def simulated(self) -> bool:
        return False

    @property
    def strategies(self) -> frozenset[SharingStrategy]:
        return STRATEGIES

    def device_nodes(self, gpu: Gpu) -> tuple[str, ...]:
        return self._discovery.device_nodes(gpu.uuid)

    def claim_edits(self, devices: Sequence[NodeDevice]) -> ContainerEdits:
        return ContainerEdits(env={self._settings.visible_devices_env: ",".join(d.uuid for d in devices)})

    def sharing(self, state_dir: Path) -> NoSharing:
        return NoSharing()

    def partitioner(self, run: RunCommand, state_dir: Path) -> None:
        return None  # its devices have no partitions
