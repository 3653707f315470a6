"""Tessera's image as an OCI layout, built without a container daemon (`make release`).

The development and CI machines have no Docker engine, buildah, podman or umoci; they have root,
Debian's packages and PyPI. So the image is assembled here, step by step:

1. **base**: a Debian rootfs (`debootstrap --variant=minbase`, suite `bookworm`) with Debian's
   `python3` (3.11) and `ca-certificates`, slimmed (no docs, man pages, locales, apt lists or
   logs), and the user and group 65532 (`tessera`) the extender runs as;
2. **app**: `/opt/tessera`, a virtual environment of that Python made without pip
   (`python3 -m venv --without-pip`, run in the rootfs with chroot), its site-packages filled by
   the host's pip with exactly `requirements-runtime.txt` (binary wheels for CPython 3.11 on
   manylinux x86_64, `--no-deps`) and the project's own wheel, and one script per
   `[project.scripts]` entry (`tessera-extender`, `tessera-dra-driver`, ...) whose first line is
   the venv's Python. No pip, setuptools or wheel is in the image;
3. each of the two trees becomes one layer: a tar with its entries sorted, every mtime set to
   `SOURCE_DATE_EPOCH` (the last commit's time), owners numeric, gzip without a name or time, so
   the same trees give the same bytes, and the image the same digest;
4. the OCI image config (user 65532, `PATH` with the venv first, the `Dockerfile`'s environment
   and command), the manifest and `index.json` are written as an OCI image layout, and packed as
   one `oci-archive` tar: `skopeo copy oci-archive:dist/... docker://REGISTRY/tessera:TAG`,
   `crane push`, or `docker load` (Docker 25+) take it.

What is reproducible: given the same rootfs (kept under `~/.cache/tessera/image-base/` by the date
of its Debian packages' build) and the same checkout, the digest is the same
(`tests/integration/test_image_build.py` builds twice). A fresh debootstrap picks up the Debian
mirror's packages of that day, so a new base is a new digest; pin it by keeping the cache, or by a
snapshot.debian.org mirror (`--mirror`).

The `Dockerfile` stays the way to build the same contents where a Docker engine is (on the
python:3.11-slim base, with pip removed likewise).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PYTHON = "3.11"
VENV = "opt/tessera"  # relative to the rootfs
USER_ID = 65532
WHEEL_SOURCES = ("pyproject.toml", "README.md", "contract", "extender", "dra_driver", "tessera")
# Binary wheels the image's glibc (Debian 12: 2.36) runs: the manylinux tags up to 2.36.
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
)
# Trees a container runtime mounts or that only the build used: never in a layer.
NOT_IN_LAYERS = ("dev", "proc", "sys", "run", "tmp", "var/tmp")
SLIMMED = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/lib/apt/lists",
    "var/cache",
)
# Files debootstrap writes that differ from build to build and that a container does not use.
UNSTABLE_FILES = ("etc/machine-id", "var/lib/dbus/machine-id", "etc/hostname", "etc/resolv.conf")
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageError(Exception):
    """The image cannot be built here; the message says what is missing."""


def missing_tools() -> str:
    """Why this machine cannot build the image ('' when it can)."""
    if os.geteuid() != 0:
        return "building the image's rootfs needs root (debootstrap, chroot)"
    for tool in ("debootstrap", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install debootstrap)"
    return ""


def _run(*command: str | Path, log: Path | None = None) -> None:
    with open(log or os.devnull, "a") as out:
        result = subprocess.run([str(c) for c in command], stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        where = f"; its output is in {log}" if log else ""
        raise ImageError(f"{Path(str(command[0])).name} failed with exit code {result.returncode}{where}")


def base_rootfs(cache: Path, mirror: str, log: Path) -> Path:
    """The debootstrapped, slimmed base rootfs, built once into `cache` and reused."""
    rootfs = cache / f"{SUITE}-minbase-python3"
    if (rootfs / "usr" / "bin" / "python3").exists():
        return rootfs
    partial = rootfs.with_name(rootfs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _run(
        "debootstrap",
        "--variant=minbase",
        "--include=python3,ca-certificates",
        SUITE,
        partial,
        mirror,
        log=log,
    )
    for tree in SLIMMED:
        shutil.rmtree(partial / tree, ignore_errors=True)
    for file in UNSTABLE_FILES:
        (partial / file).unlink(missing_ok=True)
    for tree in ("var/log", *NOT_IN_LAYERS):
        target = partial / tree
        if target.is_dir():
            for child in target.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    with open(partial / "etc" / "passwd", "a") as passwd:
        passwd.write(f"tessera:x:{USER_ID}:{USER_ID}::/nonexistent:/usr/sbin/nologin\n")
    with open(partial / "etc" / "group", "a") as group:
        group.write(f"tessera:x:{USER_ID}:\n")
    partial.rename(rootfs)
    return rootfs


def scripts() -> dict[str, str]:
    """The project's console scripts (pyproject.toml): name -> "module:function"."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["scripts"])


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def app_tree(rootfs: Path, work: Path, log: Path) -> Path:
    """`/opt/tessera` built in a copy of the rootfs (chroot runs its Python); returns a tree that
    holds only `opt/tessera`, the app layer."""
    stage = work / "stage"
    shutil.copytree(rootfs, stage, symlinks=True)
    _run("chroot", stage, f"/usr/bin/python{PYTHON}", "-m", "venv", "--without-pip", f"/{VENV}", log=log)
    site = stage / VENV / "lib" / f"python{PYTHON}" / "site-packages"
    wheels = work / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", wheels, _sources(work), log=log)
    (wheel,) = wheels.glob("tessera-*.whl")
    target = [
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        "--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}",
        "--only-binary=:all:", "--no-deps", "--no-compile", "--target", str(site),
    ]  # fmt: skip
    pip = (sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location")
    _run(*pip, *target, "-r", REPO / "requirements-runtime.txt", log=log)
    _run(*pip, *target, "--upgrade", wheel, log=log)
    shutil.rmtree(site / "bin", ignore_errors=True)  # pip's scripts name the host's Python
    _forget_build_paths(site)
    bin_dir = stage / VENV / "bin"
    for name, entry in scripts().items():
        module, function = entry.split(":")
        script = bin_dir / name
        script.write_text(
            f"#!/{VENV}/bin/python\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
        )
        script.chmod(0o755)
    for cache in stage.joinpath(VENV).rglob("__pycache__"):
        shutil.rmtree(cache)
    app = work / "app"
    (app / VENV).parent.mkdir(parents=True)
    shutil.move(stage / VENV, app / VENV)
    shutil.rmtree(stage)
    return app


def _sources(work: Path) -> Path:
    """The files the wheel is built from, as the Dockerfile copies them, in a clean directory (the
    checkout's build/ may hold files of modules since removed)."""
    source = work / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    return source


def _forget_build_paths(site: Path) -> None:
    """pip records where a local wheel came from (`direct_url.json`: this build's temporary
    directory); dropped with its RECORD line, so the layer does not change from build to build."""
    for record in site.glob("*.dist-info/direct_url.json"):
        listing = record.with_name("RECORD")
        name = f"{record.parent.name}/direct_url.json"
        lines = [line for line in listing.read_text().splitlines() if not line.startswith(f"{name},")]
        listing.write_text("".join(f"{line}\n" for line in lines))
        record.unlink()


def _entries(tree: Path, skip: Sequence[str]) -> Iterator[Path]:
    """Every path of the tree, sorted, parents before children; `skip`'s trees kept empty."""
    for top, dirs, files in os.walk(tree):
        relative = Path(top).relative_to(tree)
        dirs.sort()
        if str(relative) in skip:
            dirs.clear()
            files = []
        for name in sorted([*dirs, *files]):
            yield Path(top) / name


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:<hex> of the bytes stored
    size: int
    diff_id: str = ""  # of a layer: sha256 of the uncompressed tar


def write_blob(layout: Path, data: bytes) -> Blob:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return Blob(f"sha256:{digest}", len(data))


def layer(layout: Path, tree: Path, epoch: int, skip: Sequence[str] = ()) -> Blob:
    """One reproducible layer of `tree` (see the module docstring, step 3)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(tree, skip):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
            if not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
                continue  # device nodes and sockets: the runtime provides them
            info.mtime = epoch
            info.uname = info.gname = ""
            info.pax_headers = {}
            if info.isfile():
                with open(path, "rb") as source:
                    tar.addfile(info, source)
            else:
                tar.addfile(info)
    data = raw.getvalue()
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=6) as out:
        out.write(data)
    blob = write_blob(layout, packed.getvalue())
    return Blob(blob.digest, blob.size, f"sha256:{hashlib.sha256(data).hexdigest()}")


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Image:
    layout: Path
    archive: Path
    digest: str  # of the manifest: what `image@sha256:...` names
    layers: tuple[Blob, ...]

    @property
    def compressed_bytes(self) -> int:
        return sum(blob.size for blob in self.layers)


def image_config(diff_ids: Sequence[str], epoch: int) -> dict[str, object]:
    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": f"{USER_ID}:{USER_ID}",
            "Env": [
                f"PATH=/{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONDONTWRITEBYTECODE=1",
                "PYTHONUNBUFFERED=1",
            ],
            "Cmd": ["tessera-extender", "--help"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [
            {
                "created": created,
                "created_by": f"debootstrap --variant=minbase {SUITE} + python3 (tessera.dev.image)",
            },
            {
                "created": created,
                "created_by": "/opt/tessera: requirements-runtime.txt and tessera (tessera.dev.image)",
            },
        ],
    }


def write_layout(layout: Path, base: Path, app: Path, epoch: int, tag: str) -> Image:
    shutil.rmtree(layout, ignore_errors=True)
    layout.mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    layers = (layer(layout, base, epoch, NOT_IN_LAYERS), layer(layout, app, epoch))
    config = write_blob(layout, _json(image_config([blob.diff_id for blob in layers], epoch)))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": blob.digest, "size": blob.size} for blob in layers],
    }
    written = write_blob(layout, _json(manifest))
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": written.digest,
                "size": written.size,
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_bytes(_json(index))
    archive = layout.with_name(layout.name + ".tar")
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in [layout, *_entries(layout, ())]:
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(layout)) if path != layout else ".")
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if info.isfile():
                with open(path, "rb") as source:
                    tar.addfile(info, source)
            else:
                tar.addfile(info)
    return Image(layout, archive, written.digest, layers)


def source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH, else the last commit's time: the same checkout, the same timestamps."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        return int(given)
    result = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True
    )
    return int(result.stdout.strip() or 0)


def build(out: Path, cache: Path, mirror: str = MIRROR, log: Path | None = None) -> Image:
    problem = missing_tools()
    if problem:
        raise ImageError(problem)
    log = log or out / "image-build.log"
    out.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    tag = version()
    with tempfile.TemporaryDirectory(prefix="tessera-image-") as work:
        base = base_rootfs(cache, mirror, log)
        app = app_tree(base, Path(work), log)
        return write_layout(out / f"tessera-{tag}-oci", base, app, source_date_epoch(), tag)


def unpack(image: Image, into: Path) -> Path:
    """The image's layers extracted in order into `into` (a rootfs to chroot into)."""
    index = json.loads((image.layout / "index.json").read_text())
    blobs = image.layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_bytes())
    for entry in manifest["layers"]:
        with tarfile.open(blobs / entry["digest"].split(":")[1], "r:gz") as tar:
            tar.extractall(into, filter="fully_trusted")
    return into


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.dev.image", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="where the OCI layout and archive go")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "tessera" / "image-base",
        help="the base rootfs",
    )
    parser.add_argument("--mirror", default=MIRROR, help=f"the Debian mirror (default {MIRROR})")
    parser.add_argument(
        "--log", type=Path, help="what debootstrap and pip print (default OUT/image-build.log)"
    )
    args = parser.parse_args(argv)
    try:
        image = build(args.out, args.cache, args.mirror, args.log)
    except ImageError as exc:
        print(f"[image] not built: {exc}", file=sys.stderr)
        return 1
    sizes = ", ".join(f"{blob.size / 2**20:.1f} MiB" for blob in image.layers)
    print(f"[image] {image.archive}")
    print(f"[image] digest {image.digest}; layers (compressed) {sizes}")
    (args.out / "image-digest").write_text(image.digest + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
