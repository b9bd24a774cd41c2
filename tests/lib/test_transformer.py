"""Tests for the complete Transformer (lib/attnbook/transformer.py, chapter 10).

Truth is float64 on the CPU: the model loaded from ``torch.nn.Transformer`` must give its logits
in both norm orders; changing future target tokens must not move earlier logits; padding must
change nothing; every attention backend must agree (FlashAttention's tolerance rule in float32);
incremental decoding with a key/value cache must equal recomputation.
"""
import math

import pytest
import torch
from torch import nn

from attnbook import causal_mask, mask_to_additive
from attnbook.decoding import beam_search, greedy_decode
from attnbook.layers import count_parameters
from attnbook.positional import sinusoidal_encoding
from attnbook.testing import assert_close_to_reference
from attnbook.multihead import MultiHeadAttention
from attnbook.transformer import POSITIONS, Transformer
from attnbook.testing import F64_TOL, import_triton_flash

# Imported while the file is collected, before any test runs: a test that trains first (fit's
# optimizer imports torch's compiler stack, and with it triton) would leave triton imported
# without the interpreter, and the triton test below would fail for a reason that is not its own.
_TRITON_FLASH = None if torch.cuda.is_available() else import_triton_flash()

f64 = torch.float64
SRC_V, TGT_V, D, H, L, DFF = 11, 13, 16, 4, 2, 32
BOS, EOS = 1, 2

# nn.Transformer warns about nested tensors (its Post-LN encoder fast path) and mixed mask types.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny tensors: one thread is much faster on a busy machine
    yield
    torch.set_num_threads(threads)


def model(positions="sinusoidal", norm_first=False, dtype=f64, seed=0, **kw):
    torch.manual_seed(seed)
    return Transformer(SRC_V, TGT_V, d_model=D, n_heads=H, n_layers=L, d_ff=DFF, norm_first=norm_first,
                       positions=positions, dtype=dtype, **kw).eval()


def batch(seed=1, b=3, s=7, t=5):
    """Random tokens with right padding: source lengths (s, 4, 2), target lengths (t, 3, t)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(SRC_V, (b, s), generator=g)
    tgt = torch.randint(TGT_V, (b, t), generator=g)
    src_pad = torch.arange(s) < torch.tensor([s, 4, 2][:b])[:, None]
    tgt_pad = torch.arange(t) < torch.tensor([t, 3, t][:b])[:, None]
    return src, tgt, src_pad, tgt_pad


# ------------------------------------------------------------------------------ nn.Transformer

def _perturb_norms(ref):
    """Gains and shifts away from 1 and 0, so that every LayerNorm (and its copy) matters."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for mod in ref.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.copy_(1 + 0.3 * torch.randn(mod.weight.shape, generator=g, dtype=f64))
                mod.bias.copy_(0.3 * torch.randn(mod.bias.shape, generator=g, dtype=f64))


def _torch_reference(ref, src_embed, tgt_embed, output, src, tgt, src_pad, tgt_pad):
    """output(nn.Transformer(Emb(src) sqrt(d) + PE, Emb(tgt) sqrt(d) + PE)) with torch's masks."""
    d = ref.d_model

    def emb(table, x):
        return table(x) * math.sqrt(d) + sinusoidal_encoding(x.shape[1], d, dtype=f64)

    x_src, x_tgt = emb(src_embed, src), emb(tgt_embed, tgt)
    if not ref.batch_first:
        x_src, x_tgt = x_src.transpose(0, 1), x_tgt.transpose(0, 1)
    t = tgt.shape[1]
    y = ref(x_src, x_tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(t, dtype=f64),
            src_key_padding_mask=~src_pad, tgt_key_padding_mask=~tgt_pad,
            memory_key_padding_mask=~src_pad)            # torch: True = padding
    if not ref.batch_first:
        y = y.transpose(0, 1)
    return output(y)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_equals_nn_transformer(norm_first, tied):
    torch.manual_seed(0)
    ref = nn.Transformer(D, H, L, L, DFF, dropout=0.1, batch_first=True, norm_first=norm_first,
                         dtype=f64).eval()
    _perturb_norms(ref)
    src_embed, tgt_embed = nn.Embedding(SRC_V, D, dtype=f64), nn.Embedding(TGT_V, D, dtype=f64)
    output = nn.Linear(D, TGT_V, bias=False, dtype=f64)
    if tied:
        output.weight = tgt_embed.weight
    mine = Transformer.from_torch(ref, src_embed, tgt_embed, output).eval()
    assert mine.final_norm and mine.norm_first == norm_first and mine.tie_embeddings == tied
    src, tgt, src_pad, tgt_pad = batch()
    with torch.no_grad():
        expected = _torch_reference(ref, src_embed, tgt_embed, output, src, tgt, src_pad, tgt_pad)
        got = mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad)
        torch.testing.assert_close(got, expected, **F64_TOL)
        # the encoder alone, at real positions (torch's fast path may zero padded rows)
        x_src = src_embed(src) * math.sqrt(D) + sinusoidal_encoding(src.shape[1], D, dtype=f64)
        memory = ref.encoder(x_src, src_key_padding_mask=~src_pad)
        torch.testing.assert_close(mine.encode(src, src_pad=src_pad)[src_pad], memory[src_pad], **F64_TOL)
        # control: without the final norms that nn.Transformer adds, the logits differ
        mine.encoder_norm = mine.decoder_norm = None
        assert (mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad) - expected).abs().max() > 1e-3


