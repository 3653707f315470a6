"""Device profiles by name: what ``--backend`` chooses. Adding a vendor is one entry here.

Each factory takes the profile's settings file (``--profile``: the simulated GPUs, the pci
profile's settings; None when not given) and the node name, and raises ``BackendUnavailable``
when the profile cannot run on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from dra_driver.devices.profile import BackendUnavailable, DeviceProfile
from dra_driver.profiles.nvidia.nvml import NvmlDiscovery
from dra_driver.profiles.nvidia.profile import NvidiaProfile
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.profiles.pci.profile import PciProfile, load_settings

ProfileFactory = Callable[[Path | None, str], DeviceProfile]


def _nvml(settings: Path | None, node_name: str) -> DeviceProfile:
    discovery = NvmlDiscovery()
    return NvidiaProfile("nvml", discovery, simulated=False, mig_device_uuid=discovery.mig_device_uuid)


def _simulated(settings: Path | None, node_name: str) -> DeviceProfile:
    if settings is None:
        raise BackendUnavailable("the simulated backend needs a profile (--profile)")
    # The node name seeds the simulated UUIDs, so fake nodes do not collide.
    discovery = SimulatedDiscovery.from_file(settings, node_name)
    return NvidiaProfile(
        "simulated", discovery, simulated=True, simulated_mig_command_s=discovery.mig_command_s
    )


def _pci(settings: Path | None, node_name: str) -> DeviceProfile:
    if settings is None:
        raise BackendUnavailable("the pci backend needs its settings file (--profile)")
    return PciProfile(load_settings(settings))


PROFILES: Mapping[str, ProfileFactory] = MappingProxyType(
    {"nvml": _nvml, "simulated": _simulated, "pci": _pci}
)


def build_profile(name: str, settings: Path | None = None, node_name: str = "") -> DeviceProfile:
    factory = PROFILES.get(name)
    if factory is None:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(sorted(PROFILES))}")
    return factory(settings, node_name)
