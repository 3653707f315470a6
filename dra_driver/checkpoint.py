"""The driver's crash-safe memory of prepared claims.

One JSON file, replaced atomically (write temp, fsync, rename, fsync dir) on every change, with a
format version and a checksum so a torn or foreign file is detected instead of trusted. A claim is
recorded as ``started`` before any side effect and ``completed`` once its CDI spec is written, so
after a crash the driver knows exactly what to roll back, and Unprepare knows what to undo even
when the ResourceClaim is gone from the API.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.sharing import GpuShare

CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = "checkpoint.json"
TEMP_SUFFIX = ".tmp"
_MAX_SYNC_THREADS = 8


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be trusted (corrupt, wrong version, bad checksum)."""


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace ``path`` with ``text`` so readers see the old or the new content, never a mix."""
    write_files_atomically({path: text}, mode)


def write_files_atomically(files: Mapping[Path, str], mode: int = 0o600) -> None:
    """Replace several files, each atomically (temp file, fsync, rename), with one directory sync
    per directory; the files' data is synced concurrently, which the filesystem turns into few
    journal commits instead of one per file."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
            staged.append((tmp_name, path))
            with os.fdopen(fd, "w") as tmp:
                tmp.write(text)
            os.chmod(tmp_name, mode)
        _sync_files([tmp_name for tmp_name, _ in staged])
        for tmp_name, path in staged:
            os.replace(tmp_name, path)
    except BaseException:
        for tmp_name, _ in staged:
            Path(tmp_name).unlink(missing_ok=True)
        raise
    for directory in {path.parent for path in files}:
        _sync_path(directory)


def _sync_path(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_files(paths: Sequence[str]) -> None:
    if len(paths) <= 1:
        for path in paths:
            _sync_path(path)
        return
    with ThreadPoolExecutor(max_workers=min(_MAX_SYNC_THREADS, len(paths))) as pool:
        list(pool.map(_sync_path, paths))  # list(): re-raise the first failure


def remove_temp_files(directory: Path, name_prefix: str) -> list[Path]:
    """Delete the temp files a crash left behind in ``directory`` (those of files named
    ``name_prefix...``); the removed paths."""
    leftovers = sorted(directory.glob(f".{name_prefix}*{TEMP_SUFFIX}"))
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


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

    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


class _CheckpointFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    checksum: str
    body: _CheckpointBody


def _checksum(body: _CheckpointBody) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Checkpoint:
    """Claim UID -> ClaimRecord, persisted on every change."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self._body = self._load()

    def _load(self) -> _CheckpointBody:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return _CheckpointBody()
        try:
            parsed = _CheckpointFile.model_validate_json(raw)
        except ValidationError as err:
            raise CheckpointError(f"{self.path}: not a valid checkpoint: {err}") from None
        if parsed.version != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"{self.path}: checkpoint version {parsed.version}, this driver reads {CHECKPOINT_VERSION}"
            )
        if parsed.checksum != _checksum(parsed.body):
            raise CheckpointError(f"{self.path}: checksum mismatch, the file is corrupt")
        return parsed.body

    def _save(self, body: _CheckpointBody) -> None:
        # Memory changes only after the disk did, so a failed write leaves both on the old state.
        document = _CheckpointFile(version=CHECKPOINT_VERSION, checksum=_checksum(body), body=body)
        write_atomically(self.path, document.model_dump_json(indent=1))
        self._body = body

    @property
    def claims(self) -> dict[str, ClaimRecord]:
        return dict(self._body.claims)

    def get(self, claim_uid: str) -> ClaimRecord | None:
        return self._body.claims.get(claim_uid)

    def reload(self) -> None:
        """Read the file again (another process may have written it until now)."""
        self._body = self._load()

    def remove_temp_files(self) -> list[Path]:
        return remove_temp_files(self.path.parent, self.path.name)

    def update(self, changes: Mapping[str, ClaimRecord | None]) -> None:
        """Store each record (None removes the claim) with one durable write, if anything changed."""
        claims = dict(self._body.claims)
        for claim_uid, record in changes.items():
            if record is None:
                claims.pop(claim_uid, None)
            else:
                claims[claim_uid] = record
        if claims != self._body.claims:
            self._save(_CheckpointBody(claims=claims))

    def put(self, claim_uid: str, record: ClaimRecord) -> None:
        self.update({claim_uid: record})
