"""The notation appendix (appendix/notation.md) points at places that exist.

Every `{ref}` / `{eq}` in the appendix must name a label that one of the book's sources defines
(chapter notebooks' markdown cells, appendix/*.md, index.md): `(label)=` lines and `:name:` options
for `{ref}`, `$$ … $$ (label)` and `{math}` `:label:` for `{eq}`. A target that moved or was renamed
in a chapter would otherwise only show up as a broken link in the HTML build. The appendix says
which chapter introduces each symbol, so it must link every chapter 01-10 at least once.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from _tools import ROOT

from tools import book_index as index     # the book's one label index and role parser

NOTATION = ROOT / "appendix" / "notation.md"
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def _markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text(encoding="utf-8")


def _sources() -> list[Path]:
    return CHAPTERS + sorted((ROOT / "appendix").glob("*.md")) + [ROOT / "index.md"]


def _labels(text: str) -> tuple[set[str], set[str]]:
    """(labels `{ref}` can reach, labels `{eq}` can reach) defined in one source's markdown."""
    found = index.BookIndex()
    index.scan_markdown(text, "source", found, {"equation": 0})
    eqs = {label for label, target in found.targets.items() if target.kind == "equation"}
    return set(found.targets) - eqs, eqs


@pytest.fixture(scope="module")
def book_labels() -> dict[str, dict[str, Path]]:
    """{"ref": {label: source}, "eq": {label: source}} over every source of the book."""
    found: dict[str, dict[str, Path]] = {"ref": {}, "eq": {}}
    for label, target in index.book_index(ROOT).targets.items():
        source = ROOT / (target.doc + (".ipynb" if target.doc.startswith("chapters/") else ".md"))
        found["eq" if target.kind == "equation" else "ref"][label] = source
    return found


def _roles(text: str) -> list[tuple[str, str, str | None]]:
    """[(role, target, explicit text or None)] for every {ref}/{eq} in ``text``."""
    return [(role, label, explicit) for role, explicit, label in index.role_targets(text, ("ref", "eq"))]


@pytest.fixture(scope="module")
def notation_roles() -> list[tuple[str, str, str | None]]:
    return _roles(NOTATION.read_text(encoding="utf-8"))


def test_the_appendix_links_at_all(notation_roles):
    assert len(notation_roles) > 20, "appendix/notation.md has almost no {ref}/{eq} links"


def test_every_target_exists(notation_roles, book_labels):
    missing = [f"{{{role}}}`{target}`" for role, target, _ in notation_roles
               if target not in book_labels[role]]
    assert not missing, (
        "appendix/notation.md links labels that no chapter/appendix/index source defines "
        "({ref} needs a `(label)=` line or `:name:`, {eq} a `$$ … $$ (label)`):\n" + "\n".join(missing))


def test_ref_links_carry_explicit_text(notation_roles):
    bare = [target for role, target, text in notation_roles if role == "ref" and text is None]
    assert not bare, f"{{ref}} without explicit text in appendix/notation.md: {bare}"


def test_every_chapter_is_linked(notation_roles, book_labels):
    linked = {book_labels[role][target].name for role, target, _ in notation_roles
              if target in book_labels[role]}
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    in_toc = sorted(p.name for p in CHAPTERS if f"chapters/{p.stem}" in toc)
    assert len(CHAPTERS) >= 11 and in_toc == [p.name for p in CHAPTERS], [p.name for p in CHAPTERS]
    unlinked = [p.name for p in CHAPTERS if p.name not in linked]
    assert not unlinked, f"appendix/notation.md links no label in: {unlinked}"


def test_notation_labels_are_unique_in_the_book():
    own_refs, own_eqs = _labels(NOTATION.read_text(encoding="utf-8"))
    assert "appendix-notation" in own_refs
    clashes = []
    for path in _sources():
        if path == NOTATION:
            continue
        refs, eqs = _labels(_markdown_of(path))
        clashes += [f"{label} (also in {path.relative_to(ROOT)})" for label in (own_refs & refs) | (own_eqs & eqs)]
    assert not clashes, "labels of appendix/notation.md defined twice:\n" + "\n".join(clashes)


def test_links_into_the_appendix_resolve():
    """Chapters, index.md and the other appendices link sections of this page (sec-notation-…)."""
    own_refs, _ = _labels(NOTATION.read_text(encoding="utf-8"))
    dangling = []
    for path in _sources():
        if path == NOTATION:
            continue
        for role, target, _ in _roles(_markdown_of(path)):
            if role == "ref" and (target.startswith("sec-notation-") or target == "appendix-notation"):
                if target not in own_refs:
                    dangling.append(f"{path.relative_to(ROOT)}: {target}")
    assert not dangling, "links into appendix/notation.md that it does not define:\n" + "\n".join(dangling)


def test_parsers_on_a_sample():
    """The label and role patterns read what MyST reads (a control for the checks above)."""
    sample = ("(sec-a)=\n## A\n\n$$\nx = 1\n$$ (eq-a)\n\n:::{admonition} t\n:name: err-a\n:::\n"
              "```{math}\n:label: eq-b\ny\n```\n"
              "see {ref}`第 1 章 <sec-a>`, {ref}`sec-x`, {eq}`eq-a`.\n")
    refs, eqs = _labels(sample)
    assert refs == {"sec-a", "err-a"} and eqs == {"eq-a", "eq-b"}
    assert _roles(sample) == [("ref", "sec-a", "第 1 章"), ("ref", "sec-x", None), ("eq", "eq-a", None)]
