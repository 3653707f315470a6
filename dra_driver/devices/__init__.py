"""GPU discovery: the device model, the backend interface and its NVML and simulated backends."""

from dra_driver.devices.backend import Backend, BackendUnavailable, load_backend
from dra_driver.devices.model import Gpu, MigDevice
from dra_driver.devices.naming import gpu_device_name, mig_device_name

__all__ = [
    "Backend",
    "BackendUnavailable",
    "Gpu",
    "MigDevice",
    "gpu_device_name",
    "load_backend",
    "mig_device_name",
]
