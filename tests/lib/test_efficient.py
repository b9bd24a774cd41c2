"""Tests for attnbook.efficient: linear attention (three forms) and sparse attention masks."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.reference import attention_ref
from attnbook.testing import F64_TOL as TOL, qkv
from attnbook.efficient import (
    elu_feature_map,
    fixed_mask,
    global_token_mask,
    linear_attention,
    linear_attention_denominator,
    linear_attention_quadratic,
    linear_attention_recurrent,
    mask_nnz,
    receptive_distance,
    receptive_field,
    sliding_window_mask,
    sliding_window_nnz,
    strided_mask,
    strided_nnz,
)

F64 = torch.float64


def three_forms(q, k, v, **kw):
    out_right = linear_attention(q, k, v, **kw)
    out_loop = linear_attention_recurrent(q, k, v, **kw)
    out_quad, weights = linear_attention_quadratic(q, k, v, **kw)
    return out_right, out_loop, out_quad, weights


def random_features(d, f, seed=1):
    """A positive random-feature map (Performer-like, exp of a projection) with F != D."""
    w = torch.randn(d, f, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return lambda x: torch.exp(x @ w.to(x.dtype) / math.sqrt(d) - 1.0)


# ----------------------------------------------------------------------------- feature map

def test_elu_feature_map_is_elu_plus_one_and_stays_positive():
    x = torch.linspace(-30, 30, 601, dtype=F64)
    torch.testing.assert_close(elu_feature_map(x), F.elu(x) + 1, rtol=1e-15, atol=2e-16)
    for x0 in (-5.0, -20.0, -35.0):  # relative accuracy where elu(x) + 1 suffers cancellation
        assert elu_feature_map(torch.tensor([x0], dtype=F64)).item() == pytest.approx(math.exp(x0), rel=1e-15)
    assert (F.elu(torch.tensor([-40.0], dtype=F64)) + 1).item() == 0.0  # why the library avoids the literal form
    assert elu_feature_map(torch.tensor([-100.0], dtype=F64)).item() > 0
    assert elu_feature_map(torch.tensor([-80.0])).item() > 0  # float32
    x = torch.tensor([-50.0, -1.0, 0.5, 1000.0], dtype=F64, requires_grad=True)
    elu_feature_map(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([math.exp(-50.0), math.exp(-1.0), 1.0, 1.0], dtype=F64))


# ----------------------------------------------------------------------------- linear attention identities

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(7, 7), (7, 9), (9, 4), (1, 5), (5, 1)])
def test_three_forms_agree_float64(causal, tq, tk):
    q, k, v = qkv(tq=tq, tk=tk)
    out_right, out_loop, out_quad, weights = three_forms(q, k, v, causal=causal)
    assert out_right.shape == (2, 3, tq, 4) and weights.shape == (2, 3, tq, tk)
    torch.testing.assert_close(out_right, out_quad, **TOL)
    torch.testing.assert_close(out_loop, out_quad, **TOL)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, tq, dtype=F64), **TOL)
    assert (weights >= 0).all()
    if causal:  # top-left aligned: key j > i gets weight exactly 0
        assert (weights.masked_select(~torch.ones(tq, tk, dtype=torch.bool).tril()) == 0).all()


def test_quadratic_form_is_the_row_wise_formula():
    q, k, v = qkv(b=1, h=1, tq=4, tk=6)
    phi_q, phi_k = elu_feature_map(q[0, 0]), elu_feature_map(k[0, 0])
    for i in range(4):  # V'_i = sum_j (phi(q_i).phi(k_j)) v_j / sum_j phi(q_i).phi(k_j), term by term
        sims = [float(phi_q[i] @ phi_k[j]) for j in range(6)]
        expected = sum(s * v[0, 0, j] for j, s in enumerate(sims)) / sum(sims)
        torch.testing.assert_close(linear_attention(q, k, v)[0, 0, i], expected, **TOL)


def test_custom_feature_map_with_more_features():
    q, k, v = qkv(d=4, dv=3)
    phi = random_features(4, 16)
    for causal in (False, True):
        out_right, out_loop, out_quad, _ = three_forms(q, k, v, causal=causal, feature_map=phi)
        torch.testing.assert_close(out_right, out_quad, **TOL)
        torch.testing.assert_close(out_loop, out_quad, **TOL)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_equals_truncated_keys(causal):
    q, k, v = qkv(b=3, h=2, tq=8, tk=8)
    lengths = [8, 5, 2]
    keep = torch.arange(8) < torch.tensor(lengths)[:, None]  # (B, Tk)
    mask = keep[:, None, None, :]  # (B, 1, 1, Tk)
    out_right, out_loop, out_quad, _ = three_forms(q, k, v, causal=causal, mask=mask)
    torch.testing.assert_close(out_right, out_quad, **TOL)
    torch.testing.assert_close(out_loop, out_quad, **TOL)
    for b, n in enumerate(lengths):
        short = linear_attention(q[b], k[b, :, :n], v[b, :, :n], causal=causal)
        torch.testing.assert_close(out_right[b], short, **TOL)


def test_fully_masked_queries_give_zeros_and_finite_gradients():
    q, k, v = qkv(b=2, h=1, tq=5, tk=6)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0] = False  # batch 0: no key at all
    mask[1, ..., :3] = False  # batch 1, causal: queries 0..2 have no key
    for causal in (False, True):
        for fn in (linear_attention, linear_attention_recurrent, lambda *a, **kw: linear_attention_quadratic(*a, **kw)[0]):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = fn(qq, kk, vv, mask=mask, causal=causal)
            assert (out[0] == 0).all()
            if causal:
                assert (out[1, :, :3] == 0).all() and (out[1, :, 3:] != 0).all()
            out.sum().backward()
            assert all(torch.isfinite(t.grad).all() for t in (qq, kk, vv))
            assert (qq.grad[0] == 0).all() and (vv.grad[0] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_of_the_forms_agree(causal):
    grads = []
    for fn in (linear_attention, lambda *a, **kw: linear_attention_quadratic(*a, **kw)[0]):
        q, k, v = (t.requires_grad_() for t in qkv(tq=6, tk=6))
        (fn(q, k, v, causal=causal) * torch.linspace(-1, 1, 4, dtype=F64)).sum().backward()
        grads.append([q.grad, k.grad, v.grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_close_to_float64():
    q, k, v = qkv(tq=32, tk=32, d=16, dv=16)
    for causal in (False, True):
        ref = linear_attention(q, k, v, causal=causal)
        out = linear_attention(q.float(), k.float(), v.float(), causal=causal)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_linear_attention_is_not_softmax_attention():
    q, k, v = qkv(b=1, h=2, tq=50, tk=50, d=8, dv=8)
    for causal in (False, True):
        lin = linear_attention(q, k, v, causal=causal)
        soft = attention_ref(q, k, v, causal=causal).out
        torch.testing.assert_close(soft, F.scaled_dot_product_attention(q, k, v, is_causal=causal), **TOL)
        assert (lin - soft).abs().max().item() > 1e-2


# ----------------------------------------------------------------------------- denominators and eps

def test_identity_feature_map_gives_negative_denominators_and_raises():
    q, k, v = qkv(b=1, h=1, tq=100, tk=100, d=8, dv=8)
    identity = lambda x: x  # noqa: E731
    den = linear_attention_denominator(q, k, feature_map=identity)
    assert den.shape == (1, 1, 100)
    assert (den < 0).sum().item() > 0
    torch.testing.assert_close(den, (q @ k.sum(-2, keepdim=True).transpose(-2, -1))[..., 0], **TOL)
    for causal in (False, True):
        for fn in (linear_attention, linear_attention_recurrent, linear_attention_quadratic):
            with pytest.raises(ValueError, match="denominators"):
                fn(q, k, v, causal=causal, feature_map=identity)
            with pytest.raises(ValueError, match="denominators"):  # eps cannot rescue a negative mass
                fn(q, k, v, causal=causal, feature_map=identity, eps=1e-6)


def test_denominator_matches_elu_forms():
    q, k, v = qkv()
    for causal in (False, True):
        den = linear_attention_denominator(q, k, causal=causal)
        phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
        kernel = phi_q @ phi_k.transpose(-2, -1)
        expected = (kernel.tril() if causal else kernel).sum(-1)
        torch.testing.assert_close(den, expected, **TOL)
        assert (den > 0).all()


def test_zero_denominator_raises_unless_eps():
    q, k, v = qkv(tq=4, tk=4)
    q = -q.abs() - 0.1  # relu(q) = 0: every denominator is exactly 0
    with pytest.raises(ValueError, match="smallest 0"):
        linear_attention(q, k, v, feature_map=torch.relu)
    for fn in (linear_attention, linear_attention_recurrent, lambda *a, **kw: linear_attention_quadratic(*a, **kw)[0]):
        out = fn(q, k, v, feature_map=torch.relu, eps=1e-6)
        assert torch.isfinite(out).all() and (out == 0).all()


def test_eps_is_added_consistently():
    q, k, v = qkv()
    for causal in (False, True):
        out_right, out_loop, out_quad, weights = three_forms(q, k, v, causal=causal, eps=0.5)
        torch.testing.assert_close(out_right, out_quad, **TOL)
        torch.testing.assert_close(out_loop, out_quad, **TOL)
        den = linear_attention_denominator(q, k, causal=causal)
        torch.testing.assert_close(weights.sum(-1), den / (den + 0.5), **TOL)


# ----------------------------------------------------------------------------- property tests

@settings(deadline=None, max_examples=30)
@given(
    b=st.integers(1, 2), h=st.integers(1, 2), tq=st.integers(1, 9), tk=st.integers(1, 9),
    d=st.integers(1, 5), dv=st.integers(1, 5), causal=st.booleans(), padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_three_forms_agree(b, h, tq, tk, d, dv, causal, padded, seed):
    q, k, v = qkv(b, h, tq, tk, d, dv, seed=seed)
    mask = None
    if padded:
        g = torch.Generator().manual_seed(seed + 1)
        mask = torch.rand(b, 1, 1, tk, generator=g) < 0.6  # may mask every key of a batch
    out_right, out_loop, out_quad, weights = three_forms(q, k, v, causal=causal, mask=mask)
    torch.testing.assert_close(out_right, out_quad, **TOL)
    torch.testing.assert_close(out_loop, out_quad, **TOL)
    rows = weights.sum(-1)
    assert torch.all((rows - 1).abs() < 1e-12) if mask is None else torch.all(((rows - 1).abs() < 1e-12) | (rows == 0))


# ----------------------------------------------------------------------------- sparse masks: definitions

def brute(t, rule):
    return torch.tensor([[bool(rule(i, j)) for j in range(t)] for i in range(t)])


@pytest.mark.parametrize("t", [1, 2, 7, 16])
def test_masks_match_their_definitions(t):
    for w in range(0, 5):
        assert torch.equal(sliding_window_mask(t, w), brute(t, lambda i, j: abs(i - j) <= w))
        assert torch.equal(sliding_window_mask(t, w, causal=True), brute(t, lambda i, j: 0 <= i - j <= w))
    for l in range(1, 6):  # Child et al. strided heads: A1 = {max(0, i-l)..i}, A2 = {j: (i-j) mod l = 0}
        a1 = brute(t, lambda i, j: max(0, i - l) <= j <= i)
        a2 = brute(t, lambda i, j: j <= i and (i - j) % l == 0)
        assert torch.equal(strided_mask(t, l), a1 | a2)
        assert torch.equal(strided_mask(t, l, causal=False), a1 | a2 | (a1 | a2).T)
        for c in range(1, l + 1):  # fixed heads: same block, or the last c positions of a block
            rule = lambda i, j: j // l == i // l or j % l >= l - c  # noqa: E731
            assert torch.equal(fixed_mask(t, l, summary=c, causal=False), brute(t, rule))
            assert torch.equal(fixed_mask(t, l, summary=c), brute(t, lambda i, j: j <= i and rule(i, j)))
    g = [0, t - 1]
    assert torch.equal(global_token_mask(t, g), brute(t, lambda i, j: i in g or j in g))
    base = sliding_window_mask(t, 1)
    assert torch.equal(global_token_mask(t, torch.tensor(g), base=base), brute(t, lambda i, j: i in g or j in g) | base)
    assert mask_nnz(global_token_mask(t, [])) == 0


def test_sliding_window_nnz_closed_form_exact():
    for t in range(1, 60):
        for w in range(0, 70):
            for causal in (False, True):
                n = mask_nnz(sliding_window_mask(t, w, causal=causal))
                assert n == sliding_window_nnz(t, w, causal=causal), (t, w, causal)
            if t > w:  # the formulas as the book states them
                assert mask_nnz(sliding_window_mask(t, w)) == t * (2 * w + 1) - w * (w + 1)
                assert 2 * mask_nnz(sliding_window_mask(t, w, causal=True)) == 2 * t * (w + 1) - w * (w + 1)
            else:  # the window covers everything
                assert sliding_window_nnz(t, w) == t * t and sliding_window_nnz(t, w, causal=True) == t * (t + 1) // 2


def test_strided_nnz_closed_form_exact():
    for t in range(1, 60):
        for l in range(1, 65):
            for causal in (False, True):
                assert mask_nnz(strided_mask(t, l, causal=causal)) == strided_nnz(t, l, causal=causal), (t, l, causal)
    t = 1024  # l = sqrt(t): about 1.5 t sqrt(t) entries instead of t(t+1)/2
    assert strided_nnz(t, 32) < 1.6 * t * 32 < t * (t + 1) // 2 / 10


# ----------------------------------------------------------------------------- receptive field

@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_receptive_field_is_L_times_w(causal):
    for t in (1, 5, 23):
        for w in range(0, 4):
            for layers in range(0, 5):
                reach = receptive_field(sliding_window_mask(t, w, causal=causal), layers)
                assert torch.equal(reach, sliding_window_mask(t, layers * w, causal=causal))  # exactly L*w, no further
                i = torch.arange(t)
                limit = i if causal else torch.maximum(i, t - 1 - i)
                dist = receptive_distance(sliding_window_mask(t, w, causal=causal), layers)
                assert torch.equal(dist, torch.clamp(limit, max=layers * w))


def test_receptive_field_includes_the_residual_path():
    t = 12
    previous_only = torch.ones(t, t, dtype=torch.bool).tril(-1) & ~torch.ones(t, t, dtype=torch.bool).tril(-2)
    assert not previous_only.diagonal().any()  # query i attends only key i - 1
    for layers in range(0, 5):  # with the residual path: i - L .. i, not just i - L
        assert torch.equal(receptive_field(previous_only, layers), sliding_window_mask(t, layers, causal=True))


@pytest.mark.parametrize("make", [lambda t: strided_mask(t, 5), lambda t: fixed_mask(t, 5)])
def test_factorized_patterns_connect_everything_in_two_layers(make):
    t = 30
    full = torch.ones(t, t, dtype=torch.bool).tril()
    assert not torch.equal(receptive_field(make(t), 1), full)
    assert torch.equal(receptive_field(make(t), 2), full)


def test_global_token_connects_everything_in_two_layers():
    mask = global_token_mask(20, [7], base=sliding_window_mask(20, 0))
    assert receptive_distance(mask, 1).max().item() == 12
    assert receptive_field(mask, 2).all()


# ----------------------------------------------------------------------------- masks as attention masks

MASKS = {
    "window": lambda t: sliding_window_mask(t, 2),
    "causal_window": lambda t: sliding_window_mask(t, 3, causal=True),
    "strided": lambda t: strided_mask(t, 4),
    "fixed": lambda t: fixed_mask(t, 4, summary=2),
    "global": lambda t: global_token_mask(t, [0, 5], base=sliding_window_mask(t, 1)),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_sparse_masks_in_softmax_attention(name):
    q, k, v = qkv(tq=13, tk=13, d=6, dv=5)
    mask = MASKS[name](13)
    res = attention_ref(q, k, v, mask=mask)
    out, weights = res.out, res.weights
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(6)
    manual = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(weights, manual, **TOL)
    torch.testing.assert_close(out, manual @ v, **TOL)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOL)
    assert (weights.masked_select(~mask) == 0).all()


@pytest.mark.parametrize("backend", ["ref", "tiled", "sdpa"])
def test_sparse_masks_through_the_dispatcher(backend):
    import attnbook

    q, k, v = qkv(b=1, h=2, tq=21, tk=21, d=4, dv=3, seed=3)
    for name, make in MASKS.items():
        mask = make(21)
        expected = attention_ref(q, k, v, mask=mask).out
        out = attnbook.attention(q, k, v, mask=mask, backend=backend)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")
        causal_out = attnbook.attention(q, k, v, mask=mask, causal=True, backend=backend)
        torch.testing.assert_close(causal_out, attention_ref(q, k, v, mask=mask, causal=True).out, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- bad input

def _q():
    return qkv(b=1, h=1, tq=3, tk=4, d=2, dv=2)


BAD = [
    (lambda: linear_attention(*(t.long() for t in _q())), TypeError, "floating"),
    (lambda: linear_attention(_q()[0], _q()[1][..., :1], _q()[2]), ValueError, "feature dim"),
    (lambda: linear_attention(_q()[0], _q()[1], _q()[2][..., :3, :]), ValueError, "length Tk"),
    (lambda: linear_attention(*_q(), mask=torch.zeros(4)), TypeError, "bool"),
    (lambda: linear_attention(*_q(), mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, "key-padding"),
    (lambda: linear_attention_quadratic(*_q(), mask=torch.ones(5, dtype=torch.bool)), ValueError, "broadcast"),
    (lambda: linear_attention(*_q(), causal="yes"), TypeError, "causal"),
    (lambda: linear_attention_recurrent(*_q(), eps=-1.0), ValueError, "eps"),
    (lambda: linear_attention(*_q(), eps=float("nan")), ValueError, "eps"),
    (lambda: linear_attention(*_q(), feature_map=3), TypeError, "feature_map"),
    (lambda: linear_attention(*_q(), feature_map=lambda x: x.float()), TypeError, "feature_map"),
    (lambda: linear_attention(*_q(), feature_map=lambda x: x.sum(-1)), ValueError, "feature_map"),
    (lambda: linear_attention_denominator(_q()[0], "k"), TypeError, "k"),
    (lambda: elu_feature_map(torch.ones(3, dtype=torch.long)), TypeError, "x"),
    (lambda: sliding_window_mask(0, 1), ValueError, "t"),
    (lambda: sliding_window_mask(5, -1), ValueError, "window"),
    (lambda: sliding_window_mask(5, 1.5), TypeError, "window"),
    (lambda: sliding_window_mask(5, True), TypeError, "window"),
    (lambda: strided_mask(5, 0), ValueError, "stride"),
    (lambda: strided_mask(5, 2, causal=1), TypeError, "causal"),
    (lambda: sliding_window_nnz(5, 2, causal="no"), TypeError, "causal"),
    (lambda: fixed_mask(5, 2, summary=3), ValueError, "summary"),
    (lambda: global_token_mask(5, [5]), ValueError, "global_tokens"),
    (lambda: global_token_mask(5, [-1]), ValueError, "global_tokens"),
    (lambda: global_token_mask(5, [1.5]), TypeError, "global_tokens"),
    (lambda: global_token_mask(5, torch.tensor([0.0])), TypeError, "global_tokens"),
    (lambda: global_token_mask(5, [0], base=torch.ones(4, 4, dtype=torch.bool)), ValueError, "base"),
    (lambda: global_token_mask(5, [0], base=torch.ones(5, 5)), TypeError, "base"),
    (lambda: mask_nnz(torch.ones(3)), TypeError, "mask"),
    (lambda: sliding_window_nnz(0, 1), ValueError, "t"),
    (lambda: strided_nnz(4, 0), ValueError, "stride"),
    (lambda: receptive_field(torch.ones(3, 4, dtype=torch.bool), 1), ValueError, "square"),
    (lambda: receptive_field(torch.ones(3, 3, dtype=torch.bool), -1), ValueError, "layers"),
    (lambda: receptive_distance(torch.ones(3, 3), 1), TypeError, "mask"),
]


@pytest.mark.parametrize("call,exc,needle", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_raises_clear_errors(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()
