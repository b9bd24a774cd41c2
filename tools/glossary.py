"""The glossary 术语表 (appendix/glossary.md) and the links from each chapter's first use of a term.

appendix/glossary.md holds one Sphinx glossary (MyST ```` ```{glossary} ````). Each entry is the
Chinese term on its own line (the key), the English term(s) on the lines right under it
(Sphinx makes consecutive term lines aliases of one definition), then the indented definition.

`link_first_uses()` turns the first use of every glossary term in each chapter's prose into a
`{term}` link: `{term}`注意力`` when the text is the key itself, `{term}`LayerNorm <层归一化>``
when it is an alias. Chapters are independent: each links its own first use.

What counts as a use (a chapter's markdown cells, cells 0 and 1 excluded: title/badge, setup):
- only prose: not headings, `(label)=` lines, directive opening lines (an admonition's title)
  or their `:option:` lines, fenced code, non-Markdown directives, `$$ … $$` display math;
  inside a paragraph not inline code, roles (`{ref}`…`` keeps its text), `$…$` math, Markdown
  links, URLs or HTML tags;
- leftmost-longest: the text is read left to right and at each position the longest term
  (key or alias) wins, so 注意力 inside 自注意力 is a use of 自注意力, not of 注意力;
- a term written in ASCII (LayerNorm, Pre-LN) must stand alone: no letter, digit, `_` or `-`
  right before or after it (so `attention` inside `cross-attention` is not a use);
- a one-character key (键, 值) counts only where it is glossed, written `键（key）` with one of
  its English aliases, because the bare character is part of too many words (最大值, 键盘);
  so do the keys in GLOSSED_ONLY, ordinary words that the book also uses in another sense
  (记忆: chapter 10's encoder output, but chapter 07's "键–值记忆"); their English aliases
  are never a use on their own (memory: chapter 09's "Peak extra memory");
- an occurrence that touches an emphasis delimiter from the inside (`称为**注意力**，`) where the
  link would break the emphasis under CommonMark's flanking rules, or that a backtick follows
  directly, is skipped, and the next one is linked;
- a chapter that already has a `{term}` link to an entry is left alone for that entry.

Running it twice changes nothing. Only markdown cell sources change; cell ids, metadata and
outputs are kept, and the notebook is written with nbformat.write (as tools/colab.py does).

Prose, directives, roles, code and math are found by the MyST tokenizer (tools/myst.py).

Usage (tools/regenerate.py runs it after tools/colab.py):
    python -m tools.glossary            # link first uses in chapters/*.ipynb
    python -m tools.glossary --check    # exit 1 and list the chapters that would change
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tools import ROOT, myst
from tools.book_index import book_index, cell_source, role_targets, roles, split_target

GLOSSARY = "appendix/glossary.md"
CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"
FIRST_PROSE_CELL = 2                  # cell 0: title + badge, cell 1: setup (tools/colab.py)

# Directives whose body is Markdown prose (the opening line and :options: are not prose).
MARKDOWN_DIRECTIVES = {
    "admonition", "note", "tip", "hint", "important", "warning", "caution", "attention",
    "danger", "error", "seealso", "dropdown", "toggle", "figure", "margin", "sidebar", "topic",
    "epigraph", "div",
}

_ASCII_WORD = re.compile(r"[A-Za-z0-9_\-]")
# The blocks whose text is prose (headings, code, math, labels, directive lines are other blocks).
_PROSE_BLOCKS = {"paragraph_open", "table_open", "dt_open"}
# A bare URL: Markdown has no token for it (the book's linkify makes it a link in HTML).
_BARE_URL = re.compile(r"https?://[^\s）)，。、]+")

GLOSSED_ONLY = frozenset({"记忆"})   # linked only where glossed, like 键 and 值


# ------------------------------------------------------------------------------ the glossary

@dataclass(frozen=True)
class Entry:
    """One glossary entry: the key (the Chinese term), its aliases and its definition."""

    key: str
    aliases: tuple[str, ...]
    definition: str
    line: int                          # 1-based line of the key in the glossary file

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)


def parse_glossary(text: str) -> list[Entry]:
    """The entries of the one `{glossary}` directive in `text` (MyST Markdown).

    Follows Sphinx's glossary format: unindented lines are terms (consecutive ones are aliases
    of one entry), the indented block under them is the definition, entries are separated by
    blank lines.

    Raises:
        ValueError: not exactly one glossary, or an entry Sphinx would warn about.
    """
    lines = text.split("\n")
    found = [b for b in myst.walk(text) if b.directive is not None and b.directive.name == "glossary"]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {{glossary}} directive, found {len(found)}")
    glossary = found[0].directive
    if not glossary.closed:
        raise ValueError(f"line {glossary.start + 1}: the {{glossary}} directive is not closed")
    body, end = glossary.body_line, glossary.body_line + len(glossary.body)

    raw: list[tuple[list[tuple[str, int]], list[str]]] = []
    in_definition, was_empty = True, True
    for j in range(body, end):
        line, lineno = lines[j], j + 1
        if not line.strip():
            if in_definition and raw:
                raw[-1][1].append("")
            was_empty = True
            continue
        if not line[0].isspace():
            if in_definition:
                if not was_empty:
                    raise ValueError(f"line {lineno}: a glossary term must follow an empty line")
                raw.append(([(line.strip(), lineno)], []))
                in_definition = False
            else:
                if was_empty:
                    raise ValueError(f"line {lineno}: terms of one entry must not be separated by empty lines")
                raw[-1][0].append((line.strip(), lineno))
        else:
            if not raw:
                raise ValueError(f"line {lineno}: a definition without a term")
            if not in_definition:
                in_definition = True
                indent = len(line) - len(line.lstrip())
            raw[-1][1].append(line[indent:] if line[:indent].isspace() else line.lstrip())
        was_empty = False

    entries = []
    for names, definition in raw:
        for name, lineno in names:
            if " : " in name:
                raise ValueError(f"line {lineno}: ' : ' in a term makes Sphinx read a classifier: {name!r}")
        entries.append(Entry(
            key=names[0][0],
            aliases=tuple(name for name, _ in names[1:]),
            definition="\n".join(definition).strip(),
            line=names[0][1],
        ))
    return entries


def _resolve(path: str | Path, root: str | Path = ROOT) -> Path:
    path = Path(path)
    return path if path.is_absolute() else Path(root) / path


def terms(path: str | Path = GLOSSARY, *, root: str | Path = ROOT) -> list[Entry]:
    """The entries of the glossary at `path` (relative paths are relative to the book root)."""
    return parse_glossary(_resolve(path, root).read_text(encoding="utf-8"))


def find_entry(entries: list[Entry], name: str) -> Entry | None:
    """The entry with `name` as key or alias (case-insensitive, as Sphinx's {term} role)."""
    folded = name.strip().casefold()
    for entry in entries:
        if any(n.casefold() == folded for n in entry.names):
            return entry
    return None


def role_target(content: str) -> str:
    """`注意力权重 <注意力权重>` -> `注意力权重`; `掩码` -> `掩码` (the term a role names)."""
    return split_target(content)[1]


# ------------------------------------------------------------------------------ prose

def _prose_blocks(text: str) -> list[tuple[int, int]]:
    """(first line, end line) of each block of `text` that holds prose: paragraphs (in lists,
    blockquotes and the bodies of MARKDOWN_DIRECTIVES too), tables, definition-list terms."""
    return [(b.start, b.end) for b in myst.walk(text, lambda name: name in MARKDOWN_DIRECTIVES)
            if b.token.type in _PROSE_BLOCKS]


def prose_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges of `text` (one markdown cell's source) that are prose.

    Blocks come from the tokenizer; inside each block, what its inline tokens read as code
    spans, roles, math, links, images, autolinks, HTML, escapes, substitutions and footnote
    references is cut out, and so are bare URLs.
    """
    lines = text.split("\n")
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    spans: list[tuple[int, int]] = []
    for first, last in _prose_blocks(text):
        start, end = offsets[first], offsets[last - 1] + len(lines[last - 1])
        block = text[start:end]
        skips = [(s.start, s.end) for s in myst.inline(block)]
        skips += [m.span() for m in _BARE_URL.finditer(block)]
        pos = 0
        for a, b in sorted(skips):
            if a > pos:
                spans.append((start + pos, start + a))
            pos = max(pos, b)
        if pos < len(block):
            spans.append((start + pos, end))
    return spans


# ------------------------------------------------------------------------------ finding uses

@dataclass(frozen=True)
class Use:
    """An occurrence of a glossary term in prose."""

    key: str          # the entry's key
    surface: str      # the text as written (the key or an alias)
    start: int
    end: int


def _is_punct_or_space(ch: str) -> bool:
    if not ch or ch.isspace():
        return True
    return unicodedata.category(ch)[0] in "PS"


def _wrappable(text: str, start: int, end: int) -> bool:
    """Can text[start:end] be wrapped in a role without changing how the text around it parses?

    - A backtick right after the term would join the role's closing backtick into a longer run.
    - A role starts with `{` and ends with a backtick, both punctuation. A `*`/`_` delimiter run
      touching the term from outside stays able to open (before) or close (after) only if its
      other side is whitespace, punctuation or the line's edge (CommonMark's flanking rules).
    """
    if text[end:end + 1] == "`":
        return False
    before = re.search(r"[*_]+$", text[max(0, start - 8):start])
    if before:
        outer = start - len(before.group(0)) - 1
        if not _is_punct_or_space(text[outer] if outer >= 0 else ""):
            return False
    after = re.match(r"[*_]+", text[end:end + 8])
    if after:
        outer = end + len(after.group(0))
        if not _is_punct_or_space(text[outer] if outer < len(text) else ""):
            return False
    return True


class Matcher:
    """Finds glossary terms in prose, leftmost-longest."""

    def __init__(self, entries: list[Entry]):
        self.entries = entries
        self._by_first: dict[str, list[tuple[str, Entry]]] = {}
        for entry in entries:
            for name in entry.names:
                self._by_first.setdefault(name[0], []).append((name, entry))
        for candidates in self._by_first.values():
            candidates.sort(key=lambda c: -len(c[0]))

    def _match_at(self, text: str, i: int, end: int) -> tuple[str, Entry] | None:
        for name, entry in self._by_first.get(text[i], ()):
            j = i + len(name)
            if j > end or text[i:j] != name:
                continue
            if name.isascii():
                if name[0].isalnum() and i > 0 and _ASCII_WORD.match(text[i - 1]):
                    continue
                if name[-1].isalnum() and j < len(text) and _ASCII_WORD.match(text[j]):
                    continue
            if (len(name) == 1 or name in GLOSSED_ONLY) and name == entry.key \
                    and not self._glossed(text, j, entry):
                continue
            if entry.key in GLOSSED_ONLY and name != entry.key:
                continue  # its English alias is an ordinary word too ("Peak extra memory")
            return name, entry
        return None

    @staticmethod
    def _glossed(text: str, j: int, entry: Entry) -> bool:
        """Is the key ending at j followed by `（alias）` or `(alias)`?"""
        m = re.match(r"\s*[（(]\s*([^（）()]+?)\s*[）)]", text[j:j + 60])
        return bool(m) and m.group(1).casefold() in {a.casefold() for a in entry.aliases}

    def uses(self, text: str) -> list[Use]:
        """Every use of a glossary term in the prose of one markdown cell, in order."""
        found = []
        for start, end in prose_spans(text):
            i = start
            while i < end:
                hit = self._match_at(text, i, end)
                if hit is None:
                    i += 1
                    continue
                name, entry = hit
                if _wrappable(text, i, i + len(name)):
                    found.append(Use(entry.key, name, i, i + len(name)))
                i += len(name)
        return found


def term_roles(text: str, entries: list[Entry]) -> list[tuple[str, Entry | None]]:
    """The `{term}` roles in `text`: (the name the role targets, its entry or None)."""
    return [(role_target(content), find_entry(entries, role_target(content)))
            for name, content in roles(text) if name == "term"]


def term_link(use: Use) -> str:
    """The role that links a use: `{term}`key`` or `{term}`surface <key>``."""
    if use.surface == use.key:
        return f"{{term}}`{use.key}`"
    return f"{{term}}`{use.surface} <{use.key}>`"


# ------------------------------------------------------------------------------ notebooks

def chapter_paths(root: str | Path = ROOT) -> list[Path]:
    """chapters/NN_slug.ipynb under `root`, in order."""
    return sorted((Path(root) / "chapters").glob(CHAPTER_GLOB))


def link_notebook(nb, entries: list[Entry]) -> list[str]:
    """Link the first use of every entry in one chapter notebook, in place.

    Returns the keys of the entries linked (in the order their first uses appear).
    """
    markdown = [(i, cell) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"]
    linked = {entry.key for _, cell in markdown
              for _, entry in term_roles(cell_source(cell), entries) if entry is not None}
    matcher = Matcher(entries)
    first: dict[str, tuple[int, Use]] = {}
    for i, cell in markdown:
        if i < FIRST_PROSE_CELL:
            continue
        for use in matcher.uses(cell_source(cell)):
            if use.key not in linked and use.key not in first:
                first[use.key] = (i, use)
    by_cell: dict[int, list[Use]] = {}
    for i, use in first.values():
        by_cell.setdefault(i, []).append(use)
    for i, uses in by_cell.items():
        text = cell_source(nb.cells[i])
        for use in sorted(uses, key=lambda u: u.start, reverse=True):
            text = text[:use.start] + term_link(use) + text[use.end:]
        nb.cells[i].source = text
    return [key for key, _ in sorted(first.items(), key=lambda kv: (kv[1][0], kv[1][1].start))]


def chapter_uses(root: str | Path = ROOT, glossary: str | Path | None = None) -> dict[str, set[str]]:
    """{chapter file name: keys of the entries it uses} (a {term} role or an unlinked use)."""
    entries = terms(glossary or GLOSSARY, root=root)
    matcher = Matcher(entries)
    result = {}
    for path in chapter_paths(root):
        nb = nbformat.read(path, as_version=4)
        used: set[str] = set()
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "markdown":
                continue
            text = cell_source(cell)
            used |= {entry.key for _, entry in term_roles(text, entries) if entry is not None}
            if i >= FIRST_PROSE_CELL:
                used |= {use.key for use in matcher.uses(text)}
        result[path.name] = used
    return result


def link_first_uses(check_only: bool = False, *, root: str | Path = ROOT,
                    glossary: str | Path | None = None) -> dict[Path, list[str]]:
    """Link the first use of every glossary term in each root/chapters/NN_*.ipynb.

    Args:
        check_only: only report, do not write.
        root: the book root (holds chapters/ and, by default, appendix/glossary.md).
        glossary: the glossary file (default root/appendix/glossary.md).

    Returns:
        {chapter path: keys linked} for the chapters that were (or would be) changed.
    """
    entries = terms(glossary or GLOSSARY, root=root)
    changed: dict[Path, list[str]] = {}
    for path in chapter_paths(root):
        nb = nbformat.read(path, as_version=4)
        keys = link_notebook(nb, entries)
        if not keys:
            continue
        changed[path] = keys
        if not check_only:
            nbformat.write(nb, path)
    return changed


# ------------------------------------------------------------------------------ labels

def book_labels(root: str | Path = ROOT) -> dict[str, str]:
    """{label: document} for everything a {ref} can point to (chapters, index.md, appendix/*.md):
    the Colab edition's label index, minus equation labels."""
    return {label: target.doc for label, target in book_index(root).targets.items()
            if target.kind != "equation"}


def ref_targets(text: str) -> list[tuple[str | None, str]]:
    """The `{ref}` roles in `text`: (explicit text or None, label)."""
    return [(explicit, label) for _, explicit, label in role_targets(text, ("ref",))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Link the first use of each glossary term in chapters/*.ipynb.")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if any chapter would change")
    args = parser.parse_args(argv)
    changed = link_first_uses(check_only=args.check)
    verb = "would link" if args.check else "linked"
    for path, keys in changed.items():
        print(f"{path.relative_to(ROOT)}: {verb} {len(keys)}: {'、'.join(keys)}")
    print(f"{len(changed)} chapter(s) {'out of date' if args.check else 'rewritten'}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
