"""Tests for attnbook.flash: online softmax and the tiled FlashAttention-2 kernel (float64 truth)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnbook.flash as flash
from attnbook.reference import attention_ref, padding_mask
from attnbook.flash import attention_tiled, default_blocks, online_softmax, tile_schedule
from attnbook.testing import assert_close_to_reference, max_abs_error, rounding_step
from attnbook.testing import F64_TOL as F64, NEG_INF, assert_lse, lse_ref, make_mask, qkv, rand

# ---------------------------------------------------------------------------------------------
# online_softmax
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", [1, 3, 64, 200])
@pytest.mark.parametrize("n", [1, 50, 130])
def test_online_softmax_matches_softmax_float64(block, n):
    x = rand(4, 3, n, scale=5.0)
    torch.testing.assert_close(online_softmax(x, block=block), torch.softmax(x, -1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("big", [1000.0, 1e4])
def test_online_softmax_large_logits_and_empty_rows(big):
    x = rand(5, 40, dtype=torch.float32, scale=big)
    x[0] = NEG_INF  # a row with nothing to attend to
    x[1, :20] = NEG_INF  # a row whose first blocks are empty
    y = online_softmax(x, block=8)
    assert torch.isfinite(y).all()
    assert torch.equal(y[0], torch.zeros(40))
    torch.testing.assert_close(y[1:], torch.softmax(x[1:], -1), rtol=1e-5, atol=1e-6)


def test_online_softmax_half_returns_half():
    x = rand(3, 33, dtype=torch.float16)
    y = online_softmax(x, block=4)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), rtol=2e-3, atol=2e-3)


def test_online_softmax_bad_input():
    with pytest.raises(ValueError, match="block"):
        online_softmax(rand(3, 4), block=0)
    with pytest.raises(TypeError, match="block"):
        online_softmax(rand(3, 4), block=2.0)
    with pytest.raises(TypeError, match="x"):
        online_softmax(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="x"):
        online_softmax([1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# attention_tiled vs the float64 reference
# ---------------------------------------------------------------------------------------------

SHAPES = {  # B, H, Tq, Tk, D, Dv, block_q, block_k
    "T_not_multiple": (1, 2, 37, 37, 8, 8, 16, 16),
    "T_below_block": (1, 1, 5, 7, 8, 8, 64, 64),
    "block_1": (1, 1, 6, 5, 4, 4, 1, 1),
    "Tq_lt_Tk": (2, 1, 20, 33, 8, 8, 8, 8),
    "Tq_gt_Tk": (1, 2, 33, 12, 8, 8, 8, 8),
    "Dv_ne_D": (1, 2, 19, 23, 8, 3, 8, 8),
    "B_H_gt_1": (3, 4, 16, 16, 8, 8, 4, 8),
    "blocks_17_50": (1, 1, 30, 50, 16, 16, 17, 50),
}


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SHAPES))
def test_tiled_matches_reference_float64(name, causal, mask_kind):
    b, h, tq, tk, d, dv, bq, bk = SHAPES[name]
    q, k, v = qkv(b, h, tq, tk, d, dv)
    mask = make_mask(mask_kind, b, h, tq, tk)
    res = attention_tiled(q, k, v, mask=mask, causal=causal, block_q=bq, block_k=bk)
    out, lse = res.out, res.lse
    expected = attention_ref(q, k, v, mask=mask, causal=causal).out
    assert out.shape == (b, h, tq, dv) and lse.shape == (b, h, tq) and lse.dtype == torch.float64
    torch.testing.assert_close(out, expected, **F64)
    assert_lse(lse, lse_ref(q, k, mask, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_matches_sdpa_math(causal):
    q, k, v = qkv(2, 3, 45, 45, 16, 16)
    mask = None if causal else make_mask("bool", 2, 3, 45, 45)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    out = attention_tiled(q, k, v, mask=mask, causal=causal, block_q=16, block_k=8).out
    torch.testing.assert_close(out, expected, **F64)


def test_tiled_matches_sdpa_float32_default_backend_cross_attention():
    q, k, v = qkv(1, 2, 70, 130, 32, 32, dtype=torch.float32)
    out = attention_tiled(q, k, v).out  # default tiles
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_follows_flashattention_rule(causal):
    q, k, v = qkv(2, 2, 150, 150, 32, 32)
    mask = make_mask("bool", 2, 2, 150, 150)
    ref = attention_ref(q, k, v, mask=mask, causal=causal).out
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    res = attention_tiled(q32, k32, v32, mask=mask, causal=causal, block_q=32, block_k=48)
    out, lse = res.out, res.lse
    naive = attention_ref(q32, k32, v32, mask=mask, causal=causal).out
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert_close_to_reference(out, naive, ref)
    g = rand(*out.shape, seed=7)
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    grads_ref = torch.autograd.grad(attention_ref(q64, k64, v64, mask=mask, causal=causal).out, (q64, k64, v64), g)
    grads = torch.autograd.grad(out, (q32, k32, v32), g.float())
    grads_naive = torch.autograd.grad(naive, (q32, k32, v32), g.float())
    for name, a, n, r in zip("qkv", grads, grads_naive, grads_ref):
        assert_close_to_reference(a, n, r, factor=3.0, name=f"d{name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_float32(dtype):
    q, k, v = qkv(1, 2, 40, 40, 16, 16)
    ref = attention_ref(q, k, v, causal=True).out
    qh, kh, vh = (t.to(dtype).requires_grad_() for t in (q, k, v))
    res = attention_tiled(qh, kh, vh, causal=True, block_q=16, block_k=16)
    out, lse = res.out, res.lse
    assert out.dtype == dtype and lse.dtype == torch.float32
    naive = attention_ref(qh.detach(), kh.detach(), vh.detach(), causal=True).out
    assert_close_to_reference(out, naive, ref)
    out.float().sum().backward()
    assert qh.grad.dtype == dtype and torch.isfinite(qh.grad.float()).all()


@pytest.mark.parametrize("big", [1000.0, 1e4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_large_logits(big, dtype):
    q = rand(1, 2, 24, 8, dtype=torch.float64, seed=3)
    q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(big * math.sqrt(8))  # |scores| up to ~big
    k = rand(1, 2, 24, 8, seed=4)
    k = k / k.norm(dim=-1, keepdim=True) * math.sqrt(big * math.sqrt(8))
    v = rand(1, 2, 24, 8, seed=5)
    ref = attention_ref(q, k, v, causal=True).out
    low = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    res = attention_tiled(*low, causal=True, block_q=8, block_k=8)
    out, lse = res.out, res.lse
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    g = rand(*out.shape, seed=6)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    grads_ref = torch.autograd.grad(attention_ref(*ref_in, causal=True).out, ref_in, g)
    grads = torch.autograd.grad(out, low, g.to(dtype))
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref, **F64)
        assert_lse(lse, lse_ref(q, k, causal=True))
        for a, b in zip(grads, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * big)
    else:  # float32 and float16 (computed in float32): the FlashAttention rule, gradients included
        naive_in = [t.detach().requires_grad_() for t in low]
        naive = attention_ref(*naive_in, causal=True).out
        assert_close_to_reference(out, naive, ref)
        grads_naive = torch.autograd.grad(naive, naive_in, g.to(dtype))
        # A backward that recomputed P = exp(S - lse) from a float32 lse failed this for dV:
        # lse ~ 1e3..1e4 is rounded by ~1e-4..1e-3, and so was every recomputed P.
        assert_close_to_reference(grads[2], grads_naive[2], grads_ref[2], factor=3.0, name="dv")
        # dQ and dK go through dS = P * (dP - D_i) with D_i = rowsum(dO_i * O_i), FlashAttention-2's
        # shortcut for sum_j P_ij dP_ij: dP_ij - D_i cancels, leaving a rounding of up to
        # ~eps * Dv * max|dO| * max|V|, which dQ = scale * dS K multiplies by |K| (dK by |Q|). Near
        # one-hot rows the naive kernel's error is ~0, so the rule gets that allowance (PyTorch's
        # SDPA CPU kernel exceeds the plain 3x rule here too: dQ 6x at 1e3, dV 1e4x at 1e4).
        eps, scale = torch.finfo(torch.float32).eps, 8 ** -0.5
        shortcut = eps * scale * 8 * float(g.abs().max()) * float(v.abs().max())
        for i, name in ((0, "dq"), (1, "dk")):
            other = float((k if name == "dq" else q).abs().max())
            err, base = max_abs_error(grads[i], grads_ref[i]), max_abs_error(grads_naive[i], grads_ref[i])
            bound = 3.0 * base + rounding_step(grads_ref[i], dtype) + 3.0 * shortcut * other
            assert torch.isfinite(grads[i]).all() and err <= bound, (name, err, base, bound)


# ---------------------------------------------------------------------------------------------
# Masks: fully masked rows and tiles, broadcast forms
# ---------------------------------------------------------------------------------------------

def test_fully_masked_rows_zero_output_minus_inf_lse_zero_grads():
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 12, 20, 4, 5))
    mask = torch.rand(2, 2, 12, 20, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 1, 3] = False  # an empty row
    mask[1, :, 7:] = False  # many empty rows
    res = attention_tiled(q, k, v, mask=mask, block_q=4, block_k=8)
    out, lse = res.out, res.lse
    empty = ~mask.any(-1)  # (B, H, Tq)
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.isneginf(lse[empty]).all() and torch.isfinite(lse[~empty]).all()
    g = rand(*out.shape, seed=9)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    for grad in (dq, dk, dv):
        assert torch.isfinite(grad).all()
    assert torch.equal(dq[empty], torch.zeros_like(dq[empty]))
    ref_grads = torch.autograd.grad(attention_ref(q, k, v, mask=mask).out, (q, k, v), g)
    for a, b in zip((dq, dk, dv), ref_grads):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_first_key_tile_with_later_keys(mask_kind):
    """exp(-inf - (-inf)) = NaN trap: every row's first key tile is masked, later keys are not."""
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 10, 24, 4, 4, scale=3.0))
    keep = torch.ones(10, 24, dtype=torch.bool)
    keep[:, :8] = False  # the whole first key tile (block_k = 8)
    keep[:4, 8:16] = False  # rows 0-3: also the second one
    mask = keep if mask_kind == "bool" else torch.zeros(10, 24, dtype=torch.float64).masked_fill(~keep, NEG_INF)
    res = attention_tiled(q, k, v, mask=mask, block_q=4, block_k=8)
    out, lse = res.out, res.lse
    expected = attention_ref(q, k, v, mask=mask).out
    torch.testing.assert_close(out, expected, **F64)
    assert_lse(lse, lse_ref(q, k, mask))
    g = rand(*out.shape, seed=2)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(expected, (q, k, v), g)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("shape", [(), (20,), (1, 20), (12, 20), (2, 1, 1, 20), (1, 3, 12, 1), (2, 3, 12, 20)])
