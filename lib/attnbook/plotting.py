"""Matplotlib figure helpers used by every chapter; each returns the Figure.

Figures use English / math labels only (no CJK glyphs: Colab and fresh machines have no CJK
fonts). A helper draws into ``ax`` when one is given; otherwise it makes a new figure, closes it
in pyplot (so a notebook shows it exactly once, as the cell's value) and returns it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._checks import check_choice, check_int

__all__ = ["bar_plot", "heatmap", "hist_plot", "line_plot", "new_figure", "to_numpy"]


def to_numpy(x, *, name: str = "x", fn: str = "to_numpy") -> np.ndarray:
    """A float numpy array from a real tensor, array or (rectangular) sequence of numbers (detached, on the CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point:  # bfloat16 / float16 have no (or a lossy) numpy twin
            x = x.double()
        x = x.numpy()
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"{fn}: `{name}` must hold real numbers, got {type(x).__name__} {x!r:.60}")
    try:
        arr = np.asarray(x)
    except ValueError:  # numpy: "inhomogeneous shape"
        raise ValueError(f"{fn}: `{name}` must be rectangular (rows of equal length, like an array), got "
                         f"ragged rows {x!r:.60}") from None
    if arr.dtype == object and any(v is None for v in arr.ravel()):  # astype(float) would make None a NaN
        raise TypeError(f"{fn}: `{name}` must hold real numbers, got None in {x!r:.60}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{fn}: `{name}` must hold real numbers, got complex values {x!r:.60}")
    try:
        return arr.astype(float)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: `{name}` must hold real numbers, got {type(x).__name__} {x!r:.60}") from None


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    """``(fig, axes)`` like ``plt.subplots``, already closed in pyplot (no double display)."""
    import matplotlib.pyplot as plt

    nrows, ncols = check_int("nrows", nrows, fn="new_figure"), check_int("ncols", ncols, fn="new_figure")
    if figsize is None:
        figsize = (4.2 * ncols, 3.4 * nrows)
    elif (isinstance(figsize, (str, bytes)) or not hasattr(figsize, "__len__") or len(figsize) != 2
          or not all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                     and np.isfinite(v) and v > 0 for v in figsize)):
        raise ValueError(f"new_figure: `figsize` must be (width, height) in inches, two finite numbers > 0, "
                         f"got {figsize!r}")
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=True, **kwargs)
    plt.close(fig)
    return fig, axes


def _axes(ax, figsize):
    if ax is not None:
        from matplotlib.axes import Axes

        if not isinstance(ax, Axes):
            raise TypeError(f"plotting: `ax` must be a matplotlib Axes or None, got {type(ax).__name__}")
        return ax.figure, ax
    fig, ax = new_figure(figsize=figsize, layout="constrained")
    return fig, ax


def _label(ax, *, xlabel=None, ylabel=None, title=None, logy=False, legend=False):
    """The finishing touches every helper shares: log y, axis labels, title, legend."""
    if logy:
        ax.set_yscale("log")
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(frameon=False)


def heatmap(matrix, *, ax=None, xlabel="key $j$", ylabel="query $i$", title=None, cmap="viridis",
            colorbar=True, vmin=None, vmax=None, xticklabels=None, yticklabels=None, figsize=(4.2, 3.6)):
    """A matrix as an image, row i = query i (e.g. attention weights ``A``). Returns the Figure."""
    m = to_numpy(matrix, name="matrix", fn="heatmap")
    if m.ndim != 2 or m.size == 0:
        raise ValueError(f"heatmap: `matrix` must be 2-D and non-empty, got shape {m.shape}")
    fig, ax = _axes(ax, figsize)
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    _label(ax, xlabel=xlabel, ylabel=ylabel, title=title)
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), labels=list(xticklabels))
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), labels=list(yticklabels))
    if colorbar:
        fig.colorbar(im, ax=ax, shrink=0.85)
    return fig


