"""Tests for attnbook.layers: LayerNorm, FeedForward, residual blocks, count_parameters (EncoderLayer: test_blocks)."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.blocks import EncoderLayer
from attnbook.layers import (
    FeedForward,
    LayerNorm,
    ResidualBlock,
    count_parameters,
    layer_norm,
    swiglu_hidden_size,
)
from attnbook.multihead import MultiHeadAttention
from attnbook.reference import padding_mask

F64 = torch.float64
from attnbook.testing import F64_TOL as TOL, randomize  # noqa: E402 (the one float64 tolerance)


def randn(*shape, seed=0, dtype=F64, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return shift + scale * torch.randn(*shape, generator=g, dtype=dtype)


def torch_ln(d, eps=1e-5, seed=0, dtype=F64, **kw):
    """An nn.LayerNorm with random (not 1 / 0) gain and shift, so that copying them is tested."""
    ln = nn.LayerNorm(d, eps=eps, dtype=dtype, **kw)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        if ln.weight is not None:
            ln.weight.copy_(1 + 0.5 * torch.randn(d, generator=g, dtype=dtype))
        if ln.bias is not None:
            ln.bias.copy_(0.5 * torch.randn(d, generator=g, dtype=dtype))
    return ln


def seed_layer_norm(x, eps=1e-5):
    """The seed's formula (x - mu) / (sigma + eps): a different function, used as a control."""
    mu = x.mean(-1, keepdim=True)
    sigma = x.var(-1, unbiased=False, keepdim=True).sqrt()
    return (x - mu) / (sigma + eps)


# ------------------------------------------------------------------------------------- LayerNorm

@pytest.mark.parametrize("scale", [1.0, 1e-2, 1e-3, 1e-4])
@pytest.mark.parametrize("shape", [(7,), (3, 16), (2, 5, 64)])
def test_layer_norm_equals_torch_float64(shape, scale):
    d = shape[-1]
    ref = torch_ln(d)
    mine = LayerNorm.from_torch(ref)
    x = randn(*shape, scale=scale, shift=3.0)          # small variance on top of a large mean
    torch.testing.assert_close(mine(x), ref(x), **TOL)
    torch.testing.assert_close(layer_norm(x, ref.weight, ref.bias, 1e-5), ref(x), **TOL)


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_layer_norm_equals_torch_float32(scale):
    ref = torch_ln(32, dtype=torch.float32)
    x = randn(4, 9, 32, scale=scale, dtype=torch.float32)
    torch.testing.assert_close(LayerNorm.from_torch(ref)(x), ref(x), rtol=1e-5, atol=1e-5)


def test_seed_formula_is_a_different_function():
    """Control: the tolerance above rejects (x - mu) / (sigma + eps) at every scale tested."""
    for scale, gap in ((1.0, 1e-6), (1e-2, 0.1), (1e-3, 1.0)):
        x = randn(8, 64, scale=scale, seed=1)
        diff = (seed_layer_norm(x) - F.layer_norm(x, (64,))).abs().max().item()
        assert diff > gap, (scale, diff)


def test_layer_norm_output_statistics():
    eps = 1e-5
    for scale in (1.0, 1e-2, 1e-3):
        x = randn(6, 48, scale=scale, seed=2)
        y = layer_norm(x, eps=eps)
        var = x.var(-1, unbiased=False)
        torch.testing.assert_close(y.mean(-1), torch.zeros(6, dtype=F64), rtol=0, atol=1e-12)
        torch.testing.assert_close(y.var(-1, unbiased=False), var / (var + eps), **TOL)
    # eps = 0: exactly unit (biased) variance
    y0 = layer_norm(randn(6, 48, scale=1e-3, seed=3), eps=0.0)
    torch.testing.assert_close(y0.var(-1, unbiased=False), torch.ones(6, dtype=F64), **TOL)


def test_layer_norm_without_affine_and_without_bias():
    x = randn(3, 10, seed=4)
    for kw in (dict(elementwise_affine=False), dict(bias=False)):
        ref = torch_ln(10, **kw)
        mine = LayerNorm.from_torch(ref)
        assert (mine.weight is None) == (ref.weight is None) and (mine.bias is None) == (ref.bias is None)
        torch.testing.assert_close(mine(x), ref(x), **TOL)
        assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in ref.parameters())


