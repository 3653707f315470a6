"""Device names as published in ResourceSlices; the plugin uses the same functions to map back."""

from __future__ import annotations

from dra_driver.devices.model import Gpu, MigDevice


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str:
    # Profile names contain dots, which a DNS label forbids; the instance ids are unique per GPU.
    return f"gpu-{gpu.minor}-mig-{mig.gi}-{mig.ci}"
