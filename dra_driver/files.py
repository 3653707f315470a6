"""File helpers shared by the files the driver keeps (CDI specs, the checkpoint): the temp-file
suffix their writers use, the clean-up of temp files a crash left behind, a directory sync."""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(directory: Path, name_prefix: str) -> list[Path]:
    """Delete the temp files a crash left behind in ``directory`` (those of files named
    ``name_prefix...``); the removed paths."""
    leftovers = sorted(directory.glob(f".{name_prefix}*{TEMP_SUFFIX}"))
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers
