"""The second device profile, ``pci``: a generic PCI accelerator found in a fake sysfs tree.

The tree is laid out as the kernel's: ``bus/pci/devices/<bus id>`` links into
``devices/pci<domain>:<bus>/...`` (the PCIe root complex), each device directory with its
``vendor``, ``device`` and ``class`` files and, for accel-class devices, an ``accel/accel<N>``
entry naming its device node. Three devices match the vendor 0x1e52 (two processing
accelerators, class 0x1200..) and one does not (an Intel NIC); a third 0x1e52 function of another
class (0x0880, a system peripheral) is left out by the class prefix.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.__main__ import parse_args, publishing_mode
from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.profile import BackendUnavailable
from dra_driver.prepare import (
    ClaimPrepareError,
    ClaimRef,
    Preparer,
    ResourceClaimView,
    node_devices,
    plan_claim,
)
from dra_driver.profiles.pci.profile import GONE_MESSAGE, PciProfile
from dra_driver.profiles.registry import PROFILES, build_profile
from dra_driver.sharing import RecordingRunner, SharingManager
from dra_driver.slices import SharingMode, build_devices

from .fakes import DRIVER, GIB, NODE, FakeClaims, Result, claim, gpu_config, opaque

# bus id -> (root complex, vendor, device, class, accel nodes)
TREE: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = {
    "0000:3b:00.0": ("pci0000:3a", "0x1e52", "0x0001", "0x120000", ("accel0",)),
    "0000:5e:00.0": ("pci0000:5d", "0x1E52", "0x0001", "0x120000", ("accel1",)),  # upper case: read as lower
    "0000:5e:00.1": ("pci0000:5d", "0x1e52", "0x00ff", "0x088000", ()),  # same vendor, not an accelerator
    "0000:18:00.0": ("pci0000:17", "0x8086", "0x1593", "0x020000", ()),  # a NIC
}
SETTINGS = """
vendorId: "0x1e52"
classPrefix: "0x12"
productName: Example Accelerator
memory: 16Gi
visibleDevicesEnv: ACCEL_VISIBLE_DEVICES
sysfsRoot: {sysfs}
pollIntervalSeconds: 0.01
"""


def make_tree(root: Path) -> Path:
    """The fake sysfs under ``root``; the ``bus/pci/devices`` directory, as ``sysfsRoot`` names it."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for bus_id, (complex_, vendor, device, pci_class, nodes) in TREE.items():
        real = root / "devices" / complex_ / bus_id
        real.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (real / name).write_text(f"{value}\n")
        for node in nodes:
            (real / "accel" / node).mkdir(parents=True)
        (devices / bus_id).symlink_to(real)
    return devices


@pytest.fixture
def settings(tmp_path: Path) -> Path:
    path = tmp_path / "pci.yaml"
    path.write_text(SETTINGS.format(sysfs=make_tree(tmp_path / "sys")))
    return path


def test_discovery_finds_the_matching_devices_in_bus_order(settings: Path) -> None:
    gpus = build_profile("pci", settings).discovery.inventory()
    assert [(g.minor, g.uuid, g.pcie_root) for g in gpus] == [
        (0, "0000:3b:00.0", "pci0000:3a"),
        (1, "0000:5e:00.0", "pci0000:5d"),
    ]
    assert {(g.product_name, g.memory_bytes, g.healthy) for g in gpus} == {
        ("Example Accelerator", 16 * GIB, True)
    }


def test_slices_carry_the_common_attributes_and_the_pci_ids_only(settings: Path) -> None:
    first = build_devices(
        build_profile("pci", settings).discovery.inventory(), DRIVER, SharingMode.WHOLE_DEVICE
    )[0]
    assert first["name"] == "gpu-0"
    assert first["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": "0000:3b:00.0"},
        "index": {"int": 0},
        "minor": {"int": 0},
        "productName": {"string": "Example Accelerator"},
        "vendorID": {"string": "0x1e52"},
        "deviceID": {"string": "0x0001"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
    }
    assert first["capacity"] == {"memory": {"value": "16Gi"}}


@pytest.mark.parametrize("sharing_mode", ["auto", "consumable-capacity", "whole-device"])
def test_a_profile_without_fractions_publishes_whole_devices(settings: Path, sharing_mode: str) -> None:
    # Whatever --sharing-mode says: the scheduler must not hand out fractions this node refuses.
    config = parse_args(
        ["--node-name", NODE, "--backend", "pci", "--profile", str(settings), "--sharing-mode", sharing_mode]
    )
    assert publishing_mode(config, build_profile("pci", settings)) is SharingMode.WHOLE_DEVICE


def preparer(tmp_path: Path, profile: PciProfile, claims: FakeClaims, runner: RecordingRunner) -> Preparer:
    devices = node_devices(profile.discovery.inventory(), profile)
    return Preparer(
        driver_name=DRIVER,
        node_name=NODE,
        devices=lambda: devices,
        profile=profile,
        claims=claims,
        checkpoint=Checkpoint(tmp_path / "state"),
        sharing=SharingManager(runner, profile.sharing(tmp_path / "shares")),
        cdi_dir=tmp_path / "cdi",
    )


