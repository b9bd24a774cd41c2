"""The library's shared argument validators and their one message format.

Each helper raises ``TypeError`` for a value of the wrong kind and ``ValueError`` for a value of
the right kind out of range, with the message ``"{fn}: `{name}` must be ..., got ..."``, so the
same mistake reads the same in every module. Python and numpy scalars are treated alike
(``numpy.int64(3)`` is an int, ``numpy.float32(0.5)`` a float; bools are neither).

Modules compose these helpers; a function a chapter shows with ``show_source`` keeps its checks
out of its body, in one ``_check_<function>(...)`` call at the top (or, for the attention
kernels, in the ``@attention_kernel`` decorator below), so the code the reader sees is the maths.
"""
from __future__ import annotations

import functools
import math
import operator

import numpy as np
import torch

__all__ = [
    "as_backend",
    "attention_kernel",
    "check_attention_args",
    "check_bool",
    "check_bool_mask",
    "check_choice",
    "check_device",
    "check_dtype",
    "check_even_dim",
    "check_float",
    "check_int",
    "check_query_key",
    "check_scale",
    "check_src_mask",
    "check_tensor",
    "check_tokens",
    "describe",
]


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


def check_bool(name: str, value, *, fn: str) -> bool:
    """Validate a flag: a Python or numpy bool (not 0/1, not None)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{fn}: `{name}` must be a bool, got {value!r} ({type(value).__name__})")


def check_float(name: str, value, *, fn: str, minimum: float | None = None, maximum: float | None = None,
                inclusive: bool = True) -> float:
    """Validate a finite real number (Python/numpy int or float, not bool) within optional bounds.

    ``inclusive`` says whether the bounds themselves are allowed.  Returns it as a Python float.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: `{name}` must be a finite number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{fn}: `{name}` must be a finite number, got {value!r}")
    lo_bad = minimum is not None and (value < minimum if inclusive else value <= minimum)
    hi_bad = maximum is not None and (value > maximum if inclusive else value >= maximum)
    if lo_bad or hi_bad:
        lo = "-inf" if minimum is None else f"{minimum:g}"
        hi = "inf" if maximum is None else f"{maximum:g}"
        interval = f"[{lo}, {hi}]" if inclusive else f"({lo}, {hi})"
        raise ValueError(f"{fn}: `{name}` must lie in {interval}, got {value!r}")
    return value


def check_choice(name: str, value, choices, *, fn: str):
    """Validate that ``value`` is one of ``choices`` (e.g. ``"tanh"`` among the nonlinearities)."""
    choices = tuple(choices)
    try:
        ok = bool(value in choices)
    except (TypeError, ValueError):  # unhashable / incomparable value (a numpy array's ambiguous ==)
        ok = False
    if not ok:
        raise ValueError(f"{fn}: `{name}` must be one of {choices}, got {value!r}")
    return value


def check_dtype(name: str, dtype, *, fn: str) -> torch.dtype:
    """A floating ``torch.dtype``, or None for PyTorch's default; returns the dtype that will be used
    (``torch.get_default_dtype()`` for None), so a caller may also ignore the result."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: `{name}` must be a floating torch.dtype (float16/bfloat16/float32/"
                        f"float64) or None, got {dtype!r}")
    return dtype


def check_device(name: str, device, *, fn: str):
    """A device torch can name (``None``, ``"cpu"``, ``torch.device(...)``, an index); returned as given."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"{fn}: `{name}` must be a torch.device, a device string or None, got {device!r}")
    try:
        torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        raise (TypeError if not isinstance(device, (str, int)) else ValueError)(
            f"{fn}: `{name}` must be a torch.device, a device string such as 'cpu' or None, "
            f"got {device!r}") from None
    return device


def check_even_dim(name: str, value, *, fn: str) -> int:
    """An even feature size >= 2 (dims that come in pairs: (sin, cos), rotation planes)."""
    value = check_int(name, value, fn=fn, minimum=2)
    if value % 2:
        raise ValueError(f"{fn}: `{name}` must be even (dims come in pairs), got {value}")
    return value


def check_tokens(name: str, t, vocab_size: int, *, fn: str, ndim: int = 2, allow_empty: bool = False) -> None:
    """Token ids: a ``torch.long`` tensor with ``ndim`` dims (default ``(B, T)``), ids in ``[0, vocab_size)``."""
    if isinstance(t, (list, tuple)):
        raise TypeError(f"{fn}: `{name}` must be a torch.Tensor of token ids (torch.long), got a "
                        f"{type(t).__name__}; wrap it in torch.tensor(...)")
    check_tensor(name, t, fn=fn, min_ndim=ndim, floating=False)
    if t.ndim != ndim or t.dtype != torch.long:
        shape = " (B, T)" if ndim == 2 else ""
        raise TypeError(f"{fn}: `{name}` must be a {ndim}-D torch.long tensor{shape} of token ids, got {describe(t)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{fn}: `{name}` must be non-empty, got shape {tuple(t.shape)}")
    if t.numel() and (bool((t < 0).any()) or bool((t >= vocab_size).any())):
        raise ValueError(f"{fn}: `{name}` must hold ids in [0, {vocab_size}), "
                         f"got min {int(t.min())}, max {int(t.max())}")


