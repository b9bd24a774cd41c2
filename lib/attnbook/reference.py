"""Score functions, masks and the reference attention (chapters 03 and 04).

Everything here materialises the full ``(..., Tq, Tk)`` score matrix: it is the readable,
float64-checkable definition that the fast kernels in ``flash`` and ``triton_flash`` are tested
against.

Conventions (appendix "记号与约定"): tensors are ``(..., T, D)``, usually ``(B, H, T, D)``;
row-major projections ``Q = X W_Q``; boolean masks use True = may attend (the
``scaled_dot_product_attention`` convention); a query row with no allowed key returns zeros.

Causal alignment (``CAUSAL_ALIGNMENTS``, as ``torch.nn.attention.bias.CausalVariant``). When
``Tq != Tk`` a causal mask must say where the queries sit among the keys:

- ``"top_left"``: query i may attend key j iff ``j <= i`` (the queries are the FIRST Tq
  positions); ``scaled_dot_product_attention(is_causal=True)``, ``CausalVariant.UPPER_LEFT``;
- ``"bottom_right"``: query i may attend key j iff ``j <= i + (Tk - Tq)`` (the queries are the
  LAST Tq positions, as in incremental decoding with a key/value cache);
  ``CausalVariant.LOWER_RIGHT``, flash-attn's ``causal=True`` since 2.1.

The two agree when ``Tq == Tk``. Here ``causal=True`` is top-left (in ``attention_ref`` and the
kernels, in ``causal_mask`` by default and in ``multihead.MultiHeadAttention``);
``cache.CachedAttention``'s ``causal=True`` is bottom-right. :func:`causal_mask` builds either
mask; :func:`causal_alignment` reads a module's ``causal`` argument.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ._checks import (attention_kernel, check_choice, check_device, check_dtype, check_int,
                      check_query_key, check_scale, check_tensor)

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")   # where the Tq queries sit among Tk keys

__all__ = [
    "CAUSAL_ALIGNMENTS",
    "AttentionResult",
    "additive_scores",
    "attention_ref",
    "causal_alignment",
    "causal_mask",
    "dot_scores",
    "fold_causal",
    "general_scores",
    "mask_to_additive",
    "masked_softmax",
    "padding_mask",
    "has_nonfinite",
    "propagate_nonfinite",
    "scaled_dot_scores",
    "visible_keys",
]


class AttentionResult(NamedTuple):
    """What every attention kernel function returns (``attention_ref``, ``attention_tiled``,
    ``attention_triton``), so that swapping kernels never changes the meaning of a field.

    Read it by name (``res.out``, ``res.weights``): the three fields make ``out, w = ...``
    raise instead of silently binding the wrong tensor.

    Fields:
        out: ``(..., Tq, Dv)``, in the input dtype; differentiable.
        lse: ``(..., Tq)``, the natural-log log-sum-exp of each row of the scaled, masked scores
            (``-inf`` for a row with no allowed key). A statistic for tests and for combining
            partial results; differentiable in every kernel (a loss on it sends gradients to
            q, k and a float mask; a row with no allowed key gets a zero gradient).
        weights: ``(..., Tq, Tk)``, the softmax weights, only from kernels that materialise them
            (``attention_ref``); ``None`` from the tiled and Triton kernels.
    """

    out: torch.Tensor
    lse: torch.Tensor
    weights: torch.Tensor | None


# ---------------------------------------------------------------------------------------------
# Score functions: (..., Tq, D) x (..., Tk, D) -> (..., Tq, Tk)
# ---------------------------------------------------------------------------------------------

def dot_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot-product scores (chapter 04, eq-ch04-scores; chapter 03's "dot" score, eq-ch03-dot): ``e_ij = q_i . k_j``.

    Args: q ``(..., Tq, D)``, k ``(..., Tk, D)`` (leading dims broadcast).  Returns ``(..., Tq, Tk)``.
    """
    check_query_key(q, k, fn="dot_scores")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"dot_scores: q and k need the same D, got {tuple(q.shape)} and {tuple(k.shape)}")
    return q @ k.transpose(-2, -1)  # (..., Tq, Tk)


