"""Input validation shared by every attention backend.

Every public function in the library validates its arguments here, so that bad input gets a
clear exception naming the argument and what was seen, instead of a deep PyTorch traceback or
a silently wrong answer.
"""
from __future__ import annotations

import math
import operator

import torch

__all__ = ["check_attention_args", "check_block", "check_int", "check_scale", "check_tensor", "describe"]


def describe(t: torch.Tensor) -> str:
    """A short ``shape/dtype/device`` description used in error messages."""
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t, *, fn: str = "attention", min_ndim: int = 1, floating: bool = True) -> None:
    """Raise if ``t`` is not a tensor with at least ``min_ndim`` dims (and a floating dtype)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim < min_ndim:
        raise ValueError(f"{fn}: `{name}` must have at least {min_ndim} dims, got {describe(t)}")
    if floating and not t.dtype.is_floating_point:
        raise TypeError(
            f"{fn}: `{name}` must have a floating dtype (float16/bfloat16/float32/float64), got {describe(t)}"
        )


def check_block(name: str, value, *, fn: str = "attention") -> int:
    """Validate a tile size: a Python int >= 1 (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}: `{name}` must be an int >= 1, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{fn}: `{name}` must be >= 1, got {value}")
    return value


def check_int(name: str, value, *, fn: str, minimum: int = 1) -> int:
    """Validate an integer argument (Python or numpy int, not bool) that must be >= ``minimum``."""
    if isinstance(value, bool):
        raise TypeError(f"{fn}: `{name}` must be an int >= {minimum}, got a bool ({value!r})")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: `{name}` must be an int >= {minimum}, got {value!r} ({type(value).__name__})") from None
    if value < minimum:
        raise ValueError(f"{fn}: `{name}` must be an int >= {minimum}, got {value}")
    return value


def check_scale(scale, d: int, *, fn: str) -> float:
    """Resolve the softmax scale: ``1/sqrt(d)`` for None, else a finite number > 0 (as a float)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{fn}: `scale` must be a float or None, got {scale!r}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{fn}: `scale` must be finite and > 0, got {scale!r}")
    return float(scale)


def _broadcastable(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target)):
        if s != 1 and s != t:
            return False
    return True


def check_attention_args(q, k, v, mask=None, scale=None, *, fn: str = "attention") -> float:
    """Validate the arguments of an attention call and return the resolved softmax scale.

    Checks: q, k, v are floating tensors of one dtype on one device with ndim >= 2; their
    leading (batch) dims are equal; ``q`` and ``k`` share the feature dim D; ``k`` and ``v``
    share the key length Tk; ``mask`` (bool: True = may attend, or floating: additive) broadcasts
    to ``(..., Tq, Tk)``; ``scale`` is a finite positive number (default ``1/sqrt(D)``).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, fn=fn, min_ndim=2)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{fn}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(
            f"{fn}: q, k, v must have the same number of dims, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"{fn}: q, k, v must share their leading (batch, head) dims, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{fn}: q and k must have the same feature dim D, got q {tuple(q.shape)} (D={q.shape[-1]}) "
            f"and k {tuple(k.shape)} (D={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{fn}: k and v must have the same length Tk, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"{fn}: the feature dim D must be >= 1, got q {tuple(q.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{fn}: `mask` must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
            raise TypeError(
                f"{fn}: `mask` must be bool (True = may attend) or floating (additive), got {describe(mask)}"
            )
        if mask.device != q.device:
            raise ValueError(f"{fn}: `mask` is on {mask.device} but q is on {q.device}")
        target = tuple(q.shape[:-1]) + (k.shape[-2],)
        if not _broadcastable(tuple(mask.shape), target):
            raise ValueError(
                f"{fn}: `mask` of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
                f"{target} = (..., Tq, Tk)"
            )
    return check_scale(scale, q.shape[-1], fn=fn)
