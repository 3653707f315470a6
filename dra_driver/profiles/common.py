"""What more than one vendor profile needs: memory sizes in settings files, and the PCIe root
complex of a device from sysfs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator

from contract.quantity import parse_decimal

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")


def parse_bytes(value: object) -> int:
    """Bytes from an int or a quantity string such as ``"80Gi"``: a positive, whole number of bytes."""
    size = parse_decimal(value)
    if size <= 0 or size != size.to_integral_value():
        raise ValueError(f"{value!r} is not a memory size (a positive whole number of bytes, e.g. 80Gi)")
    return int(size)


MemorySize = Annotated[int, BeforeValidator(parse_bytes)]


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
