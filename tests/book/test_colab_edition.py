"""The Colab edition colab/*.ipynb: in sync with chapters/, free of MyST, runnable in a Colab-like runtime.

- `test_colab_edition_is_up_to_date` regenerates every edition in memory (tools/colab_edition.py)
  and fails if colab/ differs: run `python3 make.py colab` after editing a chapter.
- `test_no_myst_left` looks for MyST syntax (roles, fences, labels, equation labels) in every
  edition's Markdown; the converter tests pin each transformation.
- `test_colab_simulation` runs chapters' Colab editions in a simulated Colab
  runtime (tools/colab_sim.py): `python3 make.py colab-test` runs every chapter, `make.py test`
  (and CI) one. Chapters are chosen with ATTNBOOK_COLAB_CHAPTERS ("all" or "04,06"); without
  it the test skips (so `make.py lib` does not run it).
"""

from __future__ import annotations

import json
import os
import shutil

import nbformat
import pytest
from _tools import ROOT

from tools import colab, colab_sim
from tools import colab_edition as edition
from tools.bibliography import Bibliography
from tools.book_index import book_index
from tools.book_index import cell_source as _source
from tools.cjk import join_chinese_lines

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


@pytest.fixture(scope="module")
def expected():
    return edition.expected_editions(ROOT)


def test_colab_edition_is_up_to_date(expected):
    stale = [p.relative_to(ROOT).as_posix() for p, text in expected.items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    extra = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "colab").glob("*.ipynb")) if p not in expected]
    assert not stale and not extra, (
        f"colab/ is out of date (stale or missing: {stale}; without a chapter: {extra}): "
        "run `python3 make.py colab`")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_no_myst_left(chapter, expected):
    nb = nbformat.reads(expected[ROOT / "colab" / chapter.name], as_version=4)
    left = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            left += [f"cell {i}: {hit}" for hit in edition.find_myst(_source(cell))]
    assert not left, f"colab/{chapter.name} still contains MyST syntax:\n" + "\n".join(left[:20])


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_code_cells_unchanged_and_header(chapter, expected):
    source = nbformat.read(chapter, as_version=4)
    nb = nbformat.reads(expected[ROOT / "colab" / chapter.name], as_version=4)
    rel = f"chapters/{chapter.name}"
    code = [_source(c) for c in nb.cells if c.cell_type == "code"]
    original = [_source(c) for c in source.cells if c.cell_type == "code"]
    assert code[0] == colab.setup_cell_source()
    assert code[1:] == original[1:], "code cells must be copied unchanged (only the setup cell is rewritten)"
    head = _source(nb.cells[0])
    assert colab.badge_markdown(rel) in head.split("\n")
    assert f"/blob/{colab.repository().branch}/colab/{chapter.name})" in colab.badge_markdown(rel)
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    assert nb.metadata["attnbook"] == {"edition": "colab", "source": rel}


# ------------------------------------------------------------------------------ the converter

