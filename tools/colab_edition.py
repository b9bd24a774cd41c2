"""The Colab edition: colab/NN_slug.ipynb, generated from chapters/NN_slug.ipynb.

Colab and plain Jupyter do not render MyST. A chapter opened there would show `(sec-…)=`
labels, `:::{admonition}` fences and `{cite}` roles as raw text. The Colab edition is the same
notebook with its Markdown turned into plain Markdown (CommonMark + `$…$`/`$$…$$` + the little
HTML Colab renders) and every code cell unchanged:

- `(label)=` lines are removed;
- `:::{admonition} title` (and `{note}`, `{warning}`, …) become a blockquote with a bold title;
  `:class: dropdown` (hidden answers) and `{dropdown}`/`{toggle}` become `<details>`;
- `{cite}`key`` becomes "(Vaswani et al., 2017)", `{cite:t}` "Vaswani et al. (2017)", and the
  cited entries are listed in a 参考文献 cell at the end of the notebook;
- `{ref}`text <label>`` becomes the text, `{ref}`label`` the title of the labelled section,
  with "（第 N 章）" when the target is in another chapter; `{eq}`label`` becomes "式 (k)", the
  number the HTML book prints; `{numref}` becomes "图 k"; `[text](label)` becomes the text;
- `$$ … $$ (label)` and `{math}` with `:label:` become `$$ … \\tag{k} $$`;
- `{figure}`/`{image}` become a Markdown image (raw file URL on GitHub) and a caption line;
- cell 0 gets the Colab badge of the edition itself and a note saying where it came from;
  cell 1 is the setup cell (tools/colab.py).

An unknown directive is an error (so nothing raw reaches Colab silently). `find_myst(text)`
lists the MyST syntax left in a text; the tests run it over every generated notebook.

Usage:
    python tools/colab_edition.py            # write colab/*.ipynb (and remove stale ones)
    python tools/colab_edition.py --check    # exit 1 if colab/ is out of date
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab  # noqa: E402  (tools/colab.py: repository, badge, setup cell)

BOOK_ROOT = Path(__file__).resolve().parent.parent
EDITION_DIR = "colab"
GENERATED_NOTE = (
    "> 这是本章的 **Colab 版**：由 `{source}` 自动生成（`python3 make.py colab`），"
    "正文与代码与书中相同，只是把书的排版标记换成了 Colab 能显示的 Markdown。"
    "请不要直接编辑这个文件。"
)
REFERENCES_TITLE = "## 参考文献"
REFERENCES_CELL_ID = "colab-edition-references"

_LABEL_LINE = re.compile(r"^\s*\(([A-Za-z0-9_.:\-]+)\)=\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ROLE = re.compile(r"\{([a-z][a-z0-9_\-]*(?::[a-z][a-z0-9_\-]*)?)\}`([^`]*)`")
_REF_TEXT = re.compile(r"^(.*?)\s*<([^<>]+)>\s*$", re.S)
_COLON_OPEN = re.compile(r"^(\s*)(:{3,})\{([A-Za-z][\w\-]*)\}\s*(.*?)\s*$")
_COLON_CLOSE = re.compile(r"^\s*(:{3,})\s*$")
_TICK_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})\{([A-Za-z][\w\-]*)\}\s*(.*?)\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_OPTION = re.compile(r"^\s*:([A-Za-z][\w\-]*):\s*(.*?)\s*$")
_EQ_LABEL_END = re.compile(r"^(.*?)\$\$\s*\(([A-Za-z][\w.:\-]*)\)\s*$")
_MD_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^()\s]*)\)")

ADMONITION_TITLES = {
    "note": "注", "tip": "提示", "hint": "提示", "important": "重要", "warning": "警告",
    "caution": "注意", "attention": "注意", "danger": "危险", "error": "错误", "seealso": "另见",
}

# What the no-MyST check looks for in a Colab edition's Markdown.
MYST_PATTERNS = {
    "role": re.compile(r"\{[a-z][a-z0-9_\-]*(?::[a-z0-9_\-]+)?\}`"),
    "colon fence": re.compile(r"^\s*:{3,}", re.M),
    "directive fence": re.compile(r"^\s*(`{3,}|~{3,})\{", re.M),
    "label line": re.compile(r"^\s*\([^()\s]+\)=\s*$", re.M),
    "equation label": re.compile(r"\$\$\s*\([A-Za-z][\w.:\-]*\)\s*$", re.M),
    "directive option": re.compile(r"^\s*:(class|name|label|width|align|alt|widths|header-rows):", re.M),
}


def _without_code(text: str) -> str:
    """`text` with fenced code blocks and inline code spans blanked out (roles kept)."""
    lines, out, fence, directives = text.split("\n"), [], None, []
    for line in lines:
        m = _FENCE.match(line)
        if fence is None and m:
            s = line.strip()
            if m.group(3).lstrip().startswith("{"):          # a directive fence: scan its body
                directives.append(m.group(2))
                out.append(line)
                continue
            if directives and set(s) == {directives[-1][0]} and len(s) >= len(directives[-1]):
                directives.pop()
                out.append(line)
                continue
            fence = m.group(2)
            out.append("")
            continue
        if fence is not None:
            s = line.strip()
            if s and set(s) == {fence[0]} and len(s) >= len(fence):
                fence = None
            out.append("")
            continue
        pieces = re.split(r"(`+[^`]*`+)", line)
        kept = []
        for i, piece in enumerate(pieces):
            is_role_content = i % 2 == 1 and re.search(r"\}$", pieces[i - 1] or "")
            kept.append(piece if i % 2 == 0 or is_role_content else "``")
        out.append("".join(kept))
    return "\n".join(out)


def find_myst(text: str) -> list[str]:
    """The MyST constructs left in `text` outside code, as 'kind: line' strings (empty when plain)."""
    found = []
    text = _without_code(text)
    for kind, pattern in MYST_PATTERNS.items():
        for m in pattern.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            found.append(f"{kind}: {line.strip()[:100]}")
    return found


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def edition_relpath(chapter_relpath: str | Path) -> str:
    """chapters/04_attention_qkv.ipynb -> colab/04_attention_qkv.ipynb."""
    return f"{EDITION_DIR}/{Path(chapter_relpath).name}"


# ------------------------------------------------------------------------------ the book's labels

@dataclass
class Target:
    """Something a role can point to."""

    kind: str                 # "section", "equation", "figure", "admonition"
    doc: str                  # "chapters/04_attention_qkv" or "appendix/errata"
    title: str = ""
    number: str | None = None     # "4.3": equations of chapter 4 (tools/book_pages.py numbers them so)


@dataclass
class BookIndex:
    """Labels of every chapter and page, equation/figure numbers per page, chapter numbers."""

    targets: dict[str, Target] = field(default_factory=dict)
    chapter_numbers: dict[str, int] = field(default_factory=dict)


def _numbered(doc: str, k: int) -> str:
    """Equation/figure number as the HTML book prints it: "4.3" in chapter 4, "3" elsewhere."""
    number = re.match(r"^chapters/(\d\d)_", doc)
    return f"{int(number.group(1))}.{k}" if number else str(k)


def _scan_markdown(text: str, doc: str, index: BookIndex, counters: dict[str, int]) -> None:
    lines = text.split("\n")
    pending: list[str] = []
    for i, line in enumerate(lines):
        m = _LABEL_LINE.match(line)
        if m:
            pending.append(m.group(1))
            continue
        heading = _HEADING.match(line)
        if heading and pending:
            for label in pending:
                index.targets[label] = Target("section", doc, heading.group(2).strip())
            pending = []
        elif line.strip() and pending and not heading:
            for label in pending:                      # a label above a paragraph, table, ...
                index.targets.setdefault(label, Target("section", doc, label))
            pending = []
        eq = _EQ_LABEL_END.match(line)
        if eq:
            counters["equation"] += 1
            index.targets[eq.group(2)] = Target("equation", doc, number=_numbered(doc, counters["equation"]))
        opening = _COLON_OPEN.match(line) or _TICK_OPEN.match(line)
        if opening:
            name, arg = opening.group(3), opening.group(4)
            options = {}
            for follow in lines[i + 1:]:
                opt = _OPTION.match(follow)
                if not opt:
                    break
                options[opt.group(1)] = opt.group(2)
            if name == "math" and "label" in options:
                counters["equation"] += 1
                index.targets[options["label"]] = Target("equation", doc,
                                                         number=_numbered(doc, counters["equation"]))
            elif name in ("figure", "table", "list-table") and "name" in options:
                counters[name] = counters.get(name, 0) + 1
                index.targets[options["name"]] = Target("figure" if name == "figure" else "table", doc,
                                                        arg.strip(), _numbered(doc, counters[name]))
            elif "name" in options:
                title = arg.strip() or ADMONITION_TITLES.get(name, name)
                index.targets[options["name"]] = Target("admonition", doc, title)


_QUOTE_PREFIX = re.compile(r"^((?:[ \t]*>)*[ \t]?)")
_BLOCK_START = re.compile(r"^(#|\||[-*+]\s|\d+[.)]\s|\$\$|<|:::|```|~~~)")
_FENCE_LINE = re.compile(r"^(?:[ \t]*>)*[ \t]*(`{3,}|~{3,})")


def join_chinese_lines(markdown: str) -> str:
    """Join a paragraph's source lines where the break falls between two Chinese characters.

    Jupyter and Colab render such a break as a space ("，  每"); Chinese text has none. Lines in
    fenced code and $$ blocks, table rows, headings and list or block starts are never joined; a
    blockquote line joins the previous one only at the same quote depth (its "> " is dropped).
    The HTML book does the same on its doctree (tools/book_pages.py).
    """
    from book_pages import cjk_joinable

    out: list[str] = []
    fence, in_math = None, False
    joinable_prev = False
    for line in markdown.split("\n"):
        prefix = _QUOTE_PREFIX.match(line).group(1)
        body = line[len(prefix):]
        fenced = _FENCE_LINE.match(line)
        if fence or fenced:
            if fence is None:
                fence = fenced.group(1)
            elif fenced and fenced.group(1).startswith(fence[0]) and len(fenced.group(1)) >= len(fence):
                fence = None
            out.append(line)
            joinable_prev = False
            continue
        if body.strip().startswith("$$") or in_math:
            if body.strip().count("$$") % 2 == 1:
                in_math = not in_math
            out.append(line)
            joinable_prev = False
            continue
        text = body.strip()
        if (joinable_prev and text and not _BLOCK_START.match(text)
                and _QUOTE_PREFIX.match(out[-1]).group(1).strip() == prefix.strip()
                and not out[-1].endswith("  ")
                and cjk_joinable(out[-1].rstrip()[-1:], text[:1])):
            out[-1] = out[-1].rstrip() + text
        else:
            out.append(line)
        joinable_prev = bool(text) and not text.startswith(("#", "|"))
    return "\n".join(out)


def split_target(content: str) -> tuple[str | None, str]:
    """A cross-reference role's content: "text <label>" -> ("text", "label"), "label" -> (None, "label")."""
    explicit = _REF_TEXT.match(content)
    return (explicit.group(1), explicit.group(2).strip()) if explicit else (None, content.strip())


