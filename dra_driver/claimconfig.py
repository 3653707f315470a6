"""What the driver does with validated GpuConfigs (the model itself is shared: `contract.gpuconfig`):
which one applies to a claim, and quantities in its parameters."""

from __future__ import annotations

from collections.abc import Sequence

from contract.gpuconfig import ClaimConfigError, GpuConfig, SharingSettings
from contract.quantity import parse_quantity_ceil


def effective_sharing(configs: Sequence[GpuConfig]) -> SharingSettings | None:
    """Class configs come first and claim configs after, so the last one that says anything wins."""
    chosen: SharingSettings | None = None
    for config in configs:
        if config.sharing is not None:
            chosen = config.sharing
    return chosen


def parse_quantity(value: str | int) -> int:
    """A Kubernetes quantity ("40Gi", "1500M", "100") as an integer, rounded up like the apiserver."""
    try:
        return parse_quantity_ceil(value)
    except ValueError as err:
        raise ClaimConfigError(f"not a Kubernetes quantity: {err}") from None
