"""The extender's layers: every module has one, docs/architecture.md lists the contract's lines,
and wrong-way imports break ``lint-imports`` (``make lint``) with the edge named - on a copy of
the extender (``tests/import_contracts.py``), so the tree is never touched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.import_contracts import LINT_IMPORTS, ROOT, layers_of, lint_copy, modules_of


def documented_layers() -> list[str]:
    """The fenced list under "The extender's layers" in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("### The extender's layers") :]
    block = re.search(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block is not None
    return block.group(1).splitlines()


def test_every_module_of_the_extender_has_a_layer() -> None:
    placed = {name.strip() for line in layers_of("extender") for name in line.split("|")}
    assert placed == modules_of("extender")


def test_the_architecture_doc_lists_the_contracts_layers() -> None:
    assert documented_layers() == layers_of("extender")


# (module file, planted import, the edge lint-imports must name)
WRONG_WAY = [
    # policy reading the picture: policy is below it (pure: plain data, no I/O).
    (
        "policy/placement.py",
        "from extender.picture import store",
        "extender.policy.placement -> extender.picture.store",
    ),
    # the status writer naming the reclaim loop: it reads the counts through `ReclaimTotals`.
    (
        "status.py",
        "from extender.controllers import reclaim",
        "extender.status -> extender.controllers.reclaim",
    ),
    # the webhooks reaching into the verbs' server: they share only `serving`.
    ("webhook.py", "from extender import server", "extender.webhook -> extender.server"),
    # the memo tables, below policy, reaching up into it.
    ("memo.py", "from extender.policy import placement", "extender.memo -> extender.policy.placement"),
]


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed beside this Python")
def test_the_copy_passes_and_wrong_way_imports_break_the_layers(tmp_path: Path) -> None:
    clean = lint_copy("extender", tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for number, (module, line, edge) in enumerate(WRONG_WAY):
        broken = lint_copy("extender", tmp_path / f"broken-{number}", (module, line))
        assert broken.returncode == 1, line
        assert "extender layers" in broken.stdout and "BROKEN" in broken.stdout
        assert edge in broken.stdout, broken.stdout