def role_targets(text: str, names: tuple[str, ...] = ("ref",)) -> list[tuple[str, str | None, str]]:
    """(role, explicit text or None, label) for every role in `text` whose name is in `names`."""
    return [(m.group(1), *split_target(m.group(2))) for m in _ROLE.finditer(text) if m.group(1) in names]


def book_index(root: str | Path = BOOK_ROOT) -> BookIndex:
    """Scan chapters/*.ipynb, index.md and appendix/*.md for labels and numbers."""
    root = Path(root)
    index = BookIndex()
    for path in sorted((root / "chapters").glob("*.ipynb")):
        doc = f"chapters/{path.stem}"
        if path.stem[:2].isdigit():
            index.chapter_numbers[doc] = int(path.stem[:2])
        nb = nbformat.read(path, as_version=4)
        counters = {"equation": 0}
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                _scan_markdown(_source(cell), doc, index, counters)
    pages = [root / "index.md"] + sorted((root / "appendix").glob("*.md"))
    for path in pages:
        if path.is_file():
            doc = path.relative_to(root).with_suffix("").as_posix()
            _scan_markdown(path.read_text(encoding="utf-8"), doc, index, {"equation": 0})
    return index


# ------------------------------------------------------------------------------ citations

def _latex_to_text(text: str) -> str:
    try:
        import codecs

        import latexcodec  # noqa: F401  (registers the "ulatex" codec; pybtex depends on it)
        text = codecs.decode(text, "ulatex")
    except Exception:  # noqa: BLE001 - a field latexcodec cannot decode stays as written
        pass
    return re.sub(r"[{}]", "", text).replace("--", "–").strip()


