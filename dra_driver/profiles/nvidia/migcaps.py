"""The capability device nodes a container needs to use a MIG device.

Besides its GPU's ``/dev/nvidia<minor>`` and the control and UVM nodes, a MIG device is reached
through two of NVIDIA's capability nodes: the ``access`` capability of its GPU instance and that
of its compute instance (NVIDIA's MIG user guide, "Device Nodes and Capabilities"). The kernel
driver lists each under ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` and
``.../gi<G>/ci<C>/access``, a small file with a line ``DeviceFileMinor: <m>``; the node is
``/dev/nvidia-caps/nvidia-cap<m>``, a character device whose major is the one ``/proc/devices``
names ``nvidia-caps``. The minors exist only once the instance does, so they are read after a
partition is made (or, for an instance someone else made, when it is prepared).

The nodes go into the CDI spec with their numbers (type ``c``, major, minor): the runtime can
then create them and allow them in the device cgroup whether or not the host's
``/dev/nvidia-caps`` holds the node yet. Every path is read under a ``proc_root`` (``/proc`` on a
real node), so the simulated GPUs can keep their capability files in a directory of their own.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from dra_driver.devices.share import CharDevice

CAPS_DEVICE_DIR = "/dev/nvidia-caps"
CAPS_MAJOR_NAME = "nvidia-caps"
_MINOR_LINE = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class CapabilityFileError(OSError):
    """A capability file or /proc/devices says nothing usable: the MIG device cannot be handed
    to a container (an OSError, so it costs only the claim being prepared)."""


def capabilities_dir(proc_root: Path, gpu_minor: int) -> Path:
    return proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_minor}" / "mig"


def access_files(
    proc_root: Path, gpu_minor: int, gpu_instance: int, compute_instance: int
) -> tuple[Path, Path]:
    """The GPU instance's and the compute instance's ``access`` files."""
    gi = capabilities_dir(proc_root, gpu_minor) / f"gi{gpu_instance}"
    return gi / "access", gi / f"ci{compute_instance}" / "access"


def device_file_minor(text: str, source: Path) -> int:
    found = _MINOR_LINE.search(text)
    if found is None:
        raise CapabilityFileError(f"{source} has no 'DeviceFileMinor: <n>' line")
    return int(found.group(1))


def character_major(proc_devices: str, name: str) -> int | None:
    """The major number ``/proc/devices`` gives ``name`` among its character devices (its
    "Block devices:" section, which may reuse a number, is not read)."""
    in_characters = False
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            in_characters = line.strip() == "Character devices:"
            continue
        number, _, device = line.strip().partition(" ")
        if in_characters and device.strip() == name and number.isdigit():
            return int(number)
    return None


def caps_device_node(minor: int, major: int) -> CharDevice:
    return CharDevice(f"{CAPS_DEVICE_DIR}/nvidia-cap{minor}", major, minor)


class MigCapabilities:
    """Reads the capability nodes of MIG devices under ``proc_root``."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root

    def device_nodes(
        self, gpu_minor: int, gpu_instance: int, compute_instance: int
    ) -> tuple[CharDevice, ...]:
        """The GPU instance's node, then the compute instance's; raises OSError (a missing file)
        or CapabilityFileError (one without its number)."""
        devices = self.proc_root / "devices"
        major = character_major(devices.read_text(), CAPS_MAJOR_NAME)
        if major is None:
            raise CapabilityFileError(f"{devices} names no {CAPS_MAJOR_NAME} character device")
        return tuple(
            caps_device_node(device_file_minor(path.read_text(), path), major)
            for path in access_files(self.proc_root, gpu_minor, gpu_instance, compute_instance)
        )


# ---- the simulated GPUs' capability files ----

SIMULATED_CAPS_MAJOR = 238  # a real driver's number varies per boot; any free one will do here
# Minors laid out as a real driver numbers its MIG capabilities (1 and 2 are "config" and
# "monitor"; then per GPU 15 GPU instances of 1 + 8 compute instances each): GPU 0's GPU instance
# 3 is 30, its compute instance 0 is 31.
_FIRST_MIG_MINOR = 3
_MINORS_PER_GPU = 135
_MINORS_PER_GPU_INSTANCE = 9


def simulated_minor(gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> int:
    """The capability minor of a GPU instance (or, given one, of its compute instance)."""
    minor = _FIRST_MIG_MINOR + _MINORS_PER_GPU * gpu_minor + _MINORS_PER_GPU_INSTANCE * gpu_instance
    return minor if compute_instance is None else minor + 1 + compute_instance


class SimulatedCapabilities:
    """Writes the capability files a real driver shows for the instances of simulated GPUs, so
    ``MigCapabilities`` reads them the same way (under ``proc_root`` instead of ``/proc``)."""

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root

    def _write(self, path: Path, minor: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")

    def add(self, gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> None:
        devices = self.proc_root / "devices"
        if not devices.exists():
            devices.parent.mkdir(parents=True, exist_ok=True)
            devices.write_text(f"Character devices:\n195 nvidia\n{SIMULATED_CAPS_MAJOR} {CAPS_MAJOR_NAME}\n")
        gi_access, ci_access = access_files(self.proc_root, gpu_minor, gpu_instance, compute_instance or 0)
        if compute_instance is None:
            self._write(gi_access, simulated_minor(gpu_minor, gpu_instance))
        else:
            self._write(ci_access, simulated_minor(gpu_minor, gpu_instance, compute_instance))

    def remove(self, gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> None:
        """A destroyed compute instance's files, or a GPU instance's (with what is left under it)."""
        gi = capabilities_dir(self.proc_root, gpu_minor) / f"gi{gpu_instance}"
        shutil.rmtree(gi if compute_instance is None else gi / f"ci{compute_instance}", ignore_errors=True)
