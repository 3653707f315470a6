"""The driver's crash-safe memory of prepared claims.

Two slot files, ``checkpoint.0.json`` and ``checkpoint.1.json``, written in turn: generation ``g``
goes to slot ``g % 2``, overwriting the slot that does not hold the current state, and syncs only
that file's data (one ``fdatasync``, no rename, no directory sync). Every document carries a
format version, a generation number and a checksum; at start the valid slot with the highest
generation wins (never the newer file by mtime). A claim is recorded as ``started`` before any
command runs and ``completed`` once its CDI spec is written, so after a crash the driver knows
what to roll back, and Unprepare knows what to undo even when the ResourceClaim is gone from the
API.

A slot that fails to read is never taken to mean "the other slot is current": a write torn by a
crash and a slot corrupted after the kubelet was answered look the same on disk, and the second
would forget acknowledged claims. So the checkpoint says when it cannot prove it is complete
(``doubts``: a slot unreadable, in the wrong slot for its generation, or missing; or no
checkpoint at all) and keeps a copy of each
unreadable slot (``<slot>.unreadable``) before it is written over; the preparer then recovers
the claims from their CDI specs, which carry their records. With both slots unreadable nothing
can be trusted and the driver refuses to start.

A ``checkpoint.json`` of format 1 (one file, replaced by rename) is read when no slot exists yet.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.devices.share import GpuShare
from dra_driver.files import remove_temp_files, sync_directory

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2
SLOT_FILES = ("checkpoint.0.json", "checkpoint.1.json")
LEGACY_FILE = "checkpoint.json"  # format 1
UNREADABLE_SUFFIX = ".unreadable"  # the copy of a slot that failed to read, kept for inspection


class CheckpointError(RuntimeError):
    """No checkpoint file can be trusted (corrupt, wrong version, bad checksum)."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


class ClaimRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    name: str
    state: Literal["started", "completed"]
    devices: tuple[PreparedDevice, ...] = ()
    shares: tuple[GpuShare, ...] = ()
    cdi_spec: str | None = None  # path of the claim's CDI spec file, once planned


class _CheckpointBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = 0  # one more on every write; format 1 files have none
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


class _CheckpointFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    checksum: str
    body: _CheckpointBody


def _without_absent_partitions(record: Mapping[str, object]) -> dict[str, object]:
    """A record as hashed: a share's ``partition`` (added with MIG partitions) only when it has
    one, so the records written before it keep their checksums (the format stays 2)."""
    shares = record.get("shares")
    if not isinstance(shares, list):
        return dict(record)
    return {
        **record,
        "shares": [
            {k: v for k, v in share.items() if not (k == "partition" and v is None)} for share in shares
        ],
    }


def _checksum(body: _CheckpointBody, dumped: Mapping[str, object] | None = None) -> str:
    """SHA-256 of the body's canonical JSON; ``dumped`` is ``body.model_dump(mode="json")``."""
    document = dict(dumped if dumped is not None else body.model_dump(mode="json"))
    claims = cast(Mapping[str, Mapping[str, object]], document["claims"])
    document["claims"] = {uid: _without_absent_partitions(record) for uid, record in claims.items()}
    if not body.generation:
        del document["generation"]  # format 1 documents have none
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _parse(path: Path, raw: bytes, version: int) -> _CheckpointBody:
    try:
        parsed = _CheckpointFile.model_validate_json(raw)
    except ValidationError as err:
        raise CheckpointError(f"{path}: not a valid checkpoint: {err}") from None
    if parsed.version != version:
        raise CheckpointError(f"{path}: checkpoint version {parsed.version}, this driver reads {version}")
    if parsed.checksum != _checksum(parsed.body):
        raise CheckpointError(f"{path}: checksum mismatch, the file is corrupt")
    return parsed.body


@dataclass(frozen=True)
class _Loaded:
    body: _CheckpointBody
    doubts: tuple[str, ...]  # why the state read may lack acknowledged changes
    unreadable: tuple[Path, ...]  # slots that exist but failed to read
    found: bool  # some checkpoint file existed


def _read_slot(path: Path, slot: int) -> _CheckpointBody:
    body = _parse(path, path.read_bytes(), CHECKPOINT_VERSION)
    if body.generation % 2 != slot:
        raise CheckpointError(
            f"{path}: generation {body.generation} belongs in the other slot (a copied file?)"
        )
    return body


