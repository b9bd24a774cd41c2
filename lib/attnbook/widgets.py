"""Interactive explorations that still say something in the static HTML book (every chapter).

``explore(fn, **controls)`` shows sliders, dropdowns, checkboxes and text boxes in a live kernel
(Jupyter, Colab: ipywidgets 7.7 or 8). The HTML book has no kernel, so when ``ATTNBOOK_STATIC=1``
(set by the book build) or ipywidgets is missing, it draws one static small-multiples figure over
representative settings instead, with a one-line note that the interactive version runs in
Jupyter or Colab.
"""
from __future__ import annotations

import inspect
import io
import math
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ._checks import check_int, check_bool

__all__ = ["explore", "explore_text", "is_static", "static_settings"]

STATIC_NOTE = "*这是静态版本（几组代表性取值）。在 Jupyter 或 Colab 中运行本章，即可用滑块等控件交互探索。*"


def is_static() -> bool:
    """True when widgets cannot run: the book build (``ATTNBOOK_STATIC=1``) or no ipywidgets."""
    if os.environ.get("ATTNBOOK_STATIC", "") not in ("", "0"):
        return True
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return False


def _as_python(x):
    """numpy scalars as the Python bool / int / float they hold (a slider bound may be ``np.int64(8)``)."""
    return x.item() if isinstance(x, (np.bool_, np.integer, np.floating)) else x


def _check_control(name, spec):
    """Validate one control; returns it with numpy scalars turned into Python ones."""
    spec = _as_python(spec)
    if isinstance(spec, tuple):
        spec = tuple(_as_python(x) for x in spec)
    if isinstance(spec, bool):
        return spec
    if isinstance(spec, str):
        if "\n" in spec or "\r" in spec:
            raise ValueError(f"explore: text control `{name}` takes one line of text, got {spec!r}")
        return spec
    if isinstance(spec, tuple):
        if len(spec) not in (2, 3) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                              and math.isfinite(x) for x in spec):
            raise ValueError(f"explore: control `{name}` must be (min, max) or (min, max, step) of finite "
                             f"numbers, got {spec!r}")
        if spec[0] >= spec[1]:
            raise ValueError(f"explore: control `{name}` needs min < max, got {spec!r}")
        if len(spec) == 3 and not 0 < spec[2] <= spec[1] - spec[0]:
            raise ValueError(f"explore: control `{name}` needs 0 < step <= max - min, got {spec!r}")
        return spec
    if isinstance(spec, list):
        if not spec:
            raise ValueError(f"explore: control `{name}` is an empty list")
        return [_as_python(x) for x in spec]
    raise TypeError(
        f"explore: control `{name}` must be a (min, max[, step]) tuple, a list of options, a bool "
        f"or a str (a text box), got {spec!r}"
    )


def _default(fn, name, spec):
    if isinstance(spec, str):            # a text box starts with the text it was given
        return spec
    param = inspect.signature(fn).parameters.get(name)
    if param is not None and param.default is not inspect.Parameter.empty:
        return param.default
    if isinstance(spec, bool):
        return spec
    if isinstance(spec, list):
        return spec[0]
    lo, hi = spec[0], spec[1]
    mid = (lo + hi) / 2
    return int(round(mid)) if all(isinstance(x, int) for x in spec) else mid


def static_settings(fn, controls: Mapping[str, object], limit: int = 4) -> list[dict]:
    """Representative settings: the defaults, then each control moved to its extremes."""
    if not callable(fn):
        raise TypeError(f"static_settings: `fn` must be callable, got {type(fn).__name__}")
    if not isinstance(controls, Mapping):
        raise TypeError(f"static_settings: `controls` must be a dict {{name: control}}, got {type(controls).__name__}")
    limit = check_int("limit", limit, fn="static_settings")
    controls = {name: _check_control(name, spec) for name, spec in controls.items()}
    base = {name: _default(fn, name, spec) for name, spec in controls.items()}
    settings = [dict(base)]
    for name, spec in controls.items():
        if isinstance(spec, bool):
            options = [not base[name]]
        elif isinstance(spec, str):      # free text has no extremes: the given text only
            options = []
        elif isinstance(spec, list):
            options = [spec[0], spec[-1]]
        else:
            options = [spec[0], spec[1]]
        for value in options:
            s = dict(base, **{name: value})
            if s not in settings:
                settings.append(s)
    return settings[:limit]


def _figure_to_rgba(fig) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()


def _label(setting: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items())


