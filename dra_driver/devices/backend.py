"""The one interface the rest of the driver uses to learn about GPUs, and the backend factory."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Literal, Protocol

from dra_driver.devices.model import Gpu


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here (no NVML library, no driver, unreadable profile...)."""


class Backend(Protocol):
    def inventory(self) -> list[Gpu]:
        """The node's GPUs now, ordered by minor number."""
        ...

    def watch_health(self) -> AsyncGenerator[list[Gpu], None]:
        """Yields the whole inventory again each time a device's health or the device set changes.

        Use as ``async for gpus in backend.watch_health(): ...``. Changes are counted from the
        call, so call it before reading the initial ``inventory()`` to miss nothing.
        """
        ...


def load_backend(
    kind: Literal["nvml", "simulated"], profile: Path | None = None, node_name: str = ""
) -> Backend:
    """Build a backend; ``node_name`` seeds the simulated UUIDs so fake nodes do not collide."""
    if kind == "simulated":
        if profile is None:
            raise BackendUnavailable("the simulated backend needs a profile (--profile)")
        from dra_driver.devices.simulated import SimulatedBackend

        return SimulatedBackend.from_file(profile, node_name=node_name)
    if kind == "nvml":
        from dra_driver.devices.nvml import NvmlBackend

        return NvmlBackend()
    raise BackendUnavailable(f"unknown backend {kind!r}; choose 'nvml' or 'simulated'")