def test_mask_broadcast_forms(shape):
    q, k, v = qkv(2, 3, 12, 20, 4, 4)
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(shape, generator=g) > 0.2 if shape else torch.tensor(True)
    out = attention_tiled(q, k, v, mask=mask, block_q=5, block_k=6).out
    torch.testing.assert_close(out, attention_ref(q, k, v, mask=mask).out, **F64)


def test_padding_mask_and_causal_together():
    q, k, v = qkv(3, 2, 17, 17, 8, 8)
    mask = padding_mask([17, 9, 1], 17)
    res = attention_tiled(q, k, v, mask=mask, causal=True, block_q=4, block_k=4)
    out, lse = res.out, res.lse
    torch.testing.assert_close(out, attention_ref(q, k, v, mask=mask, causal=True).out, **F64)
    assert_lse(lse, lse_ref(q, k, mask, causal=True))


@pytest.mark.parametrize("shape", [(9, 4), (3, 9, 4), (2, 1, 3, 9, 4)])
def test_any_leading_dims(shape):
    q, k, v = rand(*shape), rand(*shape, seed=1), rand(*shape, seed=2)
    res = attention_tiled(q, k, v, causal=True, block_q=2, block_k=4)
    out, lse = res.out, res.lse
    assert out.shape == shape and lse.shape == shape[:-1]
    torch.testing.assert_close(out, attention_ref(q, k, v, causal=True).out, **F64)


