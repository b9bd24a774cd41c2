"""Tests for attnbook.seq2seq: GRU encoder-decoders without and with attention (chapters 02-03).

Everything runs in float64 with tiny models so that equalities can be tight (1e-12) or exact.
"""
from __future__ import annotations

import math

import pytest
import torch

from attnbook import additive_scores, dot_scores, general_scores, scaled_dot_scores
from attnbook.seq2seq import (
    FLOWS,
    SCORES,
    AttentionScore,
    AttentionSeq2Seq,
    EncoderOutput,
    GRUEncoder,
    Seq2Seq,
    Seq2SeqOutput,
)

f64 = torch.float64
PAD, BOS, EOS = 0, 1, 2


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


V_SRC, V_TGT, D = 11, 9, 8
TOL = dict(rtol=1e-12, atol=1e-12)


def attention_model(flow="bahdanau", score="additive", *, input_feeding=False, seed=0, **kw):
    torch.manual_seed(seed)
    if score in ("dot", "scaled_dot") and flow == "bahdanau":
        kw.setdefault("d_enc", D // 2)            # bidirectional keys 2 d_enc == d_hidden
    return AttentionSeq2Seq(V_SRC, V_TGT, d_emb=5, d_hidden=D, score=score, flow=flow,
                            input_feeding=input_feeding, **kw).double()


def plain_model(context="every_step", seed=0):
    torch.manual_seed(seed)
    return Seq2Seq(V_SRC, V_TGT, d_emb=5, d_hidden=D, context=context).double()


ATTN_CONFIGS = [(flow, score, False) for flow in FLOWS for score in SCORES]
ATTN_CONFIGS += [("luong", score, True) for score in SCORES]
ALL_MODELS = [("plain", c, False) for c in ("every_step", "init")] + ATTN_CONFIGS


def make(kind, arg, feed, seed=0):
    if kind == "plain":
        return plain_model(arg, seed)
    return attention_model(kind, arg, input_feeding=feed, seed=seed)


def batch(lengths, t_tgt=5, seed=1):
    """Right-padded random sources (ids 3..V_SRC-1) with the given lengths, and target inputs."""
    g = torch.Generator().manual_seed(seed)
    s = max(lengths)
    src = torch.randint(3, V_SRC, (len(lengths), s), generator=g)
    mask = torch.arange(s)[None] < torch.tensor(lengths)[:, None]
    src = src.masked_fill(~mask, PAD)
    tgt = torch.randint(3, V_TGT, (len(lengths), t_tgt), generator=g)
    tgt[:, 0] = BOS
    return src, mask, tgt


LENGTHS = [4, 7, 1, 5]
ids = [f"{a}-{b}{'-feed' if c else ''}" for a, b, c in ALL_MODELS]


# ------------------------------------------------------------------------------ shapes and outputs

@pytest.mark.parametrize("cfg", ALL_MODELS, ids=ids)
def test_shapes(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS, t_tgt=6)
    out = model(src, mask, tgt)
    assert isinstance(out, Seq2SeqOutput)
    assert out.logits.shape == (4, 6, V_TGT) and out.logits.dtype == f64
    assert out.states.shape == (4, 7, D)
    if cfg[0] == "plain":
        assert out.weights is None and out.contexts.shape == (4, 6, D)
    else:
        assert out.weights.shape == (4, 6, 7)
        d_key = model.encoder.d_out
        assert out.contexts.shape == (4, 6, d_key)


def test_bahdanau_encoder_is_bidirectional_and_keys_are_twice_the_state():
    model = attention_model("bahdanau", "additive")
    src, mask, _ = batch(LENGTHS)
    enc = model.encode(src, mask)
    assert isinstance(enc, EncoderOutput)
    assert model.encoder.bidirectional and enc.memory.shape == (4, 7, 2 * D)   # dim h = 2 dim s
    assert model.score.w_q.shape == (D, D) and model.score.w_k.shape == (2 * D, D)
    # summary = backward state at the first token (Bahdanau's s_0 initialiser): memory[:, 0, D:]
    torch.testing.assert_close(enc.summary, enc.memory[:, 0, D:], rtol=0, atol=0)
    luong = attention_model("luong", "general")
    enc = luong.encode(src, mask)
    assert not luong.encoder.bidirectional and enc.memory.shape == (4, 7, D)
    last = torch.tensor(LENGTHS) - 1
    torch.testing.assert_close(enc.summary, enc.memory[torch.arange(4), last], rtol=0, atol=0)


# ------------------------------------------------------------------------------ the three steps

@pytest.mark.parametrize("kind", SCORES)
def test_attention_score_calls_the_library_functions(kind):
    torch.manual_seed(2)
    d_key = D if kind in ("dot", "scaled_dot") else 6
    score = AttentionScore(kind, D, d_key).double()
    q, k = torch.randn(3, 4, D, dtype=f64), torch.randn(3, 5, d_key, dtype=f64)
    expected = {
        "dot": lambda: dot_scores(q, k),
        "scaled_dot": lambda: scaled_dot_scores(q, k),
        "general": lambda: general_scores(q, k, score.weight),
        "additive": lambda: additive_scores(q, k, score.w_q, score.w_k, score.v_a),
    }[kind]()
    torch.testing.assert_close(score(q, k), expected, rtol=0, atol=0)
    n_params = sum(p.numel() for p in score.parameters())
    assert n_params == {"dot": 0, "scaled_dot": 0, "general": D * d_key,
                        "additive": D * (D + d_key + 1)}[kind]


def test_additive_score_is_bounded_by_the_l1_norm_of_v_and_dot_is_not():
    torch.manual_seed(3)
    score = AttentionScore("additive", D, D).double()
    q, k = 100 * torch.randn(2, 6, D, dtype=f64), 100 * torch.randn(2, 9, D, dtype=f64)
    bound = score.v_a.abs().sum()
    e = score(q, k)
    assert (e.abs() <= bound).all()
    assert e.abs().max() > 0.5 * bound             # large inputs get close to the bound
    assert dot_scores(q, k).abs().max() > 100 * bound  # control: the dot score is unbounded


@pytest.mark.parametrize("cfg", ATTN_CONFIGS, ids=ids[2:])
def test_weights_sum_to_one_over_real_tokens_positive_there_zero_on_pad(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS)
    w = model(src, mask, tgt).weights
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 5, dtype=f64), **TOL)
    real = mask[:, None, :].expand_as(w)
    assert (w[real] > 0).all()                     # finite scores: strictly positive
    assert (w[~real] == 0).all()                   # PAD: exactly zero
    assert (w[2, :, 0] == 1).all()                 # a one-token source: all weight on it


