"""The errata appendix, rendered at build time from one source: appendix/errata.yml.

appendix/errata.md holds the page's prose and headings; where a table goes it says

    ```{errata} 04
    ```

(the errata of chapter 04) or ```{errata} confirmed``` (the seed findings that are not errata).
This module, loaded as a Sphinx extension (`_config.yml`: local_extensions), renders those
directives from appendix/errata.yml as MyST list-tables, so the table text lives in one place.

It also checks the source against the book (tests/book/test_errata.py runs `problems()`):
- every erratum box in chapter NN (`:::{admonition} 原笔记：… → …` with `:name: err-chNN-…`)
  has exactly one row in chapter NN's table, in the order of the boxes, and every row names
  such a box;
- every `{ref}` in a row or entry resolves to a labelled cell of the book (a `(label)=` line,
  a `:name:` option or an equation label), and the "verified" links of chapter NN's rows
  point into chapter NN;
- every finding of the seed review (`review:`) is accounted for exactly once: by the rows of
  one chapter, or by one `confirmed` entry.

Usage:
    python -m tools.errata          # print the problems, exit 1 if there are any
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

from tools import ROOT, myst
from tools.book_index import book_index, cell_source, role_targets

SOURCE = ROOT / "appendix" / "errata.yml"
ROW_FIELDS = ("box", "findings", "seed", "correction", "verified", "source")
CONFIRMED_FIELDS = ("findings", "kind", "seed", "book", "verified")

HEADERS = ("原笔记的说法", "更精确的说法", "验证", "出处")
CONFIRMED_HEADERS = ("原笔记", "本书的核对或补充", "验证")
KIND_FORMS = {"ok": "{seed}（正确）", "identity": "{seed}（正确；补一个恒等式）",
              "extension": "原笔记未涉及：{seed}"}
KINDS = tuple(KIND_FORMS)
_FINDING = re.compile(r"^(\d+)\.(\d+)$")
_CHAPTER = re.compile(r"^\d\d$")
_BOX = re.compile(r"^err-ch(\d\d)-[a-z0-9-]+$")
ERRATUM_TITLE = ("原笔记：", "原笔记:")          # an erratum box: {admonition} titled "原笔记：… → …"


class ErrataError(ValueError):
    """appendix/errata.yml does not have the expected form."""


def _text(value, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ErrataError(f"{where}: `{field}` must be non-empty MyST text, got {value!r}")
    if "\n" in value.strip():
        raise ErrataError(f"{where}: `{field}` must be one paragraph (no line breaks)")
    return value.strip()


def _findings(value, where: str, review: dict[str, str]) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ErrataError(f"{where}: `findings` must be a non-empty list like ['4.2'], got {value!r}")
    for f in value:
        if not isinstance(f, str) or not _FINDING.match(f):
            raise ErrataError(f"{where}: `findings` entries must be strings 'N.M', got {f!r}")
        if f not in review:
            raise ErrataError(f"{where}: finding {f!r} is not in `review`")
    return list(value)


def _check_fields(entry, fields: tuple[str, ...], where: str) -> None:
    if not isinstance(entry, dict) or set(entry) != set(fields):
        got = sorted(entry) if isinstance(entry, dict) else entry
        raise ErrataError(f"{where}: fields must be {', '.join(fields)}; got {got}")


def load(path: str | Path = SOURCE) -> dict:
    """Read and validate the errata source; raise ErrataError naming the entry and field."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or set(data) != {"review", "chapters", "confirmed"}:
        raise ErrataError(f"{path}: the top level must have exactly `review`, `chapters`, `confirmed`")
    review = data["review"]
    if not isinstance(review, dict) or not review:
        raise ErrataError(f"{path}: `review` must map finding ids 'N.M' to titles")
    for key, title in review.items():
        if not isinstance(key, str) or not _FINDING.match(key):
            raise ErrataError(f"{path}: `review` keys must be strings 'N.M', got {key!r}")
        _text(title, f"review {key}", "title")
    seen_chapters = []
    for c in data["chapters"]:
        chapter = c.get("chapter") if isinstance(c, dict) else None
        if not isinstance(chapter, str) or not _CHAPTER.match(chapter):
            raise ErrataError(f"{path}: every `chapters` entry needs `chapter: 'NN'`, got {c!r:.80}")
        if chapter in seen_chapters:
            raise ErrataError(f"{path}: chapter {chapter} appears twice in `chapters`")
        seen_chapters.append(chapter)
        if set(c) != {"chapter", "rows"}:
            raise ErrataError(f"chapter {chapter}: fields must be chapter, rows; got {sorted(c)}")
        if not isinstance(c["rows"], list) or not c["rows"]:
            raise ErrataError(f"chapter {chapter}: `rows` must be a non-empty list")
        for k, row in enumerate(c["rows"], 1):
            where = f"chapter {chapter} row {k}"
            _check_fields(row, ROW_FIELDS, where)
            box = row["box"]
            m = _BOX.match(box) if isinstance(box, str) else None
            if not m or m.group(1) != chapter:
                raise ErrataError(f"{where}: `box` must be an erratum box label err-ch{chapter}-…, got {box!r}")
            row["findings"] = _findings(row["findings"], where, review)
            for field in ROW_FIELDS[2:]:
                row[field] = _text(row[field], where, field)
    if seen_chapters != sorted(seen_chapters):
        raise ErrataError(f"{path}: `chapters` must be in chapter order, got {seen_chapters}")
    for k, entry in enumerate(data["confirmed"], 1):
        where = f"confirmed entry {k}"
        _check_fields(entry, CONFIRMED_FIELDS, where)
        entry["findings"] = _findings(entry["findings"], where, review)
        if entry["kind"] not in KINDS:
            raise ErrataError(f"{where}: `kind` must be one of {KINDS}, got {entry['kind']!r}")
        for field in ("seed", "book", "verified"):
            entry[field] = _text(entry[field], where, field)
    return data