@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A two-chapter book in a temporary folder, using the real _config.yml and references.bib."""
    root = tmp_path_factory.mktemp("book")
    (root / "chapters").mkdir()
    (root / "appendix").mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    shutil.copy(ROOT / "references.bib", root / "references.bib")
    (root / "appendix" / "notation.md").write_text("(sec-notation-demo)=\n# 记号\n", encoding="utf-8")
    one = nbformat.v4.new_notebook()
    one.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    one.cells = [
        nbformat.v4.new_markdown_cell("# 第 1 章 甲\n\n[![Open In Colab](x.svg)](https://example.org)"),
        nbformat.v4.new_code_cell('import sys\nif "google.colab" in sys.modules:\n    pass'),
        nbformat.v4.new_markdown_cell("(sec-ch01-a)=\n## 第一节 {cite}`vaswani2017attention`\n\n"
                                      "$$\na = b\n$$ (eq-ch01-a)\n\n$$ c = d $$ (eq-ch01-c)"),
    ]
    nbformat.write(one, root / "chapters" / "01_one.ipynb")
    two = nbformat.v4.new_notebook()
    two.metadata["kernelspec"] = one.metadata["kernelspec"]
    two.cells = [
        nbformat.v4.new_markdown_cell("# 第 2 章 乙\n\n[![Open In Colab](x.svg)](https://example.org)"),
        nbformat.v4.new_code_cell('import sys\nif "google.colab" in sys.modules:\n    pass'),
        nbformat.v4.new_markdown_cell(
            "(sec-ch02-b)=\n### 乙节\n\n"
            "见 {ref}`sec-ch01-a`、{ref}`这里 <sec-ch02-b>`、{ref}`记号 <sec-notation-demo>`、"
            "{eq}`eq-ch01-c`、{eq}`eq-ch02-m`、[链接](sec-ch02-b) 和 `{cite}` 代码。\n\n"
            ":::{admonition} 原笔记：甲 → 乙\n:class: warning\n:name: err-ch02-demo\n\n"
            "正文 {cite:t}`vaswani2017attention`。\n\n$$\nx\n$$\n:::\n\n"
            "::::{admonition} 答案\n:class: dropdown\n\n:::{note}\n内层\n:::\n\n```python\n{cite}`not a role`\n```\n::::\n\n"
            "```{math}\n:label: eq-ch02-m\ny = 1\n```\n\n"
            "{cite}`bahdanau2015neural,luong2015effective` 与 {ref}`err-ch02-demo`"),
        nbformat.v4.new_code_cell("x = 1  # {cite}`untouched`"),
    ]
    nbformat.write(two, root / "chapters" / "02_two.ipynb")
    return root


def test_converter_output(book):
    nb = edition.colab_notebook(book / "chapters" / "02_two.ipynb", root=book)
    text = _source(nb.cells[2])
    assert "“第一节 (Vaswani et al., 2017)”".replace("“", "第 1 章“") in text
    assert "这里、" in text and "记号（附录）" in text
    assert "式 (1.2)" in text and "式 (2.1)" in text
    assert "[链接]" not in text and "链接 和" in text
    assert "`{cite}` 代码" in text                       # inline code is left alone
    assert "> **原笔记：甲 → 乙**" in text and "> 正文 Vaswani et al. (2017)。" in text
    assert "<details>\n<summary><b>答案</b></summary>" in text and "> **注**\n>\n> 内层" in text
    assert "```python\n{cite}`not a role`\n```" in text    # code blocks are left alone
    assert "$$\ny = 1\n\\tag{2.1}\n$$" in text
    assert "(Bahdanau et al., 2015; Luong et al., 2015) 与 “原笔记：甲 → 乙”" in text
    assert _source(nb.cells[3]) == "x = 1  # {cite}`untouched`"
    refs = _source(nb.cells[-1])
    assert refs.startswith(edition.REFERENCES_TITLE)
    assert [line.split("**")[1] for line in refs.splitlines()[2:]] == [
        "Bahdanau et al. (2015)", "Luong et al. (2015)", "Vaswani et al. (2017)"]
    assert "[arXiv:1706.03762](https://arxiv.org/abs/1706.03762)" in refs
    one = edition.colab_notebook(book / "chapters" / "01_one.ipynb", root=book)
    assert "$$\na = b\n\\tag{1.1}\n$$" in _source(one.cells[2])
    assert "$$ c = d \\tag{1.2} $$" in _source(one.cells[2])
    assert "(sec-ch01-a)=" not in _source(one.cells[2])
    for cell in nb.cells + one.cells:
        if cell.cell_type == "markdown":
            assert edition.find_myst(_source(cell)) == []


def test_converter_rejects_unknown_directives_and_labels(book, tmp_path):
    index, bib = book_index(book), Bibliography(book / "references.bib")
    conv = edition.Converter("chapters/02_two", index, bib, colab.repository(book / "_config.yml"))
    with pytest.raises(ValueError, match="glue"):
        conv.convert(":::{glue} x\n:::")
    with pytest.raises(KeyError, match="sec-nowhere"):
        conv.convert("{ref}`sec-nowhere`")


def test_find_myst_flags_each_kind():
    sample = "(sec-x)=\n# t\n{cite}`a`\n:::{note}\n:::\n```{math}\n```\n$$ a $$ (eq-a)\n:class: warning"
    kinds = {hit.split(":")[0] for hit in edition.find_myst(sample)}
    assert kinds == set(edition.MYST_KINDS)


def test_sync_writes_and_removes(book):
    assert edition.sync(check_only=True, root=book)
    edition.sync(root=book)
    assert edition.sync(check_only=True, root=book) == []
    (book / "colab" / "09_gone.ipynb").write_text("{}", encoding="utf-8")
    assert edition.sync(check_only=True, root=book) == [book / "colab" / "09_gone.ipynb"]
    edition.sync(root=book)
    assert not (book / "colab" / "09_gone.ipynb").exists()


# ------------------------------------------------------------------------------ simulated Colab

def _chosen_chapters() -> list[str]:
    wanted = os.environ.get("ATTNBOOK_COLAB_CHAPTERS", "").strip()
    names = [p.name for p in sorted((ROOT / "colab").glob("*.ipynb"))]
    if wanted == "all":
        return names
    picked = [n for n in names if any(n.startswith(w.strip()) for w in wanted.split(",") if w.strip())]
    return picked


@pytest.mark.parametrize("name", _chosen_chapters() or [None])
def test_colab_simulation(name):
    if name is None:
        pytest.skip("set ATTNBOOK_COLAB_CHAPTERS=all (or 04,06), or run `python3 make.py colab-test`")
    report = colab_sim.run_chapter(name[:2])          # raises AssertionError with the details
    print(json.dumps(report, indent=1))
    assert report["before"] == report["after"]
    assert report["widget_images"] >= 1


@pytest.mark.parametrize("text, expected", [
    ("正文都在\n标题为", "正文都在标题为"),
    ("> 提示框\n> 第二行\n\n> 另一个", "> 提示框第二行\n\n> 另一个"),
    ("> 引文里\n正文", "> 引文里\n正文"),                      # different quote depth
    ("- 项目一\n- 项目二", "- 项目一\n- 项目二"),
    ("- 项目文字\n  继续", "- 项目文字继续"),                   # lazy continuation
    ("文字\n$$\n中\n文\n$$\n后面", "文字\n$$\n中\n文\n$$\n后面"),
    ("```text\n注释\n注释\n```", "```text\n注释\n注释\n```"),
    ("表格：\n| 甲 |", "表格：\n| 甲 |"),
    ("### 标题\n正文", "### 标题\n正文"),
    ("中文  \n硬换行", "中文  \n硬换行"),
    ("公式\n$x$ 的值", "公式\n$x$ 的值"),
])
def test_chinese_lines_are_joined_only_inside_paragraphs(text, expected):
    assert join_chinese_lines(text) == expected
