"""hack/require.sh, the check `make` runs before it builds anything: a missing, broken or too old
Python or Go stops the step with one line saying what is needed and how to get it. Each case runs
the script with a PATH of fake tools only (a `go` or `python3` that prints the version asked), so
what the machine has installed does not matter. The minimums are the repository's own:
pyproject.toml's `requires-python = ">=3.11"` and hack/k8s/go.mod's `go 1.26.0`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRE = ROOT / "hack" / "require.sh"
BASH = shutil.which("bash") or "/bin/bash"
# What the script itself runs besides bash's builtins and the tool checked.
SCRIPT_TOOLS = ("sed", "awk", "dirname")
GO_TOO_OLD = (
    "[make] Go >= 1.26.0 is needed to build the control-plane binaries; 'go' is {} (https://go.dev/dl/)\n"
)


def fake_path(tmp_path: Path, tool: str, script: str | None) -> str:
    """A PATH holding only the script's own tools and, unless `script` is None, a fake `tool`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in SCRIPT_TOOLS:
        found = shutil.which(name)
        assert found is not None, name
        (bin_dir / name).symlink_to(found)
    if script is not None:
        fake = bin_dir / tool
        fake.write_text(f"#!{BASH}\n{script}\n")
        fake.chmod(0o755)
    return str(bin_dir)


def require(path: str, *argv: str) -> tuple[int, str]:
    result = subprocess.run(
        [BASH, str(REQUIRE), *argv], env={"PATH": path}, capture_output=True, text=True, check=False
    )
    assert result.stdout == ""
    return result.returncode, result.stderr


@pytest.mark.parametrize(
    ("script", "message"),
    [
        # No go on PATH at all.
        (None, "[make] Go >= 1.26.0 is needed to build the control-plane binaries once (https://go.dev/dl/), "
         "and 'go' is not on PATH\n"),
        # 1.25.9 < 1.26.0 at the minor field.
        ("echo go1.25.9", GO_TOO_OLD.format("1.25.9")),
        # A release candidate comes before its release: go1.26rc1 < 1.26.0.
        ("echo go1.26rc1", GO_TOO_OLD.format("1.26rc1")),
        # `go env GOVERSION` fails (a broken install).
        ("exit 2", "[make] 'go env GOVERSION' fails; Go >= 1.26.0 is needed (https://go.dev/dl/)\n"),
        # Enough: the release itself, a later patch, a later minor's candidate, a two-field version.
        ("echo go1.26.0", ""),
        ("echo go1.26.8", ""),
        ("echo go1.27rc1", ""),
        ("echo go1.30", ""),
    ],
)  # fmt: skip
def test_go(tmp_path: Path, script: str | None, message: str) -> None:
    code, err = require(fake_path(tmp_path, "go", script), "go")
    assert (code, err) == (1 if message else 0, message)


def python_fake(version: str, venv: bool = True) -> str:
    """A `python3` answering the script's two calls: the version (`-c 'import sys; print(...)'`),
    then `-c 'import venv, ensurepip'` (which fails without Debian's python3-venv)."""
    return f"[[ $2 == *venv* ]] && exit {0 if venv else 1}; echo {version}"


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (None, "[make] Python >= 3.11 is needed and 'python3' is not on PATH; install it, or run "
         "make PYTHON=/path/to/python3.X\n"),
        # 3.10.12 < 3.11 at the minor field (10 < 11 as numbers, though "10" > "1" as text).
        (python_fake("3.10.12"), "[make] Python >= 3.11 is needed; 'python3' is 3.10.12; run make "
         "PYTHON=/path/to/python3.X\n"),
        ("exit 127", "[make] 'python3' does not run as Python; Python >= 3.11 is needed "
         "(make PYTHON=/path/to/python3.X)\n"),
        # New enough, but Debian's python3 without python3-venv: `import venv, ensurepip` fails.
        (python_fake("3.12.1", venv=False), "[make] 'python3' (3.12.1) lacks the venv module "
         "(on Debian/Ubuntu: apt-get install python3-venv)\n"),
        (python_fake("3.11.0"), ""),
        (python_fake("3.13.2"), ""),
    ],
)  # fmt: skip
def test_python(tmp_path: Path, script: str | None, message: str) -> None:
    code, err = require(fake_path(tmp_path, "python3", script), "python", "python3")
    assert (code, err) == (1 if message else 0, message)


def test_an_unknown_tool_gets_the_usage(tmp_path: Path) -> None:
    assert require(fake_path(tmp_path, "rust", None), "rust") == (
        1,
        "[make] usage: hack/require.sh python [INTERPRETER] | go\n",
    )
