"""The driver outside ``dra_driver/profiles/`` names no vendor in its code: what NVIDIA needs (the
``NVIDIA_VISIBLE_DEVICES`` variable, ``/dev/nvidia<minor>``, ``nvidia-smi``, NVML) lives in
``profiles/nvidia/``, and prepare, CDI, sharing and the slices meet it through ``DeviceProfile``.

The import contracts (``test_layers.py``) keep those modules from importing a profile; this keeps
them from spelling one out: an identifier or a string in code (docstrings and comments may name
NVIDIA as an example). The two entry modules are left out: they name the default profile, ``nvml``,
which is a registry key.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.import_contracts import ROOT

VENDOR_WORDS = re.compile(r"nvidia|nvml|cuda", re.IGNORECASE)
DRIVER = ROOT / "dra_driver"
# The registry builds profiles by name; __main__ and config name the default one (--backend nvml).
ALLOWED = {"profiles", "proto", "__main__.py", "config.py"}


def vendor_words(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each identifier, attribute or non-docstring string naming a vendor."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias):
            text = node.name
        else:
            continue
        if VENDOR_WORDS.search(text):
            found.append((getattr(node, "lineno", 0), text))
    return found


def test_the_driver_outside_the_profiles_names_no_vendor() -> None:
    neutral = [
        path for path in sorted(DRIVER.rglob("*.py")) if path.relative_to(DRIVER).parts[0] not in ALLOWED
    ]
    # prepare, CDI, sharing, slices, checkpoint, plugin and the device contract are all read.
    assert {"prepare.py", "cdi.py", "sharing.py", "slices.py", "profile.py"} <= {p.name for p in neutral}
    named = {path.relative_to(ROOT).as_posix(): words for path in neutral if (words := vendor_words(path))}
    assert named == {}


def test_the_scan_finds_what_the_nvidia_profile_names() -> None:
    """The same scan on NVIDIA's profile finds its environment variable, device nodes and tool, so
    the empty answer above is no blind spot of the scan."""
    words = {text for path in (DRIVER / "profiles" / "nvidia").glob("*.py") for _, text in vendor_words(path)}
    assert "NVIDIA_VISIBLE_DEVICES" in words
    assert "nvidia-smi" in words
    assert any(text.startswith("/dev/nvidia") for text in words)
