"""``attnbook.attention``: one entry point for every attention backend (chapters 04 and 09).

The backends live in one registry, :data:`BACKENDS`: ``{name: Backend(fn, supports)}``.
``attention``, :func:`choose_backend`, :func:`available_backends` and ``attnbook.bench`` all
read it, so adding a backend (chapter 09's, or a reader's own) is one call to
:func:`register_backend`. Built in, all returning the same ``out`` for the same arguments:

- ``"ref"``: :func:`attnbook.reference.attention_ref`, materialises the ``Tq x Tk`` weights;
- ``"tiled"``: :func:`attnbook.flash.attention_tiled`, exact, tile by tile, O(T) extra memory;
- ``"triton"``: :func:`attnbook.triton_flash.attention_triton`, a fused Triton kernel (CUDA, or
  CPU under ``TRITON_INTERPRET=1``); serves ``(B, H, T, D)`` inputs with no mask or a key-padding mask;
- ``"sdpa"``: PyTorch's ``scaled_dot_product_attention``, used as an oracle. It keeps torch's own
  behaviour for NaN / inf in keys and values that the mask hides (see :func:`_sdpa`); the other
  backends never let a hidden key reach the output.

``"auto"`` picks ``"triton"`` when the inputs are on a CUDA device, the Triton kernel supports
them and has passed its first-use check for that kind of call (:mod:`attnbook.trust`; see
:func:`choose_backend`), and ``"tiled"`` otherwise, so it never picks something that fails.
Arguments are validated once per call, here; backends receive validated arguments.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import trust
from ._checks import as_backend, check_attention_args, check_bool, check_choice
from ._policy import at_least_2d
from .flash import attention_tiled
from .reference import attention_ref, causal_mask

__all__ = ["BACKENDS", "Backend", "attention", "available_backends", "choose_backend", "register_backend"]


class Backend(NamedTuple):
    """One registry entry.

    ``fn(q, k, v, mask, causal, scale) -> out`` receives validated arguments (``scale`` resolved
    to a float); ``supports(q, k, v, mask) -> (ok, why)`` says whether it can serve them here.
    """

    fn: Callable
    supports: Callable


def _always(q, k, v, mask):
    return True, ""


# The kernels' unchecked bodies: attention() has validated the arguments already.
_ref = as_backend(attention_ref)
_tiled = as_backend(attention_tiled)


def _sdpa(q, k, v, mask, causal, scale):
    """PyTorch's SDPA with this library's zero policy for fully masked rows made explicit."""
    tq, tk = q.shape[-2], k.shape[-2]
    if mask is not None:  # SDPA indexes dim -2 of its mask: a (Tk,) or 0-d mask becomes (1, Tk) / (1, 1)
        mask = at_least_2d(mask)
    attn_mask = mask
    if causal and mask is not None:
        # SDPA refuses attn_mask together with is_causal: fold the causal mask in ourselves.
        cm = causal_mask(tq, tk, device=q.device)
        attn_mask = mask & cm if mask.dtype == torch.bool else mask.masked_fill(~cm, float("-inf"))
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


def _triton(q, k, v, mask, causal, scale, blocks=None):
    """The built-in Triton kernel (imported on first use); ``blocks`` fixes its tiles (see _under_check)."""
    from .triton_flash import attention_triton

    return as_backend(attention_triton, blocks=blocks)(q, k, v, mask, causal, scale)


def _triton_supports(q, k, v, mask):
    try:
        from .triton_flash import triton_support
    except Exception as exc:  # pragma: no cover - the module guards its own triton import
        return False, f"attnbook.triton_flash could not be imported: {exc}"
    return triton_support(q, k, v, mask)


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, fn: Callable, supports: Callable | None = None) -> None:
    """Add (or replace) a backend: ``attention(..., backend=name)`` then calls ``fn``.

    Args:
        name: a new name (not ``"auto"``).
        fn: ``fn(q, k, v, mask, causal, scale) -> out`` on validated arguments.
        supports: ``supports(q, k, v, mask) -> (ok, why)``; default: always supported.
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"register_backend: `name` must be a non-empty str other than 'auto', got {name!r}")
    for arg, f in (("fn", fn), ("supports", supports)):
        if f is not None and not callable(f):
            raise TypeError(f"register_backend: `{arg}` must be callable, got {type(f).__name__}")
    BACKENDS[name] = Backend(fn, supports or _always)


register_backend("ref", _ref)
register_backend("tiled", _tiled)
register_backend("triton", _triton, _triton_supports)
register_backend("sdpa", _sdpa)


AUTO_TRITON_DTYPES = (torch.float16, torch.bfloat16)  # float32: see _choose