def line_plot(x, ys, *, xlabel, ylabel, title=None, logx=False, logy=False, ax=None, markers=True,
              styles: Mapping[str, str] | None = None, figsize=(4.8, 3.4)):
    """Several curves over a shared x, ``ys = {label: values}``. Returns the Figure."""
    if not isinstance(ys, Mapping) or not ys:
        raise ValueError("line_plot: `ys` must be a non-empty dict {label: values}")
    xs = to_numpy(x, name="x", fn="line_plot")
    if logx and not (xs > 0).all():
        raise ValueError(f"line_plot: logx=True needs x > 0 (a log axis drops the rest), got min x = {xs.min()}")
    ys = {label: to_numpy(y, name=f"ys[{label!r}]", fn="line_plot") for label, y in ys.items()}
    for label, y in ys.items():
        if y.shape != xs.shape:
            raise ValueError(f"line_plot: curve {label!r} has shape {y.shape}, x has {xs.shape}")
    fig, ax = _axes(ax, figsize)
    for label, y in ys.items():
        style = (styles or {}).get(label, "-o" if markers else "-")
        ax.plot(xs, y, style, label=label, markersize=4)
    if logx:
        ax.set_xscale("log", base=2 if np.all(np.log2(xs[xs > 0]) % 1 == 0) else 10)
    _label(ax, xlabel=xlabel, ylabel=ylabel, title=title, logy=logy, legend=len(ys) > 1)
    ax.grid(alpha=0.3)
    return fig


def hist_plot(values, *, bins=50, xlabel, ylabel="density", title=None, ax=None, density=True,
              logy=False, figsize=(4.8, 3.4)):
    """Histogram(s): ``values`` is an array or ``{label: array}``. Returns the Figure."""
    _check_bins(bins)
    groups = values if isinstance(values, Mapping) else {None: values}
    groups = {label: to_numpy(v, name="values", fn="hist_plot").ravel() for label, v in groups.items()}
    if not groups or any(v.size == 0 for v in groups.values()):
        raise ValueError("hist_plot: `values` must be a non-empty array or a dict of non-empty arrays")
    if any(not np.isfinite(v).any() for v in groups.values()):
        raise ValueError("hist_plot: `values` must hold at least one finite number per histogram (all NaN/inf)")
    fig, ax = _axes(ax, figsize)
    for label, v in groups.items():
        ax.hist(v, bins=bins, density=density, alpha=0.6, label=label)
    _label(ax, xlabel=xlabel, ylabel=ylabel, title=title, logy=logy, legend=len(groups) > 1)
    return fig


_BIN_RULES = ("auto", "fd", "doane", "scott", "stone", "rice", "sturges", "sqrt")  # numpy's estimators


def _check_bins(bins) -> None:
    """``bins``: a count >= 1, one of numpy's rules, or increasing edges (a 1-D sequence of >= 2 numbers)."""
    if isinstance(bins, str):
        check_choice("bins", bins, _BIN_RULES, fn="hist_plot")
    elif isinstance(bins, (int, np.integer)) or not hasattr(bins, "__len__"):
        check_int("bins", bins, fn="hist_plot")
    else:
        edges = to_numpy(bins, name="bins", fn="hist_plot")
        if edges.ndim != 1 or edges.size < 2 or not np.isfinite(edges).all() or not (np.diff(edges) > 0).all():
            raise ValueError(f"hist_plot: `bins` as edges must be a 1-D increasing sequence of >= 2 finite "
                             f"numbers, got {bins!r:.60}")


def bar_plot(labels: Sequence[str], values, *, ylabel, title=None, ax=None, logy=False, figsize=(4.8, 3.4)):
    """Bars with text labels (e.g. FLOPs per stage). Returns the Figure."""
    vals = to_numpy(values, name="values", fn="bar_plot")
    if isinstance(labels, str) or not isinstance(labels, Sequence) or vals.ndim != 1:
        raise TypeError(f"bar_plot: `labels` must be a sequence of strings and `values` 1-D, got "
                        f"{type(labels).__name__} and shape {vals.shape}")
    if len(labels) != len(vals):
        raise ValueError(f"bar_plot: {len(labels)} labels but {len(vals)} values")
    fig, ax = _axes(ax, figsize)
    ax.bar(range(len(vals)), vals, color="tab:blue")
    ax.set_xticks(range(len(vals)), labels=list(labels))
    _label(ax, ylabel=ylabel, title=title, logy=logy)
    return fig
