"""The docs point at what exists: links between them find their headings and anchors, references to
the benchmarks page find its sections, and the architecture doc names every module of the services.

A heading's anchor is GitHub's: the text lowercased, punctuation but `-` and `_` dropped, spaces
made `-`, and `-1`, `-2`, ... added to repeats; an `<a id="...">` is an anchor too.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_HEADING = re.compile(r"^#{1,6} +(.*?) *#*$")
_EXPLICIT = re.compile(r"""<a (?:id|name)=["']([^"']+)["']""")
_LINK = re.compile(r"\]\(([^)\s#]*\.md)?#([^)\s]+)\)")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The heading texts of a markdown file, outside code fences."""
    found: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append(match.group(1))
    return found


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found: set[str] = set()
    for text in headings(path):
        base = slug(text)
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found | set(_EXPLICIT.findall(path.read_text()))


def test_slugs_are_githubs() -> None:
    cases = {
        # heading text -> anchor
        "5. DRA driver: NodePrepareResources / NodeUnprepareResources": (
            "5-dra-driver-nodeprepareresources--nodeunprepareresources"
        ),
        "Merged, on a quiet machine (2026-12-01, 16:09 UTC)": "merged-on-a-quiet-machine-2026-12-01-1609-utc",
        "How far moves could go: an upper bound (`--bound`)": "how-far-moves-could-go-an-upper-bound---bound",
    }
    assert {text: slug(text) for text in cases} == cases


def test_every_link_into_a_doc_finds_its_anchor() -> None:
    broken = []
    for doc in DOCS:
        for target, anchor in _LINK.findall(doc.read_text()):
            path = (doc.parent / target).resolve() if target else doc
            if not path.is_file() or anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target}#{anchor}")
    assert broken == []


def test_the_results_page_links_every_figure_to_the_log() -> None:
    """Each row of a results table on docs/benchmarks.md names its log entry (or the simulator's)."""
    rows = [
        line
        for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| target") and "same entry" not in line
    ]
    assert len(rows) >= 20
    assert [row for row in rows if "benchmarks-log.md#" not in row and "simulator.md#" not in row] == []


_SECTION_REFERENCE = re.compile(r"docs/(benchmarks(?:-log)?\.md),?\s+sections?\s+(\d+)(?:\s+and\s+(\d+))?")
_QUOTED_REFERENCE = re.compile(r'docs/(benchmarks(?:-log)?\.md),?\s+(?:section\s+\d+,\s+)?"([^"]+)"')


def test_references_to_the_benchmark_docs_find_their_sections() -> None:
    """Code and docs cite "docs/benchmarks.md, section 8" or 'docs/benchmarks-log.md "Wire codec"':
    the results page keeps the log's numbered sections (each links to its sittings in the log),
    and a quoted title is the start of a heading there (after its number), or a phrase of the log."""
    titles = {name: headings(ROOT / "docs" / name) for name in ("benchmarks.md", "benchmarks-log.md")}
    numbers = {
        name: {t.split(".")[0] for t in found if re.match(r"\d+\. ", t)} for name, found in titles.items()
    }
    assert numbers["benchmarks.md"] == numbers["benchmarks-log.md"] == {str(n) for n in range(1, 14)}
    missing = []
    for path in ROOT.rglob("*"):
        if path.suffix not in {".py", ".md", ".yaml", ".txt"} or {".git", ".venv"} & set(path.parts):
            continue
        where = path.relative_to(ROOT)
        text = re.sub(r"\s+", " ", path.read_text(errors="replace"))
        for name, *cited in _SECTION_REFERENCE.findall(text):
            missing += [f"{where}: {name} section {n}" for n in cited if n and n not in numbers[name]]
        for name, quoted in _QUOTED_REFERENCE.findall(text):
            if not any(
                re.sub(r"^\d+\. ", "", title).lower().startswith(quoted.lower()) for title in titles[name]
            ) and not (name == "benchmarks-log.md" and quoted in (ROOT / "docs" / name).read_text()):
                missing.append(f'{where}: {name} "{quoted}"')
    assert missing == []


# Generated code named by its folder in the table (`dra_driver/proto/`), not file by file.
_NAMED_BY_FOLDER = ("dra_driver/proto/",)


def test_the_architecture_doc_names_every_module() -> None:
    """docs/architecture.md's table of modules names each module of the services and tools by its
    path, so a new module has to take its place there."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = [
        path.relative_to(ROOT).as_posix()
        for package in ("contract", "extender", "dra_driver", "tessera")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    assert "extender/picture/store.py" in modules  # the walk found the packages
    unnamed = [
        module
        for module in modules
        if f"`{module}`" not in text and not any(module.startswith(folder) for folder in _NAMED_BY_FOLDER)
    ]
    assert unnamed == []
    assert all(f"`{folder}`" in text for folder in _NAMED_BY_FOLDER)


_REPO_PATH = re.compile(r"(extender|dra_driver|tessera|contract|bench|tests|manifests|charts|docs|hack)/")


def test_the_where_to_add_recipes_name_what_exists() -> None:
    """Every file, flag and name in backticks in the architecture doc's "Where to add" recipes is in
    the tree: a rename of a cache or a module the recipes point at has to update them."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    recipes = text[text.index("## Where to add") :]
    code = "\n".join(
        path.read_text()
        for package in ("contract", "extender", "dra_driver", "tessera", "bench")
        for path in (ROOT / package).rglob("*.py")
    )
    file_names = {
        path.name
        for folder in ("contract", "extender", "dra_driver", "tessera", "tests")
        for path in (ROOT / folder).rglob("*.py")
    }
    missing = []
    for token in re.findall(r"`([^`]+)`", recipes):
        if " " in token or token.startswith("/"):
            continue  # an expression or a device path, not a name
        if _REPO_PATH.match(token):
            found = (ROOT / token).exists()
        elif token.endswith(".py"):
            found = token in file_names  # a module or test named beside its folder
        elif token.startswith("--"):
            found = f'"{token}"' in code
        elif "/" in token:
            continue  # a resource or label name (nvidia.com/gpu)
        else:
            found = all(
                re.search(rf"\b{re.escape(part)}\b", code) for part in token.removesuffix("()").split(".")
            )
        if not found:
            missing.append(token)
    assert missing == []