def test_layer_norm_rows_are_independent_and_train_equals_eval():
    ln = LayerNorm(16, dtype=F64)
    x = randn(5, 16, seed=5)
    y = ln(x)
    x2 = x.clone()
    x2[1:] = 100 * randn(4, 16, seed=6)                  # change every other row
    assert torch.equal(ln(x2)[0], y[0])                    # row 0 does not see the batch
    ln.eval()
    assert torch.equal(ln(x), y)                           # no running statistics


@settings(max_examples=40, deadline=None)
@given(d=st.integers(2, 40), rows=st.integers(1, 5), log_scale=st.floats(-4, 2),
       shift=st.floats(-10, 10), eps=st.sampled_from([0.0, 1e-6, 1e-5, 1e-2]), seed=st.integers(0, 10**6))
def test_layer_norm_property(d, rows, log_scale, shift, eps, seed):
    x = randn(rows, d, seed=seed, scale=10**log_scale, shift=shift)
    w, b = randn(d, seed=seed + 1), randn(d, seed=seed + 2)
    if eps == 0.0 and x.var(-1, unbiased=False).min() < 1e-20:
        return
    torch.testing.assert_close(layer_norm(x, w, b, eps), F.layer_norm(x, (d,), w, b, eps),
                               rtol=1e-10, atol=1e-10)


def test_layer_norm_jacobian_closed_form_and_singular_values():
    """J = (1/s) (I - 11^T/d - c c^T / (d s^2)), s = sqrt(v + eps): symmetric, J 1 = 0, and the
    singular values are d - 2 copies of 1/s, one eps / ((v + eps) s) and one 0."""
    d = 12
    for scale, eps in ((1.0, 1e-5), (0.01, 1e-5), (0.003, 1e-5), (1.0, 0.0)):
        x = randn(d, seed=7, scale=scale, shift=0.5)
        J = torch.autograd.functional.jacobian(lambda z: layer_norm(z, eps=eps), x)
        c = x - x.mean()
        v = (c**2).mean()
        s = torch.sqrt(v + eps)
        ones = torch.ones(d, d, dtype=F64)
        closed = (torch.eye(d, dtype=F64) - ones / d - torch.outer(c, c) / (d * s**2)) / s
        torch.testing.assert_close(J, closed, rtol=1e-10, atol=1e-10 / s.item())
        torch.testing.assert_close(J, J.T, rtol=1e-10, atol=1e-10 / s.item())
        assert (J @ torch.ones(d, dtype=F64)).abs().max() < 1e-10 / s.item()
        sv = torch.linalg.svdvals(J)                                   # descending
        torch.testing.assert_close(sv[: d - 2], torch.full((d - 2,), (1 / s).item(), dtype=F64),
                                   rtol=1e-10, atol=0)
        small = (eps / ((v + eps) * s)).item()
        assert abs(sv[d - 2].item() - small) <= 1e-9 * sv[0].item(), (sv[d - 2].item(), small)
        assert sv[d - 1] <= 1e-12 * sv[0]
        expected_rank = d - 2 if eps == 0 else d - 1
        assert torch.linalg.matrix_rank(J, rtol=1e-14).item() == expected_rank
    # control: at unit scale the eps direction is tiny; at scale 0.003 (v ~ eps) it is not
    x_small = randn(d, seed=7, scale=0.003)
    J_small = torch.autograd.functional.jacobian(lambda z: layer_norm(z), x_small)
    sv_small = torch.linalg.svdvals(J_small)
    assert sv_small[d - 2] > 0.1 * sv_small[0]


def test_layer_norm_gradcheck():
    ln = LayerNorm(6, dtype=F64)
    with torch.no_grad():
        ln.weight.copy_(randn(6, seed=8))
        ln.bias.copy_(randn(6, seed=9))
    x = randn(3, 6, seed=10).requires_grad_()
    assert torch.autograd.gradcheck(ln, (x,))
    assert torch.autograd.gradgradcheck(ln, (x,))


# ------------------------------------------------------------------------------------- FeedForward

