"""An adversarial battery for the Transformer stack: multihead, cache, layers, blocks, transformer, train.

Three kinds of case, per module: misuse (every bad argument raises TypeError/ValueError naming the
function and the argument), edge sizes (batch 0, length 0, d_k = 1, one token), and oracles
against PyTorch on configurations the other test files do not use (nn.MultiheadAttention with
kdim != vdim and per-head masks, nn.LayerNorm in float16/bfloat16, nn.TransformerEncoderLayer /
DecoderLayer / nn.Transformer with other widths, depths, activations and mask mixes,
F.cross_entropy with label smoothing and a PAD id outside the vocabulary).
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbook.blocks import DecoderLayer, EncoderLayer
from attnbook.cache import CachedAttention, DecoderCache, KVCache
from attnbook.layers import FeedForward, LayerNorm, ResidualBlock, count_parameters, layer_norm
from attnbook.multihead import MultiHeadAttention, mask_from_torch, merge_heads, repeat_kv, split_heads
from attnbook.positional import sinusoidal_encoding
from attnbook.testing import F64_TOL, rand, randomize
from attnbook.train import eval_mode, fit, label_smoothed_cross_entropy, token_cross_entropy, vaswani_lr
from attnbook.transformer import Transformer

f64 = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")   # nn.Transformer's nested-tensor notes


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)




# ============================================================================== multihead

@pytest.mark.parametrize("d, h, kdim, vdim, tq, tk", [
    (6, 6, 5, 3, 4, 2),        # d_k = 1, kdim != vdim
    (12, 3, 7, 12, 1, 9),      # one query
    (8, 2, 3, 11, 5, 1),       # one key
])
def test_mha_equals_torch_with_kdim_vdim_per_head_masks(d, h, kdim, vdim, tq, tk):
    torch.manual_seed(1)
    ref = randomize(nn.MultiheadAttention(d, h, kdim=kdim, vdim=vdim, batch_first=True, dtype=f64), 1).eval()
    mine = MultiHeadAttention.from_torch(ref, backend="ref")
    b = 3
    q, k, v = rand(b, tq, d), rand(b, tk, kdim, seed=1), rand(b, tk, vdim, seed=2)
    blocked = torch.rand(b * h, tq, tk, generator=torch.Generator().manual_seed(3)) < 0.3
    blocked[..., 0] = False                                    # every query keeps key 0
    kpm = torch.zeros(b, tk, dtype=f64)
    kpm[0, -1] = -2.5                                          # a float (additive) padding term
    with torch.no_grad():
        out, w = ref(q, k, v, attn_mask=blocked, key_padding_mask=kpm, average_attn_weights=False)
        res = mine(q, k, v, mask=mask_from_torch(blocked, kpm, n_heads=h), need_weights=True)
        fast = mine(q, k, v, mask=mask_from_torch(blocked, kpm, n_heads=h))
    torch.testing.assert_close(res.out, out, **F64_TOL)
    torch.testing.assert_close(res.weights, w, **F64_TOL)
    torch.testing.assert_close(fast.out, out, **F64_TOL)


@pytest.mark.parametrize("b, tq, tk", [(0, 3, 4), (2, 0, 4), (2, 3, 0), (0, 0, 0)])
def test_mha_empty_sizes_equal_torch(b, tq, tk):
    ref = randomize(nn.MultiheadAttention(8, 2, batch_first=True, dtype=f64), 2).eval()
    mine = MultiHeadAttention.from_torch(ref)
    q, kv = rand(b, tq, 8), rand(b, tk, 8, seed=1)
    with torch.no_grad():
        expected = ref(q, kv, kv, need_weights=False)[0]
        for need_weights in (False, True):
            res = mine(q, kv, need_weights=need_weights)
            assert res.out.shape == (b, tq, 8)
            torch.testing.assert_close(res.out, expected, **F64_TOL)   # Tk = 0: out_proj's bias
            if need_weights:
                assert res.weights.shape == (b, 2, tq, tk)


def test_mha_is_permutation_equivariant_and_key_order_free():
    torch.manual_seed(3)
    m = MultiHeadAttention(12, 4, n_kv_heads=2, dtype=f64)
    x, mem = rand(2, 5, 12), rand(2, 7, 12, seed=1)
    pq, pk = torch.randperm(5), torch.randperm(7)
    base = m(x, mem).out
    torch.testing.assert_close(m(x[:, pq], mem).out, base[:, pq], **F64_TOL)
    torch.testing.assert_close(m(x, mem[:, pk]).out, base, **F64_TOL)
    assert (m(x, mem[:, pk], causal=True).out - m(x, mem, causal=True).out).abs().max() > 1e-6  # control


def test_mha_gqa_gradcheck():
    torch.manual_seed(4)
    m = MultiHeadAttention(6, 3, n_kv_heads=1, dtype=f64)
    x = rand(2, 3, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: m(t, causal=True).out, (x,))


@pytest.mark.parametrize("call, exc, match", [
    (lambda m, x: m(x, mask=[[True]]), TypeError, "MultiHeadAttention.forward: `mask` must be a torch.Tensor"),
    (lambda m, x: m(x, head_mask=[1.0, 1.0]), TypeError, "`head_mask` must be a torch.Tensor"),
    (lambda m, x: m(x, head_mask=torch.ones(2, dtype=torch.long)), TypeError, "`head_mask` must be bool or floating"),
    (lambda m, x: m([[0.0] * 8]), TypeError, "`query` must be a torch.Tensor"),
    (lambda m, x: m(x, x.float()), TypeError, "`key` must have the module's dtype"),
    (lambda m, x: m(x, mask=torch.ones(2, 3, 4, 4, dtype=torch.bool)), ValueError, "does not broadcast"),
    (lambda m, x: m(x, causal=None), TypeError, "`causal`"),
    (lambda m, x: m(x[0]), ValueError, r"`query` must be \(B, T, 8\)"),
])
def test_mha_misuse(call, exc, match):
    m, x = MultiHeadAttention(8, 2, dtype=f64), rand(2, 3, 8)
    with pytest.raises(exc, match=match):
        call(m, x)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: MultiHeadAttention(8, 2, dtype=torch.int64), TypeError, "MultiHeadAttention: `dtype`"),
    (lambda: MultiHeadAttention(8, 2, dtype="float32"), TypeError, "`dtype`"),
    (lambda: MultiHeadAttention(8, 2, device="nowhere"), ValueError, "`device`"),
    (lambda: MultiHeadAttention(8, True), TypeError, "`n_heads`"),
    (lambda: split_heads([[1.0]], 1), TypeError, "split_heads: `x`"),
    (lambda: split_heads(rand(2, 3, 8), 0), ValueError, "`n_heads`"),
    (lambda: merge_heads(rand(2, 3, 4)), ValueError, "merge_heads: `x`"),
    (lambda: repeat_kv(rand(1, 2, 3, 4, 5), 2), ValueError, r"repeat_kv: `x` must be \(B, H_kv, T, D\)"),
    (lambda: repeat_kv(rand(1, 2, 3), 2), ValueError, "repeat_kv: `x`"),
    (lambda: repeat_kv(rand(1, 2, 3, 4), 0), ValueError, "`n_rep`"),
    (lambda: mask_from_torch([[True]]), TypeError, "mask_from_torch: `attn_mask` must be a torch.Tensor"),
    (lambda: mask_from_torch(key_padding_mask=[[True]]), TypeError, "`key_padding_mask` must be a torch.Tensor"),
    (lambda: mask_from_torch(torch.ones(2, 2, dtype=torch.long)), TypeError, "`attn_mask` must be bool or floating"),
    (lambda: mask_from_torch(torch.ones(6, 2, 2, dtype=torch.bool), n_heads=4), ValueError, "B \\* n_heads"),
    (lambda: mask_from_torch(torch.zeros(2, 3, 4, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool), n_heads=2),
     ValueError, "disagree on B or Tk"),
])
def test_multihead_functions_misuse(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_split_and_merge_heads_empty():
    for shape in ((0, 3, 8), (2, 0, 8)):
        x = rand(*shape)
        heads = split_heads(x, 4)
        assert heads.shape == (shape[0], 4, shape[1], 2)
        assert merge_heads(heads).shape == shape
        assert repeat_kv(heads, 3).shape == (shape[0], 12, shape[1], 2)
    assert mask_from_torch(torch.zeros(0, 3, 4, dtype=torch.bool), n_heads=2).shape == (0, 2, 3, 4)


# ============================================================================== cache

def test_cached_attention_bottom_right_causal_with_a_mask_and_cache():
    torch.manual_seed(5)
    m = CachedAttention(8, 2, rope=True, dtype=f64)
    x = rand(2, 5, 8)
    pad = torch.tensor([[True] * 5, [True, True, True, False, True]])[:, None, None, :]
    full = m(x, causal=True, mask=pad).out
    c = KVCache()
    m(x[:, :3], causal=True, mask=pad[..., :3], cache=c)
    last2 = m(x[:, 3:], causal=True, mask=pad, cache=c).out              # Tq = 2, Tk = 5
    torch.testing.assert_close(last2, full[:, 3:], **F64_TOL)


def test_cache_select_rejects_bad_rows_and_keeps_identity():
    c = KVCache()
    c.update(rand(3, 1, 2, 4), rand(3, 1, 2, 4, seed=1))
    assert c.select(torch.arange(3)) is c
    assert torch.equal(c.select(torch.tensor([2], dtype=torch.int32)).k, c.k[2:])
    with pytest.raises(TypeError, match="KVCache.select: `rows`"):
        c.select(torch.tensor([0.0]))
    with pytest.raises(TypeError, match="`static`"):
        KVCache(static=1)
    empty = DecoderCache(2).select(torch.tensor([0, 0]))
    assert len(empty.layers) == 2 and all(len(s) == 0 for s, _ in empty.layers)


# ============================================================================== layers

# the largest magnitudes float32 statistics (nn.LayerNorm's, and these) can hold: float16's whole
# range; for bfloat16 up to ~1e18 (the squares must stay below float32's 3.4e38)
LARGE = {torch.float16: 6e4, torch.bfloat16: 1e17}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["scale300", "offset100", "large"])
def test_layer_norm_half_precision_equals_torch(dtype, kind):
    g = torch.Generator().manual_seed(6)
    base = torch.randn(16, 256, generator=g, dtype=f64)
    x = {"scale300": 300 * base, "offset100": 100 + base,
         "large": LARGE[dtype] / 4 * base.clamp(-4, 4)}[kind].to(dtype)
    ref = randomize(nn.LayerNorm(256, dtype=dtype), 6)
    mine = LayerNorm.from_torch(ref)
    truth = F.layer_norm(x.double(), (256,), ref.weight.double(), ref.bias.double())
    got, theirs = mine(x), ref(x)
    assert got.dtype == dtype and torch.isfinite(got).all()
    err, err_torch = (got.double() - truth).abs().max(), (theirs.double() - truth).abs().max()
    assert err <= 2 * err_torch + torch.finfo(dtype).eps * truth.abs().max()


def test_layer_norm_mixed_dtypes_return_the_input_dtype_like_torch():
    x = rand(3, 8).half()
    w, b = torch.ones(8), torch.zeros(8)                       # float32 affine parameters
    assert layer_norm(x, w, b).dtype == torch.float16 == F.layer_norm(x, (8,), w, b).dtype
    torch.testing.assert_close(layer_norm(x, w, b), F.layer_norm(x, (8,), w, b), rtol=1e-3, atol=1e-3)


def test_layer_norm_edge_cases_equal_torch():
    for shape, kw in (((2, 3, 4, 1), {}), ((5, 6), {"bias": False}), ((4, 7), {"elementwise_affine": False})):
        ref = nn.LayerNorm(shape[-1], dtype=f64, **kw)
        if ref.weight is not None:
            randomize(ref, 7)
        x = rand(*shape, seed=7)
        torch.testing.assert_close(LayerNorm.from_torch(ref)(x), ref(x), **F64_TOL)
    const = torch.full((2, 4), 3.0, dtype=f64)                 # eps = 0, zero variance: 0/0 in both
    torch.testing.assert_close(layer_norm(const, eps=0.0), F.layer_norm(const, (4,), eps=0.0), equal_nan=True)
    assert LayerNorm(4)(torch.zeros(0, 4)).shape == (0, 4)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: FeedForward(4, 8)(rand(2, 4)), TypeError, "FeedForward: `x` must have the module's dtype"),
    (lambda: FeedForward(4, 8)([[0.0] * 4]), TypeError, "FeedForward: `x` must be a torch.Tensor"),
    (lambda: FeedForward(4, 8, dtype=torch.int32), TypeError, "FeedForward: `dtype`"),
    (lambda: LayerNorm(4, dtype=torch.int64), TypeError, "LayerNorm: `dtype`"),
    (lambda: LayerNorm(4)([1.0, 2.0, 3.0, 4.0]), TypeError, "LayerNorm: `x` must be a torch.Tensor"),
    (lambda: layer_norm(rand(2, 4), bias=[0.0] * 4), TypeError, "layer_norm: `bias`"),
    (lambda: layer_norm(rand(2, 4), eps=float("nan")), ValueError, "layer_norm: `eps`"),
    (lambda: ResidualBlock(nn.Identity(), 4, dropout=-0.1), ValueError, "`dropout`"),
    (lambda: count_parameters(nn.Linear(2, 2), by=None), ValueError, "`by`"),
])
def test_layers_misuse(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_count_parameters_by_child_leaves_out_a_tied_output():
    m = Transformer(7, 9, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    children = count_parameters(m, by="child")
    assert "output" not in children and sum(children.values()) == sum(p.numel() for p in m.parameters())
    untied = count_parameters(Transformer(7, 9, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                          tie_embeddings=False), by="child")
    assert untied["output"] == 8 * 9                           # control: an untied one is listed


# ============================================================================== blocks

@pytest.mark.parametrize("norm_first, activation, bias", [(True, "gelu", False), (False, "relu", False),
                                                          (True, "relu", True)])
def test_encoder_layer_equals_torch_on_new_configs(norm_first, activation, bias):
    torch.manual_seed(8)
    ref = randomize(nn.TransformerEncoderLayer(12, 3, 20, dropout=0.3, activation=activation, bias=bias,
                                               norm_first=norm_first, batch_first=True, dtype=f64), 8).eval()
    mine = EncoderLayer.from_torch(ref, backend="tiled").eval()
    x = rand(2, 6, 12, seed=8)
    soft = 0.5 * rand(6, 6, seed=9)                            # an additive float mask, all finite
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with torch.no_grad():
        expected = ref(x, src_mask=soft, src_key_padding_mask=~keep)
        got = mine(x, mask=soft + torch.where(keep, 0.0, float("-inf")).to(f64)[:, None, None, :])
    torch.testing.assert_close(got[keep], expected[keep], **F64_TOL)
    one = rand(1, 1, 12, seed=10)
    torch.testing.assert_close(mine(one), ref(one), **F64_TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch_with_both_paddings(norm_first):
    torch.manual_seed(9)
    ref = randomize(nn.TransformerDecoderLayer(12, 4, 24, dropout=0.2, activation="gelu", bias=False,
                                               norm_first=norm_first, batch_first=True, dtype=f64), 9).eval()
    mine = DecoderLayer.from_torch(ref).eval()
    x, mem = rand(2, 5, 12, seed=1), rand(2, 3, 12, seed=2)
    tgt_keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    src_keep = torch.tensor([[True] * 3, [True, False, False]])
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=f64)
    with torch.no_grad():
        expected = ref(x, mem, tgt_mask=causal, tgt_key_padding_mask=~tgt_keep,
                       memory_key_padding_mask=~src_keep)
        got = mine(x, mem, self_mask=tgt_keep[:, None, None, :], memory_mask=src_keep[:, None, None, :]).out
    torch.testing.assert_close(got[tgt_keep], expected[tgt_keep], **F64_TOL)


def test_layers_with_empty_sizes_equal_torch():
    ref = randomize(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dtype=f64), 10).eval()
    mine = EncoderLayer.from_torch(ref).eval()
    for shape in ((0, 3, 8), (2, 0, 8)):
        x = rand(*shape)
        torch.testing.assert_close(mine(x), ref(x), **F64_TOL)
    dref = randomize(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, dtype=f64), 11).eval()
    dec = DecoderLayer.from_torch(dref).eval()
    x, no_memory = rand(2, 3, 8), rand(2, 0, 8)
    with torch.no_grad():
        expected = dref(x, no_memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(3, dtype=f64))
    torch.testing.assert_close(dec(x, no_memory).out, expected, **F64_TOL)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: DecoderLayer(8, 2, 16)(rand(2, 1, 8).float(), rand(2, 3, 8).float(), cache=KVCache()),
     TypeError, r"DecoderLayer.forward: `cache` must be None or a \(self_cache, cross_cache\)"),
    (lambda: DecoderLayer(8, 2, 16)(rand(2, 1, 8).float(), rand(3, 3, 8).float()), ValueError,
     r"DecoderLayer.forward: `x` must be \(B, T, d_model\) and `memory` \(B or 1, S, d_model\)"),
    (lambda: EncoderLayer(8, 2, 16)(rand(2, 3, 8)), TypeError, "dtype"),
    (lambda: EncoderLayer(6, 2, 16, rope=True), ValueError, "d_k"),
    (lambda: DecoderLayer(8, 2, 16, norm_first=0), TypeError, "`norm_first`"),
])
def test_blocks_misuse(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ============================================================================== transformer

def _torch_logits(ref, src_embed, tgt_embed, output, src, tgt, src_keep, tgt_keep):
    d = ref.d_model
    x_src = src_embed(src) * math.sqrt(d) + sinusoidal_encoding(src.shape[1], d, dtype=f64)
    x_tgt = tgt_embed(tgt) * math.sqrt(d) + sinusoidal_encoding(tgt.shape[1], d, dtype=f64)
    if not ref.batch_first:
        x_src, x_tgt = x_src.transpose(0, 1), x_tgt.transpose(0, 1)
    y = ref(x_src, x_tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=f64),
            src_key_padding_mask=~src_keep, tgt_key_padding_mask=~tgt_keep, memory_key_padding_mask=~src_keep)
    return output(y.transpose(0, 1) if not ref.batch_first else y)


@pytest.mark.parametrize("norm_first, activation, batch_first", [(True, "gelu", False), (False, "relu", True)])
def test_transformer_equals_nn_transformer_deeper_and_narrower(norm_first, activation, batch_first):
    torch.manual_seed(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = nn.Transformer(12, 3, 3, 3, 20, dropout=0.1, activation=activation, norm_first=norm_first,
                             batch_first=batch_first, dtype=f64).eval()
    randomize(ref, 12)
    src_embed, tgt_embed = nn.Embedding(6, 12, dtype=f64), nn.Embedding(5, 12, dtype=f64)
    output = nn.Linear(12, 5, bias=False, dtype=f64)                     # untied
    mine = Transformer.from_torch(ref, src_embed, tgt_embed, output).eval()
    g = torch.Generator().manual_seed(13)
    src, tgt = torch.randint(6, (2, 4), generator=g), torch.randint(5, (2, 3), generator=g)
    src_keep = torch.tensor([[True] * 4, [True, True, False, False]])
    tgt_keep = torch.tensor([[True] * 3, [True, True, False]])
    with torch.no_grad():
        expected = _torch_logits(ref, src_embed, tgt_embed, output, src, tgt, src_keep, tgt_keep)
        got = mine(src, tgt, src_pad=src_keep, tgt_pad=tgt_keep)
    torch.testing.assert_close(got[tgt_keep], expected[tgt_keep], **F64_TOL)


def tiny(positions="sinusoidal", **kw):
    torch.manual_seed(14)
    return Transformer(9, 7, d_model=8, n_heads=2, n_layers=1, d_ff=16, positions=positions,
                       dtype=f64, **kw).eval()


@pytest.mark.parametrize("positions", ["sinusoidal", "rope", "alibi", "learned"])
def test_transformer_empty_inputs_give_empty_outputs(positions):
    m = tiny(positions)
    long = torch.long
    assert m(torch.zeros(0, 3, dtype=long), torch.zeros(0, 2, dtype=long)).shape == (0, 2, 7)
    assert m(torch.ones(2, 3, dtype=long), torch.zeros(2, 0, dtype=long)).shape == (2, 0, 7)
    no_source = m(torch.zeros(2, 0, dtype=long), torch.ones(2, 2, dtype=long))
    assert no_source.shape == (2, 2, 7) and torch.isfinite(no_source).all()
    for beam in (1, 2):
        assert m.generate(torch.zeros(0, 3, dtype=long), bos=1, eos=2, max_len=4, beam_size=beam) == []
        out = m.generate(torch.zeros(2, 0, dtype=long), bos=1, eos=2, max_len=4, beam_size=beam)
        assert len(out) == 2 and all(o[-1] == 2 for o in out)


@pytest.mark.parametrize("positions", ["sinusoidal", "rope"])
def test_generate_reads_an_all_padding_row_and_ignores_right_padding(positions):
    m = tiny(positions)
    src = torch.tensor([[3, 4, 5, 6], [1, 1, 1, 1], [2, 5, 0, 0]])
    keep = torch.tensor([[True] * 4, [False] * 4, [True, True, False, False]])
    greedy = m.generate(src, src_pad=keep, bos=1, eos=2, max_len=6)
    beam1 = [m.generate(src[i:i + 1], src_pad=keep[i:i + 1], bos=1, eos=2, max_len=6, beam_size=2)[0]
             for i in range(3)]
    assert len(beam1) == 3 and beam1[1][-1] == 2                           # the all-PAD row decodes
    unpadded = m.generate(src[2:3, :2], bos=1, eos=2, max_len=6, beam_size=2)[0]
    assert beam1[2] == unpadded                                            # right padding: ignored
    assert greedy[2] == m.generate(src[2:3, :2], bos=1, eos=2, max_len=6)[0]


@pytest.mark.parametrize("call, exc, match", [
    (lambda m: m([[1, 2]], torch.tensor([[1]])), TypeError, "Transformer.forward: `src` must be a torch.Tensor"),
    (lambda m: m(torch.tensor([[1]]), [[1, 2]]), TypeError, "Transformer.forward: `tgt` must be a torch.Tensor"),
    (lambda m: m(torch.tensor([[9]]), torch.tensor([[1]])), ValueError, r"`src` must hold ids in \[0, 9\)"),
    (lambda m: m.encode(torch.tensor([[1]]), need_weights=1), TypeError, "Transformer.encode: `need_weights`"),
    (lambda m: m.encode(torch.tensor([[1]]), src_pad=[[True]]), TypeError, "`src_pad` must be a torch.Tensor"),
    (lambda m: m.decode(torch.tensor([[1]]), rand(1, 2, 8).float()), TypeError, "`memory` must have the model's dtype"),
    (lambda m: m.decode(torch.tensor([[1]]), rand(1, 2, 8), cache=DecoderCache(3)), ValueError, "one entry per decoder layer"),
    (lambda m: m.generate(torch.tensor([[1]]), bos=7, eos=2, max_len=3), ValueError, "Transformer.generate: `bos`"),
    (lambda m: m.generate(torch.tensor([[1]]), bos=1, eos=99, max_len=3, beam_size=2), ValueError, "`eos`"),
    (lambda m: m.generate(torch.tensor([[1]]), bos=1, eos=2, max_len=3, alpha=-1), ValueError, "`alpha`"),
    (lambda m: m.generate(torch.tensor([[1]]), bos=1, eos=2, max_len=0), ValueError, "`max_len`"),
    (lambda m: m.generate(torch.tensor([[1]]), bos=1, eos=2, max_len=3, cache=1), TypeError, "`cache`"),
    (lambda m: m.step_fn(torch.tensor([1, 2]))(torch.zeros(1, 0, dtype=torch.long)), ValueError, "BOS"),
    (lambda m: m.step_fn(torch.tensor([1, 2]), src_pad=torch.tensor([True])), ValueError, "`src_pad`"),
    (lambda m: Transformer(5, 5, d_model=8, n_heads=2, n_layers=1, d_ff=8, eps=-1.0), ValueError, "Transformer: `eps`"),
    (lambda m: Transformer(5, 5, d_model=8, n_heads=2, n_layers=1, d_ff=8, dtype=torch.int64), TypeError, "`dtype`"),
])
def test_transformer_misuse(call, exc, match):
    with pytest.raises(exc, match=match):
        call(tiny())


# ============================================================================== train

@pytest.mark.parametrize("shape, pad_id, eps", [((6, 5), 9, 0.3), ((2, 3, 2, 4), 0, 0.0), ((1, 1, 3), 2, 1.0)])
def test_label_smoothing_equals_torch_on_other_shapes(shape, pad_id, eps):
    g = torch.Generator().manual_seed(15)
    logits = torch.randn(*shape, generator=g, dtype=f64)
    v = shape[-1]
    target = torch.randint(v, shape[:-1], generator=g)
    target.view(-1)[0] = pad_id                                              # one PAD (maybe >= V)
    target.view(-1)[-1] = (pad_id + 1) % v                                   # one real token
    expected = F.cross_entropy(logits.reshape(-1, v), target.reshape(-1), ignore_index=pad_id,
                               label_smoothing=eps)
    got = label_smoothed_cross_entropy(logits, target, smoothing=eps, pad_id=pad_id)
    torch.testing.assert_close(got, expected, **F64_TOL)


def test_losses_gradients_equal_torch_with_pad_outside_vocab():
    logits = rand(2, 4, 5).requires_grad_()
    target = torch.tensor([[1, 7, 3, 7], [0, 4, 7, 2]])                      # PAD = 7 >= V = 5
    label_smoothed_cross_entropy(logits, target, smoothing=0.2, pad_id=7).backward()
    ours = logits.grad.clone()
    logits.grad = None
    F.cross_entropy(logits.reshape(-1, 5), target.reshape(-1), ignore_index=7, label_smoothing=0.2).backward()
    torch.testing.assert_close(ours, logits.grad, **F64_TOL)
    assert torch.all(ours[target == 7] == 0)                                 # PAD positions get no gradient


@pytest.mark.parametrize("call, exc, match", [
    (lambda: token_cross_entropy(rand(2, 3, 4), torch.tensor([[1, 2, 4], [0, 0, 0]])), ValueError, r"\[0, 4\)"),
    (lambda: label_smoothed_cross_entropy(rand(2, 4), torch.tensor([1, 2]), smoothing=-0.1), ValueError, "`smoothing`"),
    (lambda: label_smoothed_cross_entropy(rand(2, 4), torch.tensor([1, 2]), smoothing="0.1"), TypeError, "`smoothing`"),
    (lambda: label_smoothed_cross_entropy(rand(2, 4), torch.tensor([1, 2]), smoothing=None), TypeError, "`smoothing`"),
    (lambda: label_smoothed_cross_entropy(rand(2, 4), torch.tensor([1.0, 2.0]), smoothing=0.1), TypeError, "`target`"),
    (lambda: token_cross_entropy(rand(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), pad_id=True), TypeError, "`pad_id`"),
    (lambda: vaswani_lr(5, d_model=0), ValueError, "`d_model`"),
    (lambda: vaswani_lr(5.0, d_model=8), TypeError, "`step`"),
    (lambda: fit(nn.Linear(2, 1), iter([]), loss_fn=lambda m, b: m(b).sum(), steps=1, lr=0.1, seed=0,
                 progress=False), ValueError, "`batches` is empty"),
    (lambda: fit(nn.Linear(2, 1), [torch.ones(1, 2)], loss_fn=lambda m, b: m(b).sum().detach(), steps=1,
                 lr=0.1, seed=0, progress=False), ValueError, "does not depend on the model's parameters"),
])
def test_train_misuse(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_step_fn_and_fit_leave_the_training_mode_as_they_found_it():
    m = tiny(dropout=0.2).train()
    step = m.step_fn(torch.tensor([3, 4]))
    assert m.training
    a, b = step(torch.tensor([[1]])), step(torch.tensor([[1]]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)                         # eval inside: no dropout
    assert m.training
    with eval_mode(m):
        assert not m.training
    assert m.training


def test_smoothing_zero_equals_torch_when_some_logits_are_minus_inf():
    logits = rand(3, 5)
    logits[:, 4] = float("-inf")                                             # a class masked out
    target = torch.tensor([0, 1, 2])
    for eps in (0.0, 0.1):
        expected = F.cross_entropy(logits, target, label_smoothing=eps)
        got = label_smoothed_cross_entropy(logits, target, smoothing=eps, pad_id=9)
        torch.testing.assert_close(got, expected, **F64_TOL)                 # eps = 0: finite; 0.1: inf


def test_decoder_layer_needs_a_memory_and_the_cache_keeps_its_dtype():
    layer = DecoderLayer(8, 2, 16, dtype=f64)
    with pytest.raises(TypeError, match="DecoderLayer.forward: `memory` must be a torch.Tensor"):
        layer(rand(2, 3, 8), None)                   # would silently read x as its own memory
    c = KVCache()
    c.update(rand(1, 1, 2, 4), rand(1, 1, 2, 4))
    with pytest.raises(TypeError, match="KVCache.update: new keys and values must have the cached dtype"):
        c.update(rand(1, 1, 1, 4).float(), rand(1, 1, 1, 4).float())
    with pytest.raises(ValueError, match="DecoderCache: `n_layers`"):
        DecoderCache(-1)