def test_from_torch_ignores_batch_first_and_the_default_tie():
    torch.manual_seed(0)
    ref = nn.Transformer(D, H, L, L, DFF, dropout=0.0, batch_first=False, dtype=f64).eval()
    src_embed, tgt_embed = nn.Embedding(SRC_V, D, dtype=f64), nn.Embedding(TGT_V, D, dtype=f64)
    mine = Transformer.from_torch(ref, src_embed, tgt_embed).eval()      # output=None: tied
    assert mine.tie_embeddings and mine.output.weight is mine.tgt_embed.weight
    output = nn.Linear(D, TGT_V, bias=False, dtype=f64)
    output.weight = tgt_embed.weight
    src, tgt, src_pad, tgt_pad = batch()
    with torch.no_grad():
        expected = _torch_reference(ref, src_embed, tgt_embed, output, src, tgt, src_pad, tgt_pad)
        torch.testing.assert_close(mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad), expected, **F64_TOL)


def _custom_torch_transformer(norm_first, encoder_norm, decoder_norm):
    """nn.Transformer with a custom encoder and decoder, each with or without its final norm."""
    torch.manual_seed(0)
    kw = dict(dropout=0.0, batch_first=True, norm_first=norm_first, dtype=f64)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, DFF, **kw), L,
                                norm=nn.LayerNorm(D, dtype=f64) if encoder_norm else None,
                                enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, DFF, **kw), L,
                                norm=nn.LayerNorm(D, dtype=f64) if decoder_norm else None)
    ref = nn.Transformer(D, H, custom_encoder=enc, custom_decoder=dec, batch_first=True, dtype=f64)
    _perturb_norms(ref)
    return ref.eval()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("encoder_norm, decoder_norm",
                         [(True, True), (False, True), (True, False), (False, False)])
def test_from_torch_copies_each_final_norm_on_its_own(norm_first, encoder_norm, decoder_norm):
    # issue 30: a custom encoder with norm=None used to drop the decoder's norm (logits off by
    # ~18), and a custom decoder with norm=None crashed inside LayerNorm.from_torch
    ref = _custom_torch_transformer(norm_first, encoder_norm, decoder_norm)
    src_embed, tgt_embed = nn.Embedding(SRC_V, D, dtype=f64), nn.Embedding(TGT_V, D, dtype=f64)
    output = nn.Linear(D, TGT_V, bias=False, dtype=f64)
    mine = Transformer.from_torch(ref, src_embed, tgt_embed, output).eval()
    assert (mine.encoder_norm is not None, mine.decoder_norm is not None) == (encoder_norm, decoder_norm)
    assert mine.final_norm == (encoder_norm and decoder_norm)
    src, tgt, src_pad, tgt_pad = batch()
    with torch.no_grad():
        expected = _torch_reference(ref, src_embed, tgt_embed, output, src, tgt, src_pad, tgt_pad)
        torch.testing.assert_close(mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad), expected, **F64_TOL)
        # control: the other choice for either norm changes the logits
        for name, present in (("encoder_norm", encoder_norm), ("decoder_norm", decoder_norm)):
            kept = getattr(mine, name)
            setattr(mine, name, None if present else nn.LayerNorm(D, dtype=f64))
            with torch.no_grad():
                if not present:
                    getattr(mine, name).weight.fill_(1.7)
            assert (mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad) - expected).abs().max() > 1e-3, name
            setattr(mine, name, kept)