def _randomize(module, seed=0):
    return randomize(module, seed, scale=0.3)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_ffn_formula(activation):
    d, d_ff = 8, 20
    ffn = _randomize(FeedForward(d, d_ff, activation=activation, dtype=F64), seed=11)
    x = randn(2, 5, d, seed=12)
    W1, b1 = ffn.linear1.weight.T, ffn.linear1.bias            # row convention: x W_1 + b_1
    W2, b2 = ffn.linear2.weight.T, ffn.linear2.bias
    h = x @ W1 + b1
    if activation == "relu":
        h = torch.clamp(h, min=0)
    elif activation == "gelu":
        h = h * 0.5 * (1 + torch.erf(h / math.sqrt(2)))          # x Phi(x)
    else:
        gate = x @ ffn.gate.weight.T + ffn.gate.bias
        h = gate * torch.sigmoid(gate) * h                        # SiLU(x W_g + b_g) * (x W_1 + b_1)
    torch.testing.assert_close(ffn(x), h @ W2 + b2, **TOL)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_ffn_is_position_wise(activation):
    ffn = _randomize(FeedForward(6, 24, activation=activation, dtype=F64), seed=13)
    X = randn(7, 6, seed=14)
    out = ffn(X)
    for i in range(7):
        torch.testing.assert_close(out[i], ffn(X[i]), **TOL)          # row i sees only row i
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ffn(X[perm]), out[perm], **TOL)


def test_ffn_equals_two_kernel_size_one_convolutions():
    d, d_ff = 6, 24
    ffn = _randomize(FeedForward(d, d_ff, dtype=F64), seed=15)
    conv1 = nn.Conv1d(d, d_ff, kernel_size=1, dtype=F64)
    conv2 = nn.Conv1d(d_ff, d, kernel_size=1, dtype=F64)
    with torch.no_grad():
        conv1.weight.copy_(ffn.linear1.weight[:, :, None])           # (out, in, kernel=1)
        conv1.bias.copy_(ffn.linear1.bias)
        conv2.weight.copy_(ffn.linear2.weight[:, :, None])
        conv2.bias.copy_(ffn.linear2.bias)
    X = randn(3, 9, d, seed=16)                                        # (B, T, d)
    conv = conv2(F.relu(conv1(X.transpose(1, 2)))).transpose(1, 2)    # Conv1d wants (B, C, T)
    torch.testing.assert_close(ffn(X), conv, **TOL)


@pytest.mark.parametrize("d", [16, 512])
def test_ffn_parameter_counts(d):
    relu = FeedForward(d, 4 * d)
    assert sum(p.numel() for p in relu.parameters()) == 8 * d * d + 5 * d
    assert sum(p.numel() for p in FeedForward(d, 4 * d, bias=False).parameters()) == 8 * d * d
    h = swiglu_hidden_size(d)
    swiglu = FeedForward(d, h, activation="swiglu", bias=False)
    n = sum(p.numel() for p in swiglu.parameters())
    assert n == 3 * d * h
    assert 0 <= 1 - n / (8 * d * d) < 3 / (8 * d)          # floor(8d/3) loses less than one column
    if d >= 512:
        assert 1 - n / (8 * d * d) < 0.001
    assert sum(p.numel() for p in FeedForward(d, h, activation="swiglu").parameters()) == 3 * d * h + 2 * h + d


def test_swiglu_hidden_size():
    assert swiglu_hidden_size(4096, multiple_of=256) == 11008       # LLaMA-7B
    assert swiglu_hidden_size(512) == 1365 and swiglu_hidden_size(3) == 8
    assert swiglu_hidden_size(512, multiple_of=64) == 1408
    ffn = FeedForward(8, 21, activation="swiglu")
    assert ffn(torch.randn(2, 3, 8)).shape == (2, 3, 8)
    assert ffn.gate.weight.shape == ffn.linear1.weight.shape == (21, 8) and ffn.linear2.weight.shape == (8, 21)


def test_ffn_dropout_only_in_training():
    ffn = FeedForward(8, 32, dropout=0.5)
    x = torch.randn(4, 8)
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))
    ffn.train()
    torch.manual_seed(0)
    assert not torch.allclose(ffn(x), ffn.eval()(x))


# ------------------------------------------------------------------------------------- residual blocks