def scaled_dot_scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Scaled dot-product scores (chapter 04, eq-ch04-scaled): ``e_ij = scale * q_i . k_j``, scale = 1/sqrt(D).

    Args: q ``(..., Tq, D)``, k ``(..., Tk, D)``, scale (default ``1/sqrt(D)``; finite, > 0).
    Returns ``(..., Tq, Tk)``. q is scaled before the product, as in ``attention_ref``.
    """
    check_query_key(q, k, fn="scaled_dot_scores")
    if q.shape[-1] == 0:
        raise ValueError(f"scaled_dot_scores: the feature dim D of `q` must be >= 1 (scale 1/sqrt(D)), "
                         f"got q {tuple(q.shape)}")
    scale = check_scale(scale, q.shape[-1], fn="scaled_dot_scores")
    return dot_scores(q * scale, k)


def general_scores(q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Luong's "general" (bilinear) scores (chapter 03, eq-ch03-general): ``e_ij = q_i W k_j^T``.

    Args: q ``(..., Tq, Dq)``, k ``(..., Tk, Dk)``, weight ``(Dq, Dk)``.  Returns ``(..., Tq, Tk)``.
    """
    check_tensor("weight", weight, fn="general_scores", min_ndim=2)
    check_query_key(q, k, fn="general_scores", params=[("weight", weight)])
    if weight.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(
            f"general_scores: `weight` must have shape (Dq, Dk) = ({q.shape[-1]}, {k.shape[-1]}), "
            f"got {tuple(weight.shape)}"
        )
    return (q @ weight) @ k.transpose(-2, -1)  # (..., Tq, Tk)


def additive_scores(
    q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, v_a: torch.Tensor
) -> torch.Tensor:
    """Additive (Bahdanau) scores (chapter 03, eq-ch03-additive): ``e_ij = v_a . tanh(q_i W_q + k_j W_k)``.

    Bounded: ``|e_ij| <= ||v_a||_1`` because ``|tanh| <= 1`` (eq-ch03-additive-bound).

    Args: q ``(..., Tq, Dq)``, k ``(..., Tk, Dk)``, w_q ``(Dq, A)``, w_k ``(Dk, A)``, v_a ``(A,)``.
    Returns ``(..., Tq, Tk)``.
    """
    for name, t in (("w_q", w_q), ("w_k", w_k)):
        check_tensor(name, t, fn="additive_scores", min_ndim=2)
    check_tensor("v_a", v_a, fn="additive_scores", min_ndim=1)
    check_query_key(q, k, fn="additive_scores", params=[("w_q", w_q), ("w_k", w_k), ("v_a", v_a)])
    a = v_a.shape[-1]
    if w_q.shape != (q.shape[-1], a) or w_k.shape != (k.shape[-1], a) or v_a.ndim != 1:
        raise ValueError(
            f"additive_scores: expected w_q ({q.shape[-1]}, A), w_k ({k.shape[-1]}, A), v_a (A,); got "
            f"w_q {tuple(w_q.shape)}, w_k {tuple(w_k.shape)}, v_a {tuple(v_a.shape)}"
        )
    hidden = torch.tanh((q @ w_q).unsqueeze(-2) + (k @ w_k).unsqueeze(-3))  # (..., Tq, Tk, A)
    return hidden @ v_a  # (..., Tq, Tk)


# ---------------------------------------------------------------------------------------------
# Masks (True = may attend)
# ---------------------------------------------------------------------------------------------

def causal_mask(tq: int, tk: int | None = None, *, align: str = "top_left",
                device=None) -> torch.Tensor:
    """Causal mask (eq-ch04-causal-mask): query i may see key j iff j <= i + offset.

    ``align="top_left"`` (default): offset 0, like
    ``scaled_dot_product_attention(is_causal=True)``. ``align="bottom_right"``: offset
    ``tk - tq``, the queries are the last ``tq`` of ``tk`` positions (incremental
    decoding; torch's ``causal_lower_right``). The two agree when ``tq == tk``; with
    bottom-right and ``tq > tk`` the first ``tq - tk`` rows see no key.

    Args: tq, tk (default ``tq``), both >= 0; align ``"top_left"`` / ``"bottom_right"``.
    Returns a bool tensor ``(tq, tk)``, True = may attend.
    """
    tq, tk, offset = _check_causal_mask(tq, tk, align, device)   # offset: 0 or tk - tq
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(offset)


