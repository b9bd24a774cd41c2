"""attnbook: the companion library of 《注意力机制：从推导到实现》.

One concept per module (see DESIGN.md): ``attention`` (scores, masks, ``attention_ref``),
``flash`` (online softmax, ``attention_tiled``), ``dispatch`` (the entry point below),
``triton_flash`` (fused Triton kernel, imported lazily), ``efficient`` (linear attention, sparse
masks), and helpers for the book (``display``, ``plotting``, ``widgets``, ``testing``, ``bench``).

The package re-exports the entry point ``attention(q, k, v, *, mask=None, causal=False,
scale=None, backend="auto")`` with ``BACKENDS``, ``available_backends`` and ``choose_backend``,
and the names in ``__all__`` from ``attention`` and ``flash``. The function shadows the module
of the same name: ``attnbook.attention`` (and ``import attnbook.attention as m``) is the
function; reach the module's helpers with ``from attnbook.attention import causal_mask, ...``.

Importing the package has no side effects: no printing, no plotting setup (matplotlib, IPython
and ipywidgets are imported only by the helpers that draw), no Triton import, no downloads.
"""
from .attention import (
    additive_scores,
    attention_ref,
    causal_mask,
    dot_scores,
    general_scores,
    padding_mask,
    scaled_dot_scores,
)
from .flash import attention_tiled, online_softmax
from .dispatch import BACKENDS, attention, available_backends, choose_backend

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "additive_scores",
    "attention",
    "attention_ref",
    "attention_tiled",
    "available_backends",
    "causal_mask",
    "choose_backend",
    "dot_scores",
    "general_scores",
    "online_softmax",
    "padding_mask",
    "scaled_dot_scores",
]