def _list_table(headers: tuple[str, ...], widths: str, rows: list[list[str]], name: str) -> str:
    lines = [":::{list-table}", ":header-rows: 1", f":widths: {widths}", ":class: errata-table",
             f":name: {name}", ""]
    for cells in [list(headers)] + rows:
        lines.append(f"* - {cells[0]}")
        lines.extend(f"  - {cell}" for cell in cells[1:])
    lines.append(":::")
    return "\n".join(lines)


def chapter_table(data: dict, chapter: str) -> str:
    """Chapter NN's errata as a MyST list-table (the "验证" column starts with the box link)."""
    for c in data["chapters"]:
        if c["chapter"] == chapter:
            rows = [[r["seed"], r["correction"],
                     f"{{ref}}`正文提示框 <{r['box']}>`；{r['verified']}", r["source"]]
                    for r in c["rows"]]
            return _list_table(HEADERS, "22 38 20 20", rows, f"table-errata-ch{chapter}")
    raise ErrataError(f"no errata for chapter {chapter!r} in appendix/errata.yml")


def confirmed_table(data: dict) -> str:
    """The seed findings that are not errata, as a MyST list-table."""
    rows = [[KIND_FORMS[e["kind"]].format(seed=e["seed"]), e["book"], e["verified"]]
            for e in data["confirmed"]]
    return _list_table(CONFIRMED_HEADERS, "30 45 25", rows, "table-errata-confirmed")


def render(data: dict, argument: str) -> str:
    return confirmed_table(data) if argument == "confirmed" else chapter_table(data, argument)


# ------------------------------------------------------------------------------ checks

def erratum_boxes(root: str | Path = ROOT) -> dict[str, list[str]]:
    """{'04': ['err-ch04-row-vectors', …]}: the erratum boxes of each chapter, in order."""
    boxes: dict[str, list[str]] = {}
    for path in sorted((Path(root) / "chapters").glob("[0-9][0-9]_*.ipynb")):
        found = boxes.setdefault(path.name[:2], [])
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            text = cell_source(cell)
            for block in myst.walk(text):
                d = block.directive
                if d is not None and d.name == "admonition" and d.argument.startswith(ERRATUM_TITLE):
                    line = text.split("\n")[block.start]
                    found.append(d.options.get("name") or f"<unnamed box at: {line[:60]}>")
    return boxes


def shown_tables(page: str) -> list[str]:
    """The arguments of the `{errata}` directives of a page, in order ('04', 'confirmed', …)."""
    return [b.directive.argument for b in myst.walk(page) if b.directive and b.directive.name == "errata"]


def refs(text: str) -> list[str]:
    """The labels that the {ref}/{eq}/{numref} roles in `text` point to."""
    return [label for _, _, label in role_targets(text, ("ref", "eq", "numref"))]