def _load(directory: Path) -> _Loaded:
    valid: dict[int, _CheckpointBody] = {}
    problems: dict[int, CheckpointError] = {}
    for slot, name in enumerate(SLOT_FILES):
        try:
            valid[slot] = _read_slot(directory / name, slot)
        except FileNotFoundError:
            continue
        except CheckpointError as err:
            problems[slot] = err
    unreadable = tuple(directory / SLOT_FILES[slot] for slot in problems)
    if not valid and problems:
        reasons = "; ".join(str(err) for err in problems.values())
        raise CheckpointError(
            f"no checkpoint slot can be read ({reasons}): the driver cannot know which claims are "
            f"prepared. Move both slots aside to start over; claims are then recovered from their CDI specs"
        )
    if not valid:
        legacy = directory / LEGACY_FILE
        try:
            return _Loaded(_parse(legacy, legacy.read_bytes(), 1), (), (), True)
        except FileNotFoundError:
            return _Loaded(_CheckpointBody(), (), (), False)
    newest = max(valid.values(), key=lambda body: body.generation)
    other = 1 - newest.generation % 2
    doubts: list[str] = []
    if other in problems:
        doubts.append(f"{problems[other]}; it may hold a newer state than generation {newest.generation}")
    elif other not in valid:  # after the first write too: that slot may have been removed since
        doubts.append(f"{directory / SLOT_FILES[other]} is missing; it may have held a newer state")
    return _Loaded(newest, tuple(doubts), unreadable, True)


def read_claims(directory: Path) -> dict[str, ClaimRecord]:
    """The claims the newest readable slot records, for a reader beside the driver's own
    ``Checkpoint`` (no copy of an unreadable slot is kept: a write may be under way)."""
    return dict(_load(directory).body.claims)


class Checkpoint:
    """Claim UID -> ClaimRecord, persisted on every change."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._load()

    @property
    def path(self) -> Path:
        """The slot holding the current state."""
        return self.directory / SLOT_FILES[self._body.generation % 2]

    @property
    def generation(self) -> int:
        return self._body.generation

    @property
    def doubts(self) -> tuple[str, ...]:
        """Why the state read at the last load may lack changes that were acknowledged (empty:
        it is complete). Writes do not clear them: they describe what the files held."""
        return self._doubts

    def _load(self) -> None:
        loaded = _load(self.directory)
        for path in loaded.unreadable:  # kept before the next write reuses the slot
            copy = path.with_name(path.name + UNREADABLE_SUFFIX)
            try:
                shutil.copyfile(path, copy)
            except OSError as err:  # a full disk must not keep the driver from starting
                log.warning("could not keep %s as %s: %r", path, copy, err)
        self._body = loaded.body
        self._doubts = loaded.doubts
        self._found = loaded.found

    @property
    def complete(self) -> bool:
        """The files prove the state read holds every acknowledged change: no doubt, and a file
        existed (an empty directory may be a fresh node, or a wiped one)."""
        return self._found and not self._doubts

    def _save(self, claims: dict[str, ClaimRecord]) -> None:
        body = _CheckpointBody(generation=self._body.generation + 1, claims=claims)
        dumped = body.model_dump(mode="json")  # once, for the checksum and the file
        document = {"version": CHECKPOINT_VERSION, "checksum": _checksum(body, dumped), "body": dumped}
        data = json.dumps(document, separators=(",", ":")).encode()
        path = self.directory / SLOT_FILES[body.generation % 2]
        self.directory.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            # Padded to the slot's size (JSON allows trailing blanks): a file whose size stays
            # the same needs no metadata written, so fdatasync is one data flush.
            size = os.fstat(fd).st_size
            os.pwrite(fd, data + b" " * (size - len(data)), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        if created:
            sync_directory(self.directory)
        # Memory changes only after the disk did, so a failed write leaves both on the old state.
        self._body = body

    @property
    def claims(self) -> dict[str, ClaimRecord]:
        return dict(self._body.claims)

    def get(self, claim_uid: str) -> ClaimRecord | None:
        return self._body.claims.get(claim_uid)

    def reload(self) -> None:
        """Read the files again (another process may have written them until now)."""
        self._load()

    def remove_temp_files(self) -> list[Path]:
        """Temp files of format 1 writes (``.checkpoint.json.*.tmp``) a crash left behind."""
        return remove_temp_files(self.directory, LEGACY_FILE)

    def update(self, changes: Mapping[str, ClaimRecord | None]) -> None:
        """Store each record (None removes the claim) with one durable write, if anything changed."""
        claims = dict(self._body.claims)
        for claim_uid, record in changes.items():
            if record is None:
                claims.pop(claim_uid, None)
            else:
                claims[claim_uid] = record
        if claims != self._body.claims:
            self._save(claims)

    def put(self, claim_uid: str, record: ClaimRecord) -> None:
        self.update({claim_uid: record})