@pytest.mark.parametrize("cfg", ATTN_CONFIGS, ids=ids[2:])
def test_contexts_are_the_weighted_sums_of_the_encoder_states(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS)
    out = model(src, mask, tgt)
    memory = model.encode(src, mask).memory
    loop = torch.zeros_like(out.contexts)
    for j in range(src.shape[1]):                  # c_t = sum_j alpha_tj h_j
        loop += out.weights[..., j, None] * memory[:, None, j]
    torch.testing.assert_close(out.contexts, loop, **TOL)


def test_temperature_divides_the_scores():
    model = attention_model("luong", "general")
    src, mask, tgt = batch(LENGTHS)
    out1, out3 = model(src, mask, tgt), model(src, mask, tgt, temperature=3.0)
    enc = model.encode(src, mask)
    e = model.score(out1.states[:, 1:], enc.memory).masked_fill(~mask[:, None], float("-inf"))
    torch.testing.assert_close(out3.weights, torch.softmax(e / 3.0, -1), **TOL)
    torch.testing.assert_close(out1.weights, torch.softmax(e, -1), **TOL)
    assert (out3.weights - out1.weights).abs().max() > 1e-3


# ------------------------------------------------------------------------------ padding

@pytest.mark.parametrize("cfg", ALL_MODELS, ids=ids)
def test_extra_padding_and_garbage_under_the_mask_change_nothing(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS)
    ref = model(src, mask, tgt)
    src2 = torch.cat([src, torch.full((4, 3), PAD)], 1)               # 3 more PAD columns
    mask2 = torch.cat([mask, torch.zeros(4, 3, dtype=torch.bool)], 1)
    garbage = src2.clone()
    garbage[~mask2] = torch.randint(3, V_SRC, (int((~mask2).sum()),))   # non-PAD ids, masked out
    for s, m in ((src2, mask2), (garbage, mask2)):
        out = model(s, m, tgt)
        torch.testing.assert_close(out.logits, ref.logits, **TOL)
        torch.testing.assert_close(out.states, ref.states, **TOL)
        if ref.weights is not None:
            torch.testing.assert_close(out.weights[..., :7], ref.weights, **TOL)
            assert (out.weights[..., 7:] == 0).all()


