"""The attributes only NVIDIA GPUs have, as both discovery sources (NVML, simulated) publish them."""

from __future__ import annotations

from dra_driver.devices.attributes import string_attribute, version_attribute
from dra_driver.devices.model import DeviceAttribute


def nvidia_attributes(
    *,
    brand: str,
    architecture: str,
    cuda_compute_capability: str,
    driver_version: str,
    cuda_driver_version: str,
) -> dict[str, DeviceAttribute]:
    """``cuda_compute_capability`` like "9.0"; the versions as the driver reports them."""
    return {
        "brand": string_attribute(brand),
        "architecture": string_attribute(architecture),
        "cudaComputeCapability": version_attribute(cuda_compute_capability),
        "driverVersion": version_attribute(driver_version),
        "cudaDriverVersion": version_attribute(cuda_driver_version),
    }
