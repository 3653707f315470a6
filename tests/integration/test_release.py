"""The release artifacts (`make release`): the chart packaged by helm, pinned to the image's
digest; and the image itself, built here without a container daemon (tessera.dev.image) where the
machine can (root and debootstrap; skipped with the reason otherwise): both entry points run
inside it (chroot into its unpacked layers, as its user 65532), it holds no pip, setuptools or
wheel, and a second build from the same base gives the same digest."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tessera.dev.image import Image, build, missing_tools, unpack
from tessera.dev.localcluster import find_binaries

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BASE_CACHE = Path.home() / ".cache" / "tessera" / "image-base"
DIGEST = "sha256:" + "ab" * 32
CHROOT = shutil.which("chroot") or "chroot"  # looked up here: the command runs with the image's PATH
needs_image_tools = pytest.mark.skipif(
    bool(missing_tools()), reason=f"no image build here: {missing_tools()}"
)


def package_chart(dist: Path) -> Path:
    helm = find_binaries() / "helm"
    subprocess.run(
        ["bash", str(REPO / "hack" / "package-chart.sh"), str(dist)],
        env={**os.environ, "HELM": str(helm)},
        check=True,
        capture_output=True,
    )
    (archive,) = dist.glob("tessera-*.tgz")
    return archive


def rendered_images(archive: Path) -> set[str]:
    helm = find_binaries() / "helm"
    text = subprocess.run(
        [str(helm), "template", "t", str(archive), "--kube-version", "v1.37.2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        container["image"]
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] in ("Deployment", "DaemonSet") and "tessera" in doc["metadata"]["name"]
        for container in doc["spec"]["template"]["spec"]["containers"]
        if container["name"] != "kube-scheduler"
    }


def test_the_packaged_chart_pulls_the_released_image_by_digest(tmp_path: Path) -> None:
    (tmp_path / "image-digest").write_text(DIGEST + "\n")
    archive = package_chart(tmp_path)
    assert archive.name == "tessera-0.1.0.tgz"
    assert rendered_images(archive) == {f"tessera@{DIGEST}"}
    # The links to manifests/ are packaged as their files; the dashboard goes with the chart.
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "tessera/crds/queues.yaml",
        "tessera/files/deviceclasses.yaml",
        "tessera/dashboards/tessera.json",
    } <= names
    # Without a built image, the chart names the image by its tag.
    (tmp_path / "image-digest").unlink()
    archive.unlink()
    assert rendered_images(package_chart(tmp_path)) == {"tessera:0.1.0"}


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    return build(tmp_path_factory.mktemp("dist"), BASE_CACHE)


@needs_image_tools
def test_both_entry_points_run_inside_the_image_and_it_has_no_installer(image: Image, tmp_path: Path) -> None:
    rootfs = unpack(image, tmp_path / "rootfs")
    environment = {"PATH": "/opt/tessera/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/"}
    for command in ("tessera-extender", "tessera-dra-driver", "kubectl-tessera"):
        result = subprocess.run(
            [CHROOT, "--userspec=65532:65532", str(rootfs), command, "--help"],
            capture_output=True,
            text=True,
            env=environment,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage:"), result.stdout
    site = rootfs / "opt" / "tessera" / "lib" / "python3.11" / "site-packages"
    installers = [p.name for p in site.iterdir() if p.name.split("-")[0] in ("pip", "setuptools", "wheel")]
    assert installers == []
    assert not (rootfs / "usr" / "lib" / "python3" / "dist-packages" / "pip").exists()


@needs_image_tools
def test_a_second_build_gives_the_same_digest(image: Image, tmp_path: Path) -> None:
    again = build(tmp_path / "dist", BASE_CACHE)
    assert again.digest == image.digest
    assert [blob.digest for blob in again.layers] == [blob.digest for blob in image.layers]


@needs_image_tools
def test_the_archive_is_an_oci_layout_whose_blobs_are_what_they_name(image: Image) -> None:
    with tarfile.open(image.archive) as tar:
        files = {
            member.name.removeprefix("./"): tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isfile()
        }
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    blobs = {
        name.removeprefix("blobs/sha256/"): data for name, data in files.items() if name.startswith("blobs/")
    }
    assert all(hashlib.sha256(data).hexdigest() == name for name, data in blobs.items())
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert (
        entry["digest"] == image.digest
        and entry["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    )
    manifest = json.loads(blobs[image.digest.removeprefix("sha256:")])
    assert entry["size"] == len(blobs[image.digest.removeprefix("sha256:")])
    config = json.loads(blobs[manifest["config"]["digest"].removeprefix("sha256:")])
    layers = [blobs[layer["digest"].removeprefix("sha256:")] for layer in manifest["layers"]]
    assert [len(data) for data in layers] == [layer["size"] for layer in manifest["layers"]]
    # A layer's diff_id is the digest of its uncompressed tar.
    assert config["rootfs"]["diff_ids"] == [
        f"sha256:{hashlib.sha256(gzip.decompress(d)).hexdigest()}" for d in layers
    ]
    assert config["config"]["User"] == "65532:65532" and config["os"] == "linux"
