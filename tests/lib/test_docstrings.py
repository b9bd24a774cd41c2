"""Docstrings cite the book's equations by label, and every cited label exists in the chapters.

A label is defined in a chapter's Markdown after a display equation, ``$$ ... $$ (eq-chNN-name)``
(MyST's dollarmath label), or as ``:label: eq-chNN-name`` in a ``{math}`` directive or a
``(eq-chNN-name)=`` target line. Equation numbers shift when an equation is
inserted; labels do not, so the modules listed in ``LABELLED`` cite by label only.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "lib" / "attnbook"
CITED = re.compile(r"\beq-ch\d\d-[a-z0-9]+(?:-[a-z0-9]+)*")
DEFINED = re.compile(r"^\s*:label:\s*(eq-\S+)\s*$|^\s*\((eq-[^)\s]+)\)=\s*$|\$\$\s*\((eq-[^)\s]+)\)", re.M)
NUMBERED = re.compile(r"\beqs?\.\s*\d")  # "eq. 7", "eqs. 1-4"
# every module of the library, subpackages included
LABELLED = tuple(sorted(p.relative_to(LIB).with_suffix("").as_posix() for p in LIB.rglob("*.py")))


def _defined_labels() -> set[str]:
    labels = set()
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                labels |= {a or b or c for a, b, c in DEFINED.findall(src)}
    return labels


def _docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's, every class's and every function's docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    return out


DEFINED_LABELS = _defined_labels()


def test_the_chapters_define_equation_labels():
    # the scan itself works: chapter 04's attention equation and chapter 06's RoPE are found
    assert {"eq-ch04-attention", "eq-ch06-rope", "eq-ch01-rnn"} <= DEFINED_LABELS
    assert len(DEFINED_LABELS) > 50


@pytest.mark.parametrize("path", sorted(LIB.rglob("*.py")), ids=lambda p: p.relative_to(LIB).as_posix())
def test_every_cited_label_exists(path):
    missing = [(line, label) for line, doc in _docstrings(path) for label in CITED.findall(doc)
               if label not in DEFINED_LABELS]
    assert not missing, f"{path.name}: docstrings cite labels no chapter defines: {missing}"


@pytest.mark.parametrize("module", LABELLED)
def test_modules_cite_equations_by_label_not_number(module):
    path = LIB / f"{module}.py"
    numbered = [(line, m.group(0)) for line, doc in _docstrings(path) for m in NUMBERED.finditer(doc)]
    assert not numbered, f"{path.name}: cite equations by label (eq-chNN-...), not number: {numbered}"


def test_the_label_scan_would_catch_a_typo():
    assert "eq-ch04-atention" not in DEFINED_LABELS
    assert CITED.findall("see chapter 04, eq-ch04-attention.") == ["eq-ch04-attention"]
