"""hack/kind: the cluster config passes kind's own loader and validation (the kind Go module, built
by hack/kind/build-configcheck.sh), agrees with the chart values hack/kind-up.sh installs, and
the scripts parse and pass shellcheck. The rendered chart is checked against an apiserver in
tests/integration/test_kind.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "hack" / "kind"
SCRIPTS = (ROOT / "hack" / "kind-up.sh", KIND / "build-configcheck.sh")
KIND_VALUES = yaml.safe_load((KIND / "values.yaml").read_text())
CHART_VALUES = yaml.safe_load((ROOT / "charts" / "tessera" / "values.yaml").read_text())
# Where the containerd CRI plugin lives in each config version kind patches.
CRI_TABLE = {"2": "io.containerd.grpc.v1.cri", "3": "io.containerd.cri.v1.runtime"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_passes_shellcheck(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed; `bash -n` passed")
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.fixture(scope="module")
def configcheck() -> Path:
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: the kind config is checked by a program built against kind")
    built = subprocess.run(
        ["bash", str(KIND / "build-configcheck.sh")], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, f"building the kind config check failed:\n{built.stderr}"
    return Path(built.stdout.strip().splitlines()[-1])


def check(configcheck: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(configcheck), str(config)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def report(configcheck: Path) -> dict[str, Any]:
    result = check(configcheck, KIND / "config.yaml")
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def test_kind_accepts_the_config_with_the_dra_gates(report: dict[str, Any]) -> None:
    assert report["featureGates"] == {"DRAConsumableCapacity": True, "DRAPartitionableDevices": True}
    roles = [node["role"] for node in report["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") == 2
    # Every node runs the node image kind itself defaults to, pinned by digest.
    assert {node["image"] for node in report["nodes"]} == {report["kindDefaultImage"]}
    assert "@sha256:" in report["kindDefaultImage"]


def test_the_driver_runs_on_exactly_the_workers(report: dict[str, Any]) -> None:
    selector = KIND_VALUES["draDriver"]["nodeSelector"]
    for node in report["nodes"]:
        labels = node["labels"] or {}
        selected = all(labels.get(key) == value for key, value in selector.items())
        assert selected == (node["role"] == "worker"), node


@pytest.mark.parametrize("version", sorted(CRI_TABLE))
def test_containerd_has_cdi_on_in_both_config_versions(report: dict[str, Any], version: str) -> None:
    patched = tomllib.loads(report["containerd"][version])
    assert patched["version"] == int(version)
    cri = patched["plugins"][CRI_TABLE[version]]
    assert cri["enable_cdi"] is True
    # The driver writes its specs to the chart's cdiDir: containerd must read that directory.
    assert CHART_VALUES["draDriver"]["cdiDir"] in cri["cdi_spec_dirs"]


def test_kinds_validation_is_really_applied(configcheck: Path, tmp_path: Path) -> None:
    misspelled = tmp_path / "misspelled.yaml"
    misspelled.write_text((KIND / "config.yaml").read_text().replace("featureGates:", "featureGate:"))
    result = check(configcheck, misspelled)
    assert result.returncode == 1 and "field featureGate not found" in result.stderr, result.stderr
    no_control_plane = tmp_path / "workers-only.yaml"
    no_control_plane.write_text(
        (KIND / "config.yaml").read_text().replace("role: control-plane", "role: worker")
    )
    result = check(configcheck, no_control_plane)
    assert result.returncode == 1 and "control-plane" in result.stderr, result.stderr


def test_kind_values_select_the_simulated_backend() -> None:
    assert KIND_VALUES["draDriver"]["backend"] == "simulated"
    assert KIND_VALUES["image"]["pullPolicy"] == "Never"  # loaded by `kind load`, never pulled
    profiles = {p.stem for p in (ROOT / "dra_driver" / "profiles" / "nvidia" / "nodes").glob("*.yaml")}
    assert KIND_VALUES["draDriver"]["simulatedProfile"] in profiles
