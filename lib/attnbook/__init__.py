"""attnbook: the companion library of 《注意力机制：从推导到实现》.

One concept per module (see DESIGN.md): ``reference`` (scores, masks, ``attention_ref``),
``flash`` (online softmax, ``attention_tiled``), ``dispatch`` (the entry point below),
``trust`` (the first-use check ``backend="auto"`` runs before it trusts the Triton kernel),
``triton_flash`` (the fused Triton kernel's host side, imported lazily) and ``triton_kernels``
(its device code), ``efficient`` (linear attention, sparse masks), the building blocks the
chapters import by module (``rnn``, ``seq2seq``, ``decoding``, ``multihead``, ``positional``,
``layers``, ``cache``, ``blocks``, ``transformer``, ``data``, ``train``), and helpers for the book (``display``, ``plotting``, ``widgets``, ``testing``, ``bench``, ``selfcheck``: the machine report, and
``exercises``: ``check(name, fn)`` for the hands-on exercises, imported on its own; ``experiments``:
the book's empirical claims over seeds, ``python -m attnbook.experiments``, imported on its own).

The package re-exports the entry point ``attention(q, k, v, *, mask=None, causal=False,
scale=None, backend="auto")`` (the dispatcher, from ``dispatch``) with the backend registry
helpers, and the public names of ``reference`` and ``flash``. Every kernel function
(``attention_ref``, ``attention_tiled``, ``attention_triton``) returns an
:class:`AttentionResult` ``(out, lse, weights)``; the dispatcher returns ``out``.

Importing the package has no side effects: no printing, no plotting setup (matplotlib, IPython
and ipywidgets are imported only by the helpers that draw), no Triton import, no downloads.
"""
from .reference import (
    AttentionResult,
    additive_scores,
    attention_ref,
    causal_mask,
    dot_scores,
    general_scores,
    mask_to_additive,
    masked_softmax,
    padding_mask,
    scaled_dot_scores,
)
from .flash import attention_tiled, online_softmax
from .dispatch import BACKENDS, attention, available_backends, choose_backend

__version__ = "0.1.0"

__all__ = [
    "AttentionResult",
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
    "mask_to_additive",
    "masked_softmax",
    "online_softmax",
    "padding_mask",
    "scaled_dot_scores",
]