def test_from_torch_maps_an_identity_norm_to_none_and_rejects_other_norms():
    ref = _custom_torch_transformer(False, True, True)
    emb_s, emb_t = nn.Embedding(SRC_V, D, dtype=f64), nn.Embedding(TGT_V, D, dtype=f64)
    ref.decoder.norm = nn.Identity()
    mine = Transformer.from_torch(ref, emb_s, emb_t)
    assert mine.decoder_norm is None and mine.encoder_norm is not None
    assert "encoder_norm=True, decoder_norm=False" in repr(mine)
    ref.decoder.norm = nn.BatchNorm1d(D)
    with pytest.raises(TypeError, match=r"Transformer.from_torch: `model.decoder.norm` must be"):
        Transformer.from_torch(ref, emb_s, emb_t)
    ref.decoder = nn.Linear(D, D)
    with pytest.raises(TypeError, match=r"Transformer.from_torch: `model.decoder` must be an "
                                        r"nn.TransformerDecoder"):
        Transformer.from_torch(ref, emb_s, emb_t)


def test_square_subsequent_mask_is_the_seeds_float_mask():
    for t in (1, 4, 9):
        m = nn.Transformer.generate_square_subsequent_mask(t, dtype=f64)
        i, j = torch.arange(t)[:, None], torch.arange(t)[None]
        seed = torch.where(i >= j, 0.0, float("-inf")).to(f64)              # 0 if i >= j else -inf
        assert torch.equal(m, seed)
        assert torch.equal(m, mask_to_additive(causal_mask(t), f64))


# ------------------------------------------------------------------------------ causality, padding

@pytest.mark.parametrize("positions", POSITIONS)
def test_causality(positions):
    m = model(positions)
    src, tgt, src_pad, _ = batch()
    with torch.no_grad():
        base = m(src, tgt, src_pad=src_pad)
        for t in range(tgt.shape[1] - 1):
            changed = tgt.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 1 + t) % TGT_V       # every later token differs
            out = m(src, changed, src_pad=src_pad)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], **F64_TOL)
            assert (out[:, t + 1:] - base[:, t + 1:]).abs().amax() > 1e-6     # control: they are read


@pytest.mark.parametrize("positions", POSITIONS)
def test_padding_changes_nothing(positions):
    m = model(positions)
    src, tgt, src_pad, tgt_pad = batch()
    with torch.no_grad():
        base = m(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad)
        g = torch.Generator().manual_seed(5)
        src2 = torch.cat([src, torch.randint(SRC_V, (3, 4), generator=g)], 1)  # garbage in 4 more pads
        tgt2 = torch.cat([tgt, torch.randint(TGT_V, (3, 2), generator=g)], 1)
        src_pad2 = torch.cat([src_pad, torch.zeros(3, 4, dtype=torch.bool)], 1)
        tgt_pad2 = torch.cat([tgt_pad, torch.zeros(3, 2, dtype=torch.bool)], 1)
        src2[~src_pad2] = (src2[~src_pad2] + 3) % SRC_V                       # also change old pads
        out = m(src2, tgt2, src_pad=src_pad2, tgt_pad=tgt_pad2)
        torch.testing.assert_close(out[:, :5][tgt_pad], base[tgt_pad], **F64_TOL)
        unmasked = m(src2, tgt2, tgt_pad=tgt_pad2)                            # control: no src_pad
        assert (unmasked[:, :5][tgt_pad] - base[tgt_pad]).abs().max() > 1e-6
        # row by row, without any padding at all, gives the same logits
        for b in range(3):
            s, t = int(src_pad[b].sum()), int(tgt_pad[b].sum())
            alone = m(src[b:b + 1, :s], tgt[b:b + 1, :t])
            torch.testing.assert_close(alone[0], base[b, :t], **F64_TOL)


def test_attention_maps_respect_the_masks():
    m = model()
    src, tgt, src_pad, tgt_pad = batch()
    maps = m.attention_maps(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad)
    assert len(maps.encoder) == len(maps.decoder) == len(maps.cross) == L
    for w in maps.cross:
        assert w.shape == (3, H, 5, 7)
        assert torch.all(w.masked_select(~src_pad[:, None, None, :]) == 0)   # no weight on PAD
        torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 5, dtype=f64), **F64_TOL)
    for w in maps.decoder:
        assert torch.all(w.triu(1) == 0)                                     # causal
    for w in maps.encoder:
        assert torch.all(w.masked_select(~src_pad[:, None, None, :]) == 0)