def test_custom_scale():
    q, k, v = qkv(1, 1, 9, 11, 4, 4)
    res = attention_tiled(q, k, v, scale=0.3, block_q=4, block_k=4)
    out, lse = res.out, res.lse
    torch.testing.assert_close(out, attention_ref(q, k, v, scale=0.3).out, **F64)
    assert_lse(lse, lse_ref(q, k, scale=0.3))


def test_empty_sequences():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 4, 0, 3, 5))  # no keys at all: every row is empty
    res = attention_tiled(q, k, v, block_q=2, block_k=2)
    out, lse = res.out, res.lse
    assert torch.equal(out, torch.zeros(1, 2, 4, 5, dtype=torch.float64)) and torch.isneginf(lse).all()
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    q, k, v = qkv(1, 2, 0, 6, 3, 5)  # no queries
    res = attention_tiled(q, k, v, causal=True)
    out, lse = res.out, res.lse
    assert out.shape == (1, 2, 0, 5) and lse.shape == (1, 2, 0)


def test_default_blocks_rule():
    assert default_blocks(100, 100) == (32, 512)
    assert default_blocks(300, 9000) == (64, 512)
    assert default_blocks(4096, 4096) == (256, 512)
    q, k, v = qkv(1, 1, 800, 700, 8, 8)  # auto tiles: 256 x 512, tails of 32 and 188
    torch.testing.assert_close(attention_tiled(q, k, v, causal=True).out,
                               attention_ref(q, k, v, causal=True).out, **F64)


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------

