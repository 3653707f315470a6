"""A MIG device's capability nodes: read from a /proc tree (a fake one in ``tmp_path``), written
into the claim's CDI spec with their numbers, and modelled by the simulated GPUs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.model import Gpu
from dra_driver.devices.share import CharDevice
from dra_driver.prepare import ClaimRef, Preparer, node_devices
from dra_driver.profiles.nvidia.migcaps import (
    SIMULATED_CAPS_MAJOR,
    CapabilityFileError,
    MigCapabilities,
    access_files,
    character_major,
    simulated_minor,
)
from dra_driver.profiles.nvidia.profile import COMMON_DEVICE_NODES, SIMULATED_PROC, NvidiaProfile
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery, build_inventory, load_profile
from dra_driver.sharing import RecordingRunner, SharingManager
from tests.unit.dra_driver.fakes import DRIVER, NODE, FakeClaims, Result, claim

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
238 nvidia-caps
509 nvidia-caps-imex-channels
510 nvidia-uvm

Block devices:
  8 sd
240 nvidia-caps
"""


def fake_proc(root: Path, minors: dict[tuple[int, int, int], tuple[int, int]]) -> Path:
    """A /proc with ``/proc/devices`` and the access files of (GPU minor, gi, ci) -> minors."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "devices").write_text(PROC_DEVICES)
    for (gpu, gi, ci), (gi_minor, ci_minor) in minors.items():
        for path, minor in zip(access_files(root, gpu, gi, ci), (gi_minor, ci_minor), strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    return root


@pytest.mark.parametrize(
    ("gpu", "gi", "ci", "gi_minor", "ci_minor"),
    [
        (0, 3, 0, 30, 31),  # GPU 0's GPU instance 3 and its compute instance 0
        (1, 1, 0, 147, 148),  # another GPU's files name other minors
        (0, 2, 1, 21, 23),  # a second compute instance of GPU instance 2
    ],
)
def test_the_access_files_name_the_capability_nodes(
    tmp_path: Path, gpu: int, gi: int, ci: int, gi_minor: int, ci_minor: int
) -> None:
    proc = fake_proc(tmp_path / "proc", {(gpu, gi, ci): (gi_minor, ci_minor)})
    gi_file, ci_file = access_files(proc, gpu, gi, ci)
    assert gi_file == proc / f"driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/access"
    assert ci_file == proc / f"driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/ci{ci}/access"
    # The major is the character device named exactly nvidia-caps (238), not its imex sibling
    # (509) nor a block device of the same name (240).
    assert MigCapabilities(proc).device_nodes(gpu, gi, ci) == (
        CharDevice(f"/dev/nvidia-caps/nvidia-cap{gi_minor}", 238, gi_minor),
        CharDevice(f"/dev/nvidia-caps/nvidia-cap{ci_minor}", 238, ci_minor),
    )


def test_unreadable_capabilities_are_an_os_error_naming_the_file(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {(0, 3, 0): (30, 31)})
    with pytest.raises(FileNotFoundError):
        MigCapabilities(proc).device_nodes(0, 4, 0)  # no such instance
    _, ci_file = access_files(proc, 0, 3, 0)
    ci_file.write_text("DeviceFileMode: 292\n")
    with pytest.raises(CapabilityFileError, match=r"ci0/access has no 'DeviceFileMinor: <n>' line"):
        MigCapabilities(proc).device_nodes(0, 3, 0)
    (proc / "devices").write_text("Character devices:\n195 nvidia\n\nBlock devices:\n240 nvidia-caps\n")
    assert character_major((proc / "devices").read_text(), "nvidia-caps") is None
    with pytest.raises(CapabilityFileError, match="names no nvidia-caps character device"):
        MigCapabilities(proc).device_nodes(0, 3, 0)


# ---- in the CDI spec of a prepared claim ----

# The CDI spec's deviceNode fields (cdiVersion 0.6.0) and the node types it allows.
_CDI_NODE_FIELDS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}


def assert_cdi_device_nodes(nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        assert set(node) <= _CDI_NODE_FIELDS and node["path"].startswith("/")
        assert node.get("type", "c") in {"b", "c", "u", "p"}
        assert all(isinstance(node.get(key, 0), int) for key in ("major", "minor"))


def h100s(*, simulated: bool) -> list[Gpu]:
    gpus = build_inventory(load_profile(Path("h100x2-mig")), seed=NODE)
    # A simulated profile's GPUs name no device node; as real ones (simulated=False) they do.
    return [replace(gpu, simulated=simulated) for gpu in gpus]


def preparer(tmp_path: Path, gpus: list[Gpu], claims: FakeClaims) -> Preparer:
    profile = NvidiaProfile("simulated", SimulatedDiscovery(gpus), simulated=True)
    runner = RecordingRunner()
    devices = node_devices(gpus, profile)
    return Preparer(
        driver_name=DRIVER,
        node_name=NODE,
        devices=lambda: devices,
        profile=profile,
        claims=claims,
        checkpoint=Checkpoint(tmp_path / "state"),
        sharing=SharingManager(runner, profile.sharing(tmp_path / "mps")),
        cdi_dir=tmp_path / "cdi",
        partitioner=profile.partitioner(runner.run, tmp_path / "state"),
    )


PLACEMENTS = {  # claim -> placement; instance ids are the lowest free, so the third is GI 3
    "uid-a": "gpu-0-mig-1g-10gb-at-0",  # GI 1
    "uid-b": "gpu-0-mig-1g-10gb-at-1",  # GI 2
    "uid-c": "gpu-0-mig-1g-10gb-at-2",  # GI 3
}


def mig_claims() -> tuple[FakeClaims, list[ClaimRef]]:
    claims, refs = FakeClaims(), []
    for uid, device in PLACEMENTS.items():
        claims.add(claim(uid, [Result(device)], name=uid))
        refs.append(ClaimRef("ns", uid, uid))
    return claims, refs


def spec_of(tmp_path: Path, uid: str) -> dict[str, Any]:
    spec = cdi.read_claim_spec(cdi.spec_path(tmp_path / "cdi", DRIVER, uid))
    assert spec is not None
    return spec


async def test_a_made_partition_brings_its_two_capability_nodes_into_the_cdi_spec(tmp_path: Path) -> None:
    claims, refs = mig_claims()
    prep = preparer(tmp_path, h100s(simulated=False), claims)
    outcomes = await prep.prepare(refs)
    assert {uid: o.error for uid, o in outcomes.items()} == dict.fromkeys(PLACEMENTS, "")
    spec = spec_of(tmp_path, "uid-c")
    [device] = spec["devices"]
    # GPU 0, GPU instance 3, compute instance 0: minors 3 + 135*0 + 9*3 = 30 and 30 + 1 + 0 = 31,
    # as the simulated GPUs' capability files say (a real driver's numbering).
    assert (simulated_minor(0, 3), simulated_minor(0, 3, 0)) == (30, 31)
    major = SIMULATED_CAPS_MAJOR
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap30", "type": "c", "major": major, "minor": 30},
        {"path": "/dev/nvidia-caps/nvidia-cap31", "type": "c", "major": major, "minor": 31},
    ]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": path} for path in COMMON_DEVICE_NODES]
    assert_cdi_device_nodes(device["containerEdits"]["deviceNodes"] + spec["containerEdits"]["deviceNodes"])
    # The toolkit's MIG form: the MIG device's own uuid.
    env = dict(item.split("=", 1) for item in spec["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    # GPU instance 1 (claim a) is 3 + 9 = 12 and 13.
    [first] = spec_of(tmp_path, "uid-a")["devices"]
    assert [n.get("minor") for n in first["containerEdits"]["deviceNodes"]] == [None, 12, 13]
    # Destroying the instance removes its capability files, as on a real GPU.
    assert await prep.unprepare([refs[2]]) == {"uid-c": ""}
    gi_file, ci_file = access_files(tmp_path / "state" / SIMULATED_PROC, 0, 3, 0)
    assert not gi_file.parent.exists() and not ci_file.exists()


async def test_simulated_gpus_name_no_capability_node(tmp_path: Path) -> None:
    claims, refs = mig_claims()
    prep = preparer(tmp_path, h100s(simulated=True), claims)
    assert (await prep.prepare(refs[:1]))["uid-a"].error == ""
    spec = spec_of(tmp_path, "uid-a")
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == []
    # The files are there all the same: the simulation models them, a runtime is not told.
    gi_file, ci_file = access_files(tmp_path / "state" / SIMULATED_PROC, 0, 1, 0)
    assert gi_file.read_text().startswith("DeviceFileMinor: 12\n")
    assert ci_file.read_text().startswith("DeviceFileMinor: 13\n")


async def test_a_partition_whose_capabilities_cannot_be_read_fails_and_is_undone(tmp_path: Path) -> None:
    claims, refs = mig_claims()
    prep = preparer(tmp_path, h100s(simulated=False), claims)
    (tmp_path / "state" / SIMULATED_PROC).mkdir(parents=True)
    (tmp_path / "state" / SIMULATED_PROC / "devices").write_text("Character devices:\n195 nvidia\n")
    error = (await prep.prepare(refs[:1]))["uid-a"].error
    assert error.endswith("names no nvidia-caps character device")
    # No container could use the instance: it is destroyed, the claim is not recorded.
    assert not access_files(tmp_path / "state" / SIMULATED_PROC, 0, 1, 0)[0].exists()
    assert not cdi.spec_path(tmp_path / "cdi", DRIVER, "uid-a").exists()


async def test_an_existing_mig_device_brings_its_capability_nodes_too(tmp_path: Path) -> None:
    # a100x4-mig: MIG devices an administrator made (static publishing); GPU 0's first is GI 1, CI 0.
    gpus = [replace(g, simulated=False) for g in build_inventory(load_profile(Path("a100x4-mig")), seed=NODE)]
    claims = FakeClaims()
    claims.add(claim("uid-static", [Result("gpu-0-mig-1-0")], name="static"))
    prep = preparer(tmp_path, gpus, claims)
    assert (await prep.prepare([ClaimRef("ns", "uid-static", "static")]))["uid-static"].error == ""
    [device] = spec_of(tmp_path, "uid-static")["devices"]
    assert device["containerEdits"]["deviceNodes"][1:] == [
        {"path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": SIMULATED_CAPS_MAJOR, "minor": 12},
        {"path": "/dev/nvidia-caps/nvidia-cap13", "type": "c", "major": SIMULATED_CAPS_MAJOR, "minor": 13},
    ]