def check_src_mask(src: torch.Tensor, src_mask, *, fn: str) -> None:
    """A right-padded source mask: bool, ``src``'s shape ``(B, S)``, True for the first lengths[b] >= 1 tokens."""
    check_tensor("src_mask", src_mask, fn=fn, min_ndim=2, floating=False)
    if src_mask.dtype != torch.bool:
        raise TypeError(f"{fn}: `src_mask` must be a bool tensor (True = real token), "
                        f"got dtype {src_mask.dtype}")
    if src_mask.shape != src.shape:
        raise ValueError(f"{fn}: `src_mask` must have src's shape {tuple(src.shape)}, "
                         f"got {tuple(src_mask.shape)}")
    if not src_mask[:, 0].all():
        raise ValueError(f"{fn}: every source sentence needs at least one real token "
                         f"(`src_mask[:, 0]` must be True)")
    if (src_mask[:, 1:] & ~src_mask[:, :-1]).any():
        raise ValueError(f"{fn}: `src_mask` must be right-padded: True for the first lengths[b] "
                         f"positions, then False")


def check_bool_mask(name: str, mask, *, fn: str, square: bool = False) -> None:
    """A bool mask tensor (True = may attend); ``square``: exactly ``(T, T)``."""
    check_tensor(name, mask, fn=fn, floating=False)
    if mask.dtype != torch.bool:
        raise TypeError(f"{fn}: `{name}` must be a bool tensor (True = may attend), got {describe(mask)}")
    if square and (mask.ndim != 2 or mask.shape[0] != mask.shape[1]):
        raise ValueError(f"{fn}: `{name}` must be a square (T, T) mask, got shape {tuple(mask.shape)}")


def check_query_key(q, k, *, fn: str, params=()) -> None:
    """q ``(..., Tq, D)``, k ``(..., Tk, D')`` (and named weight tensors ``params``): floating,
    of q's dtype and device, with leading (batch) dims that broadcast."""
    check_tensor("q", q, fn=fn, min_ndim=2)
    check_tensor("k", k, fn=fn, min_ndim=2)
    for name, t in (("k", k), *params):
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{fn}: `{name}` must have q's dtype and device ({q.dtype}, {q.device}), "
                            f"got {t.dtype}, {t.device}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise ValueError(f"{fn}: the leading (batch) dims of q {tuple(q.shape)} and k {tuple(k.shape)} "
                         f"do not broadcast") from None


def check_scale(scale, d: int, *, fn: str) -> float:
    """Resolve the softmax scale: ``1/sqrt(d)`` for None, else a finite number > 0 (as a float)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    return check_float("scale", scale, fn=fn, minimum=0.0, inclusive=False)


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


def attention_kernel(kernel):
    """Decorator for an attention kernel ``kernel(q, k, v, *, mask, causal, scale, ...)``.

    The wrapper validates ``q, k, v, mask, causal, scale`` (naming the kernel in every message)
    and calls the kernel with ``scale`` resolved to a float and ``causal`` to a bool, so the
    kernel's body is only the mathematics. ``kernel.__wrapped__`` is the unchecked body: the
    dispatcher, which has validated the arguments once already, calls that.
    """
    name = kernel.__name__

    @functools.wraps(kernel)
    def checked(q, k, v, *, mask=None, causal=False, scale=None, **options):
        scale = check_attention_args(q, k, v, mask, scale, fn=name)
        causal = check_bool("causal", causal, fn=name)
        return kernel(q, k, v, mask=mask, causal=causal, scale=scale, **options)

    return checked


def as_backend(kernel, **options):
    """An ``@attention_kernel`` function in the backend registry's form ``fn(q, k, v, mask, causal, scale) -> out``.

    It calls the unchecked body (``kernel.__wrapped__``, with ``options``): the dispatcher and the
    first-use check have validated the arguments already.
    """
    body = kernel.__wrapped__

    def backend(q, k, v, mask, causal, scale):
        return body(q, k, v, mask=mask, causal=causal, scale=scale, **options).out

    backend.__name__ = backend.__qualname__ = f"{kernel.__name__}_backend"
    return backend