def _check_causal_mask(tq, tk, align, device) -> tuple[int, int, int]:
    check_device("device", device, fn="causal_mask")
    tq = check_int("tq", tq, fn="causal_mask", minimum=0)
    tk = tq if tk is None else check_int("tk", tk, fn="causal_mask", minimum=0)
    align = check_choice("align", align, CAUSAL_ALIGNMENTS, fn="causal_mask")
    return tq, tk, (tk - tq if align == "bottom_right" else 0)


def causal_alignment(causal, *, default: str, fn: str) -> str | None:
    """Read a ``causal`` argument: None for ``False``, ``default`` for ``True``, else the name.

    ``causal`` is a bool or one of ``CAUSAL_ALIGNMENTS`` (``"top_left"``, ``"bottom_right"``);
    ``default`` is what ``True`` means in the calling module (named in its docstring). ``fn``
    names the caller in the error raised for anything else.
    """
    default = check_choice("default", default, CAUSAL_ALIGNMENTS, fn="causal_alignment")
    if isinstance(causal, str):
        if causal not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"{fn}: `causal` must be a bool, 'top_left' or 'bottom_right', "
                             f"got {causal!r}")
        return causal
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{fn}: `causal` must be a bool, 'top_left' or 'bottom_right', got "
                        f"{causal!r} ({type(causal).__name__})")
    return default if causal else None


def fold_causal(mask, align: str | None, tq: int, tk: int, *, device=None):
    """``(mask, causal)`` for a kernel whose ``causal=True`` is top-left, from an alignment.

    ``align`` None: ``(mask, False)``; ``"top_left"``, or any alignment when ``tq == tk``:
    ``(mask, True)``; ``"bottom_right"`` with ``tq != tk``: the bottom-right
    :func:`causal_mask` folded into ``mask`` (bool: ``mask & allowed``; additive: ``-inf``
    where not allowed), and ``causal=False``. ``mask``: None, bool or additive float,
    broadcastable to ``(..., tq, tk)``; ``device``: of the folded mask (default ``mask``'s).
    """
    if align is None:
        return mask, False
    if align == "top_left" or tq == tk:
        return mask, True
    device = mask.device if mask is not None else device
    allowed = causal_mask(tq, tk, align=align, device=device)                 # (Tq, Tk)
    if mask is None or mask.dtype == torch.bool:
        return (allowed if mask is None else mask & allowed), False
    return torch.where(allowed, mask, torch.full((), float("-inf"), dtype=mask.dtype,
                                                  device=device)), False


def padding_mask(lengths, t: int) -> torch.Tensor:
    """Key-padding mask (chapter 04): key j of sequence b is real iff j < lengths[b].

    Args: lengths: ints or a 1-D integer tensor ``(B,)`` with ``0 <= lengths[b] <= t``;
    t: padded length. Returns a bool tensor ``(B, 1, 1, t)`` that broadcasts against
    ``(B, H, Tq, Tk)``.
    """
    lengths, t = _check_padding_mask(lengths, t)
    keep = torch.arange(t, device=lengths.device) < lengths[:, None]  # (B, t)
    return keep[:, None, None, :]  # (B, 1, 1, t)


