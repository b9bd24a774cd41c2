"""attnbook.tolerance: the one tolerance rule (float64 elementwise; lower precision FlashAttention's)."""
from __future__ import annotations

import pytest
import torch

from attnbook import testing, tolerance, trust
from attnbook.reference import attention_ref
from attnbook.tolerance import F64_TOL, Judgement, assert_close_to_reference, judge

f64 = torch.float64


def _attention(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, 16, generator=g, dtype=f64) for _ in range(3))
    return attention_ref(q, k, v).out, attention_ref(*(t.to(dtype) for t in (q, k, v))).out


def test_float64_rule_is_elementwise_as_torch_testing_assert_close():
    """One meaning of F64_TOL: the one torch.testing.assert_close gives it (trust used a global one)."""
    truth = torch.tensor([1e6, 1e-9], dtype=f64)
    off = truth + torch.tensor([0.0, 1e-10], dtype=f64)  # 1e-10 on 1e-9: 10% off, far under 1e-10*1e6
    assert not judge(off, truth).ok                         # elementwise: rejected
    with pytest.raises(AssertionError):
        torch.testing.assert_close(off, truth, **F64_TOL)  # the same verdict as torch's
    global_bound = F64_TOL["atol"] + F64_TOL["rtol"] * float(truth.abs().max())
    assert float((off - truth).abs().max()) <= global_bound  # control: the old global rule passed it
    close = truth * (1 + 1e-12)
    v = judge(close, truth)
    assert isinstance(v, Judgement) and v.ok and v.message == ""
    torch.testing.assert_close(close, truth, **F64_TOL)


def test_float64_rule_infinities_and_nan():
    truth = torch.tensor([float("inf"), 1.0], dtype=f64)
    assert judge(truth.clone(), truth).ok
    assert not judge(torch.tensor([float("inf"), float("nan")], dtype=f64), truth).ok
    assert not judge(torch.tensor([-float("inf"), 1.0], dtype=f64), truth).ok
    assert "index (1,)" in judge(torch.tensor([float("inf"), 2.0], dtype=f64), truth).message


def test_low_precision_rule_is_relative_to_the_naive_kernel():
    truth, naive = _attention(torch.float32)
    assert judge(naive.clone(), truth, naive=naive).ok
    wrong = naive.clone()
    wrong[0, 0, 0] += 1e-3
    v = judge(wrong, truth, naive=naive)
    assert not v.ok and v.err > v.bound and "exceeds 2 x naive error" in v.message
    assert judge(wrong, truth, naive=naive, step=2e-3).ok  # the additive step is honoured
    base = tolerance.max_abs_error(naive, truth)
    assert v.bound == pytest.approx(2 * base + tolerance.rounding_step(truth, torch.float32))


def test_low_precision_needs_a_finite_naive_baseline():
    truth, naive = _attention(torch.float32)
    with pytest.raises(ValueError, match="judge: `naive`"):
        judge(naive, truth)
    with pytest.raises(ValueError, match="not finite"):
        judge(naive, truth, naive=torch.full_like(naive, float("nan")))


@pytest.mark.parametrize("call, exc, match", [
    (lambda: judge(torch.ones(2), torch.ones(2), naive=torch.ones(2)), TypeError, "judge: `reference`"),
    (lambda: judge(torch.ones(2), torch.ones(3, dtype=f64)), ValueError, "judge: shapes differ"),
    (lambda: judge(torch.ones(2, dtype=f64), torch.ones(2, dtype=f64), tol=dict(rtol=1)), ValueError, "`tol`"),
    (lambda: judge(torch.ones(2), torch.ones(2, dtype=f64), naive=torch.ones(2), factor=0.5), ValueError,
     "`factor`"),
    (lambda: judge(torch.ones(2), torch.ones(2, dtype=f64), naive=torch.ones(2), step=-1.0), ValueError,
     "`step`"),
    (lambda: assert_close_to_reference(torch.ones(2), torch.ones(2), torch.ones(2)), TypeError,
     "assert_close_to_reference: `reference`"),
])
def test_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_testing_re_exports_the_same_objects_and_trust_uses_this_module():
    for name in ("F64_TOL", "assert_close_to_reference", "fa_rounding_margin", "max_abs_error",
                 "relative_error", "rounding_step"):
        assert getattr(testing, name) is getattr(tolerance, name), name
    assert trust.tolerance is tolerance
    assert not hasattr(trust, "testing")


def test_trust_judge_uses_the_elementwise_float64_rule():
    """trust.judge agrees with tolerance.judge in float64 (the case that differed before)."""
    truth = torch.tensor([1e6, 1e-9], dtype=f64)
    off = truth + torch.tensor([0.0, 1e-10], dtype=f64)
    fields = (off, None, None, None)
    assert trust.judge(f64, fields, [fields], (truth, None, None, None)) is not None
    assert trust.judge(f64, (truth.clone(), None, None, None), [fields], (truth, None, None, None)) is None
