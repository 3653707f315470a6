"""The import contracts of one service, run on a copy of it: a wrong-way import planted in the
copy shows the contracts bite (``lint-imports`` names the edge) without touching the tree.

Only the service's own contracts (every module they name is the service's) are copied into the
copy's ``pyproject.toml``; the untouched copy passes the same check, so a failure is the planted
import's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts_of(package: str) -> list[dict[str, Any]]:
    contracts: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]["contracts"]

    def modules(c: dict[str, Any]) -> list[str]:
        return [
            m
            for key in ("containers", "source_modules", "forbidden_modules", "modules")
            for m in c.get(key, [])
        ]

    return [c for c in contracts if all(m.split(".")[0] == package for m in modules(c))]


def layers_of(package: str) -> list[str]:
    """The lines of the layers contract whose container is the package itself."""
    [contract] = [c for c in contracts_of(package) if c.get("containers") == [package]]
    layers: list[str] = contract["layers"]
    return layers


def modules_of(package: str) -> set[str]:
    """The package's direct modules and subpackages, by name."""
    return {
        path.stem if path.is_file() else path.name
        for path in (ROOT / package).iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return '"' + str(value) + '"'


def lint_copy(
    package: str, tmp_path: Path, plant: tuple[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the package's contracts on a copy of it; ``plant`` = (module file, import line)."""
    shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    if plant is not None:
        target = tmp_path / package / plant[0]
        target.write_text(target.read_text() + f"\n{plant[1]}\n")
    lines = ["[tool.importlinter]", f'root_packages = ["{package}"]']
    for contract in contracts_of(package):
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
