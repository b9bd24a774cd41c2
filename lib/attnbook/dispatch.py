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

__all__ = ["BACKENDS", "Backend", "attention", "auto_backend", "available_backends", "choose_backend",
           "register_backend"]


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
_ref_body = as_backend(attention_ref)


def _ref(q, k, v, mask, causal, scale):
    """``attention_ref`` with float16/bfloat16 inputs computed in float32 and the result cast back.

    Its scores are materialised in the input dtype: float16 logits past 65504 (~1e5) became inf
    and the softmax NaN, where ``tiled`` and ``sdpa`` (which compute in float32) are right.
    """
    low = q.dtype in (torch.float16, torch.bfloat16)
    if not low:
        return _ref_body(q, k, v, mask, causal, scale)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    return _ref_body(q.float(), k.float(), v.float(), mask, causal, scale).to(q.dtype)


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


AUTO_TRITON_DTYPES = (torch.float16, torch.bfloat16)  # float32: see auto_backend


def auto_backend(q, k, v, mask, causal=None) -> str:
    """``"triton"`` for 16-bit CUDA inputs it supports, once past its first-use check.

    Otherwise ``"tiled"``. float32 stays on ``"tiled"`` under ``auto``: the fp32 Triton
    kernel uses IEEE products on CUDA cores (no TF32) and has never been benchmarked, so
    nothing says it is faster; ``backend="triton"`` still runs it on request.

    The check (:func:`attnbook.trust.trusted`) runs once per process and kind of call
    (device, dtype, head dims, causal, masked, backward) on what such calls run
    (:func:`_under_check`); a kind that fails warns once and gets ``"tiled"`` from then
    on. ``causal=None`` (not known here) needs both kinds to pass. The arguments are
    taken as validated (:func:`choose_backend` checks them); chapter 09 shows this
    function (its old name ``_choose`` is kept as an alias).
    """
    if not (q.is_cuda and q.dtype in AUTO_TRITON_DTYPES
            and _supports("triton", q, k, v, mask)[0]):
        return "tiled"
    return "triton" if trust.trusted(q, k, v, mask, causal, _under_check) else "tiled"


_choose = auto_backend  # the name chapter 09 showed before issue 30


def _supports(name, q, k, v, mask) -> tuple[bool, str]:
    """``BACKENDS[name].supports(q, k, v, mask)``, held to its contract: a ``(bool, str)`` pair."""
    got = BACKENDS[name].supports(q, k, v, mask)
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], bool)
            and isinstance(got[1], str)):
        raise TypeError(f"attention: backend {name!r}'s supports() must return a pair (ok: bool, "
                        f"why: str), got {got!r:.80}")
    return got


def _check_result(name, out, q, k, v, mask) -> torch.Tensor:
    """A backend's ``out``, checked: a tensor of the input's dtype and device, shape (..., Tq, Dv)."""
    lead = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    if mask is not None and mask.dim() > 2:
        lead.append(mask.shape[:-2])
    want = (*torch.broadcast_shapes(*lead), q.shape[-2], v.shape[-1])
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"attention: backend {name!r} returned {type(out).__name__}, expected a tensor "
                        f"of shape {want}")
    if tuple(out.shape) != want or out.dtype != q.dtype or out.device != q.device:
        raise RuntimeError(f"attention: backend {name!r} returned shape {tuple(out.shape)}, "
                           f"{out.dtype} on {out.device}; expected {want}, {q.dtype} on {q.device}")
    return out


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
    return auto_backend(q, k, v, mask, causal)


def available_backends(q, k, v, mask=None) -> list[str]:
    """The registered backends that can run these arguments on this machine, in registry order.

    Raises TypeError / ValueError for arguments no backend accepts (as :func:`attention` does).
    """
    check_attention_args(q, k, v, mask, fn="available_backends")
    return [name for name in BACKENDS if _supports(name, q, k, v, mask)[0]]


def attention(q, k, v, *, mask=None, causal=False, scale=None, backend: str = "auto"):
    """Scaled dot-product attention through the chosen backend (chapter 04, eq-ch04-attention).

    ``out = softmax(Q K^T * scale + M) V``; rows with no allowed key give 0.

    Args:
        q: ``(..., Tq, D)``; k: ``(..., Tk, D)``; v: ``(..., Tk, Dv)``.
        mask: bool (True = may attend) or additive float, broadcastable to ``(..., Tq, Tk)``;
            a float mask may require grad (a learned bias: "ref", "tiled", "sdpa" return its
            gradient). An additive mask holding ``+inf`` is a ValueError in every backend (it
            has no softmax: the backends used to disagree, NaN or one key's value).
        causal: forbid key j > query i (top-left aligned when ``Tq != Tk``).
        scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"auto"`` or a name in :data:`BACKENDS` (``"ref"``, ``"tiled"``, ``"triton"``,
            ``"sdpa"``, and any registered with :func:`register_backend`).
    Returns:
        ``out`` of shape ``(..., Tq, Dv)`` in the input dtype, differentiable in every backend.
    Raises:
        TypeError / ValueError for bad arguments (naming the argument and what was seen);
        RuntimeError for an explicit backend that cannot serve these arguments, saying why, and
        for a backend that returns something other than a tensor of shape ``(..., Tq, Dv)`` in
        the inputs' dtype and device (every backend's result is checked); TypeError for a
        registered ``supports`` that returns anything but an ``(ok, why)`` pair.

    float16/bfloat16: every backend computes in float32 and returns the input dtype ("ref"
    included: its materialised float16 scores overflowed past 65504).

    The log-sum-exp: ``attention`` returns ``out`` only. The kernels behind it return
    ``AttentionResult(out, lse, weights)``, and the one rule for their ``lse`` is that it is
    differentiable (a loss on it sends gradients to q, k and a float mask) in
    ``attention_ref``, ``attention_tiled`` and ``attention_triton``.
    """
    check_choice("backend", backend, ("auto", *BACKENDS), fn="attention")
    scale = check_attention_args(q, k, v, mask, scale, fn="attention")
    causal = check_bool("causal", causal, fn="attention")
    if mask is not None and mask.dtype != torch.bool and bool(torch.isposinf(mask.detach()).any()):
        raise ValueError("attention: an additive float `mask` must not hold +inf (no softmax is "
                         "defined for it; use a bool mask or -inf to hide keys, finite values to bias)")
    if backend == "auto":
        backend = auto_backend(q, k, v, mask, causal)
    ok, why = _supports(backend, q, k, v, mask)
    if not ok:
        raise RuntimeError(f"attention: backend {backend!r} cannot serve these arguments: {why}")
    return _check_result(backend, BACKENDS[backend].fn(q, k, v, mask, causal, scale), q, k, v, mask)
