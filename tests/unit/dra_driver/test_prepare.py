"""Planning a claim (which devices, how shared) and the preparer's per-claim error handling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from contract.gpuconfig import SharingStrategy
from dra_driver.devices.model import MigDevice
from dra_driver.prepare import ClaimPrepareError, ClaimRef, ResourceClaimView, node_devices, plan_claim
from dra_driver.profiles.nvidia.profile import COMMON_DEVICE_NODES
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.sharing import RecordingRunner

from .fakes import (
    DRIVER,
    GIB,
    NODE,
    FakeClaims,
    Result,
    claim,
    gpu,
    gpu_config,
    make_preparer,
    nvidia,
    opaque,
)

NVIDIA = nvidia()
DEVICES = node_devices([gpu(0), gpu(1)], NVIDIA)


def plan(obj: dict[str, Any], uid: str = "u") -> list[Any]:
    return plan_claim(ResourceClaimView.model_validate(obj), uid, DRIVER, NODE, DEVICES, NVIDIA)


def test_whole_gpu_is_exclusive() -> None:
    [planned] = plan(claim("u", [Result("gpu-0", memory="80Gi")]))
    assert planned.share.strategy == SharingStrategy.EXCLUSIVE
    assert planned.device.device_nodes == ("/dev/nvidia0",)


def test_fraction_is_mps_limited_to_its_memory_with_threads_from_memory_share() -> None:
    [planned] = plan(claim("u", [Result("gpu-1", memory="20Gi")]))
    share = planned.share
    assert (share.strategy, share.memory_limit_bytes, share.active_thread_percentage) == (
        SharingStrategy.MPS,
        20 * GIB,
        25,
    )
    assert share.gpu_uuid == "GPU-00000001-test"


def test_compute_share_sets_threads_and_config_overrides_it() -> None:
    [planned] = plan(claim("u", [Result("gpu-0", memory="10Gi", compute="400")]))
    assert planned.share.active_thread_percentage == 40
    configured = claim(
        "u",
        [Result("gpu-0", memory="10Gi", compute="400")],
        configs=[opaque(gpu_config({"strategy": "MPS", "mps": {"activeThreadPercentage": 70}}))],
    )
    assert plan(configured)[0].share.active_thread_percentage == 70


def test_time_slicing_from_class_config_and_claim_override() -> None:
    class_ts = opaque(
        gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}), "FromClass"
    )
    claim_ts = opaque(gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}))
    [from_class] = plan(claim("u", [Result("gpu-0")], configs=[class_ts]))
    assert (from_class.share.strategy, from_class.share.timeslice) == (SharingStrategy.TIME_SLICING, "Short")
    # The API lists class configs first, but the order must not matter: claim beats class.
    [overridden] = plan(claim("u", [Result("gpu-0")], configs=[claim_ts, class_ts]))
    assert overridden.share.timeslice == "Long"


def test_configs_for_other_drivers_and_other_requests_are_ignored() -> None:
    foreign = {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"x": 1}}}
    other_request = opaque(gpu_config({"strategy": "TimeSlicing"}), requests=["other"])
    subrequest = opaque(gpu_config({"strategy": "TimeSlicing"}), requests=["gpu"])
    [planned] = plan(claim("u", [Result("gpu-0")], configs=[foreign, other_request]))
    assert planned.share.strategy == SharingStrategy.EXCLUSIVE
    [chosen] = plan(claim("u", [Result("gpu-0", request="gpu/big")], configs=[subrequest]))
    assert chosen.share.strategy == SharingStrategy.TIME_SLICING


def test_results_of_other_drivers_are_skipped() -> None:
    assert plan(claim("u", [Result("nic-0", driver="net.example.com", pool="p")])) == []


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim("other-uid", [Result("gpu-0")]), "claim UID is other-uid"),
        (claim("u", [], allocated=False), "not allocated"),
        (claim("u", [Result("gpu-0", pool="node-b")]), "from pool node-b"),
        (claim("u", [Result("gpu-9")]), "gpu-9 is not on this node"),
        (
            claim(
                "u",
                [Result("gpu-0", memory="8Gi")],
                configs=[opaque(gpu_config({"strategy": "TimeSlicing"}))],
            ),
            "a fraction is shared with MPS",
        ),
        (claim("u", [Result("gpu-0", memory="8Gi"), Result("gpu-1", memory="8Gi")]), "at most one MPS"),
        (claim("u", [Result("gpu-0", memory="lots")]), "not a Kubernetes quantity"),
        (claim("u", [Result("gpu-0")], configs=[opaque({"kind": "GpuConfig"})]), "apiVersion"),
    ],
)
def test_unpreparable_claims_name_the_problem(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimPrepareError, match=message):
        plan(obj)


def test_mig_devices_are_not_shared() -> None:
    mig = MigDevice(gi=1, ci=0, profile="3g.40gb", uuid="MIG-1", memory_bytes=40 * GIB)
    devices = node_devices([dataclasses.replace(gpu(0), mig_enabled=True, mig_devices=(mig,))], NVIDIA)
    assert sorted(devices) == ["gpu-0-mig-1-0"]  # a GPU in MIG mode is only its MIG devices
    obj = claim("u", [Result("gpu-0-mig-1-0")], configs=[opaque(gpu_config({"strategy": "TimeSlicing"}))])
    with pytest.raises(ClaimPrepareError, match="MIG device gpu-0-mig-1-0 is not shared"):
        plan_claim(ResourceClaimView.model_validate(obj), "u", DRIVER, NODE, devices, NVIDIA)


async def test_one_bad_claim_does_not_fail_the_others(tmp_path: Path) -> None:
    claims = FakeClaims()
    claims.add(claim("good", [Result("gpu-0")], name="good"))
    claims.add({"metadata": {"name": "odd", "namespace": "ns"}, "status": "weird"})
    preparer = make_preparer(tmp_path, claims, RecordingRunner())
    # Asks to time-slice the GPU the good claim holds exclusively.
    ts = opaque(gpu_config({"strategy": "TimeSlicing"}))
    claims.add(claim("bad", [Result("gpu-0")], configs=[ts], name="bad"))
    outcomes = await preparer.prepare(
        [ClaimRef("ns", "good", "good"), ClaimRef("ns", "bad", "bad"), ClaimRef("ns", "odd", "odd")]
    )
    assert outcomes["good"].error == ""
    assert "held by 1 other claim(s) as Exclusive" in outcomes["bad"].error
    assert "unexpected ResourceClaim shape" in outcomes["odd"].error
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_good.json").read_text())
    assert "NVIDIA_VISIBLE_DEVICES=GPU-00000000-test" in spec["containerEdits"]["env"]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [f"k8s.{DRIVER}-claim_good.json"]


class ExplodingClaims(FakeClaims):
    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if name == "boom":
            raise RuntimeError("bug")
        return await super().read_claim(namespace, name)


async def test_unexpected_error_costs_one_claim_only(tmp_path: Path) -> None:
    claims = ExplodingClaims()
    claims.add(claim("good", [Result("gpu-0")], name="good"))
    outcomes = await make_preparer(tmp_path, claims, RecordingRunner()).prepare(
        [ClaimRef("ns", "boom", "boom"), ClaimRef("ns", "good", "good")]
    )
    assert outcomes["boom"].error == "internal error: RuntimeError('bug')"
    assert outcomes["good"].error == ""


async def test_failed_unprepare_is_kept_for_the_retry(tmp_path: Path) -> None:
    claims = FakeClaims()
    claims.add(claim("u1", [Result("gpu-0")], name="c1"))
    preparer = make_preparer(tmp_path, claims, RecordingRunner())
    await preparer.prepare([ClaimRef("ns", "u1", "c1")])
    spec = tmp_path / "cdi" / f"k8s.{DRIVER}-claim_u1.json"
    spec.unlink()
    spec.mkdir()  # something the driver cannot remove as a file
    errors = await preparer.unprepare([ClaimRef("ns", "u1", "c1")])
    assert "IsADirectoryError" in errors["u1"]
    spec.rmdir()
    assert await preparer.unprepare([ClaimRef("ns", "u1", "c1")]) == {"u1": ""}


async def test_simulated_gpus_name_no_device_nodes_in_the_cdi_spec(tmp_path: Path) -> None:
    # The simulated backend's GPUs (kind nodes, fake nodes) have no /dev/nvidia* behind them: a
    # runtime refuses a CDI spec naming a device node that does not exist, so the spec names none,
    # neither the GPU's own nor the common ones; the claim's environment is still set.
    simulated = SimulatedDiscovery.from_file(Path("h100x8")).inventory()[0]
    assert simulated.simulated
    claims = FakeClaims()
    claims.add(claim("sim", [Result("gpu-0")], name="sim"))
    preparer = make_preparer(tmp_path, claims, RecordingRunner(), gpus=[simulated])
    outcomes = await preparer.prepare([ClaimRef("ns", "sim", "sim")])
    assert outcomes["sim"].error == ""
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_sim.json").read_text())
    assert spec["containerEdits"]["deviceNodes"] == []
    assert [d["containerEdits"]["deviceNodes"] for d in spec["devices"]] == [[]]
    assert f"NVIDIA_VISIBLE_DEVICES={simulated.uuid}" in spec["containerEdits"]["env"]


def test_real_gpus_name_their_device_node_and_the_common_ones() -> None:
    devices = node_devices([gpu(3)], NVIDIA)  # as NVML discovery reports a GPU of minor 3
    assert devices["gpu-3"].device_nodes == ("/dev/nvidia3",)
    edits = NVIDIA.claim_edits([devices["gpu-3"]])
    assert edits.device_nodes == COMMON_DEVICE_NODES
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": gpu(3).uuid}
