"""README.md and docs/ stand alone, and the docs sections that the sources name exist.

Every Markdown link points inside the repository; a comment or docstring that names
docs/<file>.md#<section> names a heading of that file.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "design.md", ROOT / "deploy" / "README.md"]
DOCS += sorted(set((ROOT / "docs").glob("*.md")) - set(DOCS))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub-style anchors of a Markdown file's headings."""
    out = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(doc):
    text = doc.read_text()
    assert "DESIGN.md" not in text, f"{doc.name} names a DESIGN.md, which is not in the repository"
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        assert not path.startswith("/"), f"{doc.name}: absolute link {target}"
        file = (doc.parent / path).resolve() if path else doc
        assert file.is_relative_to(ROOT), f"{doc.name}: {target} points outside the repository"
        assert file.exists(), f"{doc.name}: {target} does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file.read_text()), f"{doc.name}: no heading #{anchor}"


SOURCES = [
    f for top in ("ops", "state", "pipeline", "deploy", "tests") for f in (ROOT / top).rglob("*.py")
]
DOC_SECTION = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def test_sources_point_at_doc_sections_that_exist():
    """A comment or docstring naming docs/<file>.md#<section> names a heading of that file."""
    named = 0
    for source in SOURCES:
        for name, anchor in DOC_SECTION.findall(source.read_text()):
            where = source.relative_to(ROOT)
            doc = ROOT / "docs" / name
            assert doc.exists(), f"{where}: docs/{name} does not exist"
            assert anchor in _anchors(doc.read_text()), f"{where}: no heading #{anchor} in {name}"
            named += 1
    assert named, "no source names a docs section: the pattern no longer matches anything"


def test_placeholders_for_what_survives_a_crash_are_marked():
    for doc in DOCS[:2]:
        assert "## What survives a crash" in doc.read_text(), doc.name


def test_the_design_module_map_names_every_module():
    """docs/design.md's module map lists each module of ops, state and pipeline under its folder."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    listed = set()
    folder = None
    for line in section.splitlines():
        if line.startswith("**`") and line.endswith("/`**"):
            folder = line[3:-4]
        elif line.startswith("- `") and folder is not None:
            listed.add(f"{folder}/{line[3:].split('`', 1)[0]}")
    modules = {
        str(f.relative_to(ROOT))
        for top in ("ops", "state", "pipeline")
        for f in (ROOT / top).rglob("*.py")
        if f.name != "__init__.py" and "__pycache__" not in f.parts
    }
    assert modules - listed == set(), "modules missing from docs/design.md's module map"
    assert listed - modules == set(), "docs/design.md's module map names modules that do not exist"
