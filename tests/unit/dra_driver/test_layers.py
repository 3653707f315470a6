"""The driver's import contracts bite: every module has a layer, and a wrong-way import breaks
``lint-imports`` (``make lint``) with the offending edge named (on a copy of the driver:
``tests/import_contracts.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_contracts import LINT_IMPORTS, layers_of, lint_copy, modules_of


def test_every_module_of_the_driver_has_a_layer() -> None:
    placed = {name.strip() for line in layers_of("dra_driver") for name in line.split("|")}
    assert placed == modules_of("dra_driver")


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed beside this Python")
def test_the_copy_passes_and_a_vendor_import_in_prepare_breaks_the_layers(tmp_path: Path) -> None:
    clean = lint_copy("dra_driver", tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    # prepare naming NVIDIA's profile: the profiles are a layer above it.
    broken = lint_copy(
        "dra_driver", tmp_path / "broken", ("prepare.py", "from dra_driver.profiles.nvidia import profile")
    )
    assert broken.returncode == 1
    assert "DRA driver layers" in broken.stdout and "BROKEN" in broken.stdout
    assert "dra_driver.prepare -> dra_driver.profiles.nvidia.profile" in broken.stdout
