"""Tolerance helpers shared by the tests and the chapters.

Truth is float64 on the CPU. A fast kernel in lower precision is judged by the rule that
FlashAttention's own tests use: its error against a float64 reference may be at most
``factor`` times the error of the naive (materialised) kernel run in the *same* dtype, plus one
rounding step of that dtype at the reference's magnitude. The failure message prints both
errors, so a regression says how far off it is, not just that it is.

It also holds the few helpers that the library's tests, the chapters and the self-check share:
the one float64 tolerance ``F64_TOL``, seeded random tensors and weights (``rand``, ``qkv``, ``make_mask``, ``randomize``),
a masked log-sum-exp oracle (``lse_ref``, ``assert_lse``) and ``import_triton_flash``.
"""
from __future__ import annotations

import math
import os

import torch

from ._checks import check_choice, check_float, check_int, check_tensor

__all__ = [
    "assert_close_to_reference", "fa_rounding_margin", "max_abs_error", "rounding_step", "relative_error",
    "F64_TOL", "CPU_BACKENDS", "rand", "randomize", "qkv", "make_mask", "lse_ref", "assert_lse", "import_triton_flash",
]

# The one float64 tolerance for exact identities (tests, chapters, selfcheck): a wrong rescale or
# a missed tile is many orders of magnitude above it, float64 rounding of these sizes far below.
F64_TOL = dict(rtol=1e-10, atol=1e-12)
CPU_BACKENDS = ("ref", "tiled", "sdpa")  # the explicit backends every CPU machine runs


def max_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b|`` computed in float64 (0.0 for empty tensors); NaN anywhere gives inf."""
    _check_pair("max_abs_error", a, b)
    if a.shape != b.shape:
        raise ValueError(f"max_abs_error: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    diff = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
    if torch.isnan(diff).any():
        return float("inf")
    return float(diff.max())


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b||_F / ||b||_F`` in float64 (b is the reference; ``||a - b||_F`` when ``b`` is all zeros)."""
    _check_pair("relative_error", a, b)
    if a.shape != b.shape:
        raise ValueError(f"relative_error: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    denom = float(b64.norm())
    return float((a64 - b64).norm()) / (denom if denom > 0 else 1.0)


def rounding_step(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """One unit of rounding of ``dtype`` at the reference's largest magnitude: ``eps * max(1, max|ref|)``."""
    check_tensor("reference", reference, fn="rounding_step", min_ndim=0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"rounding_step: `dtype` must be a floating torch.dtype, got {dtype!r}")
    scale = float(reference.detach().abs().max()) if reference.numel() else 0.0
    return torch.finfo(dtype).eps * max(scale, 1.0)


def fa_rounding_margin(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """FlashAttention's tests' additive margin: ``2 max |(r + 0.3) - 0.3 - r|``, r = the reference in ``dtype``.

    Twice the rounding of one addition at the outputs' magnitude (0.3 plus the entry): much less
    than :func:`rounding_step`'s ``eps * max(1, max|ref|)``, which in float16 exceeds the naive
    kernel's own error. The first-use check of ``backend="auto"`` judges with it.
    """
    check_tensor("reference", reference, fn="fa_rounding_margin", min_ndim=0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"fa_rounding_margin: `dtype` must be a floating torch.dtype, got {dtype!r}")
    r = reference.detach().to(dtype)
    return 2.0 * float(((r + 0.3) - 0.3 - r).abs().max()) if r.numel() else 0.0


def assert_close_to_reference(
    actual: torch.Tensor,
    naive: torch.Tensor,
    reference: torch.Tensor,
    *,
    factor: float = 2.0,
    name: str = "output",
    step: float | None = None,
) -> None:
    """Assert the FlashAttention rule: ``err(actual) <= factor * err(naive) + one rounding step``.

    ``err(x) = max |x - reference|``; the rounding step is :func:`rounding_step` of the reference
    in ``actual``'s dtype unless ``step`` is given. NaN in ``actual`` fails the rule; a naive
    result that is itself not finite (NaN or inf where the reference is not) leaves no baseline
    and raises ValueError instead of accepting anything.

    Args:
        actual: the kernel's result (any floating dtype).
        naive: the naive kernel's result in the same dtype as ``actual``.
        reference: a float64 result (the truth), same shape.
        factor: 2 for outputs, 3 for gradients (FlashAttention's tests); finite, >= 1.
        name: what is compared, for the message.
        step: the additive term (finite, >= 0), e.g. :func:`fa_rounding_margin`; default
            :func:`rounding_step`.
    Raises:
        AssertionError when the rule is broken (the message prints both errors).
    """
    fn = "assert_close_to_reference"
    for arg, t in (("actual", actual), ("naive", naive), ("reference", reference)):
        check_tensor(arg, t, fn=fn, min_ndim=0)
    if reference.dtype != torch.float64:
        raise TypeError(f"{fn}: `reference` must be float64 (the truth), got {reference.dtype}")
    factor = check_float("factor", factor, fn=fn, minimum=1.0)
    if not (actual.shape == naive.shape == reference.shape):
        raise ValueError(
            f"assert_close_to_reference: shapes differ: actual {tuple(actual.shape)}, "
            f"naive {tuple(naive.shape)}, reference {tuple(reference.shape)}"
        )
    err = max_abs_error(actual, reference)
    base = max_abs_error(naive, reference)
    if not math.isfinite(base):
        raise ValueError(f"{fn}: the naive result for {name} is not finite where the reference is "
                         f"(NaN or inf): it gives no baseline for the rule")
    if step is None:
        step = rounding_step(reference, actual.dtype)
    elif isinstance(step, bool) or not isinstance(step, (int, float)) or not (math.isfinite(step) and step >= 0):
        raise ValueError(f"{fn}: `step` must be a finite number >= 0 or None, got {step!r}")
    bound = factor * base + step
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} vs float64 reference exceeds {factor:g} x naive error "
            f"{base:.3e} + rounding step {step:.3e} (= {bound:.3e}); dtype {actual.dtype}"
        )


def _check_pair(fn: str, a, b) -> None:
    check_tensor("a", a, fn=fn, min_ndim=0, floating=False)
    check_tensor("b", b, fn=fn, min_ndim=0, floating=False)


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