# ------------------------------------------------------------------------------ backends

def _logits_by_backend(backend, dtype, positions="sinusoidal", norm_first=False):
    m = model(positions, norm_first, dtype=dtype)
    for mod in m.modules():
        if isinstance(mod, MultiHeadAttention):                 # CachedAttention included
            mod.backend = backend
    src, tgt, src_pad, tgt_pad = batch()
    with torch.no_grad():
        return m(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "alibi"])
def test_backends_agree(positions, norm_first):
    truth = _logits_by_backend("ref", f64, positions, norm_first)
    for backend in ("tiled", "sdpa"):
        torch.testing.assert_close(_logits_by_backend(backend, f64, positions, norm_first), truth, **F64_TOL)
    naive = _logits_by_backend("ref", torch.float32, positions, norm_first)
    for backend in ("tiled", "sdpa"):
        assert_close_to_reference(_logits_by_backend(backend, torch.float32, positions, norm_first),
                                  naive, truth, name=f"logits ({backend}, float32)")


def test_triton_backend_under_the_interpreter(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the triton backend is tested on the GPU")
    tf = _TRITON_FLASH           # imported at collection with TRITON_INTERPRET (attnbook.testing)
    if tf.triton is None or not tf._INTERPRETED:
        pytest.skip("triton missing, or attnbook.triton_flash imported earlier without TRITON_INTERPRET=1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    truth = _logits_by_backend("ref", f64)
    naive = _logits_by_backend("ref", torch.float32)
    assert_close_to_reference(_logits_by_backend("triton", torch.float32), naive, truth,
                              name="logits (triton interpreter, float32)")


# ------------------------------------------------------------------------------ cache

@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positions", POSITIONS)
def test_cache_equals_recomputation(positions, norm_first):
    m = model(positions, norm_first)
    src, tgt, src_pad, _ = batch(t=6)
    with torch.no_grad():
        full = m(src, tgt, src_pad=src_pad)
        memory = m.encode(src, src_pad=src_pad)
        cache = m.new_cache()
        parts = [m.decode(tgt[:, :2], memory, src_pad=src_pad, cache=cache)]   # 2 tokens, then 1 by 1
        for t in range(2, tgt.shape[1]):
            parts.append(m.decode(tgt[:, t:t + 1], memory, src_pad=src_pad, cache=cache))
    assert cache.length == tgt.shape[1]
    assert all(len(s) == tgt.shape[1] and len(c) == src.shape[1] for s, c in cache.layers)
    torch.testing.assert_close(torch.cat(parts, 1), full, **F64_TOL)


@pytest.mark.parametrize("positions", ["sinusoidal", "rope"])
def test_generate_with_and_without_cache(positions):
    m = model(positions, seed=3)
    src, _, src_pad, _ = batch()
    for beam in (1, 3):
        with_cache = m.generate(src, src_pad=src_pad, bos=BOS, eos=EOS, max_len=7, beam_size=beam)
        without = m.generate(src, src_pad=src_pad, bos=BOS, eos=EOS, max_len=7, beam_size=beam, cache=False)
        assert with_cache == without
        assert all(seq[-1] == EOS and 1 <= len(seq) <= 7 for seq in with_cache)
    # beam search reorders hypotheses: its log-probabilities match step by step
    row = src[1][src_pad[1]]
    a = beam_search(m.step_fn(row), bos=BOS, eos=EOS, beam_size=4, max_len=6)
    b = beam_search(m.step_fn(row, cache=False), bos=BOS, eos=EOS, beam_size=4, max_len=6)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    for ha, hb in zip(a, b):
        assert abs(ha.logprob - hb.logprob) < 1e-9
    # greedy on one source = greedy of the batch
    g = greedy_decode(m.step_fn(row), bos=BOS, eos=EOS, max_len=7)
    assert list(g.tokens) == m.generate(src, src_pad=src_pad, bos=BOS, eos=EOS, max_len=7)[1]


def test_step_starts_afresh_when_prefixes_do_not_extend():
    m = model()
    step, fresh = m.step_fn(torch.tensor([3, 4, 5])), m.step_fn(torch.tensor([3, 4, 5]), cache=False)
    for prefixes in ([[BOS]], [[BOS, 4], [BOS, 7]], [[BOS, 9, 9]], [[BOS, 7, 1], [BOS, 4, 4]]):
        p = torch.tensor(prefixes)
        torch.testing.assert_close(step(p), fresh(p), **F64_TOL)


# ------------------------------------------------------------------------------ structure

def test_structure_and_parameter_count():
    post, pre = model(), model(norm_first=True)
    assert post.encoder_norm is None and pre.encoder_norm is not None       # Pre-LN needs final norms
    assert post.output.weight is post.tgt_embed.weight                       # tied by default
    counts = count_parameters(post)
    assert sum(counts.values()) == sum(p.numel() for p in post.parameters())
    assert counts["embedding"] == (SRC_V + TGT_V) * D                        # output shares tgt_embed
    assert counts["attention"] == 3 * L * (4 * D * D + 4 * D)                # enc self, dec self, cross
    assert counts["ffn"] == 2 * L * (2 * D * DFF + DFF + D)
    untied = model(tie_embeddings=False)
    assert count_parameters(untied).get("other") == D * TGT_V                # one projection, once
    learned = model("learned", max_len=20)
    assert count_parameters(learned)["embedding"] == (SRC_V + TGT_V + 2 * 20) * D


def test_dropout_is_active_only_in_training():
    m = model(dropout=0.3)
    src, tgt, src_pad, tgt_pad = batch()
    m.train()
    a, b = m(src, tgt, src_pad=src_pad), m(src, tgt, src_pad=src_pad)
    assert (a - b).abs().max() > 1e-3
    m.eval()
    torch.testing.assert_close(m(src, tgt, src_pad=src_pad), m(src, tgt, src_pad=src_pad), rtol=0, atol=0)


def test_gradients_reach_every_parameter():
    m = model(norm_first=True, tie_embeddings=False)
    src, tgt, src_pad, tgt_pad = batch()
    m(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ------------------------------------------------------------------------------ validation

def test_constructor_validation():
    kw = dict(d_model=D, n_heads=H, n_layers=L, d_ff=DFF)
    with pytest.raises(ValueError, match="n_heads"):
        Transformer(5, 5, **{**kw, "n_heads": 3})
    with pytest.raises(ValueError, match="positions"):
        Transformer(5, 5, positions="relative", **kw)
    with pytest.raises(ValueError, match="d_k"):
        Transformer(5, 5, positions="rope", **{**kw, "n_heads": 16})        # d_k = 1
    with pytest.raises(ValueError, match="even"):
        Transformer(5, 5, **{**kw, "d_model": 15, "n_heads": 5})
    with pytest.raises(TypeError, match="tie_embeddings"):
        Transformer(5, 5, tie_embeddings=1, **kw)
    with pytest.raises(ValueError, match="dropout"):
        Transformer(5, 5, dropout=1.5, **kw)
    with pytest.raises(ValueError, match="backend"):
        Transformer(5, 5, backend="cuda", **kw)
    with pytest.raises(TypeError, match="src_vocab"):
        Transformer(5.0, 5, **kw)


def test_forward_validation():
    m = model()
    src, tgt, src_pad, tgt_pad = batch()
    with pytest.raises(TypeError, match="`src` must be a 2-D torch.long"):
        m(src.float(), tgt)
    with pytest.raises(ValueError, match=r"`tgt` must hold ids in \[0, 13\)"):
        m(src, tgt + TGT_V)
    with pytest.raises(ValueError, match="batch size"):
        m(src, tgt[:2])
    with pytest.raises(TypeError, match="`src_pad` must be a bool"):
        m(src, tgt, src_pad=src_pad.long())
    with pytest.raises(ValueError, match="`tgt_pad` must have the shape"):
        m(src, tgt, tgt_pad=tgt_pad[:, :3])
    with pytest.raises(ValueError, match="learned positions cover 6"):
        model("learned", max_len=6)(src, tgt)                                # source of length 7
    memory = m.encode(src, src_pad=src_pad)
    with pytest.raises(ValueError, match="takes no `tgt_pad`"):
        m.decode(tgt, memory, cache=m.new_cache(), tgt_pad=tgt_pad)
    with pytest.raises(ValueError, match="`memory` must be"):
        m.decode(tgt, memory[:, :, :4])
    with pytest.raises(TypeError, match="DecoderCache"):
        m.decode(tgt, memory, cache={})
    with pytest.raises(ValueError, match="beam_size"):
        m.generate(src, bos=BOS, eos=EOS, max_len=5, beam_size=0)
    with pytest.raises(ValueError, match="one sentence"):
        m.step_fn(src)
    with pytest.raises(ValueError, match="one row per source"):
        m.batch_step_fn(src, src_pad)(torch.ones(2, 1, dtype=torch.long))


def test_from_torch_validation():
    ref = nn.Transformer(D, H, 1, 1, DFF)
    emb = nn.Embedding(SRC_V, D)
    with pytest.raises(TypeError, match="nn.Transformer"):
        Transformer.from_torch(ref.encoder, emb, emb)
    with pytest.raises(ValueError, match="embedding_dim"):
        Transformer.from_torch(ref, nn.Embedding(SRC_V, D + 2), emb)
    with pytest.raises(ValueError, match="bias=False"):
        Transformer.from_torch(ref, emb, emb, nn.Linear(D, SRC_V))
    with pytest.raises(ValueError, match="as many layers"):
        Transformer.from_torch(nn.Transformer(D, H, 2, 1, DFF), emb, emb)


# ------------------------------------------------------------------- public names the book shows

def test_embed_and_memory_step_fn_are_public_and_the_old_names_alias_them():
    # chapter 10 shows Transformer._embed and Transformer._step: they are the public methods
    assert Transformer._embed is Transformer.embed and Transformer._step is Transformer.memory_step_fn
    for fn in (Transformer.embed, Transformer.memory_step_fn):
        assert fn.__doc__ and not fn.__name__.startswith("_")
    m = model(positions="learned")
    src, tgt, src_pad, _ = batch()
    x = m.embed(tgt, m.tgt_embed, m.tgt_pos, start=2)                    # eq-ch10-embed
    expected = m.tgt_embed(tgt) * math.sqrt(D) + m.tgt_pos(torch.arange(2, 2 + tgt.shape[1]))
    torch.testing.assert_close(x, expected, **F64_TOL)
    assert (m.embed(tgt, m.tgt_embed, m.tgt_pos) - expected).abs().max() > 1e-3   # control: start
    # memory_step_fn over a batch of memories is batch_step_fn's step
    memory = m.encode(src, src_pad=src_pad)
    prefixes = tgt[:, :3]
    for cache in (True, False):
        got = m.memory_step_fn(memory, src_pad, shared=False, cache=cache)(prefixes)
        want = m.batch_step_fn(src, src_pad, cache=cache)(prefixes)
        torch.testing.assert_close(got, want, **F64_TOL)
        last = torch.log_softmax(m(src, prefixes, src_pad=src_pad)[:, -1], -1)
        torch.testing.assert_close(got, last, **F64_TOL)


def test_embed_and_memory_step_fn_validation():
    m = model()
    src, tgt, src_pad, _ = batch()
    memory = m.encode(src, src_pad=src_pad)
    cases = [
        (lambda: m.embed(tgt, nn.Linear(D, D)), TypeError, r"Transformer.embed: `table` must be an nn.Embedding"),
        (lambda: m.embed(tgt, m.tgt_embed, m.tgt_embed), ValueError, r"Transformer.embed: `pos_table` is only"),
        (lambda: m.embed(tgt, m.tgt_embed, start=-1), ValueError, r"Transformer.embed: `start`"),
        (lambda: m.embed(tgt.float(), m.tgt_embed), TypeError, r"Transformer.embed: `tokens`"),
        (lambda: m.embed(tgt + TGT_V, m.tgt_embed), ValueError, r"Transformer.embed: `tokens`"),
        (lambda: m.memory_step_fn(memory, src_pad, shared=True), ValueError,
         r"Transformer.memory_step_fn: `memory` must be \(1, S"),
        (lambda: m.memory_step_fn(memory[..., :4], src_pad, shared=False), ValueError,
         r"Transformer.memory_step_fn: `memory`"),
        (lambda: m.memory_step_fn(memory.float(), src_pad, shared=False), TypeError,
         r"Transformer.memory_step_fn: `memory` must have the model's dtype"),
        (lambda: m.memory_step_fn(memory, src_pad[:, :2], shared=False), ValueError,
         r"Transformer.memory_step_fn: `src_pad`"),
        (lambda: m.memory_step_fn(memory, src_pad, shared=1), TypeError, r"Transformer.memory_step_fn: `shared`"),
        (lambda: m.memory_step_fn(memory, src_pad, shared=False, cache=None), TypeError,
         r"Transformer.memory_step_fn: `cache`"),
    ]
    for call, err, pattern in cases:
        with pytest.raises(err, match=pattern):
            call()
    learned = model(positions="learned")
    with pytest.raises(TypeError, match=r"Transformer.embed: `pos_table` must be an nn.Embedding"):
        learned.embed(tgt, learned.tgt_embed)
