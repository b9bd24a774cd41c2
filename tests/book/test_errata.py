"""The errata appendix: appendix/errata.yml against the chapters, and its rendering (tools/errata.py).

The source is checked against the book (every erratum box has exactly one row, every link
resolves to a labelled cell, every seed-review finding is accounted for exactly once), and each
check is shown to fail on a copy of the source with that property broken.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import yaml
from _tools import ROOT

from tools import errata


@pytest.fixture(scope="module")
def data():
    return errata.load()


@pytest.fixture(scope="module")
def boxes():
    return errata.erratum_boxes()


def test_source_matches_the_book(data):
    assert errata.problems(data) == []


def test_every_chapter_with_erratum_boxes_has_rows_in_box_order(data, boxes):
    rows = {c["chapter"]: [r["box"] for r in c["rows"]] for c in data["chapters"]}
    assert {ch for ch, b in boxes.items() if b} == set(rows)
    for chapter, labels in boxes.items():
        if labels:
            assert rows[chapter] == labels, chapter
    assert sum(map(len, boxes.values())) >= 40      # the ten chapters have 44 boxes


def test_every_review_finding_is_accounted_for_once(data):
    owners = [f for c in data["chapters"] for f in dict.fromkeys(
        f for r in c["rows"] for f in r["findings"])]
    owners += [f for e in data["confirmed"] for f in e["findings"]]
    assert sorted(owners) == sorted(data["review"]), "each finding once: rows of one chapter or one confirmed entry"
    assert len(data["review"]) == 53


def _broken(data, edit):
    d = copy.deepcopy(data)
    edit(d)
    return errata.problems(d)


def _chapter(d, nn):
    return next(c for c in d["chapters"] if c["chapter"] == nn)


def _set(nn, field, value, row=0):
    """An edit: chapter nn's row `row` gets `field` = value."""
    return lambda d: _chapter(d, nn)["rows"][row].__setitem__(field, value)


def _swap_rows(nn, i, j):
    def edit(d):
        rows = _chapter(d, nn)["rows"]
        rows[i], rows[j] = rows[j], rows[i]
    return edit


# Each check of problems() on a copy of the source with that property broken:
# (edit, messages that must all be among the problems: each item is a tuple of substrings of one).
BROKEN = {
    "a missing row": (lambda d: _chapter(d, "04")["rows"].pop(0),
                      [("err-ch04-row-vectors has 0 rows",), ("finding 4.1", "nowhere")]),
    "a duplicated row": (lambda d: _chapter(d, "02")["rows"].append(copy.deepcopy(_chapter(d, "02")["rows"][0])),
                         [("err-ch02-eos has 2 rows",)]),
    "rows out of box order": (lambda d: _chapter(d, "08")["rows"].reverse(), [("not in the order of the boxes",)]),
    "a row naming no box": (_set("07", "box", "err-ch07-no-such-box"),
                            [("err-ch07-no-such-box, which is not an erratum box",)]),
    "a link to an unlabelled cell": (_set("09", "verified", "{ref}`第 9 章 <sec-ch09-nowhere>`：…"),
                                     [("'sec-ch09-nowhere', which no cell of the book labels",)]),
    "a demonstration in another chapter": (_set("05", "verified", "{ref}`第 4 章 <sec-ch04-step2>`"),
                                           [("in chapters/04_attention_qkv, not in chapter 05",)]),
    "a row without a demonstration link": (_set("10", "verified", "见正文"), [("has no {ref} link",)]),
    "a finding counted twice": (lambda d: d["confirmed"].append({**copy.deepcopy(d["confirmed"][0]), "findings": ["8.2"]}),
                                [("finding 8.2", "2 times")]),
    "a finding filed under another chapter": (_set("03", "findings", ["4.1"]),
                                              [("finding 4.1 is in chapter 03's rows",), ("finding 3.1", "nowhere")]),
    "non-consecutive rows of one finding": (_swap_rows("04", 2, 4),          # 4.1 4.2 4.3 4.2 4.2
                                            [("rows of finding 4.2 are not consecutive",)]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_source_is_reported(data, case):
    edit, messages = BROKEN[case]
    found = _broken(data, edit)
    for parts in messages:
        assert any(all(part in p for part in parts) for p in found), (case, parts, found)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["chapters"][0]["rows"][0].pop("source"), "fields must be box, findings"),
    (lambda d: d["chapters"][0]["rows"][0].update(findings="1.1"), "`findings` must be a non-empty list"),
    (lambda d: d["chapters"][0]["rows"][0].update(findings=["1.9"]), "finding '1.9' is not in `review`"),
    (lambda d: d["chapters"][0]["rows"][0].update(box="err-ch02-layout"), "`box` must be an erratum box label err-ch01-"),
    (lambda d: d["chapters"][0]["rows"][0].update(seed="  "), "`seed` must be non-empty MyST text"),
    (lambda d: d["chapters"][0]["rows"][0].update(seed="a\n\nb"), "`seed` must be one paragraph"),
    (lambda d: d["chapters"][1].update(chapter="01"), "chapter 01 appears twice"),
    (lambda d: d["confirmed"][0].update(kind="fine"), "`kind` must be one of"),
    (lambda d: d.pop("review"), "exactly `review`, `chapters`, `confirmed`"),
])
def test_malformed_source_names_the_entry_and_field(tmp_path, edit, message):
    raw = yaml.safe_load(errata.SOURCE.read_text(encoding="utf-8"))
    edit(raw)
    path = tmp_path / "errata.yml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    with pytest.raises(errata.ErrataError, match=message.replace("(", r"\(").replace("`", "`")):
        errata.load(path)


def test_rendered_tables_link_every_box_and_keep_every_row(data):
    for c in data["chapters"]:
        table = errata.chapter_table(data, c["chapter"])
        assert table.startswith(":::{list-table}") and table.endswith(":::")
        assert table.count("\n* - ") == len(c["rows"]) + 1          # + the header row
        for r in c["rows"]:
            assert f"{{ref}}`正文提示框 <{r['box']}>`" in table
            assert r["correction"] in table and r["source"] in table
    confirmed = errata.confirmed_table(data)
    assert confirmed.count("\n* - ") == len(data["confirmed"]) + 1
    with pytest.raises(errata.ErrataError, match="no errata for chapter '11'"):
        errata.chapter_table(data, "11")


def test_the_page_renders_every_table_once():
    page = (ROOT / "appendix" / "errata.md").read_text(encoding="utf-8")
    assert "* - " not in page, "rows belong in appendix/errata.yml, not on the page"
    assert page.count("{errata}") == len(errata.load()["chapters"]) + 1


def test_book_config_loads_the_extension():
    extensions = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]["local_extensions"]
    assert extensions.get("tools.errata") == "."              # the package tools/, from the book root
    for name, path in extensions.items():                    # Sphinx imports `name` with `path` on sys.path
        assert (ROOT / path / (name.replace(".", "/") + ".py")).is_file(), name
        assert callable(importlib.import_module(name).setup), name


def test_every_erratum_box_links_its_chapters_errata_section():
    import nbformat

    missing = []
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        nn = path.name[:2]
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for box in cell.source.split(":::{admonition} 原笔记")[1:]:
                body = box.split("\n:::", 1)[0]
                if f"<sec-errata-ch{nn}>" not in body:
                    missing.append(f"{path.name}: {body.splitlines()[0][:50]}")
    assert not missing, "erratum boxes without a link to their errata section:\n" + "\n".join(missing)
