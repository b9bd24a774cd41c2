"""Tolerance helpers shared by the tests and the chapters.

Truth is float64 on the CPU. A fast kernel in lower precision is judged by the rule that
FlashAttention's own tests use: its error against a float64 reference may be at most
``factor`` times the error of the naive (materialised) kernel run in the *same* dtype, plus one
rounding step of that dtype at the reference's magnitude. The failure message prints both
errors, so a regression says how far off it is, not just that it is.
"""
from __future__ import annotations

import math

import torch

from ._checks import check_tensor

__all__ = ["assert_close_to_reference", "max_abs_error", "rounding_step", "relative_error"]


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


def assert_close_to_reference(
    actual: torch.Tensor,
    naive: torch.Tensor,
    reference: torch.Tensor,
    *,
    factor: float = 2.0,
    name: str = "output",
) -> None:
    """Assert the FlashAttention rule: ``err(actual) <= factor * err(naive) + one rounding step``.

    ``err(x) = max |x - reference|``; the rounding step is :func:`rounding_step` of the reference
    in ``actual``'s dtype. NaN in ``actual`` fails the rule; a naive result that is itself not
    finite (NaN or inf where the reference is not) leaves no baseline and raises ValueError
    instead of accepting anything.

    Args:
        actual: the kernel's result (any floating dtype).
        naive: the naive kernel's result in the same dtype as ``actual``.
        reference: a float64 result (the truth), same shape.
        factor: 2 for outputs, 3 for gradients (FlashAttention's tests); finite, >= 1.
        name: what is compared, for the message.
    Raises:
        AssertionError when the rule is broken (the message prints both errors).
    """
    fn = "assert_close_to_reference"
    for arg, t in (("actual", actual), ("naive", naive), ("reference", reference)):
        check_tensor(arg, t, fn=fn, min_ndim=0)
    if reference.dtype != torch.float64:
        raise TypeError(f"{fn}: `reference` must be float64 (the truth), got {reference.dtype}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"{fn}: `factor` must be a finite number >= 1, got {factor!r}")
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
    step = rounding_step(reference, actual.dtype)
    bound = factor * base + step
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} vs float64 reference exceeds {factor:g} x naive error "
            f"{base:.3e} + rounding step {step:.3e} (= {bound:.3e}); dtype {actual.dtype}"
        )


def _check_pair(fn: str, a, b) -> None:
    check_tensor("a", a, fn=fn, min_ndim=0, floating=False)
    check_tensor("b", b, fn=fn, min_ndim=0, floating=False)