@pytest.mark.parametrize("cfg", ALL_MODELS, ids=ids)
def test_a_sentence_alone_equals_the_same_sentence_in_a_padded_batch(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS)
    full = model(src, mask, tgt)
    alone = model(src[:1, :4], mask[:1, :4], tgt[:1])
    torch.testing.assert_close(alone.logits, full.logits[:1], **TOL)
    # control: the source content does matter
    other = src[:1, :4].clone()
    other[0, 0] = 3 + (other[0, 0] - 2) % (V_SRC - 3)
    assert (model(other, mask[:1, :4], tgt[:1]).logits - alone.logits).abs().max() > 1e-6


# ------------------------------------------------------------------------------ data flows

def _recomputed_weights(model, out, enc, query):
    e = model.score(query, enc.memory).masked_fill(~enc.mask[:, None], float("-inf"))
    return torch.softmax(e, -1)


@pytest.mark.parametrize("score", SCORES)
def test_bahdanau_query_is_the_previous_state(score):
    model = attention_model("bahdanau", score)
    src, mask, tgt = batch(LENGTHS)
    out, enc = model(src, mask, tgt), model.encode(src, mask)
    torch.testing.assert_close(out.weights, _recomputed_weights(model, out, enc, out.states[:, :-1]), **TOL)
    # control: the current state s_t would give different weights
    assert (out.weights - _recomputed_weights(model, out, enc, out.states[:, 1:])).abs().max() > 1e-4


@pytest.mark.parametrize("feed", [False, True])
@pytest.mark.parametrize("score", SCORES)
def test_luong_query_is_the_current_state(score, feed):
    model = attention_model("luong", score, input_feeding=feed)
    src, mask, tgt = batch(LENGTHS)
    out, enc = model(src, mask, tgt), model.encode(src, mask)
    torch.testing.assert_close(out.weights, _recomputed_weights(model, out, enc, out.states[:, 1:]), **TOL)
    assert (out.weights - _recomputed_weights(model, out, enc, out.states[:, :-1])).abs().max() > 1e-4
    # the attentional state: logits = W_s tanh(W_c [c_t; s_t])
    h_tilde = torch.tanh(torch.cat([out.contexts, out.states[:, 1:]], -1) @ model.combine.weight.T)
    torch.testing.assert_close(out.logits, model.out(h_tilde), **TOL)


@pytest.mark.parametrize("t", [1, 3])
def test_bahdanau_weights_at_step_t_do_not_see_the_step_t_input(t):
    """alpha_t depends on s_{t-1} only: changing y_{t-1} (tgt_in[:, t]) leaves alpha_t bit-identical."""
    src, mask, tgt = batch(LENGTHS)
    changed = tgt.clone()
    changed[:, t] = 3 + (tgt[:, t] - 2) % (V_TGT - 3)
    bahdanau = attention_model("bahdanau", "additive")
    a, b = bahdanau(src, mask, tgt).weights, bahdanau(src, mask, changed).weights
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])                 # steps up to t: untouched
    assert (a[:, t + 1] - b[:, t + 1]).abs().max() > 1e-6             # the next step sees it
    for feed in (False, True):                                        # control: Luong's does
        luong = attention_model("luong", "additive", input_feeding=feed)
        a, b = luong(src, mask, tgt).weights, luong(src, mask, changed).weights
        assert torch.equal(a[:, :t], b[:, :t])
        assert (a[:, t] - b[:, t]).abs().max() > 1e-6


def test_where_the_context_enters_the_recurrence():
    """Changing only the score parameters changes s_t iff c_t feeds the recurrence."""
    src, mask, tgt = batch(LENGTHS)
    for flow, feed, feeds_state in (("bahdanau", False, True), ("luong", False, False),
                                    ("luong", True, True)):
        model = attention_model(flow, "additive", input_feeding=feed)
        before = model(src, mask, tgt)
        with torch.no_grad():
            model.score.v_a.mul_(-2.0)
        after = model(src, mask, tgt)
        assert (after.weights - before.weights).abs().max() > 1e-4
        assert torch.equal(after.states[:, 0], before.states[:, 0])       # s_0 never sees c
        moved = (after.states - before.states).abs().max().item()
        assert (moved > 1e-6) == feeds_state, (flow, feed, moved)
        assert (after.logits - before.logits).abs().max() > 1e-6          # output always does


def test_cho_feeds_c_at_every_step_sutskever_only_initialises():
    src, mask, tgt = batch(LENGTHS)
    for context, uses_c in (("every_step", True), ("init", False)):
        model = plain_model(context)
        enc = model.encode(src, mask)
        s0 = torch.tanh(model.init(enc.summary))
        other = enc._replace(summary=torch.randn_like(enc.summary))
        a = model.decode(tgt, enc, s0=s0).logits
        b = model.decode(tgt, other, s0=s0).logits                        # same s_0, other c
        assert ((a - b).abs().max() > 1e-6) == uses_c, context
        torch.testing.assert_close(model(src, mask, tgt).logits, a, **TOL)
        assert (model.decode(tgt, other).logits - a).abs().max() > 1e-6  # c always reaches s_0


