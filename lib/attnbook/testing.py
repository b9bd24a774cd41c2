"""Tolerance helpers shared by the tests and the chapters.

Truth is float64 on the CPU. A fast kernel in lower precision is judged by the rule that
FlashAttention's own tests use: its error against a float64 reference may be at most
``factor`` times the error of the naive (materialised) kernel run in the *same* dtype, plus one
rounding step of that dtype at the reference's magnitude. The failure message prints both
errors, so a regression says how far off it is, not just that it is.
"""
from __future__ import annotations

import torch

__all__ = ["assert_close_to_reference", "max_abs_error", "rounding_step", "relative_error"]


def max_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b|`` computed in float64 (0.0 for empty tensors); NaN anywhere gives inf."""
    if a.shape != b.shape:
        raise ValueError(f"max_abs_error: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    diff = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
    if torch.isnan(diff).any():
        return float("inf")
    return float(diff.max())


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b||_F / ||b||_F`` in float64 (b is the reference)."""
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    denom = float(b64.norm())
    return float((a64 - b64).norm()) / (denom if denom > 0 else 1.0)


def rounding_step(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """One unit of rounding of ``dtype`` at the reference's largest magnitude: ``eps * max|ref|``."""
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

    Args:
        actual: the kernel's result (any floating dtype).
        naive: the naive kernel's result in the same dtype as ``actual``.
        reference: a float64 result (the truth).
        factor: 2 for outputs, 3 for gradients (FlashAttention's tests).
        name: what is compared, for the message.
    """
    if not (actual.shape == naive.shape == reference.shape):
        raise ValueError(
            f"assert_close_to_reference: shapes differ: actual {tuple(actual.shape)}, "
            f"naive {tuple(naive.shape)}, reference {tuple(reference.shape)}"
        )
    err = max_abs_error(actual, reference)
    base = max_abs_error(naive, reference)
    step = rounding_step(reference, actual.dtype)
    bound = factor * base + step
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} vs float64 reference exceeds {factor:g} x naive error "
            f"{base:.3e} + rounding step {step:.3e} (= {bound:.3e}); dtype {actual.dtype}"
        )
