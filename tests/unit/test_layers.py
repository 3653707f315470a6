"""The extender's layers, and its picture's: every module has one, docs/architecture.md lists the
contracts' lines, and wrong-way imports break ``lint-imports`` (``make lint``) with the edge named -
on a copy of the extender (``tests/import_contracts.py``), so the tree is never touched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.import_contracts import LINT_IMPORTS, ROOT, contracts_of, layers_of, lint_copy, modules_of


def documented_layers(heading: str = "### The extender's layers") -> list[str]:
    """The fenced list under `heading` in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index(heading) :]
    block = re.search(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block is not None
    return block.group(1).splitlines()


def test_every_module_of_the_extender_has_a_layer() -> None:
    placed = {name.strip() for line in layers_of("extender") for name in line.split("|")}
    assert placed == modules_of("extender")


def test_the_architecture_doc_lists_the_contracts_layers() -> None:
    assert documented_layers() == layers_of("extender")


def picture_layers() -> list[str]:
    [contract] = [c for c in contracts_of("extender") if c.get("containers") == ["extender.picture"]]
    layers: list[str] = contract["layers"]
    return layers


def test_every_part_of_the_picture_has_a_layer_and_the_doc_lists_them() -> None:
    placed = {name.strip() for line in picture_layers() for name in line.split("|")}
    assert placed == modules_of("extender/picture")
    assert documented_layers("### The picture's layers") == picture_layers()


# (module file, planted import, the edge lint-imports must name, the contract it breaks)
WRONG_WAY = [
    # policy reading the picture: policy is below it (pure: plain data, no I/O).
    (
        "policy/placement.py",
        "from extender.picture import store",
        "extender.policy.placement -> extender.picture.store",
        "extender layers",
    ),
    # the status writer naming the reclaim loop: it reads the counts through `ReclaimTotals`.
    (
        "status.py",
        "from extender.controllers import reclaim",
        "extender.status -> extender.controllers.reclaim",
        "extender layers",
    ),
    # the webhooks reaching into the verbs' server: they share only `serving`.
    ("webhook.py", "from extender import server", "extender.webhook -> extender.server", "extender layers"),
    # the memo tables, below policy, reaching up into it.
    (
        "memo.py",
        "from extender.policy import placement",
        "extender.memo -> extender.policy.placement",
        "extender layers",
    ),
    # the running-pod feed reaching up into the facade that composes it.
    (
        "picture/running.py",
        "from extender.picture import cluster",
        "extender.picture.running -> extender.picture.cluster",
        "extender picture layers",
    ),
]


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed beside this Python")
def test_the_copy_passes_and_wrong_way_imports_break_the_layers(tmp_path: Path) -> None:
    clean = lint_copy("extender", tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    for number, (module, line, edge, contract) in enumerate(WRONG_WAY):
        broken = lint_copy("extender", tmp_path / f"broken-{number}", (module, line))
        assert broken.returncode == 1, line
        assert contract in broken.stdout and "BROKEN" in broken.stdout
        assert edge in broken.stdout, broken.stdout
