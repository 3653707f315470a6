"""Device names and memory as published in ResourceSlices; the plugin uses the same functions to
map back."""

from __future__ import annotations

from dra_driver.devices.model import Gpu, MigDevice, MigPlacement

_MIB = 1 << 20


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str:
    # Profile names contain dots, which a DNS label forbids; the instance ids are unique per GPU.
    return f"gpu-{gpu.minor}-mig-{mig.gi}-{mig.ci}"


def placement_device_name(gpu: Gpu, placement: MigPlacement) -> str:
    """``gpu-0-mig-3g-40gb-at-4``: the profile (dots made dashes) and its first memory slice."""
    return f"gpu-{gpu.minor}-mig-{placement.profile.replace('.', '-').replace('+', '-')}-at-{placement.start}"


def counter_set_name(gpu: Gpu) -> str:
    """The shared counters of a partitionable GPU (``gpu-0``: one set per GPU)."""
    return f"gpu-{gpu.minor}"


def published_memory(gpu: Gpu) -> int:
    """The memory capacity a whole GPU is published with: floored to whole MiB, so the memory
    request policy's default stays on its MiB step grid."""
    return gpu.memory_bytes - gpu.memory_bytes % _MIB
