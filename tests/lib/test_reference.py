"""Tests for attnbook.attention: score functions, masks, attention_ref (float64 truth)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbook.reference import (
    additive_scores,
    attention_ref,
    causal_mask,
    dot_scores,
    general_scores,
    mask_to_additive,
    masked_softmax,
    padding_mask,
    scaled_dot_scores,
)

from attnbook.testing import F64_TOL as F64, rand


def test_scores_shapes_and_identities():
    q, k = rand(2, 5, 8), rand(2, 7, 8, seed=1)
    s = dot_scores(q, k)
    assert s.shape == (2, 5, 7)
    torch.testing.assert_close(s[1, 3, 4], q[1, 3] @ k[1, 4], **F64)
    torch.testing.assert_close(scaled_dot_scores(q, k), s / math.sqrt(8), **F64)
    torch.testing.assert_close(scaled_dot_scores(q, k, scale=0.5), s * 0.5, **F64)
    w = rand(8, 8, seed=2)
    torch.testing.assert_close(general_scores(q, k, torch.eye(8, dtype=torch.float64)), s, **F64)
    torch.testing.assert_close(general_scores(q, k, w)[0, 1, 2], q[0, 1] @ w @ k[0, 2], **F64)


def test_additive_scores_bounded_and_explicit():
    q, k = rand(4, 6), rand(9, 5, seed=1)
    w_q, w_k, v_a = rand(6, 3, seed=2), rand(5, 3, seed=3), rand(3, seed=4)
    e = additive_scores(q, k, w_q, w_k, v_a)
    assert e.shape == (4, 9)
    torch.testing.assert_close(e[2, 7], v_a @ torch.tanh(q[2] @ w_q + k[7] @ w_k), **F64)
    assert (e.abs() <= v_a.abs().sum() + 1e-12).all()


def test_causal_mask_top_left_like_sdpa():
    m = causal_mask(3, 5)
    assert m.dtype == torch.bool and m.shape == (3, 5)
    assert m.tolist() == [[True, False, False, False, False],
                          [True, True, False, False, False],
                          [True, True, True, False, False]]
    q, k, v = rand(1, 3, 4), rand(1, 5, 4, seed=1), rand(1, 5, 2, seed=2)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention_ref(q, k, v, causal=True).out, expected, **F64)


def test_padding_mask_shape_and_values():
    m = padding_mask([2, 0, 3], 3)
    assert m.shape == (3, 1, 1, 3)
    assert m[:, 0, 0].tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    with pytest.raises(ValueError, match="lengths"):
        padding_mask([4], 3)
    with pytest.raises(ValueError, match="`t`"):
        padding_mask([1], -1)
    assert padding_mask([0, 0], 0).shape == (2, 1, 1, 0)  # no keys at all is legal


def test_mask_to_additive():
    m = torch.tensor([True, False])
    assert mask_to_additive(m, torch.float32).tolist() == [0.0, float("-inf")]
    assert mask_to_additive(None, torch.float32) is None


@pytest.mark.parametrize("causal", [False, True])
def test_attention_ref_matches_sdpa_float64(causal):
    q, k, v = rand(2, 3, 7, 8), rand(2, 3, 7, 8, seed=1), rand(2, 3, 7, 5, seed=2)
    res = attention_ref(q, k, v, causal=causal)
    out, w = res.out, res.weights
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, expected, **F64)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64), **F64)


def test_bool_and_additive_masks_agree_and_follow_sdpa_polarity():
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 6, 8, seed=1), rand(1, 2, 6, 8, seed=2)
    m = rand(4, 6, seed=3) > 0
    m[:, 0] = True
    out_b = attention_ref(q, k, v, mask=m).out
    out_f = attention_ref(q, k, v, mask=mask_to_additive(m, torch.float64)).out
    torch.testing.assert_close(out_b, out_f, **F64)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(out_b, expected, **F64)


def test_fully_masked_row_gives_zeros_and_zero_grads():
    q = rand(1, 3, 4).requires_grad_()
    k, v = rand(1, 5, 4, seed=1).requires_grad_(), rand(1, 5, 4, seed=2).requires_grad_()
    m = torch.ones(3, 5, dtype=torch.bool)
    m[1] = False
    res = attention_ref(q, k, v, mask=m)
    out, w = res.out, res.weights
    assert torch.equal(out[0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(w[0, 1], torch.zeros(5, dtype=torch.float64))
    out.sum().backward()
    assert torch.equal(q.grad[0, 1], torch.zeros(4, dtype=torch.float64))
    # k and v get exactly the gradient of the two rows that attend (the empty row adds nothing)
    k2, v2 = k.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()
    attention_ref(q.detach()[:, [0, 2]], k2, v2).out.sum().backward()
    torch.testing.assert_close(k.grad, k2.grad, **F64)
    torch.testing.assert_close(v.grad, v2.grad, **F64)


def test_naive_softmax_nan_vs_masked_softmax():
    s = torch.full((2, 3), float("-inf"), dtype=torch.float64)
    s[0] = torch.tensor([1.0, 2.0, 3.0])
    naive = torch.exp(s - s.amax(-1, keepdim=True))
    naive = naive / naive.sum(-1, keepdim=True)
    assert torch.isnan(naive[1]).all()
    # where the NaN comes from (the docstring): the shift -inf - (-inf), not 0/0
    assert torch.isnan(s - s.amax(-1, keepdim=True))[1].all()
    unshifted_num, unshifted_den = torch.exp(s[1]), torch.exp(s[1]).sum()
    assert (unshifted_num == 0).all() and unshifted_den == 0  # without the shift: 0/0
    assert torch.isnan(unshifted_num / unshifted_den).all()
    p = masked_softmax(s)
    assert torch.equal(p[1], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(p[0], torch.softmax(s[0], -1), **F64)


def test_large_logits_are_finite():
    q = rand(1, 6, 4) * 1e4
    k, v = rand(1, 6, 4, seed=1), rand(1, 6, 4, seed=2)
    res = attention_ref(q.float(), k.float(), v.float())
    exact = attention_ref(q, k, v)  # float64: the values float32 must reach, not just finiteness
    torch.testing.assert_close(res.out.double(), exact.out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(res.weights.double(), exact.weights, rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(tq=st.integers(1, 9), tk=st.integers(1, 9), d=st.integers(1, 6), dv=st.integers(1, 5),
       causal=st.booleans(), seed=st.integers(0, 10_000))
def test_property_matches_manual_softmax(tq, tk, d, dv, causal, seed):
    q, k, v = rand(2, tq, d, seed=seed), rand(2, tk, d, seed=seed + 1), rand(2, tk, dv, seed=seed + 2)
    m = rand(tq, tk, seed=seed + 3) > -0.5
    res = attention_ref(q, k, v, mask=m, causal=causal)
    out, w = res.out, res.weights
    allowed = m & (causal_mask(tq, tk) if causal else torch.ones(tq, tk, dtype=torch.bool))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    for b in range(2):
        for i in range(tq):
            idx = allowed[i].nonzero().flatten()
            if len(idx) == 0:
                assert torch.equal(out[b, i], torch.zeros(dv, dtype=torch.float64))
                continue
            p = torch.softmax(s[b, i, idx], -1)
            torch.testing.assert_close(out[b, i], p @ v[b, idx], **F64)


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3), torch.ones(2, 3)), TypeError, "`q` must have a floating"),
        ((torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 4)), ValueError, "same feature dim D"),
        ((torch.ones(2, 3), torch.ones(5, 3), torch.ones(4, 3)), ValueError, "same length Tk"),
        ((torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3)), TypeError, "one dtype"),
        ((torch.ones(3), torch.ones(3), torch.ones(3)), ValueError, "at least 2 dims"),
        ((torch.ones(2, 2, 3), torch.ones(3, 2, 3), torch.ones(3, 2, 3)), ValueError, "leading"),
        (([[1.0]], torch.ones(1, 1), torch.ones(1, 1)), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        attention_ref(*args)


def test_bad_mask_and_scale():
    q = torch.ones(2, 3, 4)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention_ref(q, q, q, mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="`mask` must be bool"):
        attention_ref(q, q, q, mask=torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="`scale`"):
        attention_ref(q, q, q, scale=-1.0)
    with pytest.raises(ValueError, match="`scale`"):
        attention_ref(q, q, q, scale=float("nan"))
    with pytest.raises(TypeError, match="`causal`"):
        attention_ref(q, q, q, causal="yes")
    with pytest.raises(ValueError, match="causal_mask: `tq` must be an int >= 0"):
        causal_mask(-1)
    assert causal_mask(0, 3).shape == (0, 3)  # no queries is legal (issue 6, defect 2)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: dot_scores(torch.ones(2, 2, 3), torch.ones(3, 2, 3)), ValueError, "leading .batch. dims"),
        (lambda: dot_scores(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float64)),
         TypeError, "`k` must have q's dtype"),
        (lambda: general_scores(torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, 3, dtype=torch.float64)),
         TypeError, "`weight` must have q's dtype"),
        (lambda: additive_scores(torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, 4, dtype=torch.float64),
                                 torch.ones(3, 4), torch.ones(4)), TypeError, "`w_q` must have q's dtype"),
        (lambda: scaled_dot_scores(torch.ones(2, 3), torch.ones(2, 3), scale=float("inf")), ValueError, "`scale`"),
        (lambda: scaled_dot_scores(torch.ones(2, 3), torch.ones(2, 3), scale="0.5"), TypeError, "`scale`"),
        (lambda: masked_softmax([0.0, 1.0]), TypeError, "`scores` must be a torch.Tensor"),
        (lambda: masked_softmax(torch.ones(3, dtype=torch.int64)), TypeError, "`scores` must have a floating"),
        (lambda: mask_to_additive(torch.ones(3, dtype=torch.int64), torch.float32), TypeError, "`mask`"),
        (lambda: causal_mask(2.0), TypeError, "`tq` must be an int"),
        (lambda: padding_mask("ab", 3), TypeError, "`lengths`"),
        (lambda: padding_mask([1], 2.5), TypeError, "`t` must be an int"),
    ],
)
def test_helpers_reject_bad_input_naming_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_numpy_ints_are_ints_and_no_keys_gives_zeros():
    np = pytest.importorskip("numpy")
    assert torch.equal(causal_mask(np.int64(3)), causal_mask(3))
    assert torch.equal(padding_mask([1, 2], np.int64(3)), padding_mask([1, 2], 3))
    q = rand(2, 3, 4).requires_grad_()
    res = attention_ref(q, rand(2, 0, 4), rand(2, 0, 5))  # Tk = 0: every row is empty
    out, w = res.out, res.weights
    assert torch.equal(res.lse, torch.full((2, 3), float("-inf"), dtype=torch.float64))
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 0) and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


# ------------------------------------------------------------------ issue 30: one rule for lse
def test_reference_lse_is_differentiable_with_the_softmax_as_its_gradient():
    """d lse_i / d s_ij = P_ij: the gradient of a loss on ``attention_ref``'s lse, written by hand
    in float64 (dS = w_lse[:, None] * P, dq = scale * dS k, dk = scale * dS^T q, dbias = dS),
    and the same as the tiled kernel's (the rule every kernel follows)."""
    from attnbook.flash import attention_tiled
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(6, 6, generator=g, dtype=torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, bias)]
    res = attention_ref(leaves[0], leaves[1], v, mask=leaves[2], causal=True)
    assert res.lse.requires_grad
    got = torch.autograd.grad((res.lse * w).sum(), leaves)
    scale = 4 ** -0.5
    s = scale * q @ k.T + bias
    s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - s.max(-1, keepdim=True).values)
    p = p / p.sum(-1, keepdim=True)
    ds = w[:, None] * p
    want = (scale * ds @ k, scale * ds.T @ q, ds)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    tiled = [t.clone().requires_grad_() for t in (q, k, bias)]
    res_t = attention_tiled(tiled[0], tiled[1], v, mask=tiled[2], causal=True, block_q=4, block_k=2)
    for a, b in zip(got, torch.autograd.grad((res_t.lse * w).sum(), tiled)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_reference_lse_of_an_empty_row_is_minus_inf_with_zero_gradient():
    q, k, v = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    res = attention_ref(q, k, v, mask=mask)
    assert torch.isneginf(res.lse[1]) and torch.isfinite(res.lse[[0, 2]]).all()
    dq, dk = torch.autograd.grad(res.lse.masked_fill(torch.isinf(res.lse), 0.0).sum(), (q, k))
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all()
    assert not dq[1].any() and dq[0].any()
    assert torch.autograd.gradcheck(lambda a, b: attention_ref(a, b, v.detach(), mask=mask[[0, 2]]).lse,
                                    (q[[0, 2]].detach().requires_grad_(), k.detach().requires_grad_()))