def test_residual_block_forms_and_jacobians():
    d = 8
    f = _randomize(FeedForward(d, 16, activation="gelu", dtype=F64), seed=17)
    pre = ResidualBlock(f, d, norm_first=True, dtype=F64)
    post = ResidualBlock(f, d, norm_first=False, dtype=F64)
    ln = pre.norm
    x = randn(d, seed=18)
    torch.testing.assert_close(pre(x), x + f(layer_norm(x)), **TOL)
    torch.testing.assert_close(post(x), layer_norm(x + f(x)), **TOL)
    jac = torch.autograd.functional.jacobian
    J_f = jac(f, x)
    eye = torch.eye(d, dtype=F64)
    # y = x + f(x): I + J_f
    torch.testing.assert_close(jac(lambda z: z + f(z), x), eye + J_f, **TOL)
    # Post-LN: J_LN(x + f(x)) (I + J_f)
    J_ln = jac(ln, x + f(x))
    torch.testing.assert_close(jac(post, x), J_ln @ (eye + J_f), rtol=1e-10, atol=1e-12)
    # Pre-LN: I + J_f(LN x) J_LN(x)
    torch.testing.assert_close(jac(pre, x), eye + jac(f, ln(x)) @ jac(ln, x), rtol=1e-10, atol=1e-12)
    assert (jac(post, x) - (eye + J_f)).abs().max() > 0.1                     # control


def test_residual_block_around_attention_passes_arguments():
    mha = MultiHeadAttention(8, 2, dtype=F64)
    x = randn(2, 5, 8, seed=26)
    keep = padding_mask([5, 3], 5)
    for norm_first in (False, True):
        block = ResidualBlock(mha, 8, norm_first=norm_first, dtype=F64)
        ln = block.norm
        expected = (x + mha(ln(x), mask=keep).out if norm_first
                    else ln(x + mha(x, mask=keep).out))
        torch.testing.assert_close(block(x, mask=keep), expected, **TOL)
        assert (block(x) - expected).abs().max() > 1e-3          # control: the mask reached f


# ------------------------------------------------------------------------------------- count_parameters

def test_count_parameters_transformer_base_shapes():
    d, d_ff = 512, 2048
    enc = nn.TransformerEncoderLayer(d, 8, d_ff)
    dec = nn.TransformerDecoderLayer(d, 8, d_ff)
    ce, cd = count_parameters(enc), count_parameters(dec)
    assert ce == {"attention": 4 * d * d + 4 * d, "ffn": 8 * d * d + 5 * d, "norm": 4 * d}
    assert sum(ce.values()) == 3_152_384 and ce["ffn"] == 2_099_712
    assert sum(cd.values()) == 4_204_032 and cd["ffn"] == 2_099_712 and cd["attention"] == 2 * (4 * d * d + 4 * d)
    with warnings.catch_warnings():                  # nested-tensor note for batch_first=False
        warnings.simplefilter("ignore", UserWarning)
        model = nn.Transformer()
    full = count_parameters(model)
    assert sum(full.values()) == 44_140_544 and full["ffn"] == 25_196_544
    assert sum(full.values()) == sum(p.numel() for p in model.parameters())
    assert full["norm"] == (2 * 6 + 3 * 6 + 2) * 2 * d          # 6 + 6 layers and the two final norms


def test_count_parameters_mine_equals_torch_by_kind_and_child():
    ref = nn.TransformerEncoderLayer(16, 4, 40, batch_first=True, dtype=F64)
    mine = EncoderLayer.from_torch(ref)
    assert count_parameters(mine) == count_parameters(ref)
    by_child = count_parameters(mine, by="child")
    assert list(by_child) == ["self_attn", "ffn", "norm1", "norm2"]
    assert sum(by_child.values()) == sum(p.numel() for p in mine.parameters())
    by_child_torch = count_parameters(ref, by="child")
    assert by_child_torch["linear1"] + by_child_torch["linear2"] == by_child["ffn"]


def test_count_parameters_tied_and_other():
    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.block = EncoderLayer(4, 2, 8)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight                   # tied: counted once
            self.scale = nn.Parameter(torch.ones(1))

    lm = TinyLM()
    kinds = count_parameters(lm)
    assert kinds["embedding"] == 40 and kinds["other"] == 1
    assert sum(kinds.values()) == sum(p.numel() for p in lm.parameters())
    children = count_parameters(lm, by="child")
    assert "head" not in children and children["(own)"] == 1      # tied: nothing new to count
    assert sum(children.values()) == sum(p.numel() for p in lm.parameters())
    assert count_parameters(nn.Linear(3, 2)) == {"other": 8}