def problems(data: dict | None = None, root: str | Path = ROOT) -> list[str]:
    """Everything that keeps the errata source from matching the book; [] when it matches."""
    data = load(Path(root) / "appendix" / "errata.yml") if data is None else data
    index = book_index(root)
    boxes = erratum_boxes(root)
    out: list[str] = []
    rows_by_chapter = {c["chapter"]: c["rows"] for c in data["chapters"]}
    for chapter in sorted(set(boxes) | set(rows_by_chapter)):
        have = [r["box"] for r in rows_by_chapter.get(chapter, [])]
        want = boxes.get(chapter, [])
        for box in want:
            if have.count(box) != 1:
                out.append(f"chapter {chapter}: box {box} has {have.count(box)} rows (want exactly 1)")
        for box in have:
            if box not in want:
                out.append(f"chapter {chapter}: row for {box}, which is not an erratum box of chapter {chapter}")
        if sorted(have) == sorted(want) and have != want:
            out.append(f"chapter {chapter}: rows are not in the order of the boxes {want}")
    # the page shows every table once
    page = (Path(root) / "appendix" / "errata.md").read_text(encoding="utf-8")
    shown = shown_tables(page)
    for argument in [c["chapter"] for c in data["chapters"]] + ["confirmed"]:
        if shown.count(argument) != 1:
            out.append(f"appendix/errata.md shows the `errata {argument}` table {shown.count(argument)} times (want 1)")
    for argument in shown:
        if argument != "confirmed" and argument not in rows_by_chapter:
            out.append(f"appendix/errata.md: `errata {argument}` has no rows in appendix/errata.yml")
    # every link resolves; a chapter's rows demonstrate in that chapter
    entries = [(f"chapter {c['chapter']} row {r['box']}", c["chapter"], r)
               for c in data["chapters"] for r in c["rows"]]
    entries += [(f"confirmed {'/'.join(e['findings'])}", e["findings"][0].split(".")[0].zfill(2), e)
                for e in data["confirmed"]]
    for where, chapter, entry in entries:
        verified = refs(entry["verified"])
        if not verified:
            out.append(f"{where}: `verified` has no {{ref}} link to the cell that demonstrates it")
        for field, text in entry.items():
            if not isinstance(text, str):
                continue
            for label in refs(text):
                target = index.targets.get(label)
                if target is None:
                    out.append(f"{where}: {field} links to {label!r}, which no cell of the book labels")
                elif field == "verified" and not target.doc.startswith(f"chapters/{chapter}_"):
                    out.append(f"{where}: verified links to {label!r} in {target.doc}, not in chapter {chapter}")
    # every finding accounted for exactly once
    owners: dict[str, list[str]] = {f: [] for f in data["review"]}
    for c in data["chapters"]:
        for f in dict.fromkeys(f for r in c["rows"] for f in r["findings"]):
            owners[f].append(f"chapter {c['chapter']} rows")
            if f.split(".")[0].zfill(2) != c["chapter"]:
                out.append(f"finding {f} is in chapter {c['chapter']}'s rows, but the review files it under chapter {f.split('.')[0]}")
        for f in dict.fromkeys(f for r in c["rows"] for f in r["findings"]):
            spans = [i for i, r in enumerate(c["rows"]) if f in r["findings"]]
            if spans != list(range(spans[0], spans[-1] + 1)):
                out.append(f"chapter {c['chapter']}: the rows of finding {f} are not consecutive")
    for e in data["confirmed"]:
        for f in e["findings"]:
            owners[f].append("confirmed")
    for f, where in owners.items():
        if len(where) != 1:
            out.append(f"finding {f} ({data['review'][f]}) is accounted for {len(where)} times: {where or 'nowhere'}")
    return out


# ------------------------------------------------------------------------------ Sphinx

def setup(app) -> dict:
    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective
    from docutils.statemachine import StringList

    class ErrataDirective(SphinxDirective):
        """```{errata} NN``` or ```{errata} confirmed```: a table rendered from errata.yml."""

        required_arguments = 1
        has_content = False

        def run(self):
            self.env.note_dependency(str(SOURCE))
            try:
                text = render(load(SOURCE), self.arguments[0].strip())
            except ErrataError as err:
                raise self.error(f"errata: {err}") from None
            container = nodes.container()
            self.state.nested_parse(StringList(text.split("\n"), source=str(SOURCE)),
                                    self.content_offset, container)
            return container.children

    app.add_directive("errata", ErrataDirective)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


def main() -> int:
    found = problems()
    for p in found:
        print(p)
    print(f"{len(found)} problem(s) in {SOURCE.relative_to(ROOT)}" if found else "errata: OK")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
