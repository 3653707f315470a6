"""Opaque GpuConfig validation: good configs parse, anything unknown or out of range is named."""

from __future__ import annotations

from typing import Any

import pytest

from contract.gpuconfig import ClaimConfigError, SharingStrategy, parse_gpu_config
from dra_driver.claimconfig import effective_sharing, parse_quantity

from .fakes import gpu_config


def test_time_slicing_config_parses() -> None:
    config = parse_gpu_config(gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}))
    assert config.sharing is not None
    assert config.sharing.strategy == SharingStrategy.TIME_SLICING
    assert config.sharing.timeSlicing is not None and config.sharing.timeSlicing.interval == "Long"


def test_mps_thread_percentage_parses() -> None:
    config = parse_gpu_config(gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 30}}))
    assert config.sharing is not None and config.sharing.mps is not None
    assert config.sharing.mps.activeThreadPercentage == 30


def test_config_without_sharing_is_valid() -> None:
    assert parse_gpu_config(gpu_config()).sharing is None


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (gpu_config(color="blue"), "color: Extra inputs are not permitted"),
        (gpu_config({"strategy": "Magic"}), "sharing.strategy"),
        (gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}}), "interval"),
        (gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"slice": "Short"}}), "timeSlicing.slice"),
        (gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}), "greater than or equal to 1"),
        (
            gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 101}}),
            "less than or equal to 100",
        ),
        (gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": "50"}}), "valid integer"),
        (gpu_config({"strategy": "Exclusive", "mps": {}}), "mps settings given but strategy is Exclusive"),
        ({"apiVersion": "v1", "kind": "GpuConfig"}, "apiVersion"),
        ({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "Other"}, "kind"),
        ("strategy: MPS", "must be an object"),
        (None, "must be an object"),
    ],
)
def test_bad_configs_are_rejected_with_the_field_named(parameters: Any, message: str) -> None:
    with pytest.raises(ClaimConfigError) as err:
        parse_gpu_config(parameters)
    assert message in str(err.value)


def test_claim_config_overrides_class_config() -> None:
    from_class = parse_gpu_config(gpu_config({"strategy": "TimeSlicing"}))
    silent_claim = parse_gpu_config(gpu_config())
    from_claim = parse_gpu_config(gpu_config({"strategy": "MPS"}))
    chosen = effective_sharing([from_class, from_claim])
    assert chosen is not None and chosen.strategy == SharingStrategy.MPS
    chosen = effective_sharing([from_class, silent_claim])
    assert chosen is not None and chosen.strategy == SharingStrategy.TIME_SLICING
    assert effective_sharing([]) is None


@pytest.mark.parametrize(
    ("text", "value"),
    [("40Gi", 40 << 30), ("1500M", 1_500_000_000), ("100", 100), ("1.5Ki", 1536), ("250m", 1), ("1e3", 1000)],
)
def test_quantities(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "40GB", "forty", "1..5"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(ClaimConfigError):
        parse_quantity(text)