def _choose(q, k, v, mask, causal=None) -> str:
    """``"triton"`` for 16-bit CUDA inputs it supports, once past its first-use check.

    Otherwise ``"tiled"``. float32 stays on ``"tiled"`` under ``auto``: the fp32 Triton
    kernel uses IEEE products on CUDA cores (no TF32) and has never been benchmarked, so
    nothing says it is faster; ``backend="triton"`` still runs it on request.

    The check (:func:`attnbook.trust.trusted`) runs once per process and kind of call
    (device, dtype, head dims, causal, masked, backward) on what such calls run
    (:func:`_under_check`); a kind that fails warns once and gets ``"tiled"`` from then
    on. ``causal=None`` (not known here) needs both kinds to pass.
    """
    if not (q.is_cuda and q.dtype in AUTO_TRITON_DTYPES
            and BACKENDS["triton"].supports(q, k, v, mask)[0]):
        return "tiled"
    return "triton" if trust.trusted(q, k, v, mask, causal, _under_check) else "tiled"


def _under_check(dtype) -> dict:
    """The kernels the first-use check runs for ``dtype``: ``{label: fn(q, k, v, mask, causal, scale)}``.

    A kernel registered as ``"triton"`` by the reader: as it is. The built-in one: once per tile
    configuration it can run in ``dtype`` (:func:`attnbook.triton_flash.tile_configs`: every
    entry of the autotuning lists, or the float32 tile), each with fixed tiles, warps and stages.
    """
    fn = BACKENDS["triton"].fn
    if fn is not _triton:
        return {"the registered 'triton' kernel": fn}
    from .triton_flash import tile_configs

    configs, kernels = tile_configs(dtype), {}
    for i, config in enumerate(configs):
        tiles = ", ".join(f"{name} {bq}x{bk}/{w} warps/{s} stages" for name, (bq, bk, w, s) in config.items())
        kernels[f"tile config {i + 1} of {len(configs)} ({tiles})"] = functools.partial(_triton, blocks=config)
    return kernels


def choose_backend(q, k, v, mask=None, *, causal=None) -> str:
    """The backend ``"auto"`` uses: ``"triton"`` for 16-bit CUDA inputs it can serve, else ``"tiled"``.

    ``causal`` (a bool, or None for "either") selects which self-check verdict applies on CUDA.
    Raises TypeError / ValueError for arguments no backend accepts (as :func:`attention` does).
    """
    check_attention_args(q, k, v, mask, fn="choose_backend")
    if causal is not None:
        causal = check_bool("causal", causal, fn="choose_backend")
    return _choose(q, k, v, mask, causal)


def available_backends(q, k, v, mask=None) -> list[str]:
    """The registered backends that can run these arguments on this machine, in registry order.

    Raises TypeError / ValueError for arguments no backend accepts (as :func:`attention` does).
    """
    check_attention_args(q, k, v, mask, fn="available_backends")
    return [name for name, b in BACKENDS.items() if b.supports(q, k, v, mask)[0]]


def attention(q, k, v, *, mask=None, causal=False, scale=None, backend: str = "auto"):
    """Scaled dot-product attention through the chosen backend (chapter 04, eq-ch04-attention).

    ``out = softmax(Q K^T * scale + M) V``; rows with no allowed key give 0.

    Args:
        q: ``(..., Tq, D)``; k: ``(..., Tk, D)``; v: ``(..., Tk, Dv)``.
        mask: bool (True = may attend) or additive float, broadcastable to ``(..., Tq, Tk)``;
            a float mask may require grad (a learned bias: "ref", "tiled", "sdpa" return its gradient).
        causal: forbid key j > query i (top-left aligned when ``Tq != Tk``).
        scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"auto"`` or a name in :data:`BACKENDS` (``"ref"``, ``"tiled"``, ``"triton"``,
            ``"sdpa"``, and any registered with :func:`register_backend`).
    Returns:
        ``out`` of shape ``(..., Tq, Dv)`` in the input dtype, differentiable in every backend.
    Raises:
        TypeError / ValueError for bad arguments (naming the argument and what was seen);
        RuntimeError for an explicit backend that cannot serve these arguments, saying why.
    """
    check_choice("backend", backend, ("auto", *BACKENDS), fn="attention")
    scale = check_attention_args(q, k, v, mask, scale, fn="attention")
    causal = check_bool("causal", causal, fn="attention")
    if backend == "auto":
        backend = _choose(q, k, v, mask, causal)
    entry = BACKENDS[backend]
    ok, why = entry.supports(q, k, v, mask)
    if not ok:
        raise RuntimeError(f"attention: backend {backend!r} cannot serve these arguments: {why}")
    return entry.fn(q, k, v, mask, causal, scale)
