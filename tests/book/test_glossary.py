"""The glossary (appendix/glossary.md) and the first-use links of tools/glossary.py.

The book's glossary must parse as Sphinx reads it, give every term an English name and a
definition that links (with {ref}) to a labelled place in the book; every term must be used in
some chapter, and each chapter must link its first use of each term it uses. The linker itself is
tested on small synthetic Markdown and notebooks.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from _tools import ROOT

from tools import colab_edition as edition
from tools import glossary
from tools.book_index import BookIndex

_CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def entries():
    return glossary.terms()


@pytest.fixture(scope="module")
def uses():
    return glossary.chapter_uses(ROOT)


# ------------------------------------------------------------------------------ the book's glossary

def test_glossary_page_has_label_and_title():
    lines = (ROOT / glossary.GLOSSARY).read_text(encoding="utf-8").split("\n")
    assert lines[:2] == ["(appendix-glossary)=", "# 术语表"]


def test_glossary_parses_with_unique_names(entries):
    assert 40 <= len(entries) <= 80, len(entries)
    keys = [e.key for e in entries]
    assert len(set(keys)) == len(keys), f"duplicate keys: {sorted(k for k in keys if keys.count(k) > 1)}"
    # Sphinx looks terms up case-insensitively: a name used twice is a duplicate-term warning.
    names = [n.casefold() for e in entries for n in e.names]
    assert len(set(names)) == len(names), f"names used twice: {sorted(n for n in names if names.count(n) > 1)}"


def test_every_entry_has_an_english_name_and_a_chinese_definition(entries):
    for entry in entries:
        assert entry.aliases, f"{entry.key}: no alias line under the key"
        assert any(n.isascii() and re.search(r"[A-Za-z]", n) for n in entry.names), \
            f"{entry.key}: no English name among {entry.names}"
        if not entry.key.isascii():
            first = entry.aliases[0]
            assert re.search(r"[A-Za-z]", first) and not _CJK.search(first), \
                f"{entry.key}: the line under a Chinese key must be the English term, got {first!r}"
        assert _CJK.search(entry.definition), f"{entry.key}: the definition must be in Chinese"
        assert len(entry.definition) < 400, f"{entry.key}: keep the definition to 1-3 sentences"


def test_definitions_link_where_the_book_introduces_the_term(entries, uses):
    labels = glossary.book_labels(ROOT)
    chapters_using = {key: {name[:-len(".ipynb")] for name, keys in uses.items() if key in keys}
                      for key in (e.key for e in entries)}
    for entry in entries:
        refs = glossary.ref_targets(entry.definition)
        assert refs, f"{entry.key}: the definition has no {{ref}} to where the book introduces it"
        for text, label in refs:
            assert text, f"{entry.key}: {{ref}}`{label}` needs an explicit text (`… <{label}>`)"
            assert label in labels, f"{entry.key}: {{ref}} to unknown label {label!r}"
        docs = {labels[label] for _, label in refs}
        assert any(doc.startswith("chapters/") and doc.split("/")[1] in chapters_using[entry.key]
                   for doc in docs), (
            f"{entry.key}: no {{ref}} points into a chapter that uses the term "
            f"(refs into {sorted(docs)}, used in {sorted(chapters_using[entry.key])})")


def test_page_refs_resolve():
    text = (ROOT / glossary.GLOSSARY).read_text(encoding="utf-8")
    labels = glossary.book_labels(ROOT)
    unknown = [label for _, label in glossary.ref_targets(text) if label not in labels]
    assert not unknown, unknown


def test_every_term_is_used_in_some_chapter(entries, uses):
    used = set().union(*uses.values())
    unused = [e.key for e in entries if e.key not in used]
    assert not unused, f"glossary terms no chapter uses (drop them or use them): {unused}"


def test_term_roles_in_chapters_name_glossary_terms(entries):
    unknown = []
    for path in glossary.chapter_paths(ROOT):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                unknown += [f"{path.name}: {name}" for name, entry in glossary.term_roles(cell.source, entries)
                            if entry is None]
    assert not unknown, f"{{term}} roles naming no glossary term (Sphinx warns): {unknown}"


def test_chapters_link_the_first_use_of_every_term():
    changed = glossary.link_first_uses(check_only=True)
    report = {p.name: f"{len(keys)} ({'、'.join(keys[:4])}…)" for p, keys in changed.items()}
    assert not changed, f"first uses not linked yet, run `python3 make.py colab` (or `python -m tools.glossary`): {report}"


# ------------------------------------------------------------------------------ the linker

SAMPLE_GLOSSARY = """\
(appendix-glossary)=
# 术语表

