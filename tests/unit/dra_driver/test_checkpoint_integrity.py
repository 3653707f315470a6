"""No corruption of a checkpoint slot makes the driver forget a prepared claim silently.

The scene of every preparer test: claims A and B share gpu-0 over MPS. A's prepare starts the MPS
daemon (generation 1 "started", 2 "completed"); B joins the running daemon, so its only record is
generation 3 ("completed"), in slot 1. The kubelet was answered for both. Then the driver dies and
slot 1 is damaged in one of the ways a disk or a person can damage it. After the restart the
driver must still know B (recovered from B's CDI spec), keep B's spec, and leave the MPS daemon
running when the kubelet unprepares A, because B's pod still runs on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, CheckpointError
from dra_driver.plugin import report_recovery
from dra_driver.prepare import ClaimRef, PrepareOutcome, Preparer, RecoveryReport
from dra_driver.sharing import RecordingRunner
from tests.kubelet import client as kubelet_client
from tests.kubelet.client import Kubelet

from .fakes import DRIVER, FakeClaims, Result, claim, make_plugin, make_preparer
from .test_checkpoint import RECORD

A = ClaimRef("ns", "uid-a", "a")
B = ClaimRef("ns", "uid-b", "b")
# The same claims as the kubelet's client names them (it imports nothing from dra_driver).
KUBELET_REFS = {ref.uid: kubelet_client.ClaimRef(ref.namespace, ref.uid, ref.name) for ref in (A, B)}
GPU0 = "GPU-00000000-test"
QUIT = ("nvidia-cuda-mps-control",)  # argv of the daemon's "quit" (stdin)


def _truncate_to(keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: keep(len(data))])

    return damage


def _flip_byte_at(where: Callable[[bytes], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[where(bytes(data))] ^= 0x01
        path.write_bytes(bytes(data))

    return damage


def _remove(path: Path) -> None:
    path.unlink()


def _older_copy(path: Path) -> None:
    """The other slot's (older) document copied over it: valid, but its generation is the other
    slot's, so it cannot be the state written there."""
    other = path.with_name("checkpoint.0.json" if path.name.endswith("1.json") else "checkpoint.1.json")
    path.write_bytes(other.read_bytes())


