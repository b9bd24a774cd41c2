"""tools/book_pages.py pieces that run without a built book (the built HTML is checked in test_book_html)."""

from __future__ import annotations

import _tools  # noqa: F401  (the repository root on sys.path)
import pytest
from docutils import nodes

from tools import book_pages
from tools.cjk import join_cjk_lines as join


@pytest.mark.parametrize("texts, expected", [
    (["正文都在\n标题为"], ["正文都在标题为"]),                          # CJK | CJK
    (["编码器，\n解码器"], ["编码器，解码器"]),                          # full-width punctuation
    (["“原笔记”\n的推导"], ["“原笔记”的推导"]),                          # curly quote next to CJK
    (["第 4 章\n  介绍"], ["第 4 章介绍"]),                              # indentation goes too
    (["编码器，", "\n", "位置编码"], ["编码器，", "", "位置编码"]),      # the neighbour is in the next piece
    (["公式\nx 的值"], ["公式\nx 的值"]),                                # Latin after: stays a space
    (["the value\n是"], ["the value\n是"]),                              # Latin before
    (["about\n“x”"], ["about\n“x”"]),                                    # quotes alone are not Chinese
    (["的", "x", "\n的"], ["的", "x", "\n的"]),                          # "x" stands for a formula
    (["没有换行"], ["没有换行"]),
])
def test_join_cjk_lines(texts, expected):
    assert join(texts) == expected


def test_paragraph_transform_keeps_breaks_next_to_formulas_and_code():
    p = nodes.paragraph()
    p += [nodes.Text("雅可比矩阵是"), nodes.Text("\n"), nodes.math("", "J"), nodes.Text("，后作用的"),
          nodes.Text("\n"), nodes.Text("函数在左边，"), nodes.literal("", "a\nb"), nodes.Text("\n"),
          nodes.strong("", "最新的"), nodes.Text("\n一步")]
    doc = nodes.document(None, None)
    doc += p
    book_pages._join_chinese_lines(None, doc, "chapters/01_x")
    # Two Text("\n") nodes compare equal: the one before the formula must survive, the one between
    # 的 and 函 must go (replacing by value rather than identity removed the wrong one).
    assert p.astext() == "雅可比矩阵是\nJ，后作用的函数在左边，a\nb\n最新的一步"