def _check_padding_mask(lengths, t) -> tuple[torch.Tensor, int]:
    """``lengths`` as a 1-D integer tensor with entries in [0, t], and t as an int."""
    fn = "padding_mask"
    t = check_int("t", t, fn=fn, minimum=0)
    if isinstance(lengths, (str, bytes)) or lengths is None:
        raise TypeError(f"{fn}: `lengths` must be ints or a 1-D integer tensor, got {lengths!r:.80}")
    try:
        lengths = torch.as_tensor(lengths) if len(lengths) else torch.zeros(0, dtype=torch.long)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{fn}: `lengths` must be ints or a 1-D integer tensor, got {lengths!r:.80}") from None
    if lengths.ndim != 1 or lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"{fn}: `lengths` must be a 1-D integer sequence, got {lengths.dtype} {tuple(lengths.shape)}")
    if (lengths < 0).any() or (lengths > t).any():
        raise ValueError(f"{fn}: every entry of `lengths` must lie in [0, {t}], got {lengths.tolist()}")
    return lengths, t


def mask_to_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Turn a bool mask (True = may attend) into an additive one (0 / -inf); floats are cast to ``dtype``."""
    dtype = check_dtype("dtype", dtype, fn="mask_to_additive")
    if mask is not None:
        check_tensor("mask", mask, fn="mask_to_additive", min_ndim=0, floating=False)
        check_tensor("mask", mask, fn="mask_to_additive", min_ndim=0, floating=mask.dtype != torch.bool)
    if mask is None or mask.dtype != torch.bool:
        return None if mask is None else mask.to(dtype)
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, float("-inf"))


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Row softmax giving zeros for rows whose scores are all ``-inf`` (chapter 04).

    This is eq-ch04-softmax. On such rows a hand-written ``exp(s - max) / sum`` gives
    NaN from ``-inf - (-inf)`` (without the shift, ``exp(s) / sum`` gives 0/0); here the
    row max is replaced by 0 where it is -inf, so every exp is 0 and the denominator is
    clamped.
    Args: scores, floating ``(..., N)``.  Returns ``(..., N)`` in the same dtype
    (N = 0: empty).
    """
    check_tensor("scores", scores, fn="masked_softmax", min_ndim=1)
    # no key at all: nothing to normalise (and amax would raise)
    if scores.shape[-1] == 0:
        return scores.clone()
    m = scores.amax(dim=-1, keepdim=True)
    # fully masked row: avoid -inf - -inf
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    return p / torch.where(denom == 0, torch.ones_like(denom), denom)


# ---------------------------------------------------------------------------------------------
# Reference attention
# ---------------------------------------------------------------------------------------------

def visible_keys(mask, causal: bool, tq: int, tk: int, *, rows: slice | None = None, device=None):
    """Which keys each query may attend, as a bool tensor broadcastable to ``(..., n, Tk)``.

    A key is hidden by ``False`` in a bool mask, by ``-inf`` in an additive mask, and by
    ``causal``: ``True`` or ``"top_left"`` hides key j > query i, ``"bottom_right"`` hides
    key j > i + (Tk - Tq) (module docstring). ``rows`` restricts the query rows (a tile of them).
    """
    if rows is not None and not isinstance(rows, slice):
        raise TypeError(f"visible_keys: `rows` must be a slice or None, got {rows!r}")
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise TypeError(f"visible_keys: `mask` must be a tensor or None, got {type(mask).__name__}")
    rows = rows if rows is not None else slice(0, tq)
    i = torch.arange(tq, device=device)[rows]  # (n,)
    vis = torch.ones(len(i), tk, dtype=torch.bool, device=device)
    if causal:
        offset = tk - tq if causal == "bottom_right" else 0            # top-left: 0
        vis = torch.arange(tk, device=device)[None, :] <= i[:, None] + offset  # (n, Tk)
    if mask is not None:
        m = mask.reshape((1,) * max(0, 2 - mask.ndim) + tuple(mask.shape))  # at least (.., 1|Tq, Tk)
        m = m[..., rows, :] if m.shape[-2] != 1 else m
        vis = vis & (m if m.dtype == torch.bool else ~torch.isneginf(m))
    return vis


def has_nonfinite(t: torch.Tensor) -> bool:
    """True if ``t`` holds a NaN or inf (False for meta tensors, which hold no values)."""
    return t.device.type != "meta" and not bool(torch.isfinite(t.detach()).all())  # detach: isfinite would save t


