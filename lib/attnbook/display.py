"""Show library source inside the book (every chapter).

The library is the single source of truth: a chapter never copies library code into a cell; it
calls ``show_source(attention_tiled)`` in a cell tagged ``remove-input`` and the reader sees the
code, captioned with the file it lives in.
"""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

from ._checks import check_bool

__all__ = ["show_source", "source_of"]

_PKG_ROOT = Path(__file__).resolve().parent


def source_of(obj) -> tuple[str, str, int]:
    """Return ``(source, caption_path, first_line)`` of a library function, class or module.

    ``caption_path`` is the repository path (``lib/attnbook/flash.py``), the same wherever the
    package is installed (editable checkout, site-packages on Colab).
    """
    obj = inspect.unwrap(obj)  # a decorated kernel: show the function the reader calls, not its wrapper
    if type(obj).__name__ == "JITFunction" and callable(getattr(obj, "fn", None)):
        obj = obj.fn  # a @triton.jit kernel: its Python source
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
        lines, first = inspect.getsourcelines(obj)
    except (TypeError, OSError) as exc:
        raise TypeError(f"show_source: cannot find the source of {obj!r}: {exc}") from None
    try:
        rel = path.relative_to(_PKG_ROOT)
        caption = f"lib/attnbook/{rel.as_posix()}"
    except ValueError:
        caption = path.name
    return textwrap.dedent("".join(lines)).rstrip() + "\n", caption, max(first, 1)


def show_source(obj, *, display: bool = True):
    """Render ``obj``'s source as a Markdown code fence captioned with its path and lines.

    Args:
        obj: a function, class, method or module of the library.
        display: show it now (in a notebook); with False just return the Markdown object.
    Returns:
        None when ``display`` is true (the fence is shown); otherwise the ``IPython.display.Markdown``
        object, whose ``.data`` is the Markdown string.
    Raises:
        TypeError when ``obj`` has no Python source (a builtin, a string, an instance ...).
    """
    from IPython.display import Markdown
    from IPython.display import display as ipy_display

    display = check_bool("display", display, fn="show_source")
    src, caption, first = source_of(obj)
    last = first + src.count("\n") - 1
    fence = "````" if "```" in src else "```"
    md = Markdown(f"**`{caption}`**, lines {first}–{last}\n\n{fence}python\n{src}{fence}\n")
    if display:
        ipy_display(md)
        return None
    return md
