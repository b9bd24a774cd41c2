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

The Markdown is read with the MyST tokenizer (tools/myst.py): the converter rewrites the source
lines of the blocks and inline tokens it finds, and copies everything else byte for byte. An
unknown directive is an error (so nothing raw reaches Colab silently). `find_myst(text)` lists
the MyST syntax left in a text; the tests run it over every generated notebook.

Usage (tools/regenerate.py runs it after tools/colab.py and tools/glossary.py):
    python -m tools.colab_edition            # write colab/*.ipynb (and remove stale ones)
    python -m tools.colab_edition --check    # exit 1 if colab/ is out of date
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat

from tools import ROOT, colab, myst
from tools.bibliography import Bibliography
from tools.book_index import ADMONITION_TITLES, BookIndex, Target, book_index, cell_source, split_target
from tools.cjk import join_chinese_lines

EDITION_DIR = colab.EDITION_DIR
GENERATED_NOTE = (
    "> 这是本章的 **Colab 版**：由 `{source}` 自动生成（`python3 make.py colab`），"
    "正文与代码与书中相同，只是把书的排版标记换成了 Colab 能显示的 Markdown。"
    "请不要直接编辑这个文件。"
)
REFERENCES_TITLE = "## 参考文献"
REFERENCES_CELL_ID = "colab-edition-references"

# What the no-MyST check reports (`find_myst`), and the directive options it looks for in text.
MYST_KINDS = ("role", "colon fence", "directive fence", "label line", "equation label", "directive option")
_OPTION_NAMES = {"class", "name", "label", "width", "align", "alt", "widths", "header-rows"}
# Blocks the converter handles itself; every other line is prose, converted inline.
_SPECIAL_BLOCKS = {"myst_target", "fence", "colon_fence", "math_block", "math_block_label", "amsmath"}


def find_myst(text: str) -> list[str]:
    """The MyST constructs left in `text` outside code, as 'kind: line' strings (empty when plain)."""
    lines, found = text.split("\n"), []

    def hit(kind: str, line: int) -> None:
        found.append(f"{kind}: {lines[line].strip()[:100]}")

    for block in myst.walk(text):
        token = block.token
        if token.type == "myst_target":
            hit("label line", block.start)
        elif token.type == "math_block_label":
            hit("equation label", block.end - 1)
        elif token.type == "colon_fence":
            hit("colon fence", block.start)
        elif block.directive is not None:
            hit("directive fence", block.start)
        elif token.type == "inline":
            content = token.content
            for span in myst.inline(content):
                if span.kind == "myst_role":
                    hit("role", block.start + content.count("\n", 0, span.start))
            for k, line in enumerate(content.split("\n")):
                option = line.lstrip()
                if option.startswith(":") and option[1:].split(":", 1)[0] in _OPTION_NAMES and ":" in option[1:]:
                    hit("directive option", block.start + k)
    return found


def edition_relpath(chapter_relpath: str | Path) -> str:
    """chapters/04_attention_qkv.ipynb -> colab/04_attention_qkv.ipynb."""
    return f"{EDITION_DIR}/{Path(chapter_relpath).name}"


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

    def _link(self, line: str, span: myst.Span) -> str:
        token = span.token
        url = unquote(token.attrGet("href") or "")
        if token.markup == "autolink" or urlsplit(url).scheme or not url:
            return line[span.start:span.end]
        text = line[slice(*token.meta["label"])]
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
        """Convert the roles and MyST links of one line (code spans, math and HTML stay as written)."""
        out, at = [], 0
        for span in myst.inline(line):
            if span.kind == "myst_role":
                new = self.role(span.token.meta["name"], span.token.content)
            elif span.kind == "link":
                new = self._link(line, span)
            else:
                continue
            out += [line[at:span.start], new]
            at = span.end
        out.append(line[at:])
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
        at = 0
        for block in myst.walk("\n".join(lines), markdown_body=lambda name: False):
            token = block.token
            if token.type not in _SPECIAL_BLOCKS:
                continue
            out += [self.inline(line) for line in lines[at:block.start]]
            at = block.end
            d = block.directive
            if token.type == "myst_target":
                continue
            if token.type in ("fence", "colon_fence"):
                if not myst.is_closed(token, lines, block):
                    what = "':::' fence" if token.type == "colon_fence" else "code fence"
                    raise ValueError(f"unclosed {what} opened by {lines[block.start]!r}")
                if d is None:                                      # a plain code block: verbatim
                    out += lines[block.start:block.end]
                else:
                    indent = lines[block.start][:len(lines[block.start]) - len(lines[block.start].lstrip())]
                    out += self._directive(d, indent)
                continue
            math = lines[block.start:block.end]                    # display math: verbatim but the label
            if token.type == "math_block_label":
                head = math[-1].rstrip()
                head = head[:-len(f"({token.info})")].rstrip()[:-2]      # drop "(label)", then "$$"
                tag = self._equation_tag(token.info)
                if len(math) == 1:
                    math[-1] = f"{head.rstrip()} {tag} $$"
                else:
                    math[-1:] = ([head] if head.strip() else []) + [tag, "$$"]
            out += math
        out += [self.inline(line) for line in lines[at:]]
        return out

    def _directive(self, d: myst.Directive, indent: str) -> list[str]:
        name, arg, options, body = d.name, d.argument, d.options, d.body
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

def colab_notebook(chapter_path: str | Path, *, root: str | Path = ROOT,
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
            cell.source = converter.convert(cell_source(cell))
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


def expected_editions(root: str | Path = ROOT) -> dict[Path, str]:
    """{colab/NN_slug.ipynb path: file text} for every chapters/*.ipynb."""
    root = Path(root)
    index = book_index(root)
    bib = Bibliography(root / "references.bib")
    result = {}
    for path in sorted((root / "chapters").glob("*.ipynb")):
        nb = colab_notebook(path, root=root, index=index, bib=bib)
        result[root / EDITION_DIR / path.name] = render(nb)
    return result


def sync(check_only: bool = False, *, root: str | Path = ROOT) -> list[Path]:
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
        print(f"{verb}: {path.relative_to(ROOT)}")
    print(f"{len(changed)} Colab notebook(s) {verb} in {EDITION_DIR}/")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
