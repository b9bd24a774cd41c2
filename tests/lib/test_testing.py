"""Tests for attnbook.testing: the FlashAttention tolerance rule must accept and reject."""
import pytest
import torch

from attnbook.reference import attention_ref
from attnbook.testing import assert_close_to_reference, max_abs_error, relative_error, rounding_step


def test_max_abs_and_relative_error():
    a = torch.tensor([1.0, 2.0, 3.0])
    b = torch.tensor([1.0, 2.5, 3.0])
    assert max_abs_error(a, b) == 0.5
    assert relative_error(b, b) == 0.0
    assert max_abs_error(torch.tensor([float("nan")]), torch.tensor([0.0])) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        max_abs_error(a, b[:2])


def test_rounding_step_uses_dtype_eps():
    ref = torch.tensor([4.0], dtype=torch.float64)
    assert rounding_step(ref, torch.float32) == torch.finfo(torch.float32).eps * 4.0
    assert rounding_step(torch.tensor([0.1]), torch.float16) == torch.finfo(torch.float16).eps


def test_rule_accepts_float32_attention_and_rejects_a_wrong_one():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ref = attention_ref(q, k, v).out
    naive = attention_ref(q.float(), k.float(), v.float()).out
    assert_close_to_reference(naive.clone(), naive, ref)
    wrong = naive.clone()
    wrong[0, 0, 0] += 1e-3
    with pytest.raises(AssertionError, match="exceeds 2 x naive error"):
        assert_close_to_reference(wrong, naive, ref, name="output")


def test_rule_refuses_a_naive_baseline_that_is_not_finite():
    """A NaN naive result made the bound infinite, so anything - NaN included - passed."""
    ref = torch.ones(3, dtype=torch.float64)
    nan = torch.full((3,), float("nan"))
    with pytest.raises(ValueError, match="naive result .* not finite"):
        assert_close_to_reference(nan, nan, ref)
    with pytest.raises(AssertionError, match="max error inf"):
        assert_close_to_reference(nan, torch.ones(3), ref)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: assert_close_to_reference(torch.ones(2), torch.ones(2), torch.ones(2)), TypeError, "float64"),
        (lambda: assert_close_to_reference(torch.ones(2), torch.ones(2), torch.ones(2).double(), factor=0.5),
         ValueError, "`factor`"),
        (lambda: assert_close_to_reference([1.0], torch.ones(1), torch.ones(1).double()), TypeError, "`actual`"),
        (lambda: max_abs_error([1.0], torch.ones(1)), TypeError, "`a` must be a torch.Tensor"),
        (lambda: relative_error(torch.ones(2), torch.ones(3)), ValueError, "shapes differ"),
        (lambda: rounding_step(torch.ones(2), torch.int64), TypeError, "`dtype`"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_library_tests_run_on_one_thread_by_default():
    """tests/conftest.py's autouse fixture (issue 30): gradchecks ran ~7x slower on 2 busy cores."""
    assert torch.get_num_threads() == 1


def test_testing_keeps_fixtures_and_reexports_the_tolerance_names():
    from attnbook import testing, tolerance
    assert testing.assert_close_to_reference is tolerance.assert_close_to_reference
    assert testing.F64_TOL is tolerance.F64_TOL