# derandomize: the float32 check is the FlashAttention rule on tiny tensors, where the naive
# kernel's max error is itself a noisy yardstick (about 1 random draw in 200 lands just past
# 2x even for a single-tile kernel); fixed examples keep the suite deterministic.
# The named hard cases (STYLE.md), pinned so every run checks them: blocks of 1, T not a multiple
# of the block, T smaller than a block, Tq != Tk both ways with causal, masks with empty rows.
@example(b=1, h=1, tq=1, tk=1, d=1, dv=1, bq=1, bk=1, mask_kind=None, causal=False, dtype=torch.float64, seed=0)
@example(b=2, h=2, tq=17, tk=9, d=3, dv=2, bq=16, bk=8, mask_kind="float", causal=False, dtype=torch.float64, seed=1)
@example(b=1, h=2, tq=3, tk=5, d=4, dv=4, bq=16, bk=16, mask_kind="bool", causal=True, dtype=torch.float64, seed=2)
@example(b=1, h=1, tq=24, tk=5, d=2, dv=3, bq=4, bk=2, mask_kind=None, causal=True, dtype=torch.float64, seed=3)
@example(b=1, h=1, tq=5, tk=24, d=2, dv=3, bq=2, bk=4, mask_kind="float", causal=True, dtype=torch.float32, seed=4)
@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    b=st.integers(1, 2), h=st.integers(1, 2), tq=st.integers(1, 24), tk=st.integers(1, 24),
    d=st.integers(1, 8), dv=st.integers(1, 8), bq=st.integers(1, 16), bk=st.integers(1, 16),
    mask_kind=st.sampled_from([None, "bool", "float"]), causal=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]), seed=st.integers(0, 1000),
)
def test_property_tiled_equals_reference(b, h, tq, tk, d, dv, bq, bk, mask_kind, causal, dtype, seed):
    q, k, v = qkv(b, h, tq, tk, d, dv, seed=seed, scale=2.0)
    mask = make_mask(mask_kind, b, h, tq, tk, seed=seed)
    ref = attention_ref(q, k, v, mask=mask, causal=causal).out
    cast = (lambda t: t) if dtype == torch.float64 else (lambda t: t.float())
    mask_c = mask if mask is None or mask.dtype == torch.bool else cast(mask)
    res = attention_tiled(cast(q), cast(k), cast(v), mask=mask_c, causal=causal, block_q=bq, block_k=bk)
    out, lse = res.out, res.lse
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref, **F64)
        assert_lse(lse, lse_ref(q, k, mask, causal))
    else:
        naive = attention_ref(cast(q), cast(k), cast(v), mask=mask_c, causal=causal).out
        assert_close_to_reference(out, naive, ref)


@example(tq=1, tk=1, bq=1, bk=1, mask_kind=None, causal=False, seed=0)
@example(tq=12, tk=5, bq=8, bk=3, mask_kind="bool", causal=True, seed=1)
@example(tq=5, tk=12, bq=1, bk=8, mask_kind="bool", causal=False, seed=2)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    tq=st.integers(1, 12), tk=st.integers(1, 12), bq=st.integers(1, 8), bk=st.integers(1, 8),
    mask_kind=st.sampled_from([None, "bool"]), causal=st.booleans(), seed=st.integers(0, 1000),
)
def test_property_gradients_equal_reference(tq, tk, bq, bk, mask_kind, causal, seed):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, tq, tk, 4, 3, seed=seed))
    mask = make_mask(mask_kind, 1, 2, tq, tk, seed=seed)
    out = attention_tiled(q, k, v, mask=mask, causal=causal, block_q=bq, block_k=bk).out
    ref = attention_ref(q, k, v, mask=mask, causal=causal).out
    g = rand(*out.shape, seed=seed + 3)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, r, **F64)


