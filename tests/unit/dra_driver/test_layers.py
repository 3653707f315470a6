"""The driver's import contracts bite: every module has a layer, and a wrong-way import breaks
``lint-imports`` (``make lint``) with the offending edge named.

The violation is made on a copy of the driver in a temp directory, checked with only the
driver's contracts from ``pyproject.toml``; the untouched copy passes the same check, so the
failure is the planted import's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def driver_contracts() -> list[dict[str, Any]]:
    contracts: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]["contracts"]

    def modules(c: dict[str, Any]) -> list[str]:
        return [
            m
            for key in ("containers", "source_modules", "forbidden_modules", "modules")
            for m in c.get(key, [])
        ]

    # The driver's own: every module they name is the driver's.
    return [c for c in contracts if all(m.split(".")[0] == "dra_driver" for m in modules(c))]


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return '"' + str(value) + '"'


def lint_copy(tmp_path: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the driver's contracts on a copy of dra_driver; ``plant`` = (module file, import line)."""
    shutil.copytree(
        ROOT / "dra_driver", tmp_path / "dra_driver", ignore=shutil.ignore_patterns("__pycache__")
    )
    if plant is not None:
        target = tmp_path / "dra_driver" / plant[0]
        target.write_text(target.read_text() + f"\n{plant[1]}\n")
    lines = ["[tool.importlinter]", 'root_packages = ["dra_driver"]']
    for contract in driver_contracts():
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{key} = {_toml(value)}" for key, value in contract.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(LINT_IMPORTS.parent)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_module_of_the_driver_has_a_layer() -> None:
    [layers] = [c for c in driver_contracts() if c.get("containers") == ["dra_driver"]]
    placed = {name.strip() for line in layers["layers"] for name in line.split("|")}
    modules = {
        path.stem if path.is_file() else path.name
        for path in (ROOT / "dra_driver").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert placed == modules


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed beside this Python")
def test_the_copy_passes_and_a_vendor_import_in_prepare_breaks_the_layers(tmp_path: Path) -> None:
    clean = lint_copy(tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    # prepare naming NVIDIA's profile: the profiles are a layer above it.
    broken = lint_copy(tmp_path / "broken", ("prepare.py", "from dra_driver.profiles.nvidia import profile"))
    assert broken.returncode == 1
    assert "DRA driver layers" in broken.stdout and "BROKEN" in broken.stdout
    assert "dra_driver.prepare -> dra_driver.profiles.nvidia.profile" in broken.stdout
