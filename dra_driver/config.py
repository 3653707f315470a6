"""Driver-wide constants and the validated command-line configuration of the DRA driver."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contract.names import DRIVER_NAME

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_DIR = Path("/var/run/cdi")
DEFAULT_CHECKPOINT_DIR = Path("/var/lib/tessera-dra")
# Longest wait for one Kubernetes API call; past it the call fails (a per-claim error for prepare).
API_TIMEOUT_S = 10.0

# "auto" probes the apiserver for consumable capacity; the other two force a publishing mode.
SharingModeSetting = Literal["auto", "consumable-capacity", "whole-device"]
# "auto" probes the apiserver for partitionable devices; "dynamic" makes MIG partitions on demand,
# "static" publishes the MIG devices that exist (as before partitionable devices).
MigModeSetting = Literal["auto", "dynamic", "static"]


class DriverConfig(BaseModel):
    """Everything one driver process needs to know; built from flags, validated once at start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: str = Field(min_length=1, max_length=253)
    driver_name: str = Field(default=DRIVER_NAME, min_length=1, max_length=63)
    # A device profile of dra_driver.profiles.registry (checked when it is built), and its settings file.
    backend: str = Field(default="nvml", min_length=1)
    profile: Path | None = None
    kubeconfig: Path | None = None
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    cdi_dir: Path = DEFAULT_CDI_DIR
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR
    sharing_mode: SharingModeSetting = "auto"
    mig_mode: MigModeSetting = "auto"
    health_port: int = Field(default=0, ge=0, le=65535)

    @field_validator("plugin_dir", "registry_dir", "cdi_dir", "checkpoint_dir")
    @classmethod
    def _absolute(cls, path: Path) -> Path:
        # The kubelet dials the endpoint GetInfo names from its own working directory.
        return path.absolute()