# ------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("make, exc, match", [
    (lambda: LayerNorm(0), ValueError, "`d`"),
    (lambda: LayerNorm(4, eps=-1e-5), ValueError, "`eps`"),
    (lambda: LayerNorm(4, bias=1), TypeError, "`bias`"),
    (lambda: LayerNorm(4)(torch.randn(2, 5)), ValueError, "last dim"),
    (lambda: LayerNorm(4)(torch.ones(2, 4, dtype=torch.long)), TypeError, "floating"),
    (lambda: layer_norm(torch.randn(2, 4), weight=torch.ones(5)), ValueError, "`weight`"),
    (lambda: LayerNorm.from_torch(nn.BatchNorm1d(4)), TypeError, "nn.LayerNorm"),
    (lambda: LayerNorm.from_torch(nn.LayerNorm((2, 4))), ValueError, "one dim"),
    (lambda: FeedForward(4, 16, activation="tanh"), ValueError, "`activation`"),
    (lambda: FeedForward(4, 0), ValueError, "`d_ff`"),
    (lambda: FeedForward(4, 8, dropout=1.5), ValueError, "`dropout`"),
    (lambda: FeedForward(4, 8)(torch.randn(3, 5)), ValueError, "last dim"),
    (lambda: swiglu_hidden_size(0), ValueError, "`d_model`"),
    (lambda: ResidualBlock(lambda x: x, 4), TypeError, "`sublayer`"),
    (lambda: ResidualBlock(nn.Identity(), 4, norm_first="yes"), TypeError, "`norm_first`"),
    (lambda: count_parameters("model"), TypeError, "`module`"),
    (lambda: count_parameters(nn.Linear(2, 2), by="layer"), ValueError, "`by`"),
])
def test_validation(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


# ------------------------------------------------------------------ issue 30: overflow, underflow
def _old_layer_norm(h, eps=1e-5):  # the formula without the power-of-two scaling
    c = h - h.mean(-1, keepdim=True)
    return c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps)


def test_layer_norm_and_rms_norm_survive_bf16_rows_near_1e20_where_torch_returns_zeros():
    from attnbook.layers import layer_norm, rms_norm
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(4, 16, generator=g, dtype=torch.float64)
    x = (x64 * 1e20).bfloat16()
    want_ln = torch.nn.functional.layer_norm(x.double(), (16,))       # float64 truth of the bf16 input
    want_rms = torch.nn.functional.rms_norm(x.double(), (16,), eps=1e-6)
    bad = torch.nn.functional.layer_norm(x, (16,))                     # control: torch's NaN,
    assert torch.isnan(bad).all() and not _old_layer_norm(x.float()).any()  # the old formula's 0
    assert not torch.nn.functional.rms_norm(x, (16,), eps=1e-6).any()
    torch.testing.assert_close(layer_norm(x).double(), want_ln, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(rms_norm(x, eps=1e-6).double(), want_rms, rtol=2e-2, atol=2e-2)


def test_rms_norm_survives_float32_rows_near_1e_30_with_eps_zero():
    from attnbook.layers import layer_norm, rms_norm
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, generator=g) * 1e-30
    assert torch.isinf(torch.nn.functional.rms_norm(x, (16,), eps=0.0)).all()   # control: torch's inf
    want = torch.nn.functional.rms_norm(x.double() * 1e30, (16,), eps=0.0)
    torch.testing.assert_close(rms_norm(x, eps=0.0).double(), want, rtol=1e-5, atol=1e-6)
    want = torch.nn.functional.layer_norm(x.double() * 1e30, (16,), eps=0.0)
    torch.testing.assert_close(layer_norm(x, eps=0.0).double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaling_changes_no_bit_in_the_ordinary_range_and_keeps_gradients(dtype):
    from attnbook.layers import layer_norm, rms_norm
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 5, 16, generator=g, dtype=dtype) * 3).requires_grad_()
    assert torch.equal(layer_norm(x), _old_layer_norm(x))
    eps = torch.finfo(dtype).eps
    assert torch.equal(rms_norm(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda t: layer_norm(t, eps=1e-3), (x[:1, :2, :6].detach().clone()
                                                                        .requires_grad_(),))
        assert torch.autograd.gradcheck(lambda t: rms_norm(t, eps=1e-3), (x[:1, :2, :6].detach().clone()
                                                                      .requires_grad_(),))


def test_count_parameters_counts_attnbooks_own_rmsnorm_as_norm():
    from attnbook.layers import RMSNorm, count_parameters
    counts = count_parameters(torch.nn.Sequential(RMSNorm(4), torch.nn.Linear(4, 4)))
    assert counts == {"norm": 4, "other": 20}
