"""Page-level touches of the HTML book, as a Sphinx extension (`_config.yml`: local_extensions).

- Equations are numbered per chapter, "(4.3)" for the third labelled equation of chapter 4,
  and `{eq}` references print the same number. Without this, Sphinx numbers them across the
  whole book when the toctree is not numbered (chapter 4 started at "(20)", and every number
  moved when a chapter was added before it). tools/book_index.py numbers them the same way.
- Every chapter page shows a "last verified" line under its title: when the chapter was
  executed, the library and torch versions of the build, and how long the chapter ran.
- The Colab launch button opens the chapter's Colab edition (colab/NN_slug.ipynb, plain
  Markdown), like the badge in the chapter does.
- The Colab badge image is served from _static/ (the book shows no broken image offline).
- Interface strings that myst-nb leaves in English ("Show code cell source") are translated.
- Figures in cell outputs link to their full-size image (tap a small figure on a phone).
- A line break in the Markdown source between two Chinese characters (or Chinese punctuation)
  disappears: browsers other than Firefox render it as a space ("，  每"), which Chinese text
  does not have. Breaks next to Latin letters, digits or formulas stay spaces (the rule is
  tools/cjk.py's, which the Colab edition applies too).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import re
import subprocess

from docutils import nodes

from tools.cjk import join_cjk_lines

CHAPTER_DOC = re.compile(r"^chapters/(\d\d)_[A-Za-z0-9_]+$")
COLAB_BADGE_URL = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "_static/colab-badge.svg"
# myst-nb's prompts with {type} filled in (nb_code_prompt_show/hide in _config.yml are
# "显示{type}" / "隐藏{type}"; myst-nb substitutes an English word for {type}).
PROMPT_WORDS = {"source": "代码", "content": "代码和输出", "outputs": "输出", "output": "输出"}
LAST_VERIFIED_CLASS = "attnbook-last-verified"


def chapter_number(docname: str) -> int | None:
    m = CHAPTER_DOC.match(docname)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------ equation numbers

def _chapter_equation_numbers(app, env) -> list[str]:
    """Renumber labelled display equations of chapters/NN_* as (NN, 1), (NN, 2), ...

    Runs after Sphinx assigned figure numbers (env-get-updated); `{eq}` references and the
    "(n)" printed next to each equation both read env.toc_fignumbers.
    """
    changed = []
    for docname, kinds in getattr(env, "toc_fignumbers", {}).items():
        number = chapter_number(docname)
        if number is None or not kinds.get("displaymath"):
            continue
        ordered = sorted(kinds["displaymath"].items(), key=lambda item: item[1])
        renumbered = {node_id: (number, i) for i, (node_id, _) in enumerate(ordered, 1)}
        if renumbered != kinds["displaymath"]:
            kinds["displaymath"] = renumbered
            changed.append(docname)
    return changed


# ------------------------------------------------------------------------------ last verified

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _git_commit(srcdir: str) -> str:
    # --no-optional-locks: never take .git/index.lock (a build running beside someone's
    # `git commit` must not block it, nor leave a stale lock behind if it is interrupted).
    git = ["git", "--no-optional-locks", "-C", srcdir]
    try:
        out = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=60)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "lib"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    commit = out.stdout.strip() if out.returncode == 0 else ""
    if commit and dirty.returncode == 0 and dirty.stdout.strip():
        commit += "+"
    return commit


def last_verified_text(exec_data: dict | None, *, commit: str = "") -> str | None:
    """The "last verified" line for a chapter, or None if it was not executed."""
    if not exec_data or not exec_data.get("succeeded"):
        return None
    when = _dt.datetime.fromtimestamp(exec_data["mtime"]).strftime("%Y-%m-%d")
    library = f"attnbook {_version('attnbook')}" + (f"（{commit}）" if commit else "")
    parts = [f"最后验证：{when}", library, f"torch {_version('torch')}", f"Python {platform.python_version()}"]
    runtime = exec_data.get("runtime")
    if runtime is not None:
        parts.append(f"本章在构建机器的 CPU 上运行 {runtime:.0f} 秒")
    return " · ".join(parts)


def _last_verified(app, doctree, docname) -> None:
    if chapter_number(docname) is None:
        return
    try:
        from myst_nb.sphinx_ import NbMetadataCollector
    except ImportError:
        return
    if not hasattr(app, "_attnbook_commit"):
        app._attnbook_commit = _git_commit(str(app.srcdir))
    text = last_verified_text(NbMetadataCollector.get_exec_data(app.env, docname), commit=app._attnbook_commit)
    if text is None:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not section.children or not isinstance(section[0], nodes.title):
        return
    section.insert(1, nodes.paragraph("", text, classes=[LAST_VERIFIED_CLASS]))


# ------------------------------------------------------------------------------ Chinese line breaks

# Text inside these is code, mathematics or raw output: never touched.
_VERBATIM = (nodes.literal, nodes.literal_block, nodes.math, nodes.math_block, nodes.raw,
             nodes.comment, nodes.doctest_block)


def _text_pieces(block) -> list:
    """The Text nodes of `block` in reading order; None stands for text in code or a formula,
    which counts as a Latin character (a line break next to a formula stays a space)."""
    pieces = []
    for node in block.findall(nodes.Text):
        parent, verbatim = node.parent, False
        while parent is not None and parent is not block:
            if isinstance(parent, _VERBATIM):
                verbatim = True
                break
            parent = parent.parent
        pieces.append(None if verbatim else node)
    return pieces


def _join_chinese_lines(app, doctree, docname) -> None:
    for block in list(doctree.findall(nodes.TextElement)):
        if isinstance(block, (nodes.Inline, *_VERBATIM)) or any(
                isinstance(c, nodes.TextElement) and not isinstance(c, nodes.Inline) for c in block.children):
            continue                                     # only the innermost text blocks
        pieces = _text_pieces(block)
        texts = ["x" if p is None else p.astext() for p in pieces]
        if not any("\n" in t for p, t in zip(pieces, texts) if p is not None):
            continue
        for node, text in zip(pieces, join_cjk_lines(texts)):
            if node is not None and text != node.astext():
                parent = node.parent           # by identity: Text is a str, and .replace()/.index()
                k = next(i for i, child in enumerate(parent.children) if child is node)   # match by value
                parent[k] = nodes.Text(text)


# ------------------------------------------------------------------------------ page HTML

def _colab_edition_buttons(buttons) -> None:
    """Point the Colab launch button of a chapter at colab/ instead of chapters/."""
    for button in buttons or []:
        if not isinstance(button, dict):
            continue
        url = button.get("url")
        if isinstance(url, str) and url.startswith("https://colab.research.google.com/") and "/chapters/" in url:
            button["url"] = url.replace("/chapters/", "/colab/", 1)
        _colab_edition_buttons(button.get("buttons"))


def _inside_anchor(html: str, pos: int) -> bool:
    return html.rfind("<a ", 0, pos) > html.rfind("</a>", 0, pos)


_OUTPUT_IMG = re.compile(r'<img\b[^>]*\bsrc="((?:\.\./)*_images/[^"]+)"[^>]*>')


def link_output_images(html: str) -> str:
    """Wrap every <img> from _images/ that is not already a link in a link to itself."""
    out, last = [], 0
    for m in _OUTPUT_IMG.finditer(html):
        if _inside_anchor(html, m.start()):
            continue
        out.append(html[last:m.start()])
        out.append(f'<a class="reference internal image-reference attnbook-full-image" href="{m.group(1)}" '
                   f'title="查看原图">{m.group(0)}</a>')
        last = m.end()
    out.append(html[last:])
    return "".join(out)


def translate_prompts(html: str) -> str:
    for word, chinese in PROMPT_WORDS.items():
        html = html.replace(f"显示{word}<", f"显示{chinese}<").replace(f"隐藏{word}<", f"隐藏{chinese}<")
        html = html.replace(f'"显示{word}"', f'"显示{chinese}"').replace(f'"隐藏{word}"', f'"隐藏{chinese}"')
    return html


def _page(app, pagename, templatename, context, doctree) -> None:
    if pagename.startswith("chapters/"):
        _colab_edition_buttons(context.get("header_buttons"))
    body = context.get("body")
    if not isinstance(body, str):
        return
    pathto = context.get("pathto")
    if COLAB_BADGE_URL in body and pathto is not None:
        body = body.replace(COLAB_BADGE_URL, pathto(LOCAL_BADGE, 1))
    body = translate_prompts(body)
    body = link_output_images(body)
    context["body"] = body


def setup(app) -> dict:
    app.connect("env-get-updated", _chapter_equation_numbers, priority=900)
    app.connect("doctree-resolved", _last_verified)
    app.connect("doctree-resolved", _join_chinese_lines)
    app.connect("html-page-context", _page, priority=950)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
