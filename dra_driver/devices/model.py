"""What discovery knows about the GPUs of one node: plain, immutable data shared by every backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance plus compute instance) carved out of a physical GPU."""

    gi: int
    ci: int
    profile: str  # e.g. "1g.10gb"
    uuid: str
    memory_bytes: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as seen by the driver."""

    minor: int
    index: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    driver_version: str
    cuda_driver_version: str
    pci_bus_id: str
    memory_bytes: int
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True
    health_message: str = ""
    pcie_root: str = ""  # e.g. "pci0000:00"; empty when unknown
    # The simulated backend's GPUs have no /dev/nvidia<minor> (nor /dev/nvidiactl...) behind them.
    simulated: bool = False
