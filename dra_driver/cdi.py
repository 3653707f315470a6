"""Container Device Interface (CDI) specs: one JSON file per prepared claim.

The container runtime reads ``<cdi-dir>/<vendor>-claim_<claim uid>.json`` and applies the edits of
every device id the kubelet passes on (``<vendor>/claim=<claim uid>-<device name>``). Claim-wide
edits (environment, the device nodes every container of the vendor needs) sit at spec level; each
device adds its own device nodes and mounts. What the edits are is the device profile's; this
module only writes them down.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.devices.share import CharDevice, ContainerEdits
from dra_driver.files import TEMP_SUFFIX, remove_temp_files

CDI_VERSION = "0.6.0"
CDI_CLASS = "claim"
_BIND_OPTIONS = ["rw", "nosuid", "nodev", "bind"]
_CDI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def cdi_vendor(driver_name: str) -> str:
    return f"k8s.{driver_name}"


def cdi_kind(driver_name: str) -> str:
    return f"{cdi_vendor(driver_name)}/{CDI_CLASS}"


@dataclass(frozen=True)
class CdiDevice:
    """One device (or MIG device) of a claim as the container should see it."""

    device_name: str  # ResourceSlice device name, e.g. "gpu-3"
    device_nodes: tuple[str, ...]
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path)
    char_devices: tuple[CharDevice, ...] = ()  # nodes named with their numbers (MIG capabilities)


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    name = f"{claim_uid}-{device_name}"
    if not _CDI_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid CDI device name")
    return name


def cdi_device_id(driver_name: str, claim_uid: str, device_name: str) -> str:
    return f"{cdi_kind(driver_name)}={cdi_device_name(claim_uid, device_name)}"


def _spec_prefix(driver_name: str) -> str:
    return f"{cdi_vendor(driver_name)}-{CDI_CLASS}_"


def spec_path(cdi_dir: Path, driver_name: str, claim_uid: str) -> Path:
    return cdi_dir / f"{_spec_prefix(driver_name)}{claim_uid}.json"


def claim_specs(cdi_dir: Path, driver_name: str) -> dict[str, Path]:
    """Claim UID -> spec file, for every claim spec of this driver in ``cdi_dir``."""
    prefix = _spec_prefix(driver_name)
    return {path.name[len(prefix) : -len(".json")]: path for path in cdi_dir.glob(f"{prefix}*.json")}


def remove_leftover_temp_files(cdi_dir: Path, driver_name: str) -> list[Path]:
    """Temp files of this driver's specs that a crash in mid-write left behind (other drivers' are
    theirs to clean)."""
    return remove_temp_files(cdi_dir, _spec_prefix(driver_name))


def _mounts(mounts: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"hostPath": host, "containerPath": container, "options": _BIND_OPTIONS} for host, container in mounts
    ]


def _device_nodes(paths: Sequence[str], char_devices: Sequence[CharDevice] = ()) -> list[dict[str, Any]]:
    """A node by path (the runtime reads its type and numbers from the host node), or a character
    device with its numbers."""
    return [{"path": path} for path in paths] + [
        {"path": node.path, "type": "c", "major": node.major, "minor": node.minor} for node in char_devices
    ]


def record_annotation(driver_name: str) -> str:
    """The spec annotation holding the driver's record of the claim (its checkpoint entry), so a
    claim can be recovered from its spec when the checkpoint lost it."""
    return f"{driver_name}/claim-record"


def build_claim_spec(
    driver_name: str,
    claim_uid: str,
    devices: Sequence[CdiDevice],
    claim_edits: ContainerEdits,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
    """The CDI spec document for one claim (pure); ``claim_edits`` apply to every container of
    the claim."""
    common: dict[str, Any] = {
        "env": [f"{key}={value}" for key, value in sorted(claim_edits.env.items())],
        "deviceNodes": _device_nodes(claim_edits.device_nodes, claim_edits.char_devices),
    }
    if claim_edits.mounts:
        common["mounts"] = _mounts(claim_edits.mounts)
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver_name),
        "annotations": dict(annotations),
        "containerEdits": common,
        "devices": [
            {
                "name": cdi_device_name(claim_uid, device.device_name),
                "containerEdits": {
                    "deviceNodes": _device_nodes(device.device_nodes, device.char_devices),
                    "mounts": _mounts(device.mounts),
                },
            }
            for device in devices
        ],
    }


def write_claim_specs(specs: Mapping[Path, Mapping[str, Any]]) -> None:
    """Write the spec files of several claims, each replaced atomically (temp file, rename).

    Not synced to disk: a spec matters only to containers of this boot, the CDI directory is
    usually tmpfs, and a spec lost or torn by a power cut is found (``read_claim_spec``) and
    written again when the kubelet prepares the claim after the reboot.
    """
    staged: list[tuple[str, Path]] = []
    try:
        for path, spec in specs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
            staged.append((tmp_name, path))
            # World-readable: the container runtime, not only the driver's user, reads CDI specs.
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w") as tmp:
                tmp.write(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        for tmp_name, path in staged:
            os.replace(tmp_name, path)
    except BaseException:
        for tmp_name, _ in staged:
            Path(tmp_name).unlink(missing_ok=True)
        raise


def read_claim_spec(path: Path) -> dict[str, Any] | None:
    """The spec at ``path``, or None when it is missing or not a whole JSON document."""
    try:
        spec = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def spec_annotation(spec: Mapping[str, Any], key: str) -> str | None:
    annotations = spec.get("annotations")
    value = annotations.get(key) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None


def spec_device_names(spec: Mapping[str, Any], claim_uid: str) -> set[str]:
    """The ResourceSlice device names a claim's spec gives containers (see ``cdi_device_name``)."""
    devices = spec.get("devices")
    prefix = f"{claim_uid}-"
    names = (d.get("name") for d in devices if isinstance(d, dict)) if isinstance(devices, list) else ()
    return {name[len(prefix) :] for name in names if isinstance(name, str) and name.startswith(prefix)}


def remove_claim_specs(paths: Sequence[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
