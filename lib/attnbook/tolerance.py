"""The one numerical tolerance rule of the library: how close to the truth is close enough.

Truth is a float64 result on the CPU. A result is judged by its dtype:

- **float64** (exact identities): elementwise, ``|actual - truth| <= atol + rtol * |truth|``
  for every entry, with :data:`F64_TOL` (``rtol=1e-10, atol=1e-12``). This is the rule of
  ``torch.testing.assert_close(actual, truth, **F64_TOL)``, so the tests, the chapters, the
  first-use check (``trust``) and the exercises mean the same thing by ``F64_TOL``; an infinity
  must be matched exactly, a NaN only by a NaN.
- **lower precision** (float32, float16, bfloat16): FlashAttention's rule. Its error against the
  float64 truth may be at most ``factor`` times the error of the naive (materialised) kernel run in
  the *same* dtype, plus one rounding step of that dtype at the truth's magnitude:
  ``max|actual - truth| <= factor * max|naive - truth| + step``; ``factor`` 2 for outputs and 3
  for gradients (FlashAttention's tests), ``step`` :func:`rounding_step` unless given (``trust``
  uses the smaller :func:`fa_rounding_margin`). A NaN in ``actual`` where the truth has none
  breaks the rule; a naive result that is itself not finite leaves no baseline (ValueError).

:func:`judge` applies the rule and returns a :class:`Judgement` (it never raises on a verdict);
:func:`assert_close_to_reference` is its raising form for tests. Production code (``trust``,
``exercises``) imports this module, never ``attnbook.testing`` (test fixtures only).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._checks import check_float, check_tensor

__all__ = ["F64_TOL", "Judgement", "assert_close_to_reference", "fa_rounding_margin", "judge",
           "max_abs_error", "relative_error", "rounding_step"]

# The one float64 tolerance for exact identities (tests, chapters, selfcheck, trust, exercises):
# a wrong rescale or a missed tile is many orders of magnitude above it, float64 rounding of
# these sizes far below. Elementwise, as torch.testing.assert_close applies it.
F64_TOL = dict(rtol=1e-10, atol=1e-12)


class Judgement(NamedTuple):
    """The verdict of :func:`judge`: ``ok``; the error and the bound it was held to; ``message``
    (``""`` when ok, else one line that prints both numbers).

    float64: ``err`` is the largest excess ``|a - t| - rtol * |t|`` over the entries and ``bound``
    is ``atol`` (so ``ok == err <= bound``). Lower precision: ``err = max|a - t|`` and
    ``bound = factor * max|naive - t| + step``.
    """

    ok: bool
    err: float
    bound: float
    message: str = ""


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
    _check_dtype("rounding_step", dtype)
    scale = float(reference.detach().abs().max()) if reference.numel() else 0.0
    return torch.finfo(dtype).eps * max(scale, 1.0)


def fa_rounding_margin(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """FlashAttention's tests' additive margin: ``2 max |(r + 0.3) - 0.3 - r|``, r = the reference in ``dtype``.

    Twice the rounding of one addition at the outputs' magnitude (0.3 plus the entry): much less
    than :func:`rounding_step`'s ``eps * max(1, max|ref|)``, which in float16 exceeds the naive
    kernel's own error. The first-use check of ``backend="auto"`` judges with it.
    """
    check_tensor("reference", reference, fn="fa_rounding_margin", min_ndim=0)
    _check_dtype("fa_rounding_margin", dtype)
    r = reference.detach().to(dtype)
    return 2.0 * float(((r + 0.3) - 0.3 - r).abs().max()) if r.numel() else 0.0


def judge(actual: torch.Tensor, reference: torch.Tensor, *, naive: torch.Tensor | None = None,
          factor: float = 2.0, step: float | None = None, tol: dict | None = None,
          name: str = "output") -> Judgement:
    """Apply the rule (module docstring) to ``actual`` against the float64 ``reference``.

    Args:
        actual: the result (any floating dtype, any device); judged by its own dtype.
        reference: the float64 truth, same shape.
        naive: the naive kernel's result in ``actual``'s dtype; required below float64.
        factor: 2 for outputs, 3 for gradients; finite, >= 1 (low precision only).
        step: the additive term (finite, >= 0); default :func:`rounding_step` of the reference in
            ``actual``'s dtype (low precision only).
        tol: ``dict(rtol=, atol=)`` for float64, default :data:`F64_TOL`.
        name: what is compared, for the message.
    Returns: a :class:`Judgement`. Raises (TypeError/ValueError) only on bad arguments, and when
    the naive result is not finite where the reference is (no baseline).
    """
    return _judge("judge", actual, reference, naive, factor, step, tol, name)


def _judge(fn, actual, reference, naive, factor, step, tol, name) -> Judgement:
    check_tensor("actual", actual, fn=fn, min_ndim=0)
    check_tensor("reference", reference, fn=fn, min_ndim=0)
    if reference.dtype != torch.float64:
        raise TypeError(f"{fn}: `reference` must be float64 (the truth), got {reference.dtype}")
    if actual.shape != reference.shape:
        raise ValueError(f"{fn}: shapes differ: actual {tuple(actual.shape)}, "
                         f"reference {tuple(reference.shape)}")
    factor = check_float("factor", factor, fn=fn, minimum=1.0)
    if actual.dtype == torch.float64:
        tol = F64_TOL if tol is None else tol
        if not isinstance(tol, dict) or set(tol) != {"rtol", "atol"}:
            raise ValueError(f"{fn}: `tol` must be dict(rtol=..., atol=...), got {tol!r}")
        rtol = check_float("tol['rtol']", tol["rtol"], fn=fn, minimum=0.0)
        atol = check_float("tol['atol']", tol["atol"], fn=fn, minimum=0.0)
        if actual.numel() == 0:
            return Judgement(True, 0.0, atol)
        a, t = actual.detach().cpu(), reference.detach().cpu()
        same = (a == t) | (torch.isnan(a) & torch.isnan(t))   # exact infinities, NaN for NaN
        excess = ((a - t).abs() - rtol * t.abs()).masked_fill(same, -math.inf)
        excess = excess.nan_to_num(nan=math.inf)
        err = float(excess.max())
        if err <= atol:
            return Judgement(True, err, atol)
        worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
        return Judgement(False, err, atol, (
            f"{name}: float64 mismatch at index {worst}: |{float(a[worst])!r} - "
            f"{float(t[worst])!r}| > atol {atol:g} + rtol {rtol:g} x |truth|"))
    if naive is None:
        raise ValueError(f"{fn}: `naive` (the naive kernel's result in {actual.dtype}) is required "
                         f"to judge a {actual.dtype} result")
    check_tensor("naive", naive, fn=fn, min_ndim=0)
    if naive.shape != reference.shape:
        raise ValueError(f"{fn}: shapes differ: naive {tuple(naive.shape)}, "
                         f"reference {tuple(reference.shape)}")
    if step is None:
        step = rounding_step(reference, actual.dtype)
    elif isinstance(step, bool) or not isinstance(step, (int, float)) or not (
            math.isfinite(step) and step >= 0):
        raise ValueError(f"{fn}: `step` must be a finite number >= 0 or None, got {step!r}")
    err = max_abs_error(actual, reference)
    base = max_abs_error(naive, reference)
    if not math.isfinite(base):
        raise ValueError(f"{fn}: the naive result for {name} is not finite where the reference is "
                         f"(NaN or inf): it gives no baseline for the rule")
    bound = factor * base + float(step)
    if err <= bound:
        return Judgement(True, err, bound)
    return Judgement(False, err, bound, (
        f"{name}: max error {err:.3e} vs float64 reference exceeds {factor:g} x naive error "
        f"{base:.3e} + rounding step {float(step):.3e} (= {bound:.3e}); dtype {actual.dtype}"))


def assert_close_to_reference(actual: torch.Tensor, naive: torch.Tensor, reference: torch.Tensor,
                              *, factor: float = 2.0, name: str = "output",
                              step: float | None = None) -> None:
    """Assert the rule (module docstring) for ``actual``: :func:`judge`, raising (for tests).

    Args as :func:`judge`; ``naive`` must have ``actual``'s shape (it is not used when ``actual``
    is float64: the elementwise :data:`F64_TOL` rule decides there). Raises AssertionError with
    :attr:`Judgement.message` when the rule is broken (it prints both errors), ValueError when
    the naive result gives no baseline.
    """
    fn = "assert_close_to_reference"
    for arg, t in (("actual", actual), ("naive", naive), ("reference", reference)):
        check_tensor(arg, t, fn=fn, min_ndim=0)
    if not (actual.shape == naive.shape == reference.shape):
        raise ValueError(
            f"{fn}: shapes differ: actual {tuple(actual.shape)}, "
            f"naive {tuple(naive.shape)}, reference {tuple(reference.shape)}"
        )
    if reference.dtype != torch.float64:
        raise TypeError(f"{fn}: `reference` must be float64 (the truth), got {reference.dtype}")
    verdict = _judge(fn, actual, reference, naive, factor, step, None, name)
    if not verdict.ok:
        raise AssertionError(verdict.message)


def _check_dtype(fn: str, dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: `dtype` must be a floating torch.dtype, got {dtype!r}")


def _check_pair(fn: str, a, b) -> None:
    check_tensor("a", a, fn=fn, min_ndim=0, floating=False)
    check_tensor("b", b, fn=fn, min_ndim=0, floating=False)