def _render_static(fn, settings: Sequence[Mapping[str, object]], columns: int | None):
    import matplotlib.pyplot as plt

    images = []
    for s in settings:
        fig = fn(**s)
        if fig is None or not hasattr(fig, "savefig"):
            raise TypeError(f"explore: `fn` must return a matplotlib Figure, got {type(fig).__name__}")
        images.append(_figure_to_rgba(fig))
        plt.close(fig)
    n = len(images)
    cols = columns or (1 if images[0].shape[1] > 1100 else min(n, 2))
    rows = -(-n // cols)
    h, w = images[0].shape[:2]
    scale = 1.0 / 100  # the panels were drawn at 100 dpi
    fig, axes = plt.subplots(rows, cols, figsize=(cols * w * scale, rows * (h * scale + 0.35)), squeeze=False)
    plt.close(fig)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, img, s in zip(axes.ravel(), images, settings):
        ax.imshow(img)
        ax.set_title(_label(s), fontsize=10)
    fig.tight_layout()
    return fig


def _make_widget(name, spec, value):
    import ipywidgets as W

    desc = name
    if isinstance(spec, bool):
        return W.Checkbox(value=bool(value), description=desc)
    if isinstance(spec, str):            # the value changes on Enter or when the box loses focus
        return W.Text(value=value, description=desc, continuous_update=False)
    if isinstance(spec, list):
        return W.Dropdown(options=spec, value=value, description=desc)
    lo, hi = spec[0], spec[1]
    if all(isinstance(x, int) for x in spec):
        step = spec[2] if len(spec) == 3 else 1
        return W.IntSlider(value=int(value), min=lo, max=hi, step=step, description=desc, continuous_update=False)
    step = spec[2] if len(spec) == 3 else (hi - lo) / 100
    return W.FloatSlider(value=float(value), min=lo, max=hi, step=step, description=desc, continuous_update=False)


def _validate(fn, static, columns, controls) -> dict:
    """Every check of ``explore``'s arguments, before anything is drawn; returns the controls
    with numpy scalars as Python numbers."""
    if not callable(fn):
        raise TypeError(f"explore: `fn` must be callable, got {type(fn).__name__}")
    if not controls:
        raise ValueError("explore: give at least one control, e.g. explore(fn, n=(8, 128))")
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    controls = {name: _check_control(name, spec) for name, spec in controls.items()}
    for name in controls:
        if not takes_any and name not in params:
            raise TypeError(f"explore: control `{name}` is not a parameter of fn{inspect.signature(fn)}")
    if columns is not None:
        check_int("columns", columns, fn="explore")
    if static is not None:
        if (isinstance(static, (str, Mapping)) or not isinstance(static, Sequence) or not static
                or not all(isinstance(s, Mapping) for s in static)):
            raise TypeError(f"explore: `static` must be a non-empty list of dicts {{control: value}}, got {static!r:.80}")
        for s in static:
            unknown = set(s) - set(controls)
            if unknown:
                raise ValueError(f"explore: static setting {s} names unknown controls {sorted(unknown)}")
            for name, value in s.items():
                if isinstance(controls[name], str) and not isinstance(value, str):
                    raise TypeError(f"explore: static setting {s}: text control `{name}` needs a "
                                    f"str, got {value!r}")
    return controls


def _png(fig) -> bytes:
    """The figure as PNG bytes (closed afterwards, so the inline backend does not show it again)."""
    import matplotlib.pyplot as plt

    if fig is None or not hasattr(fig, "savefig"):
        raise TypeError(f"explore: `fn` must return a matplotlib Figure, got {type(fig).__name__}")
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


class _Message:
    """One line of text in the Output area (plain text and HTML; no traceback)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html

        return f'<pre style="color:#a94442;white-space:pre-wrap">{html.escape(self.text)}</pre>'


def _live(fn, controls):
    """Controls plus an Output area that shows ``fn``'s figure now and after every change.

    ``ipywidgets.interactive_output`` calls ``draw`` once when it is built and again on each
    change, with the Output widget capturing what ``draw`` displays. ``draw`` displays the
    figure explicitly as a PNG image: ``interactive`` would only *return* the figure, which no
    front end shows (the output stayed empty), and relying on the inline backend would depend
    on how the kernel was started. Works with ipywidgets 7.7 (Colab) and 8.

    A ``ValueError`` from ``fn`` (e.g. text a reader typed that ``fn`` cannot read) is shown
    in the Output area as one line of text instead of a traceback; other errors are bugs and
    keep their traceback.
    """
    import ipywidgets as W
    from IPython.display import Image
    from IPython.display import display as ipy_display

    def draw(**values):
        import matplotlib.pyplot as plt

        before = set(plt.get_fignums())
        try:
            fig = fn(**values)
        except ValueError as err:
            for num in set(plt.get_fignums()) - before:   # a figure fn began before it raised
                plt.close(num)
            ipy_display(_Message(str(err)))             # the controls are right above it
            return
        ipy_display(Image(data=_png(fig), format="png"))

    kwargs = {name: _make_widget(name, spec, _default(fn, name, spec)) for name, spec in controls.items()}
    out = W.interactive_output(draw, kwargs)
    return W.VBox([*kwargs.values(), out])


def explore(fn: Callable[..., object], *, static: Sequence[Mapping[str, object]] | None = None,
            columns: int | None = None, display: bool = True, **controls):
    """Explore ``fn(**values) -> Figure`` with live controls, or as static small multiples in the book.

    Args:
        fn: draws one figure for one setting of the controls and returns it.
        static: the settings shown in the static book (default: the defaults, then each control
            at its extremes, at most four panels).
        columns: panels per row in the static figure.
        display: show the result now; with False return it (the widget, or the static Figure).
        **controls: ``name=(min, max[, step])`` a slider (ints -> IntSlider), ``name=[options]`` a
            dropdown, ``name=True/False`` a checkbox, ``name="text"`` a one-line text box that
            starts with that text and calls ``fn`` when the reader presses Enter or leaves the
            box; each name must be a parameter of ``fn``. Other defaults come from ``fn``'s
            signature (else the middle / first option / the bool). The static figure shows a
            text box's given text unless ``static`` names other texts.
            In the live widget a ``ValueError`` raised by ``fn`` (text it cannot read, say) is
            shown as its message in the output area; any other exception as a traceback.
    Returns:
        None when ``display`` is true; otherwise the live widget (an ``ipywidgets.VBox`` of the
        controls and the Output area that shows the figure) or the static small-multiples Figure
        (``ATTNBOOK_STATIC=1`` or no ipywidgets).
    """
    controls = _validate(fn, static, columns, controls)
    display = check_bool("display", display, fn="explore")
    if is_static():
        settings = list(static) if static is not None else static_settings(fn, controls)
        settings = [{**{n: _default(fn, n, sp) for n, sp in controls.items()}, **s} for s in settings]
        result = _render_static(fn, settings, columns)
    else:
        result = _live(fn, controls)
    if not display:
        return result
    from IPython.display import Markdown
    from IPython.display import display as ipy_display

    ipy_display(result)
    if is_static():
        ipy_display(Markdown(STATIC_NOTE))
    return None


def explore_text(fn: Callable[..., str], *, static: Sequence[Mapping[str, object]] | None = None,
                 display: bool = True, **controls):
    """``explore`` for a function that returns text instead of a figure (chapter 11's poems).

    Live (Jupyter, Colab): the controls, and below them ``fn(**values)`` as preformatted text,
    redrawn after every change (a ``ValueError`` from ``fn`` shows its message). Static (the
    book): a Markdown gallery, one block per setting of ``static`` (default: as ``explore``),
    headed by the setting. Text needs no font in a figure, so Chinese output renders
    everywhere. Arguments as :func:`explore`; ``fn`` must return a str.
    """
    controls = _validate(fn, static, None, controls)
    display = check_bool("display", display, fn="explore_text")

    def text(values):
        out = fn(**values)
        if not isinstance(out, str):
            raise TypeError(f"explore_text: `fn` must return a str, got {type(out).__name__}")
        return out

    if is_static():
        from IPython.display import Markdown
        settings = list(static) if static is not None else static_settings(fn, controls)
        settings = [{**{n: _default(fn, n, sp) for n, sp in controls.items()}, **s} for s in settings]
        blocks = [f"**{_label(s)}**\n\n```text\n{text(s)}\n```" for s in settings]
        result = Markdown("\n\n".join(blocks + [STATIC_NOTE]))
    else:
        import ipywidgets as W
        from IPython.display import display as ipy_display

        def draw(**values):
            try:
                ipy_display(_Text(text(values)))
            except ValueError as err:
                ipy_display(_Message(str(err)))

        kwargs = {n: _make_widget(n, sp, _default(fn, n, sp)) for n, sp in controls.items()}
        result = W.VBox([*kwargs.values(), W.interactive_output(draw, kwargs)])
    if not display:
        return result
    from IPython.display import display as ipy_display
    ipy_display(result)
    return None


class _Text:
    """Preformatted text in the Output area (plain text and HTML)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        import html

        return f'<pre style="white-space:pre-wrap;font-size:1.1em">{html.escape(self.text)}</pre>'
