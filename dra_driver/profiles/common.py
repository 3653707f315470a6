"""What more than one vendor profile needs: reading a settings file, memory sizes in it, and the
PCIe root complex of a device from sysfs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from contract.quantity import parse_decimal
from dra_driver.devices.profile import BackendUnavailable

Settings = TypeVar("Settings", bound=BaseModel)

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
# How often discovery lists the partitions (MIG instances) of the GPUs whose partitions are made
# on demand: nothing tells it when an administrator makes or destroys one, and the slices must
# show it (and withdraw the placements it overlaps) within seconds.
PARTITION_POLL_S = 2.0


def parse_bytes(value: object) -> int:
    """Bytes from an int or a quantity string such as ``"80Gi"``: a positive, whole number of bytes."""
    size = parse_decimal(value)
    if size <= 0 or size != size.to_integral_value():
        raise ValueError(f"{value!r} is not a memory size (a positive whole number of bytes, e.g. 80Gi)")
    return int(size)


MemorySize = Annotated[int, BeforeValidator(parse_bytes)]


def load_settings_file(path: Path, model: type[Settings], what: str) -> Settings:
    """A profile's YAML settings file, validated; unreadable or invalid: `BackendUnavailable`
    naming `what` and the path (the driver then reports it and does not start)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BackendUnavailable(f"cannot read {what} {path}: {exc}") from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BackendUnavailable(f"invalid {what} {path}: {exc}") from exc


def pcie_root_of(device_dir: Path) -> str:
    """The PCIe root complex (e.g. "pci0000:00") above the sysfs directory of a PCI device (its
    ``/sys/bus/pci/devices/<bus id>`` link resolves through it); "" when unknown."""
    try:
        resolved = device_dir.resolve(strict=True)
    except OSError:
        return ""
    for part in resolved.parts:
        if part.startswith("pci") and ":" in part:
            return part
    return ""
