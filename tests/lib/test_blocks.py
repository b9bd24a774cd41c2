"""Tests for attnbook.blocks: EncoderLayer and DecoderLayer against PyTorch's layers (chapters 08, 10)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn as nn

from attnbook.blocks import DecoderLayer, EncoderLayer
from attnbook.cache import CachedAttention, KVCache
from attnbook.multihead import MultiHeadAttention
from attnbook.reference import padding_mask
from attnbook.testing import F64_TOL

TOL = F64_TOL

F64 = f64 = torch.float64
D, H, DFF = 16, 4, 32


def randn(*shape, seed=0, dtype=F64, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return shift + scale * torch.randn(*shape, generator=g, dtype=dtype)


# ------------------------------------------------------------------------------------- EncoderLayer

def torch_encoder_layer(norm_first, activation="relu", d=16, h=4, d_ff=40, seed=0, bias=True, batch_first=True):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.1, activation=activation, batch_first=batch_first,
                                       norm_first=norm_first, bias=bias, dtype=F64)
    with torch.no_grad():                 # LayerNorms away from 1 / 0, so that copying them matters
        for ln in (layer.norm1, layer.norm2):
            ln.weight.add_(0.3 * torch.randn_like(ln.weight))
            if ln.bias is not None:
                ln.bias.add_(0.3 * torch.randn_like(ln.bias))
        if layer.self_attn.in_proj_bias is not None:
            layer.self_attn.in_proj_bias.add_(0.1 * torch.randn_like(layer.self_attn.in_proj_bias))
    return layer.eval()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first, activation):
    ref = torch_encoder_layer(norm_first, activation)
    mine = EncoderLayer.from_torch(ref).eval()
    assert mine.norm_first == norm_first and mine.ffn.activation == activation
    x = randn(3, 7, 16, seed=19)
    fused_fn = torch._transformer_encoder_layer_fwd
    with mock.patch.object(torch, "_transformer_encoder_layer_fwd", wraps=fused_fn) as fused:
        expected = ref(x)                                      # grad enabled: PyTorch's Python path
        assert fused.call_count == 0
        with torch.no_grad():                                  # eval + no_grad: the fused C++ path
            fast = ref(x)
        assert fused.call_count == 1                           # (float64 included, torch 2.13)
    torch.testing.assert_close(mine(x), expected, **TOL)
    torch.testing.assert_close(mine(x), fast, **TOL)
    # control: the other norm order (same weights) is a different function
    other = EncoderLayer.from_torch(ref)
    other.norm_first = not norm_first
    assert (other(x) - expected).abs().max() > 1e-2


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_gradients_equal_torch(norm_first):
    ref = torch_encoder_layer(norm_first)
    mine = EncoderLayer.from_torch(ref).eval()
    x1 = randn(2, 5, 16, seed=20).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    w = randn(2, 5, 16, seed=21)
    (ref(x1) * w).sum().backward()
    (mine(x2) * w).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, **TOL)
    torch.testing.assert_close(mine.ffn.linear1.weight.grad, ref.linear1.weight.grad, **TOL)
    torch.testing.assert_close(mine.norm1.weight.grad, ref.norm1.weight.grad, **TOL)
    packed = torch.cat([mine.self_attn.q_proj.weight.grad, mine.self_attn.k_proj.weight.grad,
                        mine.self_attn.v_proj.weight.grad])
    torch.testing.assert_close(packed, ref.self_attn.in_proj_weight.grad, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_with_padding_mask(norm_first):
    ref = torch_encoder_layer(norm_first, seed=3)
    mine = EncoderLayer.from_torch(ref).eval()
    lengths, T = [7, 4, 1], 7
    x = randn(3, T, 16, seed=22)
    x[1, 4:] = 1e3 * randn(3, 16, seed=23)                   # garbage in the padded slots
    keep = padding_mask(lengths, T)                            # (B, 1, 1, T), True = real key
    pad = ~keep[:, 0, 0, :]                                     # PyTorch: True = padding
    valid = keep[:, 0, 0, :]
    expected = ref(x, src_key_padding_mask=pad)
    got = mine(x, mask=keep)
    torch.testing.assert_close(got[valid], expected[valid], **TOL)
    # real positions equal the unpadded computation
    torch.testing.assert_close(got[1, :4], mine(x[1:2, :4])[0], **TOL)
    with torch.no_grad():                                      # fast path
        fast = ref(x, src_key_padding_mask=pad)
    torch.testing.assert_close(got[valid], fast[valid], **TOL)
    # control: the unconverted (opposite-polarity) mask gives a different answer
    wrong = mine(x, mask=pad[:, None, None, :])
    assert (wrong[0] - expected[0]).abs().max() > 1e-2 or torch.isnan(wrong[0]).any()


def test_encoder_layer_causal_mask_equals_torch():
    ref = torch_encoder_layer(True, seed=4)
    mine = EncoderLayer.from_torch(ref).eval()
    x = randn(2, 6, 16, seed=24)
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=F64)   # float 0 / -inf
    torch.testing.assert_close(mine(x, causal=True), ref(x, src_mask=causal, is_causal=True), **TOL)


def test_encoder_layer_bias_false_and_sequence_first():
    ref = torch_encoder_layer(False, bias=False, batch_first=False, seed=5)
    mine = EncoderLayer.from_torch(ref).eval()
    assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in ref.parameters())
    x = randn(7, 2, 16, seed=25)                                 # (T, B, d) for the torch layer
    torch.testing.assert_close(mine(x.transpose(0, 1)).transpose(0, 1), ref(x), **TOL)


def test_encoder_layer_dropout_and_defaults():
    layer = EncoderLayer(16, 4, 32, dropout=0.2)
    x = torch.randn(2, 5, 16)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x), layer.eval()(x))
    plain = EncoderLayer(16, 4, 32)                               # dropout 0: train == eval
    assert torch.equal(plain.train()(x), plain.eval()(x))
    assert plain.norm_first is False and plain.ffn.activation == "relu"
    swiglu = EncoderLayer(16, 4, 24, activation="swiglu", norm_first=True)
    assert swiglu(x).shape == x.shape



# ------------------------------------------------------------------------------------- DecoderLayer

def test_decoder_layer_from_torch_alone():
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(D, H, DFF, dropout=0.2, activation="gelu", batch_first=True,
                                     dtype=f64).eval()
    with torch.no_grad():                 # gains and shifts away from 1 / 0: copying them matters
        for p in (p for name, p in ref.named_parameters() if name.startswith("norm")):
            p.add_(0.3 * randn(*p.shape, seed=7))
    mine = DecoderLayer.from_torch(ref).eval()
    x, mem = torch.randn(2, 5, D, dtype=f64), torch.randn(2, 6, D, dtype=f64)
    with torch.no_grad():
        expected = ref(x, mem, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5, dtype=f64))
        torch.testing.assert_close(mine(x, mem).out, expected, **F64_TOL)


def test_decoder_layer_from_torch_validation():
    with pytest.raises(TypeError, match="TransformerDecoderLayer"):
        DecoderLayer.from_torch(nn.TransformerEncoderLayer(D, H, DFF))


def test_both_layers_take_rope_at_construction():
    enc, dec = EncoderLayer(D, H, DFF, rope=True), DecoderLayer(D, H, DFF, rope=True)
    assert isinstance(enc.self_attn, CachedAttention) and enc.self_attn.rope
    assert dec.self_attn.rope and not dec.multihead_attn.rope              # cross-attention: no positions
    plain = EncoderLayer(D, H, DFF)
    assert type(plain.self_attn) is MultiHeadAttention                      # chapter 05's, unchanged
    with pytest.raises(TypeError, match="`rope`"):
        EncoderLayer(D, H, DFF, rope=1)


def test_decoder_layer_cache_must_be_a_pair():
    layer = DecoderLayer(D, H, DFF, dtype=F64)
    x, mem = randn(2, 1, D), randn(2, 3, D, seed=1)
    with pytest.raises(TypeError, match=r"DecoderLayer.forward: `cache` must be None or a \(self_cache, cross_cache\)"):
        layer(x, mem, cache=KVCache())
    out = layer(x, mem, cache=(KVCache(), KVCache(static=True))).out
    torch.testing.assert_close(out, layer(x, mem).out, **TOL)


@pytest.mark.parametrize("make, exc, match", [
    (lambda: EncoderLayer(10, 4, 16), ValueError, "`n_heads`"),
    (lambda: EncoderLayer(8, 2, 16, activation="tanh"), ValueError, "`activation`"),
    (lambda: EncoderLayer(8, 2, 16)(torch.randn(5, 8)), ValueError, "query"),
    (lambda: EncoderLayer.from_torch(nn.Linear(2, 2)), TypeError, "TransformerEncoderLayer"),
    (lambda: EncoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation=torch.tanh)),
     ValueError, "activation"),
    (lambda: EncoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation=nn.GELU("tanh"))),
     ValueError, "activation"),
])
def test_validation(make, exc, match):
    with pytest.raises(exc, match=match):
        make()
