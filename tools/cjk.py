"""Line breaks between Chinese characters: the one rule, for the HTML book and the Colab edition.

A line break in the Markdown source between two Chinese characters (or Chinese punctuation)
renders as a space in most browsers and in Jupyter/Colab ("，  每"); Chinese text has none.
Breaks next to Latin letters, digits or formulas stay spaces.

- `cjk_joinable(before, after)`: the rule for one break;
- `join_cjk_lines(texts)`: applies it to the text pieces of one paragraph of a doctree
  (tools/book_pages.py, HTML book);
- `join_chinese_lines(markdown)`: applies it to the paragraphs of a Markdown text, found by the
  tokenizer (tools/colab_edition.py, Colab edition).
"""

from __future__ import annotations

import re

from tools import myst

_CJK = re.compile(r"[\u2e80-\u9fff\u3000-\u303f\uf900-\ufaff\uff00-\uffef]")
_CJK_PUNCT = set("“”‘’—…·")
_VERBATIM = ("code_inline", "math_inline", "math_inline_double", "html_inline")  # never joined inside


def _cjk_side(ch: str, strict: bool) -> bool:
    return bool(ch) and (bool(_CJK.match(ch)) or (not strict and ch in _CJK_PUNCT))


def cjk_joinable(before: str, after: str) -> bool:
    """Whether a line break between the characters `before` and `after` should vanish: both are
    Chinese characters or Chinese punctuation (“”‘’—…· count only next to a Chinese character)."""
    return ((_cjk_side(before, True) and _cjk_side(after, False))
            or (_cjk_side(before, False) and _cjk_side(after, True)))


def join_cjk_lines(texts: list[str]) -> list[str]:
    """Drop each newline (with the spaces around it) that joins two Chinese characters.

    `texts` are the text pieces of one paragraph in reading order (a role or link splits a
    paragraph into pieces; the neighbour of a newline at a piece's edge is in the next piece).
    A newline goes when the characters on both sides are Chinese characters or Chinese
    punctuation (full-width forms, “”‘’—…·), and at least one side is not one of the ASCII-range
    quotes and dashes. Everything else is returned unchanged.
    """
    joined = "\x00".join(texts)
    out, i = [], 0
    for m in re.finditer(r"[ \t]*\n[ \t]*", joined):
        before = joined[:m.start()].replace("\x00", "")[-1:]
        after = joined[m.end():].replace("\x00", "")[:1]
        keep = not cjk_joinable(before, after)
        out.append(joined[i:m.start()])
        out.append(m.group(0) if keep else "")
        i = m.end()
    out.append(joined[i:])
    return "".join(out).split("\x00")


def _quote_depth(line: str) -> tuple[int, str]:
    """(number of leading '>' markers, the rest of the line without them and its spaces)."""
    depth, rest = 0, line.lstrip(" \t")
    while rest.startswith(">"):
        depth, rest = depth + 1, rest[1:].lstrip(" \t")
    return depth, rest


def join_chinese_lines(markdown: str) -> str:
    """Join a paragraph's source lines where the break falls between two Chinese characters.

    Only lines of one paragraph (as the tokenizer reads it) are joined; code, display math,
    table rows, headings and list or block starts are other blocks. A line of a blockquote joins
    the previous one only at the same quote depth (its "> " is dropped), and not after a hard
    break (two trailing spaces).
    """
    lines = markdown.split("\n")
    joins = set()
    blocks = list(myst.walk(markdown))
    for i, block in enumerate(blocks):
        if block.token.type == "paragraph_open":
            content = blocks[i + 1].token.content           # the paragraph's inline token
            inside = [(s.start, s.end) for s in myst.inline(content) if s.kind in _VERBATIM]
            breaks = [p for p, ch in enumerate(content) if ch == "\n"
                      and not any(a <= p < b for a, b in inside)]
            joins.update(block.start + 1 + content.count("\n", 0, p) for p in breaks)
    out: list[str] = []
    for k, line in enumerate(lines):
        if k in joins and out:
            depth, text = _quote_depth(line)
            text = text.strip()
            if (text and depth == _quote_depth(out[-1])[0] and not out[-1].endswith("  ")
                    and cjk_joinable(out[-1].rstrip()[-1:], text[:1])):
                out[-1] = out[-1].rstrip() + text
                continue
        out.append(line)
    return "\n".join(out)