def test_plain_model_memory_is_ignored():
    """Without attention only c = h_m reaches the decoder: the other encoder states do not."""
    model = plain_model()
    src, mask, tgt = batch(LENGTHS)
    enc = model.encode(src, mask)
    scrambled = enc._replace(memory=torch.randn_like(enc.memory))
    torch.testing.assert_close(model.decode(tgt, scrambled).logits, model.decode(tgt, enc).logits,
                               rtol=0, atol=0)


# ------------------------------------------------------------------------------ decoding protocol

@pytest.mark.parametrize("cfg", ALL_MODELS, ids=ids)
def test_step_function_agrees_with_teacher_forced_logits(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS, t_tgt=6)
    b = 1
    sentence = src[b, : LENGTHS[b]]
    ref = torch.log_softmax(model(src, mask, tgt).logits[b], -1)        # (T, V), padded batch
    step = model.step_fn(sentence)
    for t in range(1, 7):
        prefixes = torch.cat([tgt[b : b + 1, :t], tgt[2:4, :t]])        # N = 3 prefixes
        lp = step(prefixes)
        assert lp.shape == (3, V_TGT)
        torch.testing.assert_close(lp[0], ref[t - 1], **TOL)
        torch.testing.assert_close(lp.exp().sum(-1), torch.ones(3, dtype=f64), **TOL)
    assert model.training                                                 # mode restored


@pytest.mark.parametrize("cfg", [ALL_MODELS[0], ATTN_CONFIGS[3], ATTN_CONFIGS[5]])
def test_batch_step_function_row_n_continues_source_n(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS, t_tgt=6)
    step = model.batch_step_fn(src, mask)
    ref = torch.log_softmax(model(src, mask, tgt).logits, -1)
    for t in (1, 4, 6):
        torch.testing.assert_close(step(tgt[:, :t]), ref[:, t - 1], **TOL)
    for b, n in enumerate(LENGTHS):                          # = the one-sentence step function
        torch.testing.assert_close(model.step_fn(src[b, :n])(tgt[b : b + 1, :4])[0],
                                   step(tgt[:, :4])[b], **TOL)
    with pytest.raises(ValueError, match="one row per source"):
        step(tgt[:2, :3])


def test_decoding_functions_live_in_decoding_only_and_agree():
    decoding = pytest.importorskip("attnbook.decoding")
    from attnbook import seq2seq

    for name in ("greedy_decode", "greedy_decode_batch", "beam_search", "exact_map"):
        assert not hasattr(seq2seq, name) and name not in seq2seq.__all__  # one import path: decoding
    model = attention_model("bahdanau", "additive")
    src, mask, _ = batch(LENGTHS)
    together = decoding.greedy_decode_batch(model.batch_step_fn(src, mask), batch_size=4,
                                            bos=BOS, eos=EOS, max_len=6)
    for b, n in enumerate(LENGTHS):
        step = model.step_fn(src[b, :n])
        alone = decoding.greedy_decode(step, bos=BOS, eos=EOS, max_len=6)
        assert alone.tokens == together[b].tokens
        assert abs(alone.logprob - together[b].logprob) < 1e-10
        assert abs(decoding.score_sequence(step, alone.tokens, bos=BOS) - alone.logprob) < 1e-10
        wide = decoding.beam_search(step, bos=BOS, eos=EOS, beam_size=V_TGT**3, max_len=3)
        exact = decoding.exact_map(step, bos=BOS, eos=EOS, vocab_size=V_TGT, max_len=3)
        assert wide[0].tokens == exact.tokens


# ------------------------------------------------------------------------------ training signal

