"""The checkpoint file, and crash recovery of prepare/unprepare built on it."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from contract.gpuconfig import SharingStrategy
from dra_driver.checkpoint import Checkpoint, CheckpointError, ClaimRecord, PreparedDevice
from dra_driver.devices.share import Command, GpuShare
from dra_driver.prepare import ClaimRef
from dra_driver.sharing import RecordingRunner

from .fakes import GIB, FakeClaims, Result, claim, make_preparer

DATA = Path(__file__).parent / "data"

RECORD = ClaimRecord(
    namespace="ns",
    name="c",
    state="completed",
    devices=(PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.tessera.dev/claim=u-gpu-0",), "s1"),),
    shares=(GpuShare("GPU-0", "gpu-0", SharingStrategy.MPS, 10 * GIB, 13),),
    cdi_spec="/var/run/cdi/x.json",
)


def test_round_trip_through_a_new_instance(tmp_path: Path) -> None:
    Checkpoint(tmp_path).put("u", RECORD)
    reloaded = Checkpoint(tmp_path)
    assert reloaded.get("u") == RECORD
    assert stat.S_IMODE(reloaded.path.stat().st_mode) == 0o600
    reloaded.update({"u": None})
    reloaded.update({"u": None})  # removing an unknown claim is a no-op
    assert Checkpoint(tmp_path).claims == {}


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    assert Checkpoint(tmp_path / "absent").claims == {}


def test_tampered_file_is_refused(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put("u", RECORD)
    path = checkpoint.path
    document = json.loads(path.read_text())
    document["body"]["claims"]["u"]["name"] = "other"
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match="checksum"):
        Checkpoint(tmp_path)


def test_torn_file_and_unknown_version_are_refused(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put("u", RECORD)
    path = checkpoint.path
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="not a valid checkpoint"):
        Checkpoint(tmp_path)
    document = json.loads(text)
    document["version"] = 99
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match="version 99"):
        Checkpoint(tmp_path)


def test_writes_alternate_between_two_slots_and_a_torn_write_costs_only_itself(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put("a", RECORD)
    first = checkpoint.path
    checkpoint.put("b", RECORD)
    second = checkpoint.path
    assert first != second and {first.name, second.name} == {"checkpoint.0.json", "checkpoint.1.json"}
    checkpoint.update({"a": None, "b": None})  # shorter than what the slot held: padded, still valid
    assert checkpoint.path == first and Checkpoint(tmp_path).claims == {}
    # A crash tears the next write (into the other slot): the last acknowledged state is read.
    text = second.read_text()
    second.write_text(text[: len(text) // 2])
    assert Checkpoint(tmp_path).claims == {}


def test_a_format_1_file_is_read_when_no_slot_exists(tmp_path: Path) -> None:
    record = RECORD.model_dump(mode="json")
    for share in record["shares"]:
        del share["partition"]  # format 1 predates MIG partitions
    body = {"claims": {"u": record}}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    document = {"version": 1, "checksum": hashlib.sha256(canonical.encode()).hexdigest(), "body": body}
    (tmp_path / "checkpoint.json").write_text(json.dumps(document, indent=1))
    checkpoint = Checkpoint(tmp_path)
    assert checkpoint.get("u") == RECORD
    checkpoint.put("v", RECORD)  # from now on in the slots
    assert set(Checkpoint(tmp_path).claims) == {"u", "v"}


# ---- recovery, through the preparer ----

REF = ClaimRef("ns", "uid-1", "claim")


def _fraction_claims() -> FakeClaims:
    claims = FakeClaims()
    claims.add(claim("uid-1", [Result("gpu-0", memory="40Gi", share_id="share-a")]))
    return claims


async def test_completed_claim_is_answered_from_the_checkpoint_after_restart(tmp_path: Path) -> None:
    claims = _fraction_claims()
    first = await make_preparer(tmp_path, claims, RecordingRunner()).prepare([REF])
    assert first["uid-1"].error == ""
    runner = RecordingRunner()
    restarted = make_preparer(tmp_path, claims, runner)
    del claims.claims[("ns", "claim")]  # the API no longer has it: the answer must come from disk
    again = await restarted.prepare([REF])
    assert again == first
    assert runner.commands == []  # nothing set up twice


async def test_half_prepared_claim_is_rolled_back_and_redone(tmp_path: Path) -> None:
    claims = _fraction_claims()
    # The crash: the MPS daemon start never happens, leaving the claim "started".
    crashing = RecordingRunner(fail_when=lambda c: c.argv == ("nvidia-cuda-mps-control", "-d"))
    preparer = make_preparer(tmp_path, claims, crashing)
    planned = await preparer.prepare([REF])
    assert "injected failure" in planned["uid-1"].error
    # A failed prepare cleans up after itself...
    assert Checkpoint(tmp_path / "checkpoint").get("uid-1") is None
    # ...and a real crash (record left "started") is rolled back by the next prepare.
    started = ClaimRecord(
        namespace="ns",
        name="claim",
        state="started",
        shares=(GpuShare("GPU-00000000-test", "gpu-0", SharingStrategy.MPS, 40 * GIB, 50),),
        cdi_spec=str(tmp_path / "cdi" / "leftover.json"),
    )
    (tmp_path / "cdi").mkdir(exist_ok=True)
    (tmp_path / "cdi" / "leftover.json").write_text("{}")
    Checkpoint(tmp_path / "checkpoint").put("uid-1", started)
    runner = RecordingRunner()
    result = await make_preparer(tmp_path, claims, runner).prepare([REF])
    assert result["uid-1"].error == ""
    argv = [c.argv for c in runner.commands]
    reset, setup = argv[:2], argv[2:]
    assert reset == [("nvidia-cuda-mps-control",), ("nvidia-smi", "-i", "GPU-00000000-test", "-c", "DEFAULT")]
    assert setup == [
        ("nvidia-smi", "-i", "GPU-00000000-test", "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control", "-d"),
    ]
    assert not (tmp_path / "cdi" / "leftover.json").exists()
    record = Checkpoint(tmp_path / "checkpoint").get("uid-1")
    assert record is not None and record.state == "completed"


async def test_unprepare_after_restart_uses_the_checkpoint_and_resets_sharing(tmp_path: Path) -> None:
    claims = _fraction_claims()
    await make_preparer(tmp_path, claims, RecordingRunner()).prepare([REF])
    claims.claims.clear()  # the claim may be deleted before unprepare
    runner = RecordingRunner()
    errors = await make_preparer(tmp_path, claims, runner).unprepare([REF])
    assert errors == {"uid-1": ""}
    assert runner.commands[0] == Command(
        ("nvidia-cuda-mps-control",),
        env=(
            ("CUDA_VISIBLE_DEVICES", "GPU-00000000-test"),
            ("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps" / "GPU-00000000-test" / "pipe")),
            ("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "mps" / "GPU-00000000-test" / "log")),
        ),
        stdin="quit\n",
    )
    assert list((tmp_path / "cdi").iterdir()) == []
    assert Checkpoint(tmp_path / "checkpoint").claims == {}


async def test_unprepare_of_unknown_claim_succeeds(tmp_path: Path) -> None:
    runner = RecordingRunner()
    assert await make_preparer(tmp_path, FakeClaims(), runner).unprepare([REF]) == {"uid-1": ""}
    assert runner.commands == []


async def test_a_completed_claim_whose_spec_was_lost_is_prepared_again(tmp_path: Path) -> None:
    claims = _fraction_claims()
    preparer = make_preparer(tmp_path, claims, RecordingRunner())
    first = await preparer.prepare([REF])
    spec = tmp_path / "cdi" / "k8s.gpu.tessera.dev-claim_uid-1.json"
    text = spec.read_text()
    spec.write_text("")  # a power cut took the unsynced spec; the checkpoint still says completed
    reads = claims.reads
    again = await preparer.prepare([REF])
    assert again == first and claims.reads == reads + 1
    assert spec.read_text() == text


def test_a_checkpoint_written_before_the_device_profiles_still_loads(tmp_path: Path) -> None:
    """data/ holds the two slot files the driver wrote before the share model moved to
    ``dra_driver.devices.share`` (format 2, generations 1 and 2): the format did not change, so
    the newer slot is read with both claims, shares and all."""
    for slot in ("checkpoint.0.json", "checkpoint.1.json"):
        (tmp_path / slot).write_bytes((DATA / slot).read_bytes())
    checkpoint = Checkpoint(tmp_path)
    assert checkpoint.path == tmp_path / "checkpoint.0.json"  # generation 2
    assert sorted(checkpoint.claims) == ["uid-mps", "uid-ts"]
    mps = checkpoint.claims["uid-mps"]
    assert (mps.state, mps.devices[0].share_id) == ("completed", "share-1")
    assert mps.shares == (GpuShare("GPU-aaaa", "gpu-0", SharingStrategy.MPS, 20 * GIB, 25),)
    sliced = checkpoint.claims["uid-ts"]
    assert sliced.state == "started"
    assert sliced.shares == (GpuShare("GPU-bbbb", "gpu-1", SharingStrategy.TIME_SLICING, timeslice="Long"),)
