"""The image installs pyproject.toml's runtime dependencies, pinned, and nothing of the dev extras."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = "requirements-runtime.txt"


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / LOCK).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def _lock_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_runtime", ROOT / "hack" / "lock_runtime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_lines() -> list[str]:
    # Continuation lines joined: one entry per RUN instruction.
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_every_runtime_dependency_is_pinned_within_its_specifier() -> None:
    pins = _locked()
    for text in PROJECT["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} (pyproject runtime dependency) missing from {LOCK}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK} pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )


def test_no_dev_extra_reaches_the_image() -> None:
    dev = {canonicalize_name(Requirement(text).name) for text in PROJECT["optional-dependencies"]["dev"]}
    assert {"cryptography", "grpcio-tools"} <= dev
    assert dev.isdisjoint(_locked()), f"dev extras in {LOCK}: {sorted(dev & set(_locked()))}"
    for run in _run_lines():
        for name in dev:
            assert name not in run, f"the Dockerfile installs the dev package {name}: {run}"


def test_the_lock_is_the_closure_of_the_runtime_dependencies() -> None:
    # Computed from this environment's package metadata; where its versions differ from the lock
    # (a venv resolved later), the closure may differ legitimately, so the check needs the same pins.
    closure = _lock_tool().runtime_closure(ROOT / "pyproject.toml")
    pins = _locked()
    drift = {
        name: (pins.get(name), version) for name, version in closure.items() if pins.get(name) != version
    }
    if drift and set(closure) <= set(pins):
        pytest.skip(f"this environment's versions differ from {LOCK} (locked, here): {drift}")
    assert closure == pins, (
        f"{LOCK} is not the runtime closure: missing {sorted(set(closure) - set(pins))}, "
        f"extra {sorted(set(pins) - set(closure))}, versions {drift}; regenerate with `make lock`"
    )


def test_dockerfile_installs_only_the_lock_then_the_project_without_dependencies() -> None:
    installs = [run for run in _run_lines() if "pip install" in run]
    assert installs == [
        f"RUN /opt/tessera/bin/pip install --no-deps --only-binary=:all: -r {LOCK}",
        "RUN /opt/tessera/bin/pip install --no-deps .",
    ]
    assert f"!{LOCK}" in (ROOT / ".dockerignore").read_text().splitlines()
    for package in ("contract", "extender", "dra_driver"):
        assert f"COPY {package} ./{package}" in DOCKERFILE
        assert f"!{package}/" in (ROOT / ".dockerignore").read_text().splitlines()


def test_base_image_is_pinned_and_the_user_is_not_root() -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert base is not None, "the base image is one ARG, used by both stages"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base.group(1)), base.group(1)
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("0", "root")
