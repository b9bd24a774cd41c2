"""Tests for AttentionSeq2Seq's intervention on the attention weights (``alpha_fn``, chapter 03):
the model's own weights reproduce the model exactly, replaced weights are the ones used, every
flow calls the hook with the right steps, and bad hooks get clear exceptions."""
from __future__ import annotations

import pytest
import torch

from attnbook.decoding import greedy_decode_batch
from attnbook.seq2seq import AttentionSeq2Seq
from test_seq2seq import batch as seq2seq_batch

pytestmark = pytest.mark.usefixtures("one_thread")

f64 = torch.float64
PAD, BOS, EOS = 0, 1, 2
V_SRC, V_TGT, D = 11, 9, 8
LENGTHS = [4, 7, 1, 5]
FLOW_CONFIGS = [("bahdanau", False), ("luong", False), ("luong", True)]
IDS = ["bahdanau", "luong", "luong-feed"]


def model_of(flow, feed, seed=0):
    torch.manual_seed(seed)
    return AttentionSeq2Seq(V_SRC, V_TGT, d_emb=5, d_hidden=D, score="additive", flow=flow,
                            input_feeding=feed).double()


def batch(lengths=LENGTHS, t_tgt=5, seed=1):
    return seq2seq_batch(lengths, t_tgt=t_tgt, seed=seed)   # test_seq2seq's padded batch


def first_real(alpha, t):
    """One-hot weights on source position 0 (always real), shaped like alpha."""
    out = torch.zeros_like(alpha)
    out[..., 0] = 1.0
    return out


@pytest.mark.parametrize("flow,feed", FLOW_CONFIGS, ids=IDS)
def test_the_models_own_weights_reproduce_the_model_exactly(flow, feed):
    model = model_of(flow, feed)
    src, mask, tgt = batch()
    ref = model(src, mask, tgt)
    out = model(src, mask, tgt, alpha_fn=lambda a, t: a)
    for x, y in zip(ref, out):
        assert torch.equal(x, y)


@pytest.mark.parametrize("flow,feed", FLOW_CONFIGS, ids=IDS)
def test_replaced_weights_are_used_and_returned(flow, feed):
    model = model_of(flow, feed)
    src, mask, tgt = batch()
    out = model(src, mask, tgt, alpha_fn=first_real)
    enc = model.encode(src, mask)
    assert torch.equal(out.weights[..., 0], torch.ones_like(out.weights[..., 0]))
    torch.testing.assert_close(out.contexts, enc.memory[:, :1].expand_as(out.contexts),
                               rtol=0, atol=0)
    ref = model(src, mask, tgt)
    assert (ref.logits - out.logits).abs().max() > 1e-6       # the intervention changes the output


@pytest.mark.parametrize("flow,feed", FLOW_CONFIGS, ids=IDS)
def test_the_hook_sees_each_decoder_step_once(flow, feed):
    model = model_of(flow, feed)
    src, mask, tgt = batch()
    seen = []

    def spy(alpha, t):
        seen.append((t, alpha.shape[1]))
        return alpha

    model(src, mask, tgt, alpha_fn=spy)
    if flow == "luong" and not feed:
        assert seen == [(0, tgt.shape[1])]                    # all queries at once
    else:
        assert seen == [(t, 1) for t in range(tgt.shape[1])]


def test_a_permutation_within_the_real_keys_is_accepted_and_keeps_each_row():
    model = model_of("bahdanau", False)
    src, mask, tgt = batch()
    g = torch.Generator().manual_seed(0)
    b, s = mask.shape
    perm = torch.arange(s).repeat(b, tgt.shape[1], 1)
    for i, n in enumerate(mask.sum(1).tolist()):
        for t in range(tgt.shape[1]):
            perm[i, t, :n] = torch.randperm(n, generator=g)

    def permute(alpha, t):
        return alpha.gather(-1, perm[:, t:t + alpha.shape[1]])

    own = model(src, mask, tgt).weights
    out = model(src, mask, tgt, alpha_fn=permute).weights
    # the first step's query s_0 does not depend on the hook: its row is a permutation of the model's
    assert torch.equal(out[:, 0].sort(-1).values, own[:, 0].sort(-1).values)
    assert not torch.equal(out[:, 0], own[:, 0])
    assert bool((out.masked_select(~mask[:, None, :].expand_as(out)) == 0).all())


def test_the_hook_reaches_greedy_decoding():
    model = model_of("bahdanau", False)
    src, mask, _ = batch()

    def decode(**kw):
        hyps = greedy_decode_batch(model.batch_step_fn(src, mask, **kw), batch_size=len(src),
                                   bos=BOS, eos=EOS, max_len=6)
        return [list(h.tokens) for h in hyps]

    assert decode() == decode(alpha_fn=lambda a, t: a)
    calls = []

    def spy(alpha, t):
        calls.append(t)
        return alpha

    decode(alpha_fn=spy)
    assert calls and min(calls) == 0 and max(calls) <= 5


def test_bad_hooks_get_clear_exceptions():
    model = model_of("bahdanau", False)
    src, mask, tgt = batch()
    with pytest.raises(TypeError, match="`alpha_fn` must be None or a callable"):
        model(src, mask, tgt, alpha_fn="uniform")
    with pytest.raises(TypeError, match="must return a tensor"):
        model(src, mask, tgt, alpha_fn=lambda a, t: a.tolist())
    with pytest.raises(ValueError, match="weights like alpha"):
        model(src, mask, tgt, alpha_fn=lambda a, t: a[..., :-1])
    with pytest.raises(ValueError, match="weights like alpha"):
        model(src, mask, tgt, alpha_fn=lambda a, t: a.float())
    with pytest.raises(ValueError, match="finite weights >= 0"):
        model(src, mask, tgt, alpha_fn=lambda a, t: a * float("nan"))
    with pytest.raises(ValueError, match="finite weights >= 0"):
        model(src, mask, tgt, alpha_fn=lambda a, t: 2 * a - a.amax(-1, keepdim=True))

    def on_pad(alpha, t):                       # uniform over all positions, PAD included
        return torch.full_like(alpha, 1.0 / alpha.shape[-1])

    with pytest.raises(ValueError, match="PAD keys weight exactly 0"):
        model(src, mask, tgt, alpha_fn=on_pad)
    with pytest.raises(ValueError, match="must sum to 1"):
        model(src, mask, tgt, alpha_fn=lambda a, t: 0.5 * a)
    enc = model.encode(src, mask)
    q = torch.zeros(len(src), 1, D, dtype=f64)
    with pytest.raises(ValueError, match="`t` must"):
        model.attend(q, enc, alpha_fn=lambda a, t: a, t=-1)
