"""Tests for attnbook.plotting and attnbook.widgets (static and live modes)."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook import plotting, widgets  # noqa: E402


def test_heatmap_and_line_plot_return_figures():
    fig = plotting.heatmap(torch.rand(4, 6), title="A")
    assert fig.axes[0].get_xlabel() == "key $j$" and fig.axes[0].get_title() == "A"
    assert fig.axes[0].images[0].get_array().shape == (4, 6)
    fig = plotting.line_plot([1, 2, 4], {"a": [1, 2, 3], "b": torch.tensor([3.0, 2.0, 1.0])},
                             xlabel="n", ylabel="t", logx=True, logy=True)
    assert len(fig.axes[0].lines) == 2 and fig.axes[0].get_yscale() == "log"
    fig = plotting.hist_plot({"x": np.arange(10), "y": np.arange(5)}, xlabel="v")
    assert fig.axes[0].get_legend() is not None
    fig = plotting.bar_plot(["QK", "AV"], [2.0, 3.0], ylabel="FLOPs")
    assert len(fig.axes[0].patches) == 2


def test_plotting_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        plotting.heatmap(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="shape"):
        plotting.line_plot([1, 2], {"a": [1, 2, 3]}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="labels"):
        plotting.bar_plot(["a"], [1, 2], ylabel="y")


def _draw(n=8, scaled=True, kind="a"):
    return plotting.line_plot(np.arange(n), {kind: np.arange(n) * (0.5 if scaled else 1.0)},
                              xlabel="i", ylabel="y", title=f"n={n}")


def test_static_settings_vary_each_control():
    s = widgets.static_settings(_draw, {"n": (2, 32), "scaled": True, "kind": ["a", "b"]}, limit=10)
    assert s[0] == {"n": 8, "scaled": True, "kind": "a"}
    assert {"n": 2, "scaled": True, "kind": "a"} in s and {"n": 8, "scaled": False, "kind": "a"} in s


def test_explore_static_small_multiples(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    fig = widgets.explore(_draw, n=(2, 32), scaled=True, display=False,
                          static=[{"n": 4}, {"n": 16, "scaled": False}, {"n": 32}])
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 3
    assert panels[1].get_title() == "n=16, scaled=False"


def test_explore_live_builds_widgets(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)
    w = widgets.explore(_draw, n=(2, 32), scaled=True, kind=["a", "b"], display=False)
    names = [c.description for c in w.children[:-1]]
    assert names == ["n", "scaled", "kind"]
    assert w.children[0].value == 8 and type(w.children[-1]).__name__ == "Output"


def test_explore_bad_controls():
    with pytest.raises(ValueError, match="min < max"):
        widgets.explore(_draw, n=(5, 2), display=False)
    with pytest.raises(TypeError, match="control `n`"):
        widgets.explore(_draw, n=16, display=False)          # a bare number is no control
    with pytest.raises(ValueError, match="at least one control"):
        widgets.explore(_draw, display=False)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: plotting.heatmap("abc"), TypeError, "heatmap: `matrix` must hold real numbers"),
        (lambda: plotting.heatmap(torch.ones(2, 2, dtype=torch.complex64)), TypeError, "real numbers"),
        (lambda: plotting.line_plot([0, 1, 2], {"a": [1, 2, 3]}, xlabel="x", ylabel="y", logx=True),
         ValueError, "logx=True needs x > 0"),
        (lambda: plotting.hist_plot({}, xlabel="x"), ValueError, "non-empty"),
        (lambda: plotting.bar_plot(3, [1.0], ylabel="y"), TypeError, "`labels`"),
        (lambda: plotting.new_figure(0, 1), ValueError, "`nrows`"),
    ],
)
def test_plotting_rejects_bad_input_naming_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(n=(2, 32, 0)), ValueError, "0 < step"),
        (dict(n=(2, float("nan"))), ValueError, "finite"),
        (dict(size=(2, 32)), TypeError, "control `size` is not a parameter"),
        (dict(n=(2, 32), columns=0), ValueError, "`columns`"),
        (dict(n=(2, 32), static={"n": 4}), TypeError, "`static` must be a non-empty list"),
        (dict(n=(2, 32), static=[]), TypeError, "`static` must be a non-empty list"),
    ],
)
def test_explore_rejects_bad_arguments(monkeypatch, kwargs, exc, match):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    with pytest.raises(exc, match=match):
        widgets.explore(_draw, display=False, **kwargs)


def _say(text="ignored default", n=3):
    """A figure for a text control; text it cannot read raises ValueError (as a chapter's fn)."""
    if not text.strip() or not text.isascii():
        raise ValueError(f"cannot read {text!r}: type ASCII text")
    return plotting.line_plot(np.arange(n), {text: np.arange(n)}, xlabel="i", ylabel="y",
                              title=text)


def test_text_control_live_is_a_text_box_starting_with_the_given_text(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)
    w = widgets.explore(_say, text="3 March 2021", n=(1, 6), display=False)
    box = w.children[0]
    assert type(box).__name__ == "Text" and box.description == "text"
    assert box.value == "3 March 2021"                # the given text, not fn's default
    assert box.continuous_update is False             # redraws on Enter / blur only


def test_text_control_static_shows_given_text_or_static_texts(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    assert widgets.static_settings(_say, {"text": "abc", "n": (1, 5)}, limit=10) == [
        {"text": "abc", "n": 3}, {"text": "abc", "n": 1}, {"text": "abc", "n": 5}]
    fig = widgets.explore(_say, text="abc", display=False, static=[{}, {"text": "x y"}])
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == ["text=abc", "text=x y"]


def test_live_value_error_is_shown_as_a_message_not_a_traceback(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    w = widgets.explore(_say, text="ok", display=False)
    assert type(shown[-1]).__name__ == "Image"        # the first figure
    w.children[0].value = "   "                       # what a reader types, then Enter
    assert type(shown[-1]).__name__ == "_Message"
    assert repr(shown[-1]) == "cannot read '   ': type ASCII text"      # fn's message
    assert "&#x27;" in shown[-1]._repr_html_() and "<pre" in shown[-1]._repr_html_()
    w.children[0].value = "fine again"
    assert type(shown[-1]).__name__ == "Image"        # and the next good text draws again


def test_live_other_errors_still_raise(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)

    def broken(text="a"):
        raise KeyError(text)                          # a bug in fn, not bad input

    import IPython.display
    import ipywidgets.widgets.widget_output as widget_output
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: None)
    # Outside a shell the KeyError propagates. Once any test has started an IPython shell in
    # this process, ipywidgets' Output area shows the traceback there instead (as in a
    # notebook): no shell for this test, so the order of the test files does not matter.
    monkeypatch.setattr(widget_output, "get_ipython", lambda: None)
    with pytest.raises(KeyError):
        widgets.explore(broken, text="a", display=False)


def test_static_value_error_is_not_hidden(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    with pytest.raises(ValueError, match="cannot read"):   # the author's own setting: fail
        widgets.explore(_say, text="ok", display=False, static=[{"text": " "}])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(text="two\nlines"), ValueError, "text control `text` takes one line"),
        (dict(text="a", static=[{"text": 5}]), TypeError, "text control `text` needs a str"),
        (dict(text=b"bytes"), TypeError, "or a str"),
    ],
)
def test_text_control_rejects_bad_arguments(monkeypatch, kwargs, exc, match):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    with pytest.raises(exc, match=match):
        widgets.explore(_say, display=False, **kwargs)
