"""``attnbook.attention``: one entry point for every attention backend (chapters 04 and 09).

Backends, all returning the same ``out`` for the same arguments:

- ``"ref"``: :func:`attnbook.attention.attention_ref`, materialises the ``Tq x Tk`` weights;
- ``"tiled"``: :func:`attnbook.flash.attention_tiled`, exact, tile by tile, O(T) extra memory;
- ``"triton"``: :func:`attnbook.triton_flash.attention_triton`, a fused Triton kernel (CUDA, or
  CPU under ``TRITON_INTERPRET=1``); serves ``(B, H, T, D)`` inputs with no mask or a key-padding mask;
- ``"sdpa"``: PyTorch's ``scaled_dot_product_attention``, used as an oracle.

``"auto"`` picks ``"triton"`` when the inputs are on a CUDA device, Triton is installed and the
kernel supports the dtype / head dim / mask (see :func:`choose_backend`), and ``"tiled"``
otherwise, so it never picks something that fails.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_attention_args
from .attention import attention_ref, causal_mask
from .flash import attention_tiled

__all__ = ["BACKENDS", "attention", "available_backends", "choose_backend", "triton_status"]

BACKENDS = ("auto", "ref", "tiled", "triton", "sdpa")


def _key_padding_view(mask, q):
    """``mask`` as a 4-D ``(B|1, H|1, 1, Tk)`` bool view if it is a key-padding mask, else None.

    The dispatcher's masks broadcast to ``(..., Tq, Tk)``, so a 2-D mask means ``(Tq, Tk)``; the
    Triton kernel also reads a 2-D bool mask as ``(B, Tk)``. Normalising here removes the
    ambiguity: only masks whose query dim is 1 are handed to the kernel, always as 4-D.
    """
    if mask is None:
        return None
    if mask.dtype != torch.bool or q.ndim != 4 or mask.ndim > 4:
        return None
    m = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    return m if m.shape[-2] == 1 else None


def triton_status(q, k, v, mask=None) -> tuple[bool, str]:
    """``(True, "")`` if the Triton kernel can serve these arguments here, else ``(False, why)``."""
    try:
        from . import triton_flash
    except Exception as exc:  # pragma: no cover - import guarded inside the module itself
        return False, f"attnbook.triton_flash could not be imported: {exc}"
    if mask is not None and _key_padding_view(mask, q) is None:
        return False, (
            f"the Triton backend takes only a boolean key-padding mask broadcastable as (B, H, 1, Tk) "
            f"on (B, H, T, D) inputs; got a {mask.dtype} mask of shape {tuple(mask.shape)}"
        )
    return triton_flash.triton_support(q, k, v, _key_padding_view(mask, q))


def choose_backend(q, k, v, mask=None) -> str:
    """The backend ``"auto"`` uses: ``"triton"`` on CUDA when it can serve, else ``"tiled"``.

    Raises TypeError / ValueError for arguments no backend accepts (as :func:`attention` does).
    """
    check_attention_args(q, k, v, mask, fn="choose_backend")
    if q.is_cuda and triton_status(q, k, v, mask)[0]:
        return "triton"
    return "tiled"


def available_backends(q, k, v, mask=None) -> list[str]:
    """The explicit backends that can run these arguments on this machine (a subset of ``BACKENDS``).

    Raises TypeError / ValueError for arguments no backend accepts (as :func:`attention` does).
    """
    check_attention_args(q, k, v, mask, fn="available_backends")
    names = ["ref", "tiled", "sdpa"]
    if triton_status(q, k, v, mask)[0]:
        names.insert(2, "triton")
    return names


def _sdpa(q, k, v, mask, causal, scale):
    tq, tk = q.shape[-2], k.shape[-2]
    if mask is not None:  # SDPA indexes dim -2 of its mask: a (Tk,) or 0-d mask becomes (1, Tk) / (1, 1)
        mask = mask.reshape((1,) * max(0, 2 - mask.ndim) + tuple(mask.shape))
    attn_mask = mask
    if causal and mask is not None:
        # SDPA refuses attn_mask together with is_causal: fold the causal mask in ourselves.
        cm = causal_mask(tq, tk, device=q.device)
        if mask.dtype == torch.bool:
            attn_mask = mask & cm
        else:
            attn_mask = mask.masked_fill(~cm, float("-inf"))
        causal = False
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    if attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    # Fully masked rows: make the zero policy explicit, whatever SDPA's kernel does. Such a row is
    # opened to every key before the call (a finite dummy; some SDPA kernels, e.g. the math one
    # before torch 2.5, return NaN there, and NaN * 0 would leak NaN into every gradient) and
    # zeroed after it, so it gets zero output and zero gradients.
    allowed = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
    row_ok = allowed.expand(*q.shape[:-1], tk).any(dim=-1, keepdim=True)  # (..., Tq, 1)
    if not bool(row_ok.all()):
        open_row = True if attn_mask.dtype == torch.bool else 0.0  # every key allowed
        attn_mask = torch.where(row_ok, attn_mask, open_row)  # (..., Tq, Tk)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale)
    return out.masked_fill(~row_ok, 0.0)


def attention(q, k, v, *, mask=None, causal=False, scale=None, backend: str = "auto"):
    """Scaled dot-product attention through the chosen backend (chapter 04, eq. 10).

    ``out = softmax(Q K^T * scale + M) V``; rows with no allowed key give 0.

    Args:
        q: ``(..., Tq, D)``; k: ``(..., Tk, D)``; v: ``(..., Tk, Dv)``.
        mask: bool (True = may attend) or additive float, broadcastable to ``(..., Tq, Tk)``;
            a float mask may require grad (a learned bias: "ref", "tiled", "sdpa" return its gradient).
        causal: forbid key j > query i (top-left aligned when ``Tq != Tk``).
        scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"auto"``, ``"ref"``, ``"tiled"``, ``"triton"`` or ``"sdpa"``.
    Returns:
        ``out`` of shape ``(..., Tq, Dv)`` in the input dtype, differentiable in every backend.
    Raises:
        TypeError / ValueError for bad arguments (naming the argument and what was seen);
        RuntimeError for ``backend="triton"`` where the kernel cannot serve, saying why.
    """
    if backend not in BACKENDS:
        raise ValueError(f"attention: unknown `backend` {backend!r}; choose one of {BACKENDS}")
    scale = check_attention_args(q, k, v, mask, scale, fn="attention")
    if not isinstance(causal, bool):
        raise TypeError(f"attention: `causal` must be a bool, got {causal!r}")
    if backend == "auto":
        backend = choose_backend(q, k, v, mask)
    if backend == "ref":
        return attention_ref(q, k, v, mask=mask, causal=causal, scale=scale)[0]
    if backend == "tiled":
        return attention_tiled(q, k, v, mask=mask, causal=causal, scale=scale)[0]
    if backend == "sdpa":
        return _sdpa(q, k, v, mask, causal, scale)
    ok, why = triton_status(q, k, v, mask)
    if not ok:
        raise RuntimeError(f"attention: backend 'triton' cannot serve these arguments: {why}")
    from .triton_flash import attention_triton

    return attention_triton(q, k, v, mask=_key_padding_view(mask, q), causal=causal, scale=scale)[0]
