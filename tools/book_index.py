"""The book's label index and its cross-references, shared by every tool.

`book_index(root)` reads chapters/*.ipynb, index.md and appendix/*.md with the MyST tokenizer
(tools/myst.py) and records what a role can point to:
- `(label)=` above a heading: a section with the heading's title (above anything else: the label);
- `$$ … $$ (label)` and `{math}` with `:label:`: an equation, numbered as the HTML book numbers
  it ("4.3" in chapter 4, tools/book_pages.py; "3" on other pages);
- `{figure}`/`{table}`/`{list-table}` with `:name:`: a figure or table, numbered the same way;
- any other directive with `:name:`: an admonition, titled by its argument.

`role_targets(text)` lists the cross-reference roles of a text; `split_target` reads one role's
content ("text <label>") as Sphinx does; `cell_source(cell)` is a notebook cell's source text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tools import ROOT, myst

ADMONITION_TITLES = {
    "note": "注", "tip": "提示", "hint": "提示", "important": "重要", "warning": "警告",
    "caution": "注意", "attention": "注意", "danger": "危险", "error": "错误", "seealso": "另见",
}
_CHAPTER_DOC = re.compile(r"^chapters/(\d\d)_")


def cell_source(cell) -> str:
    """A notebook cell's source as one string (nbformat keeps it as a string or a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


@dataclass
class Target:
    """Something a role can point to."""

    kind: str                 # "section", "equation", "figure", "table", "admonition"
    doc: str                  # "chapters/04_attention_qkv" or "appendix/errata"
    title: str = ""
    number: str | None = None     # "4.3": equations of chapter 4 (tools/book_pages.py numbers them so)


@dataclass
class BookIndex:
    """Labels of every chapter and page, equation/figure numbers per page, chapter numbers."""

    targets: dict[str, Target] = field(default_factory=dict)
    chapter_numbers: dict[str, int] = field(default_factory=dict)


def numbered(doc: str, k: int) -> str:
    """Equation/figure number as the HTML book prints it: "4.3" in chapter 4, "3" elsewhere."""
    number = _CHAPTER_DOC.match(doc)
    return f"{int(number.group(1))}.{k}" if number else str(k)


def scan_markdown(text: str, doc: str, index: BookIndex, counters: dict[str, int]) -> None:
    """Add the labels of one Markdown text (a cell or a page) of `doc` to `index`."""
    pending: list[str] = []
    blocks = list(myst.walk(text))
    for i, block in enumerate(blocks):
        token = block.token
        if token.type == "myst_target":
            pending.append(token.content)
            continue
        if token.type == "heading_open":
            title = blocks[i + 1].token.content.strip()       # the heading's inline token
            for label in pending:
                index.targets[label] = Target("section", doc, title)
            pending = []
        elif pending and token.type != "inline":
            for label in pending:                      # a label above a paragraph, table, ...
                index.targets.setdefault(label, Target("section", doc, label))
            pending = []
        if token.type == "math_block_label":
            counters["equation"] += 1
            index.targets[token.info] = Target("equation", doc, number=numbered(doc, counters["equation"]))
        d = block.directive
        if d is None:
            continue
        if d.name == "math" and "label" in d.options:
            counters["equation"] += 1
            index.targets[d.options["label"]] = Target("equation", doc,
                                                       number=numbered(doc, counters["equation"]))
        elif d.name in ("figure", "table", "list-table") and "name" in d.options:
            counters[d.name] = counters.get(d.name, 0) + 1
            index.targets[d.options["name"]] = Target("figure" if d.name == "figure" else "table", doc,
                                                      d.argument, numbered(doc, counters[d.name]))
        elif "name" in d.options:
            index.targets[d.options["name"]] = Target("admonition", doc,
                                                      d.argument or ADMONITION_TITLES.get(d.name, d.name))


def book_index(root: str | Path = ROOT) -> BookIndex:
    """Scan root/chapters/*.ipynb, index.md and appendix/*.md for labels and numbers."""
    root = Path(root)
    index = BookIndex()
    for path in sorted((root / "chapters").glob("*.ipynb")):
        doc = f"chapters/{path.stem}"
        if path.stem[:2].isdigit():
            index.chapter_numbers[doc] = int(path.stem[:2])
        counters = {"equation": 0}
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                scan_markdown(cell_source(cell), doc, index, counters)
    for path in [root / "index.md"] + sorted((root / "appendix").glob("*.md")):
        if path.is_file():
            doc = path.relative_to(root).with_suffix("").as_posix()
            scan_markdown(path.read_text(encoding="utf-8"), doc, index, {"equation": 0})
    return index


# ------------------------------------------------------------------------------ cross-references

def split_target(content: str) -> tuple[str | None, str]:
    """A cross-reference role's content as Sphinx reads it: "text <label>" -> ("text", "label"),
    "label" -> (None, "label")."""
    from sphinx.util.nodes import split_explicit_title

    explicit, title, target = split_explicit_title(content.strip())
    return (title, target.strip()) if explicit else (None, content.strip())


def roles(text: str) -> list[tuple[str, str]]:
    """(role name, content) of every role in `text`, in order: in its paragraphs, headings and
    tables, in directive arguments and in the bodies MyST reads as Markdown (not in code)."""
    found = []
    for block in myst.walk(text):
        if block.directive is not None:
            found += [(s.token.meta["name"], s.token.content) for s in myst.inline(block.directive.argument)
                      if s.kind == "myst_role"]
        elif block.token.type == "inline":
            found += [(t.meta["name"], t.content) for t in _children(block.token) if t.type == "myst_role"]
    return found


def _children(token):
    for child in token.children or []:
        yield child
        yield from _children(child)


def role_targets(text: str, names: tuple[str, ...] = ("ref",)) -> list[tuple[str, str | None, str]]:
    """(role, explicit text or None, label) for every role in `text` whose name is in `names`."""
    return [(name, *split_target(content)) for name, content in roles(text) if name in names]