# ---------------------------------------------------------------------------------------------
# Custom backward
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_kind, causal", [(None, False), (None, True), ("bool", False), ("float", True)])
def test_gradcheck(mask_kind, causal):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 5, 7, 3, 4, seed=4))
    mask = make_mask(mask_kind, 1, 2, 5, 7, seed=4)
    if mask is not None:
        mask[..., 2, :] = False if mask.dtype == torch.bool else NEG_INF  # include an empty row
    fn = lambda q, k, v: attention_tiled(q, k, v, mask=mask, causal=causal, block_q=2, block_k=3).out
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("shape", [(7,), (5, 7), (1, 2, 5, 7), (2, 1, 1, 7)])
def test_learned_additive_mask_gets_its_gradient(shape):
    """A float mask that requires grad (a learned bias) gets dS, summed over its broadcast dims."""
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 5, 7, 3, 4, seed=6))
    bias = rand(*shape, seed=7)
    bias[..., 0] = NEG_INF  # a hidden key: zero gradient there, never NaN
    bias.requires_grad_()
    fn = lambda q, k, v, b: attention_tiled(q, k, v, mask=b, causal=True, block_q=2, block_k=3).out
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))
    g = rand(2, 2, 5, 4, seed=8)
    grads = torch.autograd.grad(fn(q, k, v, bias), (q, k, v, bias), g)
    expected = torch.autograd.grad(attention_ref(q, k, v, mask=bias, causal=True).out, (q, k, v, bias), g)
    for a, r in zip(grads, expected):
        assert a.shape == r.shape and torch.isfinite(a).all()
        torch.testing.assert_close(a, r, **F64)


@pytest.mark.parametrize("name", ["T_not_multiple", "Tq_gt_Tk", "Dv_ne_D", "B_H_gt_1", "block_1"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_autograd_through_reference(name, causal):
    b, h, tq, tk, d, dv, bq, bk = SHAPES[name]
    q, k, v = (t.requires_grad_() for t in qkv(b, h, tq, tk, d, dv))
    mask = make_mask("bool", b, h, tq, tk)
    res = attention_tiled(q, k, v, mask=mask, causal=causal, block_q=bq, block_k=bk)
    out, lse = res.out, res.lse
    assert lse.requires_grad  # issue 30: the log-sum-exp carries gradients in every kernel
    ref = attention_ref(q, k, v, mask=mask, causal=causal).out
    g = rand(*out.shape, seed=11)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, r, **F64)


def saved_bytes(fn, t):
    """Bytes autograd keeps for backward when ``fn`` runs on (1, 2, t, 16) inputs."""
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, t, t, 16, 16, dtype=torch.float32))
    total = []

    def pack(x):
        total.append(x.numel() * x.element_size())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn(q, k, v)
    out.sum().backward()
    return sum(total)


def test_saved_tensors_grow_linearly_not_quadratically():
    tiled = lambda q, k, v: attention_tiled(q, k, v, block_q=32, block_k=32).out
    ref = lambda q, k, v: attention_ref(q, k, v).out
    t_small, t_big = (saved_bytes(tiled, t) for t in (64, 256))
    r_small, r_big = (saved_bytes(ref, t) for t in (64, 256))
    # q, k, v, out (1*2*T*16 floats each) and the row max m and row sum l (1*2*T each): nothing of size T^2
    assert t_big == 4 * (4 * 2 * 256 * 16 + 2 * 2 * 256)
    assert t_big / t_small == pytest.approx(4.0)  # 4x longer -> 4x the bytes
    assert r_big / r_small > 12.0  # the materialised weights grow 16x
    assert r_big > 10 * t_big


# ---------------------------------------------------------------------------------------------
# Causal tile skipping
# ---------------------------------------------------------------------------------------------

def test_tile_schedule_counts():
    n, b = 6, 8
    assert len(tile_schedule(n * b, n * b, b, b)) == n * n
    assert len(tile_schedule(n * b, n * b, b, b, causal=True)) == n * (n + 1) // 2
    assert len(tile_schedule(13, 13, 1, 1, causal=True)) == 13 * 14 // 2  # T(T+1)/2 score entries
    assert tile_schedule(4, 9, 2, 3, causal=True) == [(0, 0), (1, 0), (1, 1)]