@pytest.mark.parametrize("cfg", ALL_MODELS, ids=ids)
def test_gradients_reach_every_parameter(cfg):
    model = make(*cfg)
    src, mask, tgt = batch(LENGTHS)
    logits = model(src, mask, tgt).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V_TGT), tgt.roll(-1, 1).reshape(-1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().max() > 0, name
    assert (model.encoder.embed.weight.grad[PAD] == 0).all()              # padding_idx row


def test_a_few_steps_of_training_learn_to_copy():
    """End to end: 40 Adam steps on a copy task cut the loss by more than 3x (from ~log V)."""
    model = attention_model("bahdanau", "general").float()
    g = torch.Generator().manual_seed(4)
    src = torch.randint(3, V_TGT, (32, 5), generator=g)
    tgt = torch.cat([torch.full((32, 1), BOS), src], 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(40):
        logits = model(src, torch.ones_like(src, dtype=torch.bool), tgt[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V_TGT), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(V_TGT)) < 0.3 and losses[-1] < losses[0] / 3


# ------------------------------------------------------------------------------ validation

def test_constructor_validation():
    with pytest.raises(ValueError, match="`flow` must be one of"):
        AttentionSeq2Seq(5, 5, flow="vaswani")
    with pytest.raises(ValueError, match="AttentionSeq2Seq: `score` must be one of"):
        AttentionSeq2Seq(5, 5, score="cosine")
    with pytest.raises(ValueError, match="AttentionSeq2Seq: `pad_id` must be a token id"):
        AttentionSeq2Seq(5, 9, pad_id=5)
    with pytest.raises(TypeError, match="AttentionSeq2Seq: `d_emb` must be an int"):
        AttentionSeq2Seq(5, 5, d_emb=2.5)
    with pytest.raises(ValueError, match=r"dim\(s\) == dim\(h\).*d_enc=32"):
        AttentionSeq2Seq(5, 5, d_hidden=64, score="dot", flow="bahdanau")
    with pytest.raises(ValueError, match="input_feeding"):
        AttentionSeq2Seq(5, 5, flow="bahdanau", input_feeding=True)
    with pytest.raises(TypeError, match="`input_feeding` must be a bool"):
        AttentionSeq2Seq(5, 5, flow="luong", input_feeding=1)
    with pytest.raises(ValueError, match="`context` must be one of"):
        Seq2Seq(5, 5, context="sometimes")
    with pytest.raises(ValueError, match="Seq2Seq: `d_hidden` must be an int >= 1"):
        Seq2Seq(5, 5, d_hidden=0)
    model = plain_model()
    src, mask, tgt = batch(LENGTHS)
    with pytest.raises(ValueError, match=r"`s0` must have shape \(B, d_hidden\)"):
        model.decode(tgt, model.encode(src, mask), s0=torch.zeros(4, D + 1, dtype=f64))
    with pytest.raises(ValueError, match="d_query == d_key"):
        AttentionScore("scaled_dot", 4, 6)
    with pytest.raises(ValueError, match="d_attn"):
        AttentionScore("general", 4, 6, d_attn=3)
    with pytest.raises(TypeError, match="`bidirectional` must be a bool"):
        GRUEncoder(5, 4, 4, bidirectional="yes")


def test_call_validation():
    model = attention_model("luong", "dot")
    src, mask, tgt = batch(LENGTHS)
    fn = "AttentionSeq2Seq|GRUEncoder"
    with pytest.raises(TypeError, match=rf"({fn}).*`src` must be a 2-D torch.long"):
        model(src.int(), mask, tgt)
    with pytest.raises(TypeError, match="`src_mask` must be a bool"):
        model(src, mask.long(), tgt)
    with pytest.raises(ValueError, match="`src_mask` must have src's shape"):
        model(src, mask[:, :-1], tgt)
    with pytest.raises(ValueError, match="right-padded"):
        holes = mask.clone()
        holes[0, 2] = False                                       # a gap inside sentence 0
        model(src, holes, tgt)
    with pytest.raises(ValueError, match="at least one real token"):
        bad = mask.clone()
        bad[1] = False
        model(src, bad, tgt)
    with pytest.raises(ValueError, match=r"`src` must hold ids in \[0, 11\)"):
        model(src + V_SRC, mask, tgt)
    with pytest.raises(ValueError, match=r"`tgt_in` must hold ids in \[0, 9\)"):
        model(src, mask, tgt + V_TGT)
    with pytest.raises(ValueError, match="same batch size"):
        model(src, mask, tgt[:2])
    with pytest.raises(ValueError, match="`temperature` must lie in"):
        model(src, mask, tgt, temperature=0.0)
    with pytest.raises(ValueError, match="1-D tensor"):
        model.step_fn(src)
    with pytest.raises(TypeError, match="`src` must be a torch.Tensor"):
        model.step_fn([3, 4, 5])
    step = model.step_fn(src[0, :4])
    with pytest.raises(ValueError, match="`prefixes` must have at least 2 dims"):
        step(torch.tensor([BOS]))
    with pytest.raises(TypeError, match="`prefixes` must be a 2-D torch.long"):
        step(torch.tensor([[BOS]], dtype=torch.int32))

