"""The opaque configuration a DeviceClass or ResourceClaim may pass to the DRA driver, strictly validated.

A claim (or its class) carries, in ``spec.devices.config[].opaque``, ``{"driver": <the driver>,
"parameters": {...}}``. The parameters must be a ``GpuConfig`` object; anything unknown or out of
range is rejected with a message that names the field. Both sides read this one model: the
driver when it prepares a claim (the message becomes the claim's prepare error, never a driver
crash), and the extender's validating webhook, which refuses a bad config at `kubectl apply`.

Example::

    apiVersion: gpu.tessera.dev/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: TimeSlicing        # Exclusive | TimeSlicing | MPS
      timeSlicing: {interval: Short}
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from contract.kube import validation_problems

CONFIG_KIND = "GpuConfig"


class ClaimConfigError(ValueError):
    """Opaque parameters that are not a valid GpuConfig; the message is meant for the user."""


class SharingStrategy(StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
# Position = the number ``nvidia-smi compute-policy --set-timeslice`` takes.
TIMESLICE_INTERVALS: tuple[TimeSliceInterval, ...] = ("Default", "Short", "Medium", "Long")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeSlicingSettings(_Strict):
    interval: TimeSliceInterval = "Default"


class MpsSettings(_Strict):
    # Overrides the share derived from the allocated compute capacity (or memory share).
    activeThreadPercentage: StrictInt | None = Field(default=None, ge=1, le=100)


class SharingSettings(_Strict):
    strategy: SharingStrategy
    timeSlicing: TimeSlicingSettings | None = None
    mps: MpsSettings | None = None

    @model_validator(mode="after")
    def _settings_match_strategy(self) -> Self:
        if self.timeSlicing is not None and self.strategy != SharingStrategy.TIME_SLICING:
            raise ValueError(f"timeSlicing settings given but strategy is {self.strategy}")
        if self.mps is not None and self.strategy != SharingStrategy.MPS:
            raise ValueError(f"mps settings given but strategy is {self.strategy}")
        return self


class GpuConfig(_Strict):
    apiVersion: Literal["gpu.tessera.dev/v1alpha1"]
    kind: Literal["GpuConfig"]
    sharing: SharingSettings | None = None


def parse_gpu_config(parameters: Any, where: str = "") -> GpuConfig:
    """Validate one opaque ``parameters`` object; raises ClaimConfigError naming each bad field
    (``where``: the path of the parameters in their object, e.g. spec.devices.config[0].opaque.parameters)."""
    at = f" in {where}" if where else ""
    if not isinstance(parameters, dict):
        raise ClaimConfigError(f"opaque parameters{at} must be an object, got {type(parameters).__name__}")
    try:
        return GpuConfig.model_validate(parameters)
    except ValidationError as err:
        problems = validation_problems(err, "<root>")
        raise ClaimConfigError(f"invalid {CONFIG_KIND}{at}: {problems}") from None
