"""Device profiles by name: what ``--backend`` chooses. Adding a vendor is one entry here.

Each factory takes the profile's settings file (``--profile``: the simulated GPUs, the pci
profile's settings; None when not given), the node name and the driver's state directory (its
checkpoint directory, where the simulated GPUs keep their MIG instances; None: not watched), and
raises ``BackendUnavailable`` when the profile cannot run on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from dra_driver.devices.profile import BackendUnavailable, DeviceProfile
from dra_driver.profiles.nvidia.nvml import NvmlDiscovery
from dra_driver.profiles.nvidia.profile import SIMULATED_MIG_STATE, NvidiaProfile
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.profiles.pci.profile import PciProfile, load_settings

ProfileFactory = Callable[[Path | None, str, Path | None], DeviceProfile]


def _nvml(settings: Path | None, node_name: str, state_dir: Path | None) -> DeviceProfile:
    discovery = NvmlDiscovery()
    return NvidiaProfile("nvml", discovery, simulated=False, mig_device_uuid=discovery.mig_device_uuid)


def _simulated(settings: Path | None, node_name: str, state_dir: Path | None) -> DeviceProfile:
    if settings is None:
        raise BackendUnavailable("the simulated backend needs a profile (--profile)")
    # The node name seeds the simulated UUIDs, so fake nodes do not collide. Discovery lists the
    # MIG instances the partitioner's state file holds (``partitioner(run, state_dir)``).
    mig_state = state_dir / SIMULATED_MIG_STATE if state_dir is not None else None
    discovery = SimulatedDiscovery.from_file(settings, node_name, mig_state)
    return NvidiaProfile(
        "simulated", discovery, simulated=True, simulated_mig_command_s=discovery.mig_command_s
    )


def _pci(settings: Path | None, node_name: str, state_dir: Path | None) -> DeviceProfile:
    if settings is None:
        raise BackendUnavailable("the pci backend needs its settings file (--profile)")
    return PciProfile(load_settings(settings))


PROFILES: Mapping[str, ProfileFactory] = MappingProxyType(
    {"nvml": _nvml, "simulated": _simulated, "pci": _pci}
)


def build_profile(
    name: str, settings: Path | None = None, node_name: str = "", state_dir: Path | None = None
) -> DeviceProfile:
    factory = PROFILES.get(name)
    if factory is None:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(sorted(PROFILES))}")
    return factory(settings, node_name, state_dir)