async def test_a_whole_device_gets_its_node_and_the_env_var_and_runs_no_command(
    tmp_path: Path, settings: Path
) -> None:
    profile = build_profile("pci", settings)
    assert isinstance(profile, PciProfile)
    claims, runner = FakeClaims(), RecordingRunner()
    claims.add(claim("u1", [Result("gpu-1")], name="c1"))
    outcome = (await preparer(tmp_path, profile, claims, runner).prepare([ClaimRef("ns", "u1", "c1")]))["u1"]
    assert outcome.error == ""
    spec: dict[str, Any] = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_u1.json").read_text())
    assert spec["containerEdits"] == {"env": ["ACCEL_VISIBLE_DEVICES=0000:5e:00.0"], "deviceNodes": []}
    assert [d["containerEdits"] for d in spec["devices"]] == [
        {"deviceNodes": [{"path": "/dev/accel/accel1"}], "mounts": []}
    ]
    assert runner.commands == []


@pytest.mark.parametrize(
    ("result", "configs", "message"),
    [
        # 1Gi of a 16Gi device: a fraction, which only MPS could share.
        (
            Result("gpu-0", memory="1Gi"),
            [],
            "request gpu holds 1073741824 of 17179869184 bytes of gpu-0: a fraction needs MPS, which the pci "
            r"device profile does not set up \(it supports Exclusive only\)",
        ),
        (
            Result("gpu-0"),
            [opaque(gpu_config({"strategy": "TimeSlicing"}))],
            r"request gpu asks for TimeSlicing on gpu-0, which the pci device profile does not set up",
        ),
        (
            Result("gpu-0"),
            [opaque(gpu_config({"strategy": "MPS"}))],
            r"request gpu asks for MPS on gpu-0, which the pci device profile does not set up",
        ),
    ],
)
async def test_sharing_it_cannot_set_up_is_refused_on_the_claim(
    tmp_path: Path, settings: Path, result: Result, configs: list[dict[str, Any]], message: str
) -> None:
    profile = build_profile("pci", settings)
    assert isinstance(profile, PciProfile)
    obj = claim("u1", [result], configs=configs, name="c1")
    devices = node_devices(profile.discovery.inventory(), profile)
    with pytest.raises(ClaimPrepareError, match=message):
        plan_claim(ResourceClaimView.model_validate(obj), "u1", DRIVER, NODE, devices, profile)
    # Through the preparer the refusal is this claim's error (the pod event), and nothing is left.
    claims, runner = FakeClaims(), RecordingRunner()
    claims.add(obj)
    outcome = (await preparer(tmp_path, profile, claims, runner).prepare([ClaimRef("ns", "u1", "c1")]))["u1"]
    assert outcome.devices == ()
    assert "which the pci device profile does not set up" in outcome.error
    assert not (tmp_path / "cdi").exists() and runner.commands == []


def test_a_device_that_leaves_sysfs_keeps_its_name_and_is_unhealthy_until_it_is_back(
    tmp_path: Path, settings: Path
) -> None:
    discovery = build_profile("pci", settings).discovery
    discovery.inventory()
    link = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    target = link.readlink()
    link.unlink()  # e.g. the device fell off the bus
    gone = discovery.inventory()
    assert [(g.minor, g.healthy, g.health_message) for g in gone] == [(0, False, GONE_MESSAGE), (1, True, "")]
    link.symlink_to(target)
    assert [(g.minor, g.healthy) for g in discovery.inventory()] == [(0, True), (1, True)]


async def test_health_watch_yields_the_inventory_after_a_change(tmp_path: Path, settings: Path) -> None:
    discovery = build_profile("pci", settings).discovery
    watcher = discovery.watch_health()
    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:5e:00.0").unlink()
    gpus = await asyncio.wait_for(anext(watcher), 10)
    assert [g.healthy for g in gpus] == [True, False]
    await watcher.aclose()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vendorId: '0x1e52'\nmemory: 16Gi\n", "visibleDevicesEnv"),  # required
        ("vendorId: '1e52'\nmemory: 16Gi\nvisibleDevicesEnv: X\n", "vendorId"),  # not 0x....
        ("vendorId: '0x1e52'\nmemory: 1.5\nvisibleDevicesEnv: X\n", "memory size"),
        ("vendorId: '0x1e52'\nmemory: 16Gi\nvisibleDevicesEnv: X\nbogus: 1\n", "bogus"),
    ],
)
def test_bad_settings_are_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pci.yaml"
    path.write_text(text)
    with pytest.raises(BackendUnavailable, match="invalid pci profile settings") as error:
        build_profile("pci", path)
    assert message in str(error.value)


def test_the_registry_names_its_profiles_and_refuses_others(tmp_path: Path) -> None:
    assert sorted(PROFILES) == ["nvml", "pci", "simulated"]
    with pytest.raises(BackendUnavailable, match="needs its settings file"):
        build_profile("pci")
    with pytest.raises(BackendUnavailable, match="no PCI devices directory"):
        path = tmp_path / "pci.yaml"
        path.write_text(SETTINGS.format(sysfs=tmp_path / "absent"))
        build_profile("pci", path)
    with pytest.raises(
        BackendUnavailable, match="unknown backend 'rocm'; choose one of nvml, pci, simulated"
    ):
        build_profile("rocm")
