"""Step 1 of chapter 03's three steps as a module: ``AttentionScore`` (dot, scaled dot, general, additive)."""
from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_choice, check_int
from ..reference import additive_scores, dot_scores, general_scores, scaled_dot_scores

__all__ = ["SCORES", "AttentionScore"]

SCORES = ("dot", "scaled_dot", "general", "additive")


class AttentionScore(nn.Module):
    """Step 1 of the three steps: a score for every query s_t and key h_j (chapter 03).

    The scores are eq-ch03-dot, eq-ch03-scaled, eq-ch03-general and eq-ch03-additive.

    ``kind`` picks one of the library's score functions (no second implementation here):
    ``"dot"``: ``s . h`` (needs ``d_query == d_key``, no parameters); ``"scaled_dot"``:
    ``s . h / sqrt(d)``; ``"general"``: ``s W_a h^T`` with ``W_a (d_query, d_key)``
    (Luong); ``"additive"``: ``v_a . tanh(s W_q + h W_k)`` with
    ``W_q (d_query, d_attn)``, ``W_k (d_key, d_attn)``, ``v_a (d_attn,)`` (Bahdanau;
    Luong's "concat"), bounded by ``||v_a||_1``. Row-vector convention: ``s W_q``
    multiplies on the right.

    Forward: query ``(..., Tq, d_query)``, keys ``(..., Tk, d_key)`` -> scores
    ``(..., Tq, Tk)``.
    """

    def __init__(self, kind: str, d_query: int, d_key: int, *,
                 d_attn: int | None = None):
        super().__init__()
        self.kind, self.d_query, self.d_key, self.d_attn = _check_attention_score(
            kind, d_query, d_key, d_attn)
        if kind == "general":
            self.weight = nn.Parameter(torch.randn(d_query, d_key) / math.sqrt(d_key))
        elif kind == "additive":
            self.w_q = nn.Parameter(torch.randn(d_query, self.d_attn)
                                    / math.sqrt(d_query))
            self.w_k = nn.Parameter(torch.randn(d_key, self.d_attn) / math.sqrt(d_key))
            self.v_a = nn.Parameter(torch.randn(self.d_attn) / math.sqrt(self.d_attn))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.kind == "dot":
            return dot_scores(query, keys)
        if self.kind == "scaled_dot":
            return scaled_dot_scores(query, keys)
        if self.kind == "general":
            return general_scores(query, keys, self.weight)
        return additive_scores(query, keys, self.w_q, self.w_k, self.v_a)

    def extra_repr(self) -> str:
        extra = f", d_attn={self.d_attn}" if self.d_attn else ""
        return f"kind={self.kind!r}, d_query={self.d_query}, d_key={self.d_key}{extra}"


def _check_attention_score(kind, d_query, d_key, d_attn) -> tuple[str, int, int, int | None]:
    """``AttentionScore``'s arguments; returns (kind, d_query, d_key, d_attn or None)."""
    fn = "AttentionScore"
    kind = check_choice("kind", kind, SCORES, fn=fn)
    d_query, d_key = check_int("d_query", d_query, fn=fn), check_int("d_key", d_key, fn=fn)
    if kind in ("dot", "scaled_dot") and d_query != d_key:
        raise ValueError(f"{fn}: {kind!r} scores need d_query == d_key (s . h is only defined "
                         f"for equal sizes), got d_query={d_query}, d_key={d_key}; "
                         f"use 'general' or 'additive', or match the sizes")
    if d_attn is not None and kind != "additive":
        raise ValueError(f"{fn}: `d_attn` is only used by 'additive' scores, got kind={kind!r}")
    if kind != "additive":
        return kind, d_query, d_key, None
    return kind, d_query, d_key, (d_query if d_attn is None else check_int("d_attn", d_attn, fn=fn))
