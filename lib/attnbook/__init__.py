"""attnbook: the companion library of 《注意力机制：从推导到实现》.

One concept per module (see DESIGN.md): ``attention`` (scores, masks, ``attention_ref``),
``flash`` (online softmax, ``attention_tiled``), ``triton_flash`` (fused Triton kernel,
imported lazily), ``efficient`` (linear attention, sparse masks), and helpers for the book
(``display``, ``plotting``, ``widgets``, ``testing``, ``bench``).

Importing the package has no side effects: no plotting setup, no printing, no downloads.
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