def propagate_nonfinite(out, v, visible):
    """Give ``out`` the inf / NaN that visible non-finite entries of ``v`` put there.

    The kernels multiply by ``v`` with its non-finite entries set to 0, so that a hidden key
    (weight exactly 0) holding NaN / inf never reaches the output (0 * NaN would be NaN). This puts
    back what the maths gives for the visible ones: out[i, c] is NaN if a visible key has NaN in
    column c or both +inf and -inf, else +inf / -inf if one has that. Only called when ``v`` has a
    non-finite entry. ``visible``: bool ``(..., n, Tk)`` for the rows of ``out`` ``(..., n, Dv)``.
    """
    vis = visible.to(out.dtype)
    hits = [torch.matmul(vis, cond.to(out.dtype)) > 0 for cond in (v.isnan(), v == float("inf"), v == float("-inf"))]
    nan, pos, neg = hits
    out = out.masked_fill(pos, float("inf")).masked_fill(neg, float("-inf"))
    return out.masked_fill(nan | (pos & neg), float("nan"))


@attention_kernel
def attention_ref(q, k, v, *, mask=None, causal=False, scale=None):
    """Scaled dot-product attention, materialised (chapter 04, eq-ch04-attention).

    ``out = softmax(Q K^T * scale + M) V`` where M is 0 / -inf from ``mask`` and
    ``causal``. Computed in the input dtype (use float64 inputs for a high-precision
    reference).

    Args:
        q: ``(..., Tq, D)``; k: ``(..., Tk, D)``; v: ``(..., Tk, Dv)``.
        mask: bool (True = may attend) or additive float, broadcastable to
            ``(..., Tq, Tk)``.
        causal: also forbid key j > query i (top-left aligned, as SDPA's
            ``is_causal``; a bool). For the bottom-right alignment pass
            ``mask=causal_mask(Tq, Tk, align="bottom_right")`` instead (module
            docstring).
        scale: softmax scale, default ``1/sqrt(D)``.
    Returns:
        :class:`AttentionResult` ``(out, lse, weights)``: ``out (..., Tq, Dv)``, the row
        log-sum-exp ``lse (..., Tq)`` and ``weights (..., Tq, Tk)``. A row with no
        allowed key has ``out = 0``, ``weights = 0`` and ``lse = -inf``. A key the mask
        hides never reaches the output, even if its k or v holds NaN / inf (padding
        garbage).
        Arguments are validated by ``@attention_kernel``, which also resolves ``scale``.
    """
    tq, tk = q.shape[-2], k.shape[-2]
    # Scale q first: the unscaled Q K^T is 1/scale (sqrt(D)) times the logits and
    # overflows float16's 65504 (-> inf -> NaN in the softmax) while logits of ~1e4
    # still fit.
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., Tq, Tk)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.to(scores.dtype)  # additive (float) mask
    visible = visible_keys(mask, causal, tq, tk, device=q.device)  # (..., Tq, Tk)
    # masked_fill, not "+ (-inf)": a hidden key whose k holds NaN must give -inf, not
    # NaN + -inf = NaN.
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = masked_softmax(scores)  # (..., Tq, Tk)
    # lse is differentiable (the rule of every kernel): d lse / d score = weight. A row
    # with no allowed key gets -inf and a zero gradient (logsumexp of all -inf would
    # give NaN gradients), so its scores are replaced by 0 before the reduction.
    if tk:
        open_row = visible.any(dim=-1, keepdim=True)  # (..., Tq, 1)
        lse = torch.logsumexp(scores.masked_fill(~open_row, 0.0), dim=-1)
        lse = lse.masked_fill(~open_row[..., 0], float("-inf"))
    else:
        lse = scores.new_full(scores.shape[:-1], float("-inf"))
    if not has_nonfinite(v):
        return AttentionResult(weights @ v, lse, weights)  # (..., Tq, Dv)
    # hidden keys: weight 0 times 0, not 0 * NaN
    out = weights @ v.masked_fill(~torch.isfinite(v.detach()), 0.0)
    return AttentionResult(propagate_nonfinite(out, v, visible), lse, weights)
