"""MyST Markdown read with a real tokenizer: markdown-it-py and mdit-py-plugins.

These are the parser myst-parser itself is built on, configured with the book's
`myst_enable_extensions` (`_config.yml`): labels `(label)=` (`myst_target` tokens), roles
`{name}`content`` (`myst_role`), `:::` fences (`colon_fence`), `$$ … $$ (label)`
(`math_block_label`), amsmath environments, definition lists and substitutions. A directive is
a ```` ``` ```` or `:::` fence whose info string starts with `{name}`; its leading `:key: value`
lines are its options, read with myst-parser's own option tokenizer. MyST parses the body of
most directives as Markdown again: `walk()` does the same, so a label or role inside an
admonition is found where the HTML book finds it.

`inline(line)` lists the inline tokens of one line together with the character span each was
read from (markdown-it keeps no source positions for inline tokens, so the rules that read code
spans, roles, links, math, HTML and escapes are wrapped to record them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterator

from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkLabel
from markdown_it.token import Token
from mdit_py_plugins.amsmath import amsmath_plugin
from mdit_py_plugins.colon_fence import colon_fence_plugin
from mdit_py_plugins.deflist import deflist_plugin
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.footnote import footnote_plugin
from mdit_py_plugins.myst_blocks import myst_block_plugin
from mdit_py_plugins.myst_role import myst_role_plugin
from mdit_py_plugins.substitution import substitution_plugin
from myst_parser.parsers.options import options_to_items

# Directives whose body MyST does not read as Markdown (code, mathematics, data).
VERBATIM_DIRECTIVES = frozenset({"code", "code-block", "code-cell", "sourcecode", "math", "raw",
                                 "errata", "bibliography"})
# Inline rules whose tokens get a source span (see `inline`).
_SPANNED_RULES = ("escape", "myst_role", "backticks", "math_inline", "math_inline_double", "link",
                  "image", "autolink", "html_inline", "substitution_inline", "footnote_ref")


def _new_parser() -> MarkdownIt:
    return (MarkdownIt("commonmark").enable("table")
            .use(myst_block_plugin).use(myst_role_plugin).use(colon_fence_plugin)
            .use(dollarmath_plugin, allow_labels=True, allow_space=True, allow_digits=True,
                 double_inline=False)
            .use(amsmath_plugin).use(deflist_plugin).use(substitution_plugin)
            .use(footnote_plugin).disable("footnote_inline").disable("footnote_tail"))


@lru_cache(maxsize=None)
def parser() -> MarkdownIt:
    """The block and inline parser (shared; markdown-it parsers are reusable)."""
    return _new_parser()


def tokens(text: str) -> list[Token]:
    """The flat token stream of `text` (block tokens with `.map` line ranges, inline children)."""
    return parser().parse(text)


# ------------------------------------------------------------------------------ directives

@dataclass
class Directive:
    """A directive fence: ```` ```{name} argument ```` or `:::{name} argument`, then its body."""

    name: str
    argument: str
    options: dict[str, str] = field(default_factory=dict)
    body: list[str] = field(default_factory=list)    # source lines after the options
    body_line: int = 0                               # index of body[0] among the text's lines
    start: int = 0                                   # line of the opening fence
    end: int = 0                                     # one past the closing fence
    closed: bool = True


def _is_close(line: str, markup: str) -> bool:
    s = line.strip()
    return bool(s) and set(s) == {markup[0]} and len(s) >= len(markup)


def is_closed(token: Token, lines: list[str], block: "Block") -> bool:
    """Whether the fence `token` (read as `block` of `lines`) has its closing line."""
    return block.end - block.start >= 2 and _is_close(lines[block.end - 1], token.markup)


def split_options(lines: list[str]) -> tuple[dict[str, str], int]:
    """MyST's option block: the leading lines starting with ':' -> ({key: value}, lines used)."""
    n = 0
    while n < len(lines) and lines[n].lstrip().startswith(":") and not lines[n].lstrip().startswith(":::"):
        n += 1
    if not n:
        return {}, 0
    items, _ = options_to_items("\n".join(line.lstrip()[1:] for line in lines[:n]))
    return {key: value for key, value in items}, n


def directive(token: Token, lines: list[str], offset: int = 0) -> Directive | None:
    """The directive a `fence`/`colon_fence` token opens (None for a plain code block).

    `lines` are the source lines the token's `.map` indexes (shifted by `offset`).
    """
    if token.type not in ("fence", "colon_fence") or not token.info.startswith("{"):
        return None
    name, _, argument = token.info[1:].partition("}")
    start, end = token.map[0] + offset, token.map[1] + offset
    closed = end - start >= 2 and _is_close(lines[end - 1], token.markup)
    raw = lines[start + 1:end - 1] if closed else lines[start + 1:end]
    options, n = split_options(raw)
    return Directive(name.strip(), argument.strip(), options, raw[n:], start + 1 + n, start, end, closed)


# ------------------------------------------------------------------------------ walking

@dataclass
class Block:
    """One block token met by `walk`, with its line range in the walked text."""

    token: Token
    start: int
    end: int
    directive: Directive | None = None
    depth: int = 0                                   # how many directive bodies it is inside


def walk(text: str, markdown_body: Callable[[str], bool] = lambda name: name not in VERBATIM_DIRECTIVES,
         ) -> Iterator[Block]:
    """Every block token of `text` in document order, descending into the bodies of the
    directives for which `markdown_body(name)` is true (parsed as Markdown again, as MyST does).

    Line numbers are indexes into `text.split("\\n")`.
    """
    yield from _walk(text.split("\n"), 0, len(text.split("\n")), markdown_body, 0)


def _walk(lines, lo, hi, markdown_body, depth):
    toks = tokens("\n".join(lines[lo:hi]))
    for token in toks:
        if token.map is None:                         # closing tokens
            continue
        start, end = token.map[0] + lo, token.map[1] + lo
        d = directive(token, lines, lo)
        yield Block(token, start, end, d, depth)
        if d is not None and markdown_body(d.name):
            yield from _walk(lines, d.body_line, d.body_line + len(d.body), markdown_body, depth + 1)


# ------------------------------------------------------------------------------ inline

def _spanned(fn):
    def rule(state, silent):
        start, count = state.pos, len(state.tokens) + (1 if state.pending else 0)
        found = fn(state, silent)            # (pending text is pushed first, as its own token)
        if found and not silent and len(state.tokens) > count:
            token = state.tokens[count]
            token.meta = {**(token.meta or {}), "span": (start, state.pos)}
            if token.type in ("link_open", "image"):
                skip = 2 if token.type == "image" else 1
                label_end = parseLinkLabel(state.__class__(state.src, state.md, state.env, []),
                                           start + skip - 1)
                token.meta["label"] = (start + skip, label_end)
        return found
    return rule


@lru_cache(maxsize=None)
def _inline_parser() -> MarkdownIt:
    md = _new_parser()
    for rule in md.inline.ruler.__rules__:
        if rule.name in _SPANNED_RULES:
            rule.fn = _spanned(rule.fn)
    md.inline.ruler.__cache__ = None
    md.core.ruler.disable("text_join")           # keep escapes apart from the text around them
    return md


@dataclass
class Span:
    """An inline token and the characters [start, end) of the line it was read from."""

    token: Token
    start: int
    end: int

    @property
    def kind(self) -> str:
        return "link" if self.token.type == "link_open" else self.token.type


def inline(line: str) -> list[Span]:
    """The spanned inline tokens (code spans, roles, links, images, math, HTML, autolinks,
    escapes, substitutions) of one line or paragraph, outermost only, left to right."""
    children = _inline_parser().parseInline(line)[0].children or []
    spans, reach = [], 0
    for token in children:
        span = (token.meta or {}).get("span")
        if span is None or span[0] < reach:
            continue
        spans.append(Span(token, *span))
        reach = span[1]
    return spans