class Bibliography:
    """references.bib read with pybtex; author-year labels as the HTML book prints them."""

    def __init__(self, bib_path: str | Path):
        from pybtex.database import parse_file

        self.entries = parse_file(str(bib_path)).entries
        self._warned: set[str] = set()
        base = {key: (self._names(key), self._year(key)) for key in self.entries}
        groups: dict[tuple[str, str], list[str]] = {}
        for key, label in base.items():
            groups.setdefault(label, []).append(key)
        self.labels: dict[str, tuple[str, str]] = {}
        for (names, year), keys in groups.items():
            if len(keys) == 1:
                self.labels[keys[0]] = (names, year)
                continue
            keys.sort(key=lambda k: (self._sort_authors(k), _latex_to_text(self.entries[k].fields.get("title", ""))))
            for suffix, key in zip("abcdefghijklmnopqrstuvwxyz", keys):
                self.labels[key] = (names, year + suffix)

    def _persons(self, key: str):
        entry = self.entries[key]
        return entry.persons.get("author") or entry.persons.get("editor") or []

    def _sort_authors(self, key: str) -> str:
        return " ".join(_latex_to_text(" ".join(p.last_names + p.first_names)) for p in self._persons(key))

    def _names(self, key: str) -> str:
        last = [_latex_to_text(" ".join(p.prelast_names + p.last_names)) for p in self._persons(key)]
        if not last:
            return key
        if len(last) == 1:
            return last[0]
        if len(last) == 2:
            return f"{last[0]} and {last[1]}"
        return f"{last[0]} et al."

    def _year(self, key: str) -> str:
        return self.entries[key].fields.get("year", "n.d.")

    def label(self, key: str) -> tuple[str, str]:
        """(names, year) of a key; a key missing from references.bib shows as itself (the
        bibliography test in tests/book/test_notebooks.py reports it)."""
        if key not in self.labels:
            if key not in self._warned:
                self._warned.add(key)
                print(f"warning: citation key {key!r} is not in references.bib", file=sys.stderr)
            return key, ""
        return self.labels[key]

    def cite(self, keys: list[str], textual: bool) -> str:
        labels = [self.label(k) for k in keys]
        if textual:
            return ", ".join(f"{names} ({year})" if year else names for names, year in labels)
        return "(" + "; ".join(f"{names}, {year}" if year else names for names, year in labels) + ")"

    def reference(self, key: str) -> str:
        """One bibliography line in Markdown."""
        entry = self.entries[key]
        f = entry.fields
        authors = [
            _latex_to_text(" ".join(p.first_names + p.middle_names + p.prelast_names + p.last_names))
            for p in self._persons(key)
        ]
        authors = ["et al." if a == "others" else a for a in authors]
        names, year = self.labels[key]
        venue = f.get("journal") or f.get("booktitle") or f.get("publisher") or f.get("howpublished") or ""
        parts = [f"**{names} ({year})**. {', '.join(authors)}. *{_latex_to_text(f.get('title', key))}*."]
        if venue:
            parts.append(f"{_latex_to_text(venue)}.")
        eprint = f.get("eprint")
        if eprint and f.get("archiveprefix", f.get("archivePrefix", "arXiv")).lower() == "arxiv":
            parts.append(f"[arXiv:{eprint}](https://arxiv.org/abs/{eprint})")
        elif f.get("doi"):
            parts.append(f"[doi:{f['doi']}](https://doi.org/{f['doi']})")
        elif f.get("url"):
            parts.append(f"<{f['url']}>")
        return "- " + " ".join(parts)

    def sort_key(self, key: str):
        names, year = self.labels[key]
        return (names.lower(), year)