```{glossary}
:sorted:

注意力
attention
   按内容取信息。见{ref}`第 3 章 <sec-ch03-steps>`。

自注意力
self-attention
   查询、键、值来自同一序列。

注意力权重
attention weights
   softmax 之后的矩阵。

键
key
   被找到的一方。

层归一化
layer normalization
LayerNorm
   沿特征维归一化。
   第二行。

Pre-LN
pre-normalization
   子层入口处归一化。

记忆
memory
   编码器的输出。
```
"""


@pytest.fixture()
def sample():
    return glossary.parse_glossary(SAMPLE_GLOSSARY)


def _linked(text: str, entries) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 第 1 章 标题"), nbformat.v4.new_code_cell("import sys"),
                nbformat.v4.new_markdown_cell(text)]
    glossary.link_notebook(nb, entries)
    return nb.cells[2].source


def test_parse_glossary_reads_keys_aliases_and_definitions(sample):
    assert [e.key for e in sample] == ["注意力", "自注意力", "注意力权重", "键", "层归一化", "Pre-LN", "记忆"]
    assert sample[4].aliases == ("layer normalization", "LayerNorm")
    assert sample[4].definition == "沿特征维归一化。\n第二行。"
    assert glossary.ref_targets(sample[0].definition) == [("第 3 章", "sec-ch03-steps")]
    assert glossary.find_entry(sample, "layernorm") is sample[4]
    assert glossary.find_entry(sample, "掩码") is None


@pytest.mark.parametrize("bad, message", [
    ("没有术语表", "exactly one"),
    ("```{glossary}\n注意力\n\nattention\n   定义。\n```", "must not be separated"),
    ("```{glossary}\n注意力\n   定义。\n自注意力\n   定义。\n```", "must follow an empty line"),
    ("```{glossary}\n   定义。\n```", "without a term"),
    ("```{glossary}\n注意力 : 分类\n   定义。\n```", "classifier"),
    ("```{glossary}\n注意力\n   定义。\n", "not closed"),
])
def test_parse_glossary_rejects_what_sphinx_would_warn_about(bad, message):
    with pytest.raises(ValueError, match=message):
        glossary.parse_glossary(bad)


# (text, the text with its first uses linked)
LINKED = {
    "first use linked once": ("注意力是机制。注意力有三步。", "{term}`注意力`是机制。注意力有三步。"),
    # 自注意力 contains 注意力: the first 注意力 on its own comes later
    "longest term wins": ("自注意力先出现，然后是注意力。", "{term}`自注意力`先出现，然后是{term}`注意力`。"),
    "longest term only": ("只有自注意力。", "只有{term}`自注意力`。"),
    # 注意力权重 and 注意力 start alike: the longer one is tried first
    "longer of two alike": ("注意力权重之后是注意力。", "{term}`注意力权重`之后是{term}`注意力`。"),
    "alias links to the key": ("每个子层后接 LayerNorm，也叫层归一化。",
                               "每个子层后接 {term}`LayerNorm <层归一化>`，也叫层归一化。"),
    "ascii terms stand alone": ("self-attentions 与 my-Pre-LN 与 Pre-LNx 都不算。",
                                "self-attentions 与 my-Pre-LN 与 Pre-LNx 都不算。"),
    "ascii term alone": ("两层 Pre-LN 模型。", "两层 {term}`Pre-LN` 模型。"),
    "one-character key only where glossed": ("按键盘上的键。查询与键（key）做点积。", "按键盘上的键。查询与{term}`键`（key）做点积。"),
    "one-character key, ASCII parentheses": ("键(Key)也行。", "{term}`键`(Key)也行。"),
    "a GLOSSED_ONLY word only where glossed": ("键–值记忆不算。编码器的记忆（memory）算。",
                                                "键–值记忆不算。编码器的{term}`记忆`（memory）算。"),
    "a GLOSSED_ONLY key's English alias alone is not a use": (
        "Peak extra memory 与 shared memory 不算。编码器的记忆（memory）算。",
        "Peak extra memory 与 shared memory 不算。编码器的{term}`记忆`（memory）算。"),
    "roles, links, URLs and HTML are not prose": (
        "见{ref}`注意力 <sec-x>`、{eq}`注意力`、[注意力](https://x.org/注意力)、"
        "<https://注意力.org>、https://x.org/注意力、<b title=\"注意力\">粗</b>。注意力。",
        "见{ref}`注意力 <sec-x>`、{eq}`注意力`、[注意力](https://x.org/注意力)、"
        "<https://注意力.org>、https://x.org/注意力、<b title=\"注意力\">粗</b>。{term}`注意力`。"),
    # `称为**注意力**，` would become `称为**{term}`…`**，`, which CommonMark does not read as bold
    "emphasis is not broken": ("称为**注意力**，后面的注意力。", "称为**注意力**，后面的{term}`注意力`。"),
    # with punctuation or space outside the delimiters the link can go inside
    "emphasis after a space": ("叫作 **注意力**。", "叫作 **{term}`注意力`**。"),
    "emphasis inside punctuation": ("（**注意力**）", "（**{term}`注意力`**）"),
    # `注意力`x`` would become `{term}`注意力``x``: the two backticks would make one run
    "term right before a code span": ("注意力`x` 与 `y`注意力。", "注意力`x` 与 `y`{term}`注意力`。"),
}


@pytest.mark.parametrize("case", LINKED)
def test_first_uses_are_linked(sample, case):
    text, expected = LINKED[case]
    assert _linked(text, sample) == expected


def test_headings_labels_and_code_are_not_prose(sample):
    text = "\n".join([
        "(sec-ch01-x)=",
        "## 注意力",
        "",
        "`注意力` 与 ``注意力`` 是代码。",
        "",
        "```python",
        "# 注意力",
        "```",
        "",
        "~~~",
        "注意力",
        "~~~",
        "",
        "这里的注意力才是正文。",
    ])
    out = _linked(text, sample)
    assert out == text.replace("这里的注意力", "这里的{term}`注意力`")


def test_math_is_not_prose(sample):
    text = "\n".join([
        "行内 $\\text{注意力}$ 与 $$\\text{注意力}$$。",
        "",
        "$$",
        "\\text{注意力} = 1",
        "$$ (eq-ch01-a)",
        "",
        "$$ \\text{注意力} $$",
        "",
        "价格 \\$5，注意力。",
    ])
    out = _linked(text, sample)
    assert out == text.replace("，注意力。", "，{term}`注意力`。")


def test_admonition_title_and_options_are_not_prose(sample):
    text = "\n".join([
        ":::{admonition} 原笔记：注意力 → 自注意力",
        ":class: warning",
        ":name: err-ch01-注意力",
        "",
        "正文里的注意力。",
        ":::",
    ])
    out = _linked(text, sample)
    assert out == text.replace("正文里的注意力", "正文里的{term}`注意力`")
    assert "原笔记：注意力 → 自注意力" in out


def test_code_and_math_directives_are_not_prose(sample):
    text = "\n".join([
        "```{code-block} python",
        "注意力 = 1",
        "```",
        "",
        ":::{math}",
        "\\text{注意力}",
        ":::",
        "",
        "````{note}",
        "```",
        "注意力",
        "```",
        "说明里的注意力。",
        "````",
    ])
    out = _linked(text, sample)
    assert out == text.replace("说明里的注意力", "说明里的{term}`注意力`")


def test_existing_term_role_is_left_alone(sample):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 第 1 章 标题"), nbformat.v4.new_code_cell("import sys"),
                nbformat.v4.new_markdown_cell("注意力在前。"),
                nbformat.v4.new_markdown_cell("后面才有 {term}`attention <注意力>` 和 {term}`layernorm`。层归一化。")]
    assert glossary.link_notebook(nb, sample) == []
    assert nb.cells[2].source == "注意力在前。"


def test_title_and_setup_cells_are_skipped(sample):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 第 1 章 注意力\n\n注意力"),
                nbformat.v4.new_markdown_cell("注意力"),
                nbformat.v4.new_code_cell("# 注意力"),
                nbformat.v4.new_markdown_cell("正文：注意力。")]
    assert glossary.link_notebook(nb, sample) == ["注意力"]
    assert [c.source for c in nb.cells] == ["# 第 1 章 注意力\n\n注意力", "注意力", "# 注意力",
                                            "正文：{term}`注意力`。"]


def test_linking_is_idempotent(sample):
    text = "自注意力、注意力、LayerNorm、键（key）与 Pre-LN。注意力。"
    once = _linked(text, sample)
    assert once.count("{term}") == 5
    assert _linked(once, sample) == once


# ------------------------------------------------------------------------------ notebooks on disk

def _chapter(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# 第 1 章 标题"), nbformat.v4.new_code_cell("import sys")]
    for i, text in enumerate(cells):
        if text.startswith("code:"):
            cell = nbformat.v4.new_code_cell(text[5:])
            cell.outputs = [nbformat.v4.new_output("stream", text="注意力\n")]
            cell.execution_count = 3
        else:
            cell = nbformat.v4.new_markdown_cell(text)
        cell["id"] = f"cell-{i}"
        cell.metadata["tags"] = ["keep"]
        nb.cells.append(cell)
    nbformat.write(nb, path)


def test_link_first_uses_on_a_book_copy(tmp_path):
    (tmp_path / "appendix").mkdir()
    (tmp_path / "appendix" / "glossary.md").write_text(SAMPLE_GLOSSARY, encoding="utf-8")
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    _chapter(chapters / "01_a.ipynb", ["注意力与注意力", "code:x = '注意力'", "LayerNorm 和层归一化"])
    _chapter(chapters / "02_b.ipynb", ["这一章也讲注意力和{term}`自注意力`。"])
    _chapter(chapters / "03_c.ipynb", ["没有术语。"])
    before = {p.name: p.read_text(encoding="utf-8") for p in chapters.glob("*.ipynb")}

    report = glossary.link_first_uses(check_only=True, root=tmp_path)
    assert {p.name: keys for p, keys in report.items()} == {"01_a.ipynb": ["注意力", "层归一化"],
                                                             "02_b.ipynb": ["注意力"]}
    assert {p.name: p.read_text(encoding="utf-8") for p in chapters.glob("*.ipynb")} == before

    assert glossary.link_first_uses(root=tmp_path).keys() == report.keys()
    nb = nbformat.read(chapters / "01_a.ipynb", as_version=4)
    old = nbformat.reads(before["01_a.ipynb"], as_version=4)
    assert nb.cells[2].source == "{term}`注意力`与注意力"
    assert nb.cells[4].source == "{term}`LayerNorm <层归一化>` 和层归一化"
    assert nb.cells[3] == old.cells[3]                            # code cell and its outputs kept
    assert [c.get("id") for c in nb.cells] == [c.get("id") for c in old.cells]
    assert [c.metadata for c in nb.cells] == [c.metadata for c in old.cells]
    assert nb.metadata == old.metadata
    assert (chapters / "01_a.ipynb").read_text(encoding="utf-8") == nbformat.writes(nb) + "\n"
    assert (chapters / "03_c.ipynb").read_text(encoding="utf-8") == before["03_c.ipynb"]
    assert glossary.link_first_uses(root=tmp_path) == {}           # idempotent
    assert glossary.chapter_uses(tmp_path) == {"01_a.ipynb": {"注意力", "层归一化"},
                                               "02_b.ipynb": {"注意力", "自注意力"},
                                               "03_c.ipynb": set()}


def test_cli_check_reports_and_fails(tmp_path, monkeypatch, capsys):
    (tmp_path / "appendix").mkdir()
    (tmp_path / "appendix" / "glossary.md").write_text(SAMPLE_GLOSSARY, encoding="utf-8")
    (tmp_path / "chapters").mkdir()
    _chapter(tmp_path / "chapters" / "01_a.ipynb", ["注意力"])
    monkeypatch.setattr(glossary, "ROOT", tmp_path)
    monkeypatch.setattr(glossary.link_first_uses, "__kwdefaults__",
                        {**glossary.link_first_uses.__kwdefaults__, "root": tmp_path})
    assert glossary.main(["--check"]) == 1
    assert "chapters/01_a.ipynb: would link 1: 注意力" in capsys.readouterr().out
    assert glossary.main([]) == 0
    assert glossary.main(["--check"]) == 0


# ------------------------------------------------------------------------------ the Colab edition

def test_colab_edition_turns_term_roles_into_their_text():
    converter = edition.Converter("chapters/01_a", BookIndex(), None, None)
    line = "看{term}`注意力`、{term}`LayerNorm <层归一化>`和 `{term}` 代码。"
    assert converter.inline(line) == "看注意力、LayerNorm和 `{term}` 代码。"
    assert not edition.find_myst(converter.inline(line))
