"""Test fixtures shared by the library's tests and the chapters (production code never imports it).

Seeded random tensors and weights (``rand``, ``qkv``, ``make_mask``, ``randomize``), a masked
log-sum-exp oracle (``lse_ref``, ``assert_lse``), ``import_triton_flash`` and the CPU backend
names. The tolerance rule lives in :mod:`attnbook.tolerance`; its names (``F64_TOL``,
``assert_close_to_reference``, ``fa_rounding_margin``, ``max_abs_error``, ``relative_error``,
``rounding_step``) are re-exported here because the tests and chapters 01, 05 and 07-11 import
them from ``attnbook.testing``.
"""
from __future__ import annotations

import os

import torch

from ._checks import check_choice, check_int
from .tolerance import (  # re-exported: tests and chapters import them from here
    F64_TOL, assert_close_to_reference, fa_rounding_margin, max_abs_error, relative_error,
    rounding_step,
)

__all__ = [
    "assert_close_to_reference", "fa_rounding_margin", "max_abs_error", "rounding_step", "relative_error",
    "F64_TOL", "CPU_BACKENDS", "rand", "randomize", "qkv", "make_mask", "lse_ref", "assert_lse", "import_triton_flash",
]

CPU_BACKENDS = ("ref", "tiled", "sdpa")  # the explicit backends every CPU machine runs


# ------------------------------------------------------------------ shared test helpers
NEG_INF = float("-inf")


def rand(*shape, dtype=torch.float64, seed=0, scale=1.0):
    """Standard normal tensor from its own seeded generator (never the global RNG state)."""
    shape = [check_int(f"shape[{i}]", n, fn="rand", minimum=0) for i, n in enumerate(shape)]
    g = torch.Generator().manual_seed(check_int("seed", seed, fn="rand", minimum=0))
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def randomize(module, seed=0, scale=0.5):
    """Every parameter of ``module`` drawn from ``scale * N(0, 1)`` (biases and LayerNorm gains too),
    so a test that copies weights between implementations fails if one parameter is missed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def qkv(b=2, h=3, tq=7, tk=9, d=5, dv=4, *, dtype=torch.float64, seed=0, scale=1.0):
    """q ``(b, h, tq, d)``, k ``(b, h, tk, d)`` (both times ``scale``), v ``(b, h, tk, dv)``."""
    return (rand(b, h, tq, d, dtype=dtype, seed=seed, scale=scale),
            rand(b, h, tk, d, dtype=dtype, seed=seed + 1, scale=scale),
            rand(b, h, tk, dv, dtype=dtype, seed=seed + 2))


def make_mask(kind, b, h, tq, tk, seed=0):
    """None, a random bool mask (True = attend) or an additive float mask with some -inf, ``(b, 1, tq, tk)``."""
    check_choice("kind", kind, (None, "bool", "float"), fn="make_mask")
    if kind is None:
        return None
    g = torch.Generator().manual_seed(seed + 10)
    keep = torch.rand(b, 1, tq, tk, generator=g) > 0.3  # broadcast over heads
    if kind == "bool":
        return keep
    bias = torch.randn(b, 1, tq, tk, generator=g, dtype=torch.float64)
    return bias.masked_fill(~keep, NEG_INF)


def lse_ref(q, k, mask=None, causal=False, scale=None):
    """The masked-lse oracle: log-sum-exp of each row of the materialised, masked, scaled scores."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else s + mask
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG_INF)
    return torch.logsumexp(s, -1)


def assert_lse(lse, expected):
    """``lse`` equals the oracle: -inf exactly where it is -inf, float64-close elsewhere, never NaN."""
    assert not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected))
    fin = torch.isfinite(expected)
    torch.testing.assert_close(lse[fin], expected[fin].to(lse.dtype), **F64_TOL)


def import_triton_flash():
    """``attnbook.triton_flash``, with its kernels built for the CPU interpreter when there is no GPU.

    ``@triton.jit`` reads ``TRITON_INTERPRET`` when ``attnbook.triton_kernels`` is first imported
    (by ``attnbook.triton_flash``), so it is set for that import only and restored after it: the
    rest of the session (notebooks above all) never sees it. Tests that run the kernels set it
    again while they run (the interpreter reads it then too).
    """
    saved = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from attnbook import triton_flash
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return triton_flash