# ------------------------------------------------------------------------------ Markdown conversion

class Converter:
    """MyST Markdown of one chapter -> plain Markdown."""

    def __init__(self, doc: str, index: BookIndex, bib: Bibliography, repo: colab.Repository):
        self.doc = doc
        self.index = index
        self.bib = bib
        self.repo = repo
        self.cited: list[str] = []

    # --- inline ---------------------------------------------------------------------------------

    def _where(self, target: Target) -> str:
        if target.doc == self.doc:
            return ""
        number = self.index.chapter_numbers.get(target.doc)
        if number is not None:
            return f"第 {number} 章"
        if target.doc.startswith("appendix/"):
            return "附录"
        return "本书"

    def _target(self, label: str) -> Target:
        target = self.index.targets.get(label)
        if target is None:
            raise KeyError(f"{self.doc}: unknown label {label!r} (no `({label})=`, :name: or equation label)")
        return target

    def role(self, name: str, content: str) -> str:
        if name.startswith("cite"):
            keys = [k.strip() for k in content.split(",") if k.strip()]
            for key in keys:
                if key not in self.cited:
                    self.cited.append(key)
            return self.bib.cite(keys, textual=name in ("cite:t", "cite:ts"))
        text, label = split_target(content)
        if name == "ref":
            target = self._target(label)
            where = self._where(target)
            if text:
                return f"{text}（{where}）" if where else text
            title = self.inline(target.title) if target.title else label
            return f"{where}“{title}”" if where else f"“{title}”"
        if name == "eq":
            target = self._target(label)
            if "." in str(target.number):                  # "式 (4.3)" says the chapter itself
                return f"式 ({target.number})"
            return f"{self._where(target)}式 ({target.number})"
        if name == "numref":
            target = self._target(label)
            word = "图" if target.kind == "figure" else "表"
            where = self._where(target)
            if text:
                return text.replace("%s", str(target.number)).replace("{number}", str(target.number))
            return f"{where}{word} {target.number}"
        if name == "doc":
            return text or Path(label).name
        if name == "math":
            return f"${content}$"
        if name in ("term", "abbr", "sub", "sup", "kbd", "code", "samp", "guilabel", "index"):
            return text or content
        raise ValueError(f"{self.doc}: no plain-Markdown form for the role {{{name}}}`{content}`")

    def _link(self, m: re.Match) -> str:
        bang, text, url = m.group(1), m.group(2), m.group(3)
        if bang or re.match(r"^[a-z][a-z0-9+.\-]*:", url) or not url:
            return m.group(0)
        label = url[1:] if url.startswith("#") else url
        if label in self.index.targets:
            target = self.index.targets[label]
            where = self._where(target)
            return f"{text}（{where}）" if where else text
        if url.endswith(".ipynb") and "/" not in url.strip("./"):
            return f"[{text}]({colab.colab_url(edition_relpath(url), config_path=self.config_path)})"
        return text

    config_path: Path = colab.CONFIG

    def inline(self, line: str) -> str:
        """Convert roles and MyST links outside inline code spans."""
        pieces = re.split(r"(`+[^`]*`+)", line)
        out = []
        for i, piece in enumerate(pieces):
            if i % 2 == 1 and not (out and re.search(r"\}$", out[-1])):
                out.append(piece)             # an inline code span
                continue
            if i % 2 == 1:                    # `{role}` + `content`: the role's backticked content
                role = re.search(r"\{([a-z][a-z0-9_\-]*(?::[a-z][a-z0-9_\-]*)?)\}$", out[-1])
                if role:
                    out[-1] = out[-1][: role.start()]
                    out.append(self.role(role.group(1), piece.strip("`")))
                    continue
                out.append(piece)
                continue
            out.append(_MD_LINK.sub(self._link, piece))
        return "".join(out)

    # --- blocks ---------------------------------------------------------------------------------

    def _equation_tag(self, label: str) -> str:
        target = self._target(label)
        return f"\\tag{{{target.number}}}"

    def convert(self, text: str) -> str:
        out = self._block(text.split("\n"))
        joined = "\n".join(out)
        joined = re.sub(r"\n{3,}", "\n\n", joined)
        return join_chinese_lines(joined.strip("\n"))

    def _block(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            if _LABEL_LINE.match(line):
                i += 1
                continue
            opening = _COLON_OPEN.match(line)
            if opening:
                end = self._colon_end(lines, i, len(opening.group(2)))
                out += self._directive(opening.group(3), opening.group(4), lines[i + 1:end], opening.group(1))
                i = end + 1
                continue
            opening = _TICK_OPEN.match(line)
            if opening:
                end = self._fence_end(lines, i, opening.group(2))
                out += self._directive(opening.group(3), opening.group(4), lines[i + 1:end], opening.group(1))
                i = end + 1
                continue
            fence = _FENCE.match(line)
            if fence:                                          # a plain code block: verbatim
                end = self._fence_end(lines, i, fence.group(2))
                out += lines[i:end + 1]
                i = end + 1
                continue
            if line.strip().startswith("$$"):                  # display math: verbatim but the label
                end = i if (line.strip() != "$$" and line.strip().count("$$") >= 2) else None
                j = i
                if end is None:
                    j = i + 1
                    while j < len(lines) and "$$" not in lines[j]:
                        j += 1
                    end = min(j, len(lines) - 1)
                block = lines[i:end + 1]
                eq = _EQ_LABEL_END.match(block[-1])
                if eq:
                    head = eq.group(1)
                    tag = self._equation_tag(eq.group(2))
                    if len(block) == 1:
                        block[-1] = f"{head.rstrip()} {tag} $$"
                    else:
                        block[-1:] = ([head] if head.strip() else []) + [tag, "$$"]
                out += block
                i = end + 1
                continue
            out.append(self.inline(line))
            i += 1
        return out

    @staticmethod
    def _colon_end(lines: list[str], start: int, colons: int) -> int:
        depth = [colons]
        for j in range(start + 1, len(lines)):
            inner = _COLON_OPEN.match(lines[j])
            if inner:
                depth.append(len(inner.group(2)))
                continue
            close = _COLON_CLOSE.match(lines[j])
            if close and len(close.group(1)) >= depth[-1]:
                depth.pop()
                if not depth:
                    return j
        raise ValueError(f"unclosed ':::' fence opened by {lines[start]!r}")

    @staticmethod
    def _fence_end(lines: list[str], start: int, fence: str) -> int:
        char, n = fence[0], len(fence)
        for j in range(start + 1, len(lines)):
            s = lines[j].strip()
            if s and set(s) == {char} and len(s) >= n:
                return j
        raise ValueError(f"unclosed code fence opened by {lines[start]!r}")

    def _directive(self, name: str, arg: str, body: list[str], indent: str) -> list[str]:
        options: dict[str, str] = {}
        while body and _OPTION.match(body[0]):
            opt = _OPTION.match(body[0])
            options[opt.group(1)] = opt.group(2)
            body = body[1:]
        classes = options.get("class", "").split()
        if name in ("admonition", *ADMONITION_TITLES, "dropdown", "toggle"):
            if name == "admonition":
                title = arg
            elif name in ("dropdown", "toggle"):
                title = arg or "展开"
            else:
                title = ADMONITION_TITLES[name]
                if arg:
                    body = [arg, ""] + body
            inner = self._block(body)
            while inner and not inner[0].strip():
                inner.pop(0)
            while inner and not inner[-1].strip():
                inner.pop()
            title = self.inline(title)
            if name in ("dropdown", "toggle") or "dropdown" in classes:
                return ["", "<details>", f"<summary><b>{title}</b></summary>", "", *inner, "", "</details>", ""]
            quoted = [f"> **{title}**", ">"] + [f"> {x}" if x.strip() else ">" for x in inner]
            return ["", *quoted, ""]
        if name == "math":
            tag = [self._equation_tag(options["label"])] if "label" in options else []
            return ["", "$$", *([arg] if arg else []), *body, *tag, "$$", ""]
        if name in ("figure", "image"):
            url = self._file_url(arg)
            alt = options.get("alt", "")
            caption = self._block(body) if name == "figure" else []
            number = ""
            if name == "figure" and "name" in options:
                number = f"图 {self._target(options['name']).number}："
            lines = ["", f"![{alt}]({url})", ""]
            if caption:
                lines += [f"*{number}" + " ".join(c.strip() for c in caption if c.strip()) + "*", ""]
            return lines
        if name in ("code", "code-block", "sourcecode", "code-cell"):
            return [f"{indent}```{arg.split()[0] if arg else ''}", *body, f"{indent}```"]
        if name == "bibliography":
            return []
        raise ValueError(f"{self.doc}: no plain-Markdown form for the directive {{{name}}} "
                         f"(teach tools/colab_edition.py, or avoid it in chapters)")

    def _file_url(self, path: str) -> str:
        if re.match(r"^[a-z]+://", path):
            return path
        rel = (Path(self.doc).parent / path).as_posix()
        parts = []
        for part in rel.split("/"):
            if part == "..":
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return f"https://raw.githubusercontent.com/{self.repo.org}/{self.repo.name}/{self.repo.branch}/{'/'.join(parts)}"


# ------------------------------------------------------------------------------ notebooks

def colab_notebook(chapter_path: str | Path, *, root: str | Path = BOOK_ROOT,
                   index: BookIndex | None = None, bib: Bibliography | None = None):
    """The Colab edition of one chapter, as a notebook node."""
    root = Path(root)
    chapter_path = Path(chapter_path)
    rel = chapter_path.resolve().relative_to(root.resolve()).as_posix()
    config_path = root / "_config.yml"
    index = index or book_index(root)
    bib = bib or Bibliography(root / "references.bib")
    repo = colab.repository(config_path)
    nb = nbformat.read(chapter_path, as_version=4)
    nb = colab.expected_header(nb, rel, config_path=config_path)      # badge + setup cell
    converter = Converter(f"chapters/{chapter_path.stem}", index, bib, repo)
    converter.config_path = config_path
    new = copy.deepcopy(nb)
    for cell in new.cells:
        if cell.cell_type == "markdown":
            cell.source = converter.convert(_source(cell))
        elif cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    head = new.cells[0].source.split("\n")
    badge_rows = [i for i, line in enumerate(head) if line.strip().startswith(colab.BADGE_PREFIX)]
    note = GENERATED_NOTE.format(source=rel)
    at = badge_rows[0] + 1 if badge_rows else 1
    head[at:at] = ["", note]
    new.cells[0].source = re.sub(r"\n{3,}", "\n\n", "\n".join(head))
    if any(k in bib.entries for k in converter.cited):
        keys = sorted((k for k in converter.cited if k in bib.entries), key=bib.sort_key)
        refs = "\n".join(bib.reference(k) for k in keys)
        cell = nbformat.v4.new_markdown_cell(f"{REFERENCES_TITLE}\n\n{refs}")
        cell["id"] = REFERENCES_CELL_ID
        new.cells.append(cell)
    new.metadata.pop("widgets", None)
    new.metadata["attnbook"] = {"edition": "colab", "source": rel}
    new.metadata["colab"] = {"name": chapter_path.name, "provenance": []}
    return new


def render(nb) -> str:
    """The exact file text nbformat.write produces (for comparing with what is on disk)."""
    return nbformat.writes(nb) + "\n"


def expected_editions(root: str | Path = BOOK_ROOT) -> dict[Path, str]:
    """{colab/NN_slug.ipynb path: file text} for every chapters/*.ipynb."""
    root = Path(root)
    index = book_index(root)
    bib = Bibliography(root / "references.bib")
    result = {}
    for path in sorted((root / "chapters").glob("*.ipynb")):
        nb = colab_notebook(path, root=root, index=index, bib=bib)
        result[root / EDITION_DIR / path.name] = render(nb)
    return result


def sync(check_only: bool = False, *, root: str | Path = BOOK_ROOT) -> list[Path]:
    """Write colab/*.ipynb; remove editions whose chapter is gone. Returns what changed (or would)."""
    root = Path(root)
    expected = expected_editions(root)
    out_dir = root / EDITION_DIR
    changed = []
    for path, text in expected.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            changed.append(path)
            if not check_only:
                out_dir.mkdir(exist_ok=True)
                path.write_text(text, encoding="utf-8")
    for stale in sorted(out_dir.glob("*.ipynb")) if out_dir.is_dir() else []:
        if stale not in expected:
            changed.append(stale)
            if not check_only:
                stale.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the Colab edition colab/*.ipynb from chapters/*.ipynb.")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if colab/ is out of date")
    args = parser.parse_args(argv)
    changed = sync(check_only=args.check)
    verb = "out of date" if args.check else "written"
    for path in changed:
        print(f"{verb}: {path.relative_to(BOOK_ROOT)}")
    print(f"{len(changed)} Colab notebook(s) {verb} in {EDITION_DIR}/")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