# Each way slot 1 (generation 3, the only record of B) is damaged. A document is
# {"version":2,"checksum":"<64 hex>","body":{...}}: offset 0 is an empty file, 1..12 cut inside
# the version, ~30 inside the checksum, the middle inside the body, len-1 drops the closing brace.
DAMAGE: dict[str, Callable[[Path], None]] = {
    "empty file": _truncate_to(lambda n: 0),
    "cut after 1 byte": _truncate_to(lambda n: 1),
    "cut inside the version": _truncate_to(lambda n: 12),
    "cut inside the checksum": _truncate_to(lambda n: 30),
    "cut inside the body": _truncate_to(lambda n: n // 2),
    "last byte cut": _truncate_to(lambda n: n - 1),
    "byte flipped in the checksum": _flip_byte_at(lambda d: d.index(b'"checksum":"') + 15),
    "byte flipped in the last record": _flip_byte_at(lambda d: d.rindex(b'"namespace":"ns"') + 14),
    "byte flipped in the generation": _flip_byte_at(lambda d: d.index(b'"generation":') + 13),
    "slot missing": _remove,
    "older generation copied in": _older_copy,
}


def _claims() -> FakeClaims:
    claims = FakeClaims()
    claims.add(claim("uid-a", [Result("gpu-0", memory="20Gi")], name="a"))
    claims.add(claim("uid-b", [Result("gpu-0", memory="30Gi")], name="b"))
    return claims


async def _prepare_a_then_b(tmp_path: Path, claims: FakeClaims) -> dict[str, PrepareOutcome]:
    preparer = make_preparer(tmp_path, claims, RecordingRunner())
    answered = {**await preparer.prepare([A]), **await preparer.prepare([B])}
    assert all(not outcome.error for outcome in answered.values())
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    assert checkpoint.generation == 3 and checkpoint.path.name == "checkpoint.1.json"
    return answered


async def _restart(tmp_path: Path, claims: FakeClaims, runner: RecordingRunner) -> Preparer:
    preparer = make_preparer(tmp_path, claims, runner)
    await preparer.recover()
    return preparer


def _spec(tmp_path: Path, ref: ClaimRef) -> Path:
    return cdi.spec_path(tmp_path / "cdi", DRIVER, ref.uid)


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
async def test_a_damaged_newest_slot_loses_no_prepared_claim(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    claims = _claims()
    answered = await _prepare_a_then_b(tmp_path, claims)
    damage(tmp_path / "checkpoint" / "checkpoint.1.json")

    runner = RecordingRunner()
    preparer = await _restart(tmp_path, claims, runner)
    assert list(preparer.recovery.adopted) == ["uid-b"] and preparer.recovery.doubts
    assert "1 claim(s) recovered" in preparer.recovery.summary()
    assert _spec(tmp_path, B).exists()
    assert Checkpoint(tmp_path / "checkpoint").get("uid-b") == answered_record(tmp_path, answered)
    # The kubelet asks again for B: answered as before, from the recovered record.
    reads = claims.reads
    assert await preparer.prepare([B]) == {"uid-b": answered["uid-b"]} and claims.reads == reads
    # A's pod ends: B still uses the daemon, so nothing runs.
    assert await preparer.unprepare([A]) == {"uid-a": ""}
    assert runner.commands == []
    # B's pod ends: now the daemon quits and the GPU is reset, once.
    assert await preparer.unprepare([B]) == {"uid-b": ""}
    assert [c.argv for c in runner.commands] == [QUIT, ("nvidia-smi", "-i", GPU0, "-c", "DEFAULT")]
    assert not _spec(tmp_path, B).exists()


def _torn_after(k: int, new: bytes, old: bytes) -> bytes:
    """The write of ``new`` over ``old`` torn by a crash after its first k bytes."""
    return new[:k] + old[k:]


def _flipped_at(k: int, new: bytes, old: bytes) -> bytes:
    """The whole write of ``new``, with one bit of byte k flipped later (the disk, a person)."""
    return new[:k] + bytes([new[k] ^ 0x01]) + new[k + 1 :]


@pytest.mark.parametrize("slot_at", [_torn_after, _flipped_at], ids=["torn", "flipped"])
async def test_the_write_of_b_damaged_at_every_byte_loses_no_prepared_claim(
    tmp_path: Path, slot_at: Callable[[int, bytes, bytes], bytes]
) -> None:
    # The write of generation 3 (B's only record) over slot 1, which held generation 1 (A
    # "started"): torn by a crash after its first k bytes (the new document's first k bytes,
    # padded to the slot's size as written, then the old one's), or whole with byte k flipped.
    # At every k through the header and the generation (the first 128 bytes) and the last 32,
    # and every 16th between (the body's records; each k costs a restart with a checkpoint
    # write). A write torn while its bytes still equal the old ones (k up to 25 at least, the common
    # '{"version":2,"checksum":"') wrote nothing, so the kubelet was never answered for B: its
    # spec is a leftover, removed, and the kubelet's retry prepares B again. At every other k
    # the restarted driver knows A and B as completed, keeps both specs, runs no command, and
    # doubts the checkpoint unless the write is whole.
    claims = _claims()
    state = tmp_path / "checkpoint"
    preparer = make_preparer(tmp_path, claims, RecordingRunner())
    await preparer.prepare([A])
    old = (state / "checkpoint.1.json").read_bytes()  # generation 1
    answered = await preparer.prepare([B])
    new = (state / "checkpoint.1.json").read_bytes()  # generation 3, padded to at least len(old)
    slot0 = (state / "checkpoint.0.json").read_bytes()  # generation 2: A completed
    specs = {path.name: path.read_bytes() for path in (tmp_path / "cdi").iterdir()}
    assert len(specs) == 2 and len(new) >= len(old)
    forgotten: list[int] = []
    wrote_nothing: list[int] = []
    last = len(new) + (1 if slot_at is _torn_after else 0)
    for k in sorted({*range(128), *range(128, last - 32, 16), *range(last - 32, last)}):
        for leftover in state.iterdir():
            leftover.unlink()
        damaged = slot_at(k, new, old)
        (state / "checkpoint.0.json").write_bytes(slot0)
        (state / "checkpoint.1.json").write_bytes(damaged)
        for name, data in specs.items():
            (tmp_path / "cdi" / name).write_bytes(data)
        runner = RecordingRunner()
        restarted = await _restart(tmp_path, claims, runner)
        known = {uid for uid, r in Checkpoint(state).claims.items() if r.state == "completed"}
        kept = {path.name for path in (tmp_path / "cdi").iterdir()}
        if damaged == old:  # torn before its first changed byte
            wrote_nothing.append(k)
            assert (known, kept, restarted.recovery.doubts) == ({"uid-a"}, {_spec(tmp_path, A).name}, ()), k
            assert (await restarted.prepare([B]))["uid-b"].devices == answered["uid-b"].devices, k
        elif known != {"uid-a", "uid-b"} or kept != set(specs) or runner.commands:
            forgotten.append(k)
        else:
            whole = slot_at is _torn_after and k == len(new)
            assert bool(restarted.recovery.doubts) != whole, k
    assert forgotten == []
    # The two documents agree on '{"version":2,"checksum":"' and, one time in 16 or more, on
    # the checksums' first hex digits too: a write torn inside that common prefix wrote nothing.
    common = next(k for k, (a, b) in enumerate(zip(new, old, strict=False)) if a != b)
    assert common >= len('{"version":2,"checksum":"')
    assert wrote_nothing == (list(range(common + 1)) if slot_at is _torn_after else [])


def answered_record(tmp_path: Path, answered: dict[str, PrepareOutcome]) -> object:
    """B's record as its spec carries it: completed, with the devices the kubelet was told."""
    spec = json.loads(_spec(tmp_path, B).read_text())
    record = json.loads(spec["annotations"][cdi.record_annotation(DRIVER)])
    assert record["state"] == "completed"
    assert [d["device_name"] for d in record["devices"]] == [d.device_name for d in answered["uid-b"].devices]
    return Checkpoint(tmp_path / "checkpoint").get("uid-b")


async def test_an_intact_checkpoint_still_removes_specs_it_does_not_know(tmp_path: Path) -> None:
    """The doubt is what changes the rule: with both slots whole, an unknown spec is a prepare
    that ran no command and crashed before recording it (never answered), and goes."""
    claims = _claims()
    await _prepare_a_then_b(tmp_path, claims)
    stray = _spec(tmp_path, ClaimRef("ns", "uid-stray", "stray"))
    stray.write_bytes(_spec(tmp_path, B).read_bytes())
    preparer = await _restart(tmp_path, claims, RecordingRunner())
    assert not stray.exists() and preparer.recovery.adopted == {} and not preparer.recovery.degraded
    assert set(Checkpoint(tmp_path / "checkpoint").claims) == {"uid-a", "uid-b"}


async def test_a_spec_without_a_record_keeps_its_gpu_from_being_reset(tmp_path: Path) -> None:
    """A spec an older driver wrote (no record in it) cannot be adopted: it is kept, and its GPU
    is not reset while it exists; unpreparing that claim removes it and resets the GPU."""
    claims = _claims()
    await _prepare_a_then_b(tmp_path, claims)
    spec = json.loads(_spec(tmp_path, B).read_text())
    del spec["annotations"]
    _spec(tmp_path, B).write_text(json.dumps(spec))
    DAMAGE["empty file"](tmp_path / "checkpoint" / "checkpoint.1.json")

    runner = RecordingRunner()
    preparer = await _restart(tmp_path, claims, runner)
    assert preparer.recovery.unaccounted == [_spec(tmp_path, B)] and preparer.recovery.adopted == {}
    assert await preparer.unprepare([A]) == {"uid-a": ""}
    assert runner.commands == []  # B's pod may still use the daemon
    # A new fraction on gpu-0 would set the GPU up again under B's pod: it waits for B.
    claims.add(claim("uid-c", [Result("gpu-0", memory="10Gi")], name="c"))
    waiting = await preparer.prepare([ClaimRef("ns", "uid-c", "c")])
    assert "may be in use by claim(s) uid-b, known only by a CDI spec" in waiting["uid-c"].error
    assert runner.commands == []
    assert await preparer.unprepare([B]) == {"uid-b": ""}
    assert not _spec(tmp_path, B).exists()
    # Which strategy B used is unknown: the GPU is reset from each one the profile sets up.
    resets = [c.argv for c in runner.commands]
    assert (await preparer.prepare([ClaimRef("ns", "uid-c", "c")]))["uid-c"].error == ""  # now it may
    assert sorted(resets) == sorted(
        [
            QUIT,
            ("nvidia-smi", "-i", GPU0, "-c", "DEFAULT"),
            ("nvidia-smi", "compute-policy", "-i", GPU0, "--set-timeslice", "0"),
        ]
    )


async def test_both_slots_damaged_refuses_to_start_and_moving_them_aside_recovers(tmp_path: Path) -> None:
    claims = _claims()
    await _prepare_a_then_b(tmp_path, claims)
    state = tmp_path / "checkpoint"
    for slot in ("checkpoint.0.json", "checkpoint.1.json"):
        DAMAGE["cut inside the body"](state / slot)
    with pytest.raises(CheckpointError, match=r"(?s)no checkpoint slot can be read.*Move both slots aside"):
        make_preparer(tmp_path, claims, RecordingRunner())
    # What the message says to do: with no checkpoint at all, every spec is taken for a claim.
    for slot in ("checkpoint.0.json", "checkpoint.1.json"):
        (state / slot).rename(state / f"{slot}.bad")
    preparer = await _restart(tmp_path, claims, RecordingRunner())
    assert sorted(preparer.recovery.adopted) == ["uid-a", "uid-b"]


# ---- the checkpoint alone ----


def _two_generations(tmp_path: Path) -> Checkpoint:
    checkpoint = Checkpoint(tmp_path)
    checkpoint.put("a", RECORD)  # generation 1, slot 1
    checkpoint.put("b", RECORD)  # generation 2, slot 0
    return checkpoint


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_newest_slot_is_a_doubt_and_is_kept_for_inspection(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    _two_generations(tmp_path)
    newest = tmp_path / "checkpoint.0.json"
    damage(newest)
    reread = Checkpoint(tmp_path)
    assert set(reread.claims) == {"a"} and not reread.complete
    assert len(reread.doubts) == 1 and "may" in reread.doubts[0]
    copy = tmp_path / "checkpoint.0.json.unreadable"
    assert copy.exists() == newest.exists()
    if newest.exists():
        assert copy.read_bytes() == newest.read_bytes()


def test_a_damaged_older_slot_is_a_doubt_too(tmp_path: Path) -> None:
    """Slot 1 (generation 1) damaged, slot 0 (generation 2) whole: slot 1 could have held
    generation 3, whose write reached the disk but whose data did not survive."""
    _two_generations(tmp_path)
    DAMAGE["cut inside the body"](tmp_path / "checkpoint.1.json")
    reread = Checkpoint(tmp_path)
    assert set(reread.claims) == {"a", "b"} and reread.doubts


def test_the_higher_generation_wins_over_the_newer_file(tmp_path: Path) -> None:
    _two_generations(tmp_path)
    older = tmp_path / "checkpoint.1.json"  # generation 1, touched after generation 2
    stat = (tmp_path / "checkpoint.0.json").stat()
    os.utime(older, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    reread = Checkpoint(tmp_path)
    assert reread.generation == 2 and set(reread.claims) == {"a", "b"} and reread.complete


def test_only_two_whole_slots_prove_completeness(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path)
    assert not checkpoint.complete  # nothing on disk: a fresh node, or a wiped one
    checkpoint.put("a", RECORD)
    # Generation 1 alone: the first write, or generation 2's slot was removed since.
    assert Checkpoint(tmp_path).doubts == (
        f"{tmp_path / 'checkpoint.0.json'} is missing; it may have held a newer state",
    )
    checkpoint.put("b", RECORD)
    assert Checkpoint(tmp_path).complete


# ---- through the kubelet's own client, over the real unix socket ----


async def test_the_kubelet_unprepares_a_and_the_daemon_under_b_survives(tmp_path: Path) -> None:
    claims = _claims()
    plugin, _ = make_plugin(tmp_path, claims)
    await plugin.start()
    try:
        kubelet = Kubelet(plugin.sockets.registration)
        endpoint = (await kubelet.register()).endpoint
        for ref in KUBELET_REFS.values():
            assert (await kubelet.prepare(endpoint, [ref]))[ref.uid].error == ""
    finally:
        await plugin.stop(grace_s=0)
    DAMAGE["cut inside the body"](tmp_path / "state" / "checkpoint.1.json")

    runner = RecordingRunner()
    plugin, _ = make_plugin(tmp_path, claims, runner=runner)
    await plugin.start()
    try:
        kubelet = Kubelet(plugin.sockets.registration)
        endpoint = (await kubelet.register()).endpoint
        assert await kubelet.unprepare(endpoint, [KUBELET_REFS["uid-a"]]) == {"uid-a": ""}
        assert runner.commands == []
        assert cdi.spec_path(tmp_path / "cdi", DRIVER, B.uid).exists()
        assert await kubelet.unprepare(endpoint, [KUBELET_REFS["uid-b"]]) == {"uid-b": ""}
        assert [c.argv for c in runner.commands] == [QUIT, ("nvidia-smi", "-i", GPU0, "-c", "DEFAULT")]
    finally:
        await plugin.stop(grace_s=0)


# ---- recovery cost ----


async def test_recovery_resets_each_gpu_once_however_many_claims_a_crash_interrupted(tmp_path: Path) -> None:
    """12 claims were "started" on 2 GPUs (6 each, MPS) when the driver died. Rolled back per
    claim that is 12 resets of 2 commands (24); recover() resets each GPU once: 2 x 2 = 4. The
    kubelet's 12 prepares that follow start each GPU's daemon once more: 2 x 2 = 4 commands."""
    claims = FakeClaims()
    refs = [ClaimRef("ns", f"uid-{i}", f"c-{i}") for i in range(12)]
    for i, ref in enumerate(refs):
        claims.add(claim(ref.uid, [Result(f"gpu-{i % 2}", memory="4Gi")], name=ref.name))
    crashed = make_preparer(tmp_path, claims, RecordingRunner())
    await crashed.prepare(refs)
    checkpoint = Checkpoint(tmp_path / "checkpoint")
    checkpoint.update(
        {ref.uid: checkpoint.claims[ref.uid].model_copy(update={"state": "started"}) for ref in refs}
    )

    runner = RecordingRunner()
    preparer = await _restart(tmp_path, claims, runner)
    resets = [c.argv for c in runner.commands]
    assert sorted(resets) == sorted(
        [
            QUIT,
            ("nvidia-smi", "-i", GPU0, "-c", "DEFAULT"),
            QUIT,
            ("nvidia-smi", "-i", "GPU-00000001-test", "-c", "DEFAULT"),
        ]
    )
    assert Checkpoint(tmp_path / "checkpoint").claims == {}
    for ref in refs:  # as the kubelet retries: one request per pod
        assert (await preparer.prepare([ref]))[ref.uid].error == ""
    assert len(runner.commands) - len(resets) == 4


async def test_an_unreachable_apiserver_costs_the_node_event_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Warning event is the last of three reports (ERROR logs and gauges come first): failing
    to post it is a WARNING, not a failed start."""
    report = RecoveryReport(doubts=("slot damaged",), unaccounted=[tmp_path / "spec.json"])
    async with ApiClient(Configuration(host="http://127.0.0.1:9")) as api:  # discard port: refused
        await report_recovery(api, "node-a", DRIVER, report)
    assert "could not post the DRACheckpointRecovered event on node node-a" in caplog.text