@pytest.mark.parametrize("tq, tk, bq, bk", [(16, 16, 4, 4), (13, 29, 4, 6), (29, 13, 6, 4), (10, 10, 3, 7), (7, 7, 1, 1)])
def test_tile_schedule_is_exactly_the_tiles_with_an_allowed_pair(tq, tk, bq, bk):
    allowed = torch.ones(tq, tk, dtype=torch.bool).tril()  # top-left causal
    expected = {(i, j) for i in range(-(-tq // bq)) for j in range(-(-tk // bk))
                if allowed[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk].any()}
    assert set(tile_schedule(tq, tk, bq, bk, causal=True)) == expected


@pytest.mark.parametrize("causal", [False, True])
def test_kernel_visits_exactly_the_scheduled_tiles(monkeypatch, causal):
    """Count the tiles the forward and backward loops really compute."""
    visited = []
    real = flash._mask_tile

    def spy(s, mask, lead, i0, j0, causal_):
        visited.append((i0 // 4, j0 // 6))
        return real(s, mask, lead, i0, j0, causal_)

    monkeypatch.setattr(flash, "_mask_tile", spy)
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, 22, 25, 4, 4))
    out = attention_tiled(q, k, v, causal=causal, block_q=4, block_k=6).out
    forward_tiles, visited[:] = list(visited), []
    out.sum().backward()
    schedule = tile_schedule(22, 25, 4, 6, causal=causal)
    assert forward_tiles == schedule
    assert sorted(visited) == sorted(schedule)
    assert len(schedule) == (6 * 5 if not causal else 1 + 2 + 2 + 3 + 4 + 4)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

def test_bad_input_raises_clear_errors():
    q, k, v = qkv(1, 2, 6, 6, 4, 4)
    with pytest.raises(ValueError, match="block_q"):
        attention_tiled(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="block_k"):
        attention_tiled(q, k, v, block_k=-3)
    with pytest.raises(TypeError, match="block_q"):
        attention_tiled(q, k, v, block_q=2.5)
    with pytest.raises(TypeError, match="block_k"):
        attention_tiled(q, k, v, block_k=True)
    with pytest.raises(TypeError, match="floating"):
        attention_tiled(q.long(), k.long(), v.long())
    with pytest.raises(ValueError, match="feature dim D"):
        attention_tiled(q, rand(1, 2, 6, 5), v)
    with pytest.raises(ValueError, match="mask"):
        attention_tiled(q, k, v, mask=torch.ones(3, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask"):
        attention_tiled(q, k, v, mask=torch.ones(6, 6, dtype=torch.int64))
    with pytest.raises(TypeError, match="causal"):
        attention_tiled(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="device"):
        attention_tiled(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="block_q"):
        tile_schedule(4, 4, 0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_cuda():
    q, k, v = qkv(1, 2, 70, 90, 16, 16)
    mask = make_mask("bool", 1, 2, 70, 90)
    res = attention_tiled(q.cuda(), k.cuda(), v.cuda(), mask=mask.cuda(), causal=True, block_q=16, block_k=32)
    out, lse = res.out, res.lse
    assert out.device.type == "cuda" and lse.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), attention_ref(q, k, v, mask=mask, causal=True).out, **F64)


# ------------------------------------------------------------------ issue 30: lse has a gradient
def test_tiled_lse_is_differentiable_and_matches_the_oracle():
    """One rule for every kernel: lse carries gradients (Triton's did, tiled's was detached)."""
    from attnbook.testing import lse_ref
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 1, 7, 7, generator=g, dtype=torch.float64)
    w_out = torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64)
    w_lse = torch.randn(1, 2, 7, generator=g, dtype=torch.float64)

    def loss(res):
        return (res.out * w_out).sum() + (res.lse * w_lse).sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    res = attention_tiled(*leaves[:3], mask=leaves[3], causal=True, block_q=3, block_k=2)
    assert res.lse.requires_grad
    got = torch.autograd.grad(loss(res), leaves)
    oracle = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = attention_ref(*oracle[:3], mask=oracle[3], causal=True).out
    lse = lse_ref(*oracle[:2], mask=oracle[3], causal=True)
    want = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), oracle)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda *t: attention_tiled(*t, causal=True, block_q=3, block_k=2).lse,
        tuple(t.clone().requires_grad_() for t in (q, k, v)))


def test_tiled_lse_gradient_of_an_empty_row_is_zero():
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    res = attention_tiled(q, k, v, mask=mask)
    assert torch.isneginf(res.lse[0, 0, 1])
    dq, = torch.autograd.grad(res.lse.masked_fill(torch.isinf(res.lse), 0.0).sum(), q)
    assert torch.isfinite(dq).all() and not dq[0, 0, 1].any()


def test_the_shown_tile_functions_have_public_names_and_old_aliases():
    from attnbook import flash
    assert flash._forward is flash.tiled_forward and flash._backward is flash.tiled_backward
    assert {"tiled_forward", "tiled_backward"} <= set(flash.__all__)
