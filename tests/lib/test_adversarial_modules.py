"""An adversarial battery over reference, positional, rnn, seq2seq, decoding, data, efficient,
widgets, plotting, display and testing: the classes of failure an outside probe found, so that
they cannot come back in a function the probe did not try.

1. Misuse (``MISUSE``): wrong types, lists for tensors, wrong dtypes or devices, out-of-range
   ids and sizes, non-finite numbers. Each must raise the stated exception with a message that
   names the function and the argument ("fn: `arg` ...") -- never an internal error.
2. Edge sizes (0, 1, huge) give the mathematically right empty / trivial / finite result.
3. Oracles on configurations the module tests do not use: independent formulas written here.
4. Invariances and determinism.
Everything is tiny (float64, a few positions) so the whole file runs in a few seconds.
"""
from __future__ import annotations

import datetime as dt
import math
import re
import time
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from attnbook import decoding, efficient, positional, plotting, reference, rnn, seq2seq, testing, widgets
from attnbook import data
from attnbook.display import show_source, source_of

F64 = torch.float64
TOL = testing.F64_TOL

pytestmark = pytest.mark.usefixtures("one_thread")


def r(*shape, seed=0, dtype=F64):
    return testing.rand(*shape, dtype=dtype, seed=seed)


# ---------------------------------------------------------------------------- fixtures of the table
def _rnn():
    torch.manual_seed(0)
    return rnn.SimpleRNN(3, 4, dtype=F64)


def _factors():
    m = _rnn()
    return rnn.step_jacobians(m, m(r(2, 5, 3)).z)


def _lm(v=5, eos=2, max_len=None, seed=0):
    return decoding.random_tree_lm(v, eos=eos, seed=seed, max_len=max_len)


def _s2s(attention=False, **kw):
    torch.manual_seed(0)
    if attention:
        return seq2seq.AttentionSeq2Seq(9, 8, d_emb=4, d_hidden=6, **kw).double()
    return seq2seq.Seq2Seq(9, 8, d_emb=4, d_hidden=6, **kw).double()


SRC = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]])
MASK = SRC != 0
TGT = torch.tensor([[1, 3, 4], [1, 5, 6]])


def _param_with_grad():
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    return p


def _fig(n=1):
    return plotting.line_plot([0, 1], {"a": [0, n]}, xlabel="x", ylabel="y")


q4, k4, v4 = r(2, 3, 4), r(2, 5, 4, seed=1), r(2, 5, 2, seed=2)

# (id, thunk, exception, function name, argument name)
MISUSE = [
    # reference
    ("dot_scores-list", lambda: reference.dot_scores([[1.0]], k4), TypeError, "dot_scores", "q"),
    ("dot_scores-int", lambda: reference.dot_scores(q4, k4.long()), TypeError, "dot_scores", "k"),
    ("dot_scores-dtype", lambda: reference.dot_scores(q4, k4.float()), TypeError, "dot_scores", "k"),
    ("scaled-scale0", lambda: reference.scaled_dot_scores(q4, k4, 0.0), ValueError, "scaled_dot_scores", "scale"),
    ("scaled-nan", lambda: reference.scaled_dot_scores(q4, k4, math.nan), ValueError, "scaled_dot_scores", "scale"),
    ("scaled-str", lambda: reference.scaled_dot_scores(q4, k4, "1"), TypeError, "scaled_dot_scores", "scale"),
    ("general-shape", lambda: reference.general_scores(q4, k4, r(3, 4)), ValueError, "general_scores", "weight"),
    ("general-list", lambda: reference.general_scores(q4, k4, [[1.0]]), TypeError, "general_scores", "weight"),
    ("additive-dtype", lambda: reference.additive_scores(q4, k4, r(4, 2), r(4, 2), r(2).float()),
     TypeError, "additive_scores", "v_a"),
    ("causal-neg", lambda: reference.causal_mask(-1), ValueError, "causal_mask", "tq"),
    ("causal-float", lambda: reference.causal_mask(2.5), TypeError, "causal_mask", "tq"),
    ("causal-bool", lambda: reference.causal_mask(3, True), TypeError, "causal_mask", "tk"),
    ("causal-device", lambda: reference.causal_mask(3, device="nope"), ValueError, "causal_mask", "device"),
    ("padding-range", lambda: reference.padding_mask([1, 5], 3), ValueError, "padding_mask", "lengths"),
    ("padding-float", lambda: reference.padding_mask([1.5], 3), ValueError, "padding_mask", "lengths"),
    ("padding-none", lambda: reference.padding_mask(None, 3), TypeError, "padding_mask", "lengths"),
    ("padding-int", lambda: reference.padding_mask(5, 3), TypeError, "padding_mask", "lengths"),
    ("padding-str", lambda: reference.padding_mask("12", 3), TypeError, "padding_mask", "lengths"),
    ("padding-t", lambda: reference.padding_mask([1], -1), ValueError, "padding_mask", "t"),
    ("padding-2d", lambda: reference.padding_mask([[1]], 3), ValueError, "padding_mask", "lengths"),
    ("to_additive-dtype", lambda: reference.mask_to_additive(torch.ones(2, dtype=torch.bool), torch.int64),
     TypeError, "mask_to_additive", "dtype"),
    ("to_additive-list", lambda: reference.mask_to_additive([True], F64), TypeError, "mask_to_additive", "mask"),
    ("softmax-list", lambda: reference.masked_softmax([1.0, 2.0]), TypeError, "masked_softmax", "scores"),
    ("softmax-int", lambda: reference.masked_softmax(torch.ones(3, dtype=torch.long)), TypeError,
     "masked_softmax", "scores"),
    ("attention_ref-list", lambda: reference.attention_ref([[1.0]], k4, v4), TypeError, "attention_ref", "q"),
    ("attention_ref-mask", lambda: reference.attention_ref(q4, k4, v4, mask=[[True]]), TypeError,
     "attention_ref", "mask"),
    # positional
    ("freq-odd", lambda: positional.frequencies(3), ValueError, "frequencies", "d_model"),
    ("freq-zero", lambda: positional.frequencies(0), ValueError, "frequencies", "d_model"),
    ("freq-str", lambda: positional.frequencies("4"), TypeError, "frequencies", "d_model"),
    ("freq-base0", lambda: positional.frequencies(4, base=0), ValueError, "frequencies", "base"),
    ("freq-base-nan", lambda: positional.frequencies(4, base=math.nan), ValueError, "frequencies", "base"),
    ("freq-device", lambda: positional.frequencies(4, device="nope"), ValueError, "frequencies", "device"),
    ("pe-n0", lambda: positional.sinusoidal_encoding(0, 4), ValueError, "sinusoidal_encoding", "n_positions"),
    ("pe-dtype", lambda: positional.sinusoidal_encoding(3, 4, dtype=torch.int32), TypeError,
     "sinusoidal_encoding", "dtype"),
    ("pe-dtype-str", lambda: positional.sinusoidal_encoding(3, 4, dtype="float32"), TypeError,
     "sinusoidal_encoding", "dtype"),
    ("rot-inf", lambda: positional.rotation_matrix(math.inf, 4), ValueError, "rotation_matrix", "k"),
    ("rot-odd", lambda: positional.rotation_matrix(1, 5), ValueError, "rotation_matrix", "d_model"),
    ("perm-odd", lambda: positional.half_split_permutation(5), ValueError, "half_split_permutation", "d_model"),
    ("rope-D0", lambda: positional.apply_rope(torch.zeros(2, 3, 0)), ValueError, "apply_rope", "x"),
    ("rope-D3", lambda: positional.apply_rope(torch.zeros(2, 3, 3)), ValueError, "apply_rope", "x"),
    ("rope-list", lambda: positional.apply_rope([[1.0, 2.0]]), TypeError, "apply_rope", "x"),
    ("rope-1d", lambda: positional.apply_rope(torch.zeros(4)), ValueError, "apply_rope", "x"),
    ("rope-int", lambda: positional.apply_rope(torch.zeros(2, 4, dtype=torch.long)), TypeError, "apply_rope", "x"),
    ("rope-pos-list", lambda: positional.apply_rope(r(3, 4), [0, 1, 2]), TypeError, "apply_rope", "positions"),
    ("rope-pos-nan", lambda: positional.apply_rope(r(3, 4), torch.tensor([0.0, math.nan, 2.0])), ValueError,
     "apply_rope", "positions"),
    ("rope-pos-shape", lambda: positional.apply_rope(r(3, 4), torch.arange(4)), ValueError, "apply_rope",
     "positions"),
    ("rope-pos-bool", lambda: positional.apply_rope(r(3, 4), torch.ones(3, dtype=torch.bool)), TypeError,
     "apply_rope", "positions"),
    ("rope-pairing", lambda: positional.apply_rope(r(3, 4), pairing="adjacent"), ValueError, "apply_rope",
     "pairing"),
    ("rope-base", lambda: positional.apply_rope(r(3, 4), base=-1.0), ValueError, "apply_rope", "base"),
    ("slopes-0", lambda: positional.alibi_slopes(0), ValueError, "alibi_slopes", "n_heads"),
    ("slopes-dtype", lambda: positional.alibi_slopes(4, dtype=torch.int64), TypeError, "alibi_slopes", "dtype"),
    ("alibi-tq", lambda: positional.alibi_bias(2, 0), ValueError, "alibi_bias", "tq"),
    ("alibi-sym", lambda: positional.alibi_bias(2, 3, symmetric=1), TypeError, "alibi_bias", "symmetric"),
    ("alibi-device", lambda: positional.alibi_bias(2, 3, device="gpu0"), ValueError, "alibi_bias", "device"),
    # rnn
    ("rnn-d_in", lambda: rnn.SimpleRNN(0, 4), ValueError, "SimpleRNN", "d_in"),
    ("rnn-nonlin", lambda: rnn.SimpleRNN(3, 4, nonlinearity="gelu"), ValueError, "SimpleRNN", "nonlinearity"),
    ("rnn-dtype", lambda: rnn.SimpleRNN(3, 4, dtype=torch.int64), TypeError, "SimpleRNN", "dtype"),
    ("rnn-bias", lambda: rnn.SimpleRNN(3, 4, bias=1), TypeError, "SimpleRNN", "bias"),
    ("rnn-device", lambda: rnn.SimpleRNN(3, 4, device="nope"), ValueError, "SimpleRNN", "device"),
    ("rnn-x-list", lambda: _rnn()([[[1.0, 2.0, 3.0]]]), TypeError, "SimpleRNN.forward", "x"),
    ("rnn-x-dtype", lambda: _rnn()(r(1, 2, 3).float()), TypeError, "SimpleRNN.forward", "x"),
    ("rnn-x-width", lambda: _rnn()(r(1, 2, 4)), ValueError, "SimpleRNN.forward", "x"),
    ("rnn-h0", lambda: _rnn()(r(1, 2, 3), r(2, 4)), ValueError, "SimpleRNN.forward", "h0"),
    ("rnn-h0-list", lambda: _rnn()(r(1, 2, 3), [[0.0] * 4]), TypeError, "SimpleRNN.forward", "h0"),
    ("jac-rnn", lambda: rnn.step_jacobians(nn.RNN(3, 4), r(2, 4)), TypeError, "step_jacobians", "rnn"),
    ("jac-z-dtype", lambda: rnn.step_jacobians(_rnn(), r(2, 4).float()), TypeError, "step_jacobians", "z"),
    ("jac-z-width", lambda: rnn.step_jacobians(_rnn(), r(2, 5)), ValueError, "step_jacobians", "z"),
    ("jprod-range", lambda: rnn.jacobian_product(_factors(), 6, 0), ValueError, "jacobian_product", "t"),
    ("jprod-neg", lambda: rnn.jacobian_product(_factors(), 2, -1), ValueError, "jacobian_product", "k"),
    ("jprod-square", lambda: rnn.jacobian_product(r(2, 3, 4), 1, 0), ValueError, "jacobian_product", "factors"),
    ("jnorm-ord", lambda: rnn.jacobian_norms(_factors(), ord="spectral"), ValueError, "jacobian_norms", "ord"),
    ("jnorm-ord3", lambda: rnn.jacobian_norms(_factors(), ord=3), ValueError, "jacobian_norms", "ord"),
    ("jnorm-ord-bool", lambda: rnn.jacobian_norms(_factors(), ord=True), ValueError, "jacobian_norms", "ord"),
    ("jnorm-k", lambda: rnn.jacobian_norms(_factors(), k=9), ValueError, "jacobian_norms", "k"),
    ("clip-0", lambda: rnn.clip_grad_norm([_param_with_grad()], 0.0), ValueError, "clip_grad_norm", "max_norm"),
    ("clip-nan", lambda: rnn.clip_grad_norm([_param_with_grad()], math.nan), ValueError, "clip_grad_norm",
     "max_norm"),
    ("clip-params", lambda: rnn.clip_grad_norm(5, 1.0), TypeError, "clip_grad_norm", "parameters"),
    ("clip-params-item", lambda: rnn.clip_grad_norm([5], 1.0), TypeError, "clip_grad_norm", "parameters[0]"),
    ("clipv-neg", lambda: rnn.clip_grad_value([_param_with_grad()], -1), ValueError, "clip_grad_value",
     "clip_value"),
    ("act-name", lambda: rnn.activation_derivative(r(3), "gelu"), ValueError, "activation_derivative",
     "nonlinearity"),
    ("from_torch-gru", lambda: rnn.SimpleRNN.from_torch(nn.GRU(3, 4)), TypeError, "SimpleRNN.from_torch", "rnn"),
    # decoding
    ("lp-neg", lambda: decoding.length_penalty(-10, 0.5), ValueError, "length_penalty", "length"),
    ("lp-nan", lambda: decoding.length_penalty(3, math.nan), ValueError, "length_penalty", "alpha"),
    ("lp-str", lambda: decoding.length_penalty("3", 0.5), TypeError, "length_penalty", "length"),
    ("lp-alpha-neg", lambda: decoding.length_penalty(3, -1.0), ValueError, "length_penalty", "alpha"),
    ("lp-alpha-str", lambda: decoding.length_penalty(3, "a"), TypeError, "length_penalty", "alpha"),
    ("lp-float-len", lambda: decoding.length_penalty(2.5, 1.0), TypeError, "length_penalty", "length"),
    ("score-none", lambda: decoding.score_sequence(_lm(), None, bos=1), TypeError, "score_sequence", "tokens"),
    ("score-float", lambda: decoding.score_sequence(_lm(), [1.5], bos=1), TypeError, "score_sequence",
     "tokens[0]"),
    ("score-str", lambda: decoding.score_sequence(_lm(), "12", bos=1), TypeError, "score_sequence", "tokens"),
    ("score-tensor", lambda: decoding.score_sequence(_lm(), torch.tensor([[1]]), bos=1), TypeError,
     "score_sequence", "tokens"),
    ("score-step", lambda: decoding.score_sequence(5, [1], bos=1), TypeError, "score_sequence", "step"),
    ("greedy-bos", lambda: decoding.greedy_decode(_lm(), bos=-1, eos=2, max_len=3), ValueError,
     "greedy_decode", "bos"),
    ("greedy-max_len", lambda: decoding.greedy_decode(_lm(), bos=1, eos=2, max_len=0), ValueError,
     "greedy_decode", "max_len"),
    ("greedy-eos", lambda: decoding.greedy_decode(_lm(), bos=1, eos=5, max_len=3), ValueError,
     "greedy_decode", "eos"),
    ("greedy-probs", lambda: decoding.greedy_decode(lambda p: torch.full((len(p), 4), 0.25), bos=1, eos=2,
                                                    max_len=3), ValueError, "greedy_decode", "step"),
    ("greedy-shape", lambda: decoding.greedy_decode(lambda p: torch.zeros(4), bos=1, eos=2, max_len=3),
     ValueError, "greedy_decode", "step"),
    ("batch-size", lambda: decoding.greedy_decode_batch(_lm(), batch_size=0, bos=1, eos=2, max_len=3),
     ValueError, "greedy_decode_batch", "batch_size"),
    ("beam-size", lambda: decoding.beam_search(_lm(), bos=1, eos=2, beam_size=0, max_len=3), ValueError,
     "beam_search", "beam_size"),
    ("beam-alpha", lambda: decoding.beam_search(_lm(), bos=1, eos=2, beam_size=2, max_len=3, alpha=-1),
     ValueError, "beam_search", "alpha"),
    ("beam-trace", lambda: decoding.beam_search(_lm(), bos=1, eos=2, beam_size=2, max_len=3, trace="x"),
     TypeError, "beam_search", "trace"),
    ("enum-huge", lambda: decoding.enumerate_sequences(_lm(), bos=1, eos=2, vocab_size=5, max_len=10**9),
     ValueError, "enumerate_sequences", "max_len"),
    ("enum-eos", lambda: decoding.enumerate_sequences(_lm(), bos=1, eos=5, vocab_size=5, max_len=2),
     ValueError, "enumerate_sequences", "eos"),
    ("map-alpha", lambda: decoding.exact_map(_lm(), bos=1, eos=2, vocab_size=5, max_len=2, alpha=math.nan),
     ValueError, "exact_map", "alpha"),
    ("tree-v", lambda: decoding.random_tree_lm(1, eos=0, seed=0), ValueError, "random_tree_lm", "vocab_size"),
    ("tree-eos", lambda: decoding.random_tree_lm(5, eos=5, seed=0), ValueError, "random_tree_lm", "eos"),
    ("tree-temp", lambda: decoding.random_tree_lm(5, eos=2, seed=0, temperature=0), ValueError,
     "random_tree_lm", "temperature"),
    ("tree-seed", lambda: decoding.random_tree_lm(5, eos=2, seed=-1), ValueError, "random_tree_lm", "seed"),
    ("tree-step-list", lambda: _lm()([[1]]), TypeError, "random_tree_lm step", "prefixes"),
    ("tree-step-1d", lambda: _lm()(torch.tensor([1])), ValueError, "random_tree_lm step", "prefixes"),
    ("tree-step-float", lambda: _lm()(torch.tensor([[1.0]])), ValueError, "random_tree_lm step", "prefixes"),
    # seq2seq
    ("enc-pad", lambda: seq2seq.GRUEncoder(5, 4, 4, pad_id=5), ValueError, "GRUEncoder", "pad_id"),
    ("enc-src-list", lambda: seq2seq.GRUEncoder(5, 4, 4)([[1, 2]], torch.ones(1, 2, dtype=torch.bool)),
     TypeError, "GRUEncoder", "src"),
    ("s2s-src-list", lambda: _s2s()([[3, 4]], MASK, TGT), TypeError, "Seq2Seq", "src"),
    ("s2s-tgt-list", lambda: _s2s()(SRC, MASK, [[1, 3]]), TypeError, "Seq2Seq", "tgt_in"),
    ("s2s-mask-list", lambda: _s2s()(SRC, MASK.tolist(), TGT), TypeError, "GRUEncoder", "src_mask"),
    ("att-src-list", lambda: _s2s(True)([[3, 4]], MASK, TGT), TypeError, "AttentionSeq2Seq", "src"),
    ("s2s-s0-dtype", lambda: _s2s().decode(TGT, _s2s().encode(SRC, MASK), s0=torch.zeros(2, 6)), TypeError,
     "Seq2Seq.decode", "s0"),
    ("s2s-s0-list", lambda: _s2s().decode(TGT, _s2s().encode(SRC, MASK), s0=[[0.0] * 6] * 2), TypeError,
     "Seq2Seq.decode", "s0"),
    ("s2s-tgt-range", lambda: _s2s().decode(TGT + 8, _s2s().encode(SRC, MASK)), ValueError, "Seq2Seq.decode",
     "tgt_in"),
    ("s2s-enc-tuple", lambda: _s2s().decode(TGT, (1, 2, 3)), TypeError, "Seq2Seq.decode", "enc"),
    ("s2s-enc-rows", lambda: _s2s().decode(TGT[:1], _s2s().encode(SRC, MASK)), ValueError, "Seq2Seq.decode",
     "enc"),
    ("att-enc-other", lambda: _s2s(True).decode(TGT, _s2s(True, flow="luong").encode(SRC, MASK)), ValueError,
     "AttentionSeq2Seq.decode", "enc"),
    ("att-enc-tuple", lambda: _s2s(True).decode(TGT, (1, 2, 3)), TypeError, "AttentionSeq2Seq.decode", "enc"),
    ("att-tgt-range", lambda: _s2s(True).decode(TGT + 8, _s2s(True).encode(SRC, MASK)), ValueError,
     "AttentionSeq2Seq.decode", "tgt_in"),
    ("att-temp-0", lambda: _s2s(True)(SRC, MASK, TGT, temperature=0.0), ValueError, "AttentionSeq2Seq.decode",
     "temperature"),
    ("att-temp-inf", lambda: _s2s(True)(SRC, MASK, TGT, temperature=math.inf), ValueError,
     "AttentionSeq2Seq.decode", "temperature"),
    ("att-temp-bool", lambda: _s2s(True)(SRC, MASK, TGT, temperature=True), TypeError,
     "AttentionSeq2Seq.decode", "temperature"),
    ("attend-query", lambda: _s2s(True).attend(r(2, 1, 5), _s2s(True).encode(SRC, MASK)), ValueError,
     "AttentionSeq2Seq.attend", "query"),
    ("attend-query-dtype", lambda: _s2s(True).attend(r(2, 1, 6).float(), _s2s(True).encode(SRC, MASK)),
     TypeError, "AttentionSeq2Seq.attend", "query"),
    ("score-kind", lambda: seq2seq.AttentionScore("cosine", 4, 4), ValueError, "AttentionScore", "kind"),
    ("score-d", lambda: seq2seq.AttentionScore("general", 0, 4), ValueError, "AttentionScore", "d_query"),
    ("score-d_attn", lambda: seq2seq.AttentionScore("additive", 4, 4, d_attn=0), ValueError, "AttentionScore",
     "d_attn"),
    ("stepfn-2d", lambda: _s2s().step_fn(SRC), ValueError, "Seq2Seq.step_fn", "src"),
    ("stepfn-range", lambda: _s2s().step_fn(torch.tensor([3, 99])), ValueError, "GRUEncoder", "src"),
    # data
    ("vocab-int", lambda: data.Vocab(5), TypeError, "Vocab", "tokens"),
    ("vocab-none", lambda: data.Vocab(None), TypeError, "Vocab", "tokens"),
    ("vocab-item", lambda: data.Vocab(["a", 5]), TypeError, "Vocab", "tokens"),
    ("vocab-level", lambda: data.Vocab("ab", level="byte"), ValueError, "Vocab", "level"),
    ("decode-none", lambda: data.Vocab("ab").decode(None), TypeError, "Vocab.decode", "ids"),
    ("decode-range", lambda: data.Vocab("ab").decode([99]), ValueError, "Vocab.decode", "ids"),
    ("decode-neg", lambda: data.Vocab("ab").decode([-1]), ValueError, "Vocab.decode", "ids"),
    ("decode-2d", lambda: data.Vocab("ab").decode(torch.ones(1, 2, dtype=torch.long)), ValueError,
     "Vocab.decode", "ids"),
    ("decode-float", lambda: data.Vocab("ab").decode([4.0]), TypeError, "Vocab.decode", "ids"),
    ("encode-int", lambda: data.Vocab("ab").encode(5), TypeError, "Vocab.encode", "text"),
    ("encode-items", lambda: data.Vocab("ab").encode([5]), TypeError, "Vocab.encode", "text"),
    ("tokenize-none", lambda: data.Vocab("ab").tokenize(None), TypeError, "Vocab.tokenize", "text"),
    ("batch-int-src", lambda: data.make_batch([(5, [6])]), TypeError, "make_batch", "pairs"),
    ("batch-not-list", lambda: data.make_batch(5), TypeError, "make_batch", "pairs"),
    ("batch-float-ids", lambda: data.make_batch([([1.5], [1])]), TypeError, "make_batch", "pairs"),
    ("batch-neg-ids", lambda: data.make_batch([([-1], [1])]), ValueError, "make_batch", "pairs"),
    ("batch-bool-ids", lambda: data.make_batch([([True], [1])]), TypeError, "make_batch", "pairs"),
    ("split-int", lambda: data.split_of(5), TypeError, "split_of", "key"),
    ("split-none", lambda: data.split_of(None), TypeError, "split_of", "key"),
    ("format-str", lambda: data.format_date("2021-01-01", "YYYY/M/D"), TypeError, "format_date", "date"),
    ("format-fmt", lambda: data.format_date(dt.date(2021, 1, 1), "ISO"), ValueError, "format_date", "fmt"),
    ("format-yy", lambda: data.format_date(dt.date(1900, 1, 1), "DD/MM/YY"), ValueError, "format_date", "date"),
    ("parse-day", lambda: data.parse_date("31/02/21"), ValueError, "parse_date", "text"),
    ("parse-year0", lambda: data.parse_date("0000/1/1"), ValueError, "parse_date", "text"),
    ("parse-int", lambda: data.parse_date(5), TypeError, "parse_date", "text"),
    ("parse-fmt", lambda: data.parse_date("3 March 2021", "DMY"), ValueError, "parse_date", "fmt"),
    ("date-formats-str", lambda: data.date_task(formats="YYYY/M/D"), TypeError, "date_task", "formats"),
    ("date-order", lambda: data.date_task(start=dt.date(2000, 1, 2), end=dt.date(2000, 1, 1)), ValueError,
     "date_task", "end"),
    ("date-datetime", lambda: data.date_task(start=dt.datetime(2000, 1, 1)), TypeError, "date_task", "start"),
    ("rev-min", lambda: data.reversal_task(min_len=0), ValueError, "reversal_task", "min_len"),
    ("rev-alphabet", lambda: data.reversal_task(alphabet="aa"), ValueError, "reversal_task", "alphabet"),
    ("pairs-n", lambda: data.reversal_task().pairs(0), ValueError, "reversal_task.pairs", "n"),
    ("pairs-split", lambda: data.reversal_task().pairs(2, split="dev"), ValueError, "reversal_task.pairs",
     "split"),
    ("pairs-seed", lambda: data.reversal_task().pairs(2, seed=-1), ValueError, "reversal_task.pairs", "seed"),
    ("recall-v", lambda: data.first_token_recall(2, 3, vocab_size=1), ValueError, "first_token_recall",
     "vocab_size"),
    ("adding-dtype", lambda: data.adding_problem(2, 4, dtype=torch.int64), TypeError, "adding_problem", "dtype"),
    # efficient
    ("lin-list", lambda: efficient.linear_attention([[1.0]], k4, v4), TypeError, "linear_attention", "q"),
    ("lin-mask-float", lambda: efficient.linear_attention(q4, k4, v4, mask=torch.ones(5)), TypeError,
     "linear_attention", "mask"),
    ("lin-mask-full", lambda: efficient.linear_attention(q4, k4, v4, mask=torch.ones(3, 5, dtype=torch.bool)),
     ValueError, "linear_attention", "mask"),
    ("lin-causal", lambda: efficient.linear_attention(q4, k4, v4, causal=1), TypeError, "linear_attention",
     "causal"),
    ("lin-eps", lambda: efficient.linear_attention(q4, k4, v4, eps=-1.0), ValueError, "linear_attention", "eps"),
    ("lin-phi", lambda: efficient.linear_attention(q4, k4, v4, feature_map=5), TypeError, "linear_attention",
     "feature_map"),
    ("lin-identity", lambda: efficient.linear_attention(q4, k4, v4, feature_map=lambda x: x), ValueError,
     "linear_attention", "denominators"),
    ("rec-dtype", lambda: efficient.linear_attention_recurrent(q4, k4.float(), v4), TypeError,
     "linear_attention_recurrent", "dtype"),
    ("quad-Tq0", lambda: efficient.linear_attention_quadratic(r(0, 4), r(2, 4), r(2, 2)), ValueError,
     "linear_attention_quadratic", "Tq"),
    ("window-t", lambda: efficient.sliding_window_mask(0, 1), ValueError, "sliding_window_mask", "t"),
    ("window-w", lambda: efficient.sliding_window_mask(4, -1), ValueError, "sliding_window_mask", "window"),
    ("window-device", lambda: efficient.sliding_window_mask(4, 1, device="nope"), ValueError,
     "sliding_window_mask", "device"),
    ("strided-l", lambda: efficient.strided_mask(5, 0), ValueError, "strided_mask", "stride"),
    ("fixed-c", lambda: efficient.fixed_mask(5, 2, summary=3), ValueError, "fixed_mask", "summary"),
    ("global-range", lambda: efficient.global_token_mask(5, [7]), ValueError, "global_token_mask",
     "global_tokens"),
    ("global-float", lambda: efficient.global_token_mask(5, torch.tensor([1.0])), TypeError,
     "global_token_mask", "global_tokens"),
    ("global-base", lambda: efficient.global_token_mask(5, [1], base=torch.ones(4, 4, dtype=torch.bool)),
     ValueError, "global_token_mask", "base"),
    ("field-square", lambda: efficient.receptive_field(torch.ones(2, 3, dtype=torch.bool), 1), ValueError,
     "receptive_field", "mask"),
    ("field-layers", lambda: efficient.receptive_field(torch.ones(2, 2, dtype=torch.bool), -1), ValueError,
     "receptive_field", "layers"),
    ("nnz-float", lambda: efficient.mask_nnz(torch.ones(2, 2)), TypeError, "mask_nnz", "mask"),
    # widgets, plotting, display
    ("explore-fn", lambda: widgets.explore(5, n=(1, 2)), TypeError, "explore", "fn"),
    ("explore-order", lambda: widgets.explore(lambda n: None, n=(2, 1)), ValueError, "explore", "n"),
    ("explore-nan", lambda: widgets.explore(lambda n: None, n=(0, math.nan)), ValueError, "explore", "n"),
    ("explore-none", lambda: widgets.explore(lambda n: None, n=None), TypeError, "explore", "n"),
    ("explore-unknown", lambda: widgets.explore(lambda n: None, m=(0, 1)), TypeError, "explore", "m"),
    ("explore-columns", lambda: widgets.explore(lambda n: None, columns=0, n=(0, 1)), ValueError, "explore",
     "columns"),
    ("settings-controls", lambda: widgets.static_settings(lambda n: None, [("n", (0, 1))]), TypeError,
     "static_settings", "controls"),
    ("numpy-ragged", lambda: plotting.to_numpy([[1, 2], [3]]), ValueError, "to_numpy", "x"),
    ("numpy-none", lambda: plotting.to_numpy(None), TypeError, "to_numpy", "x"),
    ("numpy-none-item", lambda: plotting.to_numpy([1.0, None]), TypeError, "to_numpy", "x"),
    ("numpy-complex", lambda: plotting.to_numpy(torch.tensor([1j])), TypeError, "to_numpy", "x"),
    ("heatmap-3d", lambda: plotting.heatmap(torch.ones(2, 2, 2)), ValueError, "heatmap", "matrix"),
    ("heatmap-empty", lambda: plotting.heatmap(torch.ones(0, 3)), ValueError, "heatmap", "matrix"),
    ("line-ys", lambda: plotting.line_plot([1], {}, xlabel="x", ylabel="y"), ValueError, "line_plot", "ys"),
    ("line-ragged", lambda: plotting.line_plot([1, 2], {"a": [[1], [2, 3]]}, xlabel="x", ylabel="y"),
     ValueError, "line_plot", "ys['a']"),
    ("bar-count", lambda: plotting.bar_plot(["a"], [1, 2], ylabel="y"), ValueError, "bar_plot", "labels"),
    ("figure-rows", lambda: plotting.new_figure(0), ValueError, "new_figure", "nrows"),
    ("figure-size", lambda: plotting.new_figure(figsize=(0, 3)), ValueError, "new_figure", "figsize"),
    ("plot-ax", lambda: plotting.heatmap(torch.ones(2, 2), ax="left"), TypeError, "plotting", "ax"),
    ("source-str", lambda: show_source("abc", display=False), TypeError, "show_source", "abc"),
    ("source-display", lambda: show_source(reference.causal_mask, display="no"), TypeError, "show_source",
     "display"),
    # testing
    ("max_abs-list", lambda: testing.max_abs_error([1.0], torch.ones(1)), TypeError, "max_abs_error", "a"),
    ("max_abs-shape", lambda: testing.max_abs_error(torch.ones(2), torch.ones(3)), ValueError, "max_abs_error",
     "shapes"),
    ("close-ref", lambda: testing.assert_close_to_reference(torch.ones(2), torch.ones(2), torch.ones(2)),
     TypeError, "assert_close_to_reference", "reference"),
    ("close-factor", lambda: testing.assert_close_to_reference(torch.ones(2), torch.ones(2), r(2), factor="2"),
     TypeError, "assert_close_to_reference", "factor"),
    ("rounding-dtype", lambda: testing.rounding_step(r(2), torch.int32), TypeError, "rounding_step", "dtype"),
    ("make_mask-kind", lambda: testing.make_mask("boolean", 1, 1, 2, 2), ValueError, "make_mask", "kind"),
    ("rand-shape", lambda: testing.rand(2, -1), ValueError, "rand", "shape[1]"),
    ("rand-seed", lambda: testing.rand(2, seed=0.5), TypeError, "rand", "seed"),
    # edge sizes that used to reach an internal error
    ("scaled-D0", lambda: reference.scaled_dot_scores(r(2, 0), r(3, 0)), ValueError, "scaled_dot_scores", "q"),
    ("hist-bins", lambda: plotting.hist_plot([1.0, 2.0], bins=0, xlabel="x"), ValueError, "hist_plot", "bins"),
    ("lin-v-none", lambda: efficient.linear_attention(q4, k4, None), TypeError, "linear_attention", "v"),
    ("rec-v-none", lambda: efficient.linear_attention_recurrent(q4, k4, None), TypeError,
     "linear_attention_recurrent", "v"),
    ("hist-nan", lambda: plotting.hist_plot([math.nan, math.nan], xlabel="x"), ValueError, "hist_plot", "values"),
    ("hist-rule", lambda: plotting.hist_plot([1.0, 2.0], bins="x", xlabel="x"), ValueError, "hist_plot", "bins"),
    ("hist-edges", lambda: plotting.hist_plot([1.0, 2.0], bins=[2, 1], xlabel="x"), ValueError, "hist_plot",
     "bins"),
    ("rope-pairing-array", lambda: positional.apply_rope(r(3, 4), pairing=np.array([1, 2])), ValueError,
     "apply_rope", "pairing"),
    # another device (meta stands in for a GPU on a CPU-only machine)
    ("dev-dot", lambda: reference.dot_scores(q4, k4.to("meta")), TypeError, "dot_scores", "k"),
    ("dev-rope", lambda: positional.apply_rope(r(3, 4), torch.arange(3, device="meta")), ValueError, "apply_rope",
     "positions"),
    ("dev-rnn", lambda: _rnn()(r(1, 2, 3).to("meta")), TypeError, "SimpleRNN.forward", "x"),
    ("dev-jac", lambda: rnn.step_jacobians(_rnn(), r(2, 4).to("meta")), TypeError, "step_jacobians", "z"),
    ("dev-s0", lambda: _s2s().decode(TGT, _s2s().encode(SRC, MASK), s0=r(2, 6).to("meta")), TypeError,
     "Seq2Seq.decode", "s0"),
    ("dev-query", lambda: _s2s(True).attend(r(2, 1, 6).to("meta"), _s2s(True).encode(SRC, MASK)), TypeError,
     "AttentionSeq2Seq.attend", "query"),
    ("dev-lin", lambda: efficient.linear_attention(q4, k4.to("meta"), v4), ValueError, "linear_attention",
     "device"),
]


@pytest.mark.parametrize("thunk, exc, fn, arg", [m[1:] for m in MISUSE], ids=[m[0] for m in MISUSE])
def test_misuse_raises_a_clear_error_naming_function_and_argument(thunk, exc, fn, arg):
    with pytest.raises(Exception) as info:
        thunk()
    err = info.value
    assert type(err) is exc, f"expected {exc.__name__}, got {type(err).__name__}: {err}"
    msg = str(err)
    assert msg.startswith(fn) or f"{fn}:" in msg, f"message does not name {fn!r}: {msg}"
    assert arg in msg, f"message does not name the argument {arg!r}: {msg}"


def test_misuse_table_covers_every_module_of_this_pass():
    names = " ".join(m[3] for m in MISUSE)
    for fn in ("dot_scores", "apply_rope", "SimpleRNN", "length_penalty", "AttentionSeq2Seq", "Vocab",
               "linear_attention", "explore", "to_numpy", "show_source", "max_abs_error"):
        assert fn in names
    assert len({m[0] for m in MISUSE}) == len(MISUSE)  # unique ids


def test_apply_rope_with_D0_talks_about_x_not_the_ladder():
    with pytest.raises(ValueError) as info:
        positional.apply_rope(torch.zeros(2, 3, 0))
    assert "frequencies" not in str(info.value) and "d_model" not in str(info.value)


def test_huge_enumeration_is_refused_at_once():
    t0 = time.perf_counter()
    with pytest.raises(ValueError):
        decoding.enumerate_sequences(_lm(), bos=1, eos=2, vocab_size=3, max_len=10**12)
    assert time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------------------- accepted inputs
def test_numpy_scalars_and_integer_ids_are_accepted():
    b = data.make_batch([(np.array([5, 6]), [np.int64(7)]), (torch.tensor([4]), (8, 9))])
    assert b.src.tolist() == [[5, 6], [4, 0]] and b.tgt_out.tolist() == [[7, data.EOS_ID, 0], [8, 9, data.EOS_ID]]
    assert data.Vocab("ab").decode(np.array([4, 5])) == "ab"
    assert reference.causal_mask(np.int64(2)).shape == (2, 2)
    assert positional.sinusoidal_encoding(np.int32(3), np.int64(4)).shape == (3, 4)
    assert decoding.length_penalty(np.int64(7), np.float32(1.0)) == 2.0
    assert rnn.jacobian_norms(_factors(), ord=np.int64(2)).shape == (2, 6)
    settings = widgets.static_settings(lambda n=4: None, {"n": (np.int64(2), np.int64(8))})
    assert settings == [{"n": 4}, {"n": 2}, {"n": 8}]
    assert all(type(s["n"]) is int for s in settings)


def test_explore_accepts_numpy_int_slider_bounds(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    fig = widgets.explore(lambda n=3: _fig(n), n=(np.int64(1), np.int64(5)), display=False)
    assert sum(1 for ax in fig.axes if ax.images) == 3  # defaults, then both extremes


# ---------------------------------------------------------------------------- edge sizes
def test_zero_and_one_sizes():
    assert reference.causal_mask(0).shape == (0, 0) and reference.causal_mask(0, 3).shape == (0, 3)
    assert reference.padding_mask([], 4).shape == (0, 1, 1, 4)
    assert reference.padding_mask([0, 0], 0).shape == (2, 1, 1, 0)
    assert reference.masked_softmax(torch.ones(2, 0)).shape == (2, 0)
    full = reference.masked_softmax(torch.tensor([[-math.inf, -math.inf], [0.0, -math.inf]]))
    assert full.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    res = reference.attention_ref(r(1, 2, 3), r(1, 0, 3), r(1, 0, 4))
    assert res.out.shape == (1, 2, 4) and not res.out.any() and torch.isneginf(res.lse).all()
    assert reference.attention_ref(r(1, 0, 3), r(1, 2, 3), r(1, 2, 4)).out.shape == (1, 0, 4)
    assert positional.apply_rope(r(2, 0, 4)).shape == (2, 0, 4)
    assert torch.equal(positional.apply_rope(r(1, 4)), r(1, 4))  # position 0: no rotation
    assert positional.sinusoidal_encoding(1, 2, dtype=F64).tolist() == [[0.0, 1.0]]
    m = _rnn()
    assert m(r(2, 0, 3)).h.shape == (2, 0, 4)
    assert m(r(0, 3, 3)).h.shape == (0, 3, 4)
    norms = rnn.jacobian_norms(_factors(), k=5)
    assert norms.shape == (2, 1) and torch.allclose(norms, torch.ones(2, 1, dtype=F64))
    assert rnn.jacobian_product(_factors(), 3, 3).equal(torch.eye(4, dtype=F64).expand(2, 4, 4))
    assert decoding.greedy_decode(_lm(), bos=1, eos=2, max_len=1).tokens == (2,)
    assert decoding.beam_search(_lm(2, eos=0), bos=1, eos=0, beam_size=1, max_len=1)[0].tokens == (0,)
    one = efficient.linear_attention(r(1, 4), r(1, 4, seed=1), r(1, 2, seed=2))
    torch.testing.assert_close(one, r(1, 2, seed=2), **TOL)  # one key: its value, whatever the weight
    assert efficient.sliding_window_mask(1, 5).tolist() == [[True]]
    b = data.make_batch([([], [])])
    assert b.src.shape == (1, 1) and b.src_len.tolist() == [0] and b.tgt_out.tolist() == [[data.EOS_ID]]


def test_huge_values_stay_finite():
    x = r(3, 8)
    far = positional.apply_rope(x, torch.tensor([1e9, 2e9, 3e9], dtype=F64))
    torch.testing.assert_close(far.norm(dim=-1), x.norm(dim=-1), **TOL)  # a rotation keeps norms
    assert math.isfinite(decoding.length_penalty(10**6, 3.0))
    pe = positional.sinusoidal_encoding(1, 2, base=1e300, dtype=F64)
    assert torch.isfinite(pe).all()
    big = torch.tensor([[1e300, -1e300, 0.0]], dtype=F64)
    assert torch.isfinite(reference.masked_softmax(big)).all()
    assert efficient.receptive_field(efficient.sliding_window_mask(6, 1), 10**9).all()  # stops at R = all


# ---------------------------------------------------------------------------- seq2seq: the temperature limit
@pytest.mark.parametrize("flow", ["bahdanau", "luong"])
@pytest.mark.parametrize("dtype, tau", [(torch.float32, 1e-40), (torch.float32, 1e-46), (torch.float64, 1e-310),
                                        (torch.float64, 5e-324)])
def test_attention_temperature_to_zero_is_hard_attention(flow, dtype, tau):
    torch.manual_seed(0)
    model = seq2seq.AttentionSeq2Seq(9, 8, d_emb=4, d_hidden=6, flow=flow).to(dtype)
    out = model(SRC, MASK, TGT, temperature=tau)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.weights).all()
    # the limit is the argmax of the scores (over real keys), one-hot
    enc = model.encode(SRC, MASK)
    queries = out.states[:, :-1] if flow == "bahdanau" else out.states[:, 1:]
    e = model.score(queries, enc.memory).masked_fill(~MASK[:, None, :], -math.inf)
    hard = torch.nn.functional.one_hot(e.argmax(-1), SRC.shape[1]).to(dtype)
    assert torch.equal(out.weights, hard)


def test_attention_temperature_ties_share_the_weight_and_large_t_is_uniform():
    model = _s2s(True)
    enc = model.encode(SRC, MASK)
    enc = seq2seq.EncoderOutput(torch.ones_like(enc.memory), enc.mask, enc.summary)  # every key ties
    _, w = model.attend(r(2, 1, 6), enc, temperature=1e-300)
    torch.testing.assert_close(w[:, 0], MASK.double() / MASK.sum(1, keepdim=True), **TOL)
    _, w = model.attend(r(2, 1, 6), model.encode(SRC, MASK), temperature=1e300)
    torch.testing.assert_close(w[:, 0], MASK.double() / MASK.sum(1, keepdim=True), **TOL)


def test_stable_temperature_form_has_the_plain_forms_gradient():
    model = _s2s(True)
    enc = model.encode(SRC, MASK)
    for tau in (0.3, 1.0, 4.0):
        q1 = r(2, 3, 6, seed=9).requires_grad_()
        q2 = q1.detach().clone().requires_grad_()
        _, w = model.attend(q1, enc, temperature=tau)
        e = model.score(q2, enc.memory).masked_fill(~MASK[:, None, :], -math.inf)
        plain = torch.softmax(e / tau, -1)
        probe = r(2, 3, 4, seed=10)
        (g1,) = torch.autograd.grad((w * probe).sum(), q1)
        (g2,) = torch.autograd.grad((plain * probe).sum(), q2)
        torch.testing.assert_close(g1, g2, **TOL)


def test_temperature_one_is_unchanged_by_the_stable_form():
    model = _s2s(True)
    enc = model.encode(SRC, MASK)
    query = r(2, 3, 6)
    _, w = model.attend(query, enc)
    e = model.score(query, enc.memory).masked_fill(~MASK[:, None, :], -math.inf)
    torch.testing.assert_close(w, torch.softmax(e, -1), **TOL)


# ---------------------------------------------------------------------------- oracles
@pytest.mark.parametrize("nonlinearity, bias", [("relu", False), ("tanh", False), ("relu", True)])
def test_simple_rnn_equals_nn_rnn_in_other_settings(nonlinearity, bias):
    torch.manual_seed(1)
    ref = nn.RNN(3, 5, nonlinearity=nonlinearity, bias=bias, batch_first=True, dtype=F64)
    mine = rnn.SimpleRNN.from_torch(ref)
    x, h0 = r(2, 6, 3, seed=3), r(2, 5, seed=4)
    out, h_n = ref(x, h0[None])
    h = mine(x, h0).h
    torch.testing.assert_close(h, out, **TOL)
    torch.testing.assert_close(h[:, -1], h_n[0], **TOL)


def test_jacobian_product_equals_autograd_for_sigmoid():
    torch.manual_seed(2)
    m = rnn.SimpleRNN(2, 3, nonlinearity="sigmoid", dtype=F64)
    x = r(1, 4, 2, seed=5)
    z = m(x).z
    factors = rnn.step_jacobians(m, z)

    def h_t_from_h_1(h1):  # h_4 as a function of h_1, re-running steps 2..4
        h = h1
        for t in range(1, 4):
            h = torch.sigmoid(x[0, t] @ m.W_xh + m.b + h @ m.W_hh)
        return h

    auto = torch.autograd.functional.jacobian(h_t_from_h_1, m(x).h[0, 0].detach())
    torch.testing.assert_close(rnn.jacobian_product(factors, 4, 1)[0], auto, **TOL)


def test_clip_grad_norm_equals_torch_with_missing_grads():
    torch.manual_seed(3)
    mine = [torch.zeros(3, requires_grad=True), torch.zeros(2, 2, requires_grad=True), torch.zeros(1)]
    theirs = [p.clone().detach().requires_grad_(p.requires_grad) for p in mine]
    for a, b in zip(mine[:2], theirs[:2]):
        a.grad = torch.randn_like(a) * 10
        b.grad = a.grad.clone()
    n1 = rnn.clip_grad_norm(mine, 0.5)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(n1, n2)
    for a, b in zip(mine[:2], theirs[:2]):
        torch.testing.assert_close(a.grad, b.grad)


def test_positional_encodings_equal_the_formulas_written_out():
    d, base = 6, 100.0
    pe = positional.sinusoidal_encoding(5, d, base=base, dtype=F64)
    for p in range(5):
        for i in range(d // 2):
            w = base ** (-2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * w), abs=1e-15)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * w), abs=1e-15)
    for k in (-2.5, 0.0, 3.0):  # PE(p + k) = PE(p) M_k, for any real offset
        m = positional.rotation_matrix(k, d, base=base, dtype=F64)
        shifted = torch.tensor([[f(((p + k) * base ** (-2 * i / d))) for i in range(d // 2) for f in (math.sin, math.cos)]
                                for p in range(5)], dtype=F64)
        torch.testing.assert_close(pe @ m, shifted, **TOL)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_rope_equals_complex_multiplication(pairing):
    x, pos = r(2, 5, 8), torch.tensor([0.0, 1.5, -3.0, 7.0, 100.0], dtype=F64)
    out = positional.apply_rope(x, pos, base=500.0, pairing=pairing)
    omega = torch.tensor([500.0 ** (-2 * i / 8) for i in range(4)], dtype=F64)
    if pairing == "interleaved":
        z = torch.complex(x[..., 0::2], x[..., 1::2])
    else:
        z = torch.complex(x[..., :4], x[..., 4:])
    rot = z * torch.polar(torch.ones_like(pos[:, None] * omega), pos[:, None] * omega)
    expected = (torch.stack([rot.real, rot.imag], -1).flatten(-2) if pairing == "interleaved"
                else torch.cat([rot.real, rot.imag], -1))
    torch.testing.assert_close(out, expected, **TOL)


def test_rope_scores_depend_on_the_offset_only():
    q, k = r(1, 6, seed=7), r(1, 6, seed=8)
    def score(m, n):
        return (positional.apply_rope(q, torch.tensor([m])) * positional.apply_rope(k, torch.tensor([n]))).sum()
    torch.testing.assert_close(score(5, 2), score(103, 100), **TOL)
    torch.testing.assert_close(score(0, 7), score(-7, 0), **TOL)


@pytest.mark.parametrize("h", [1, 2, 3, 5, 6, 8, 12])
def test_alibi_slopes_and_bias_equal_the_papers_recipe(h):
    def pow2(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]
    c = 2 ** math.floor(math.log2(h))
    expected = pow2(c) + pow2(2 * c)[0::2][: h - c]
    torch.testing.assert_close(positional.alibi_slopes(h, dtype=F64), torch.tensor(expected, dtype=F64), **TOL)
    bias = positional.alibi_bias(h, 3, 4, dtype=F64)
    for head in range(h):
        for i in range(3):
            for j in range(4):
                want = -expected[head] * (i - j) if j <= i else -math.inf
                assert bias[head, i, j].item() == pytest.approx(want, abs=1e-15) or want == bias[head, i, j].item()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_beam_one_is_greedy_and_a_wide_beam_is_exact_map(seed, alpha):
    lm = decoding.random_tree_lm(4, eos=1, seed=seed + 10, temperature=0.5)
    greedy = decoding.greedy_decode(lm, bos=0, eos=1, max_len=4)
    one = decoding.beam_search(lm, bos=0, eos=1, beam_size=1, max_len=4)
    assert one[0].tokens == greedy.tokens and one[0].logprob == pytest.approx(greedy.logprob, abs=1e-12)
    wide = decoding.beam_search(lm, bos=0, eos=1, beam_size=4 ** 4, max_len=4, alpha=alpha)
    exact = decoding.exact_map(lm, bos=0, eos=1, vocab_size=4, max_len=4, alpha=alpha)
    assert wide[0].tokens == exact.tokens and wide[0].score == pytest.approx(exact.score, abs=1e-12)
    assert decoding.score_sequence(lm, greedy.tokens, bos=0) == pytest.approx(greedy.logprob, abs=1e-12)


def test_enumeration_of_a_model_that_ends_by_max_len_sums_to_one():
    lm = decoding.random_tree_lm(3, eos=2, seed=4, max_len=4)
    _, logprobs = decoding.enumerate_sequences(lm, bos=0, eos=2, vocab_size=3, max_len=4)
    assert torch.logsumexp(logprobs, 0).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk", [(4, 4), (3, 6), (6, 3)])
def test_linear_attention_forms_equal_an_explicit_double_sum(causal, tq, tk):
    q, k, v = r(2, tq, 3, seed=11), r(2, tk, 3, seed=12), r(2, tk, 2, seed=13)
    keep = torch.tensor([[True] * tk, [True] * (tk - 1) + [False]])[:, None, :]  # (B, 1, Tk) key padding
    phi = efficient.elu_feature_map
    expected = torch.zeros(2, tq, 2, dtype=F64)
    for b in range(2):
        for i in range(tq):
            num, den = torch.zeros(2, dtype=F64), 0.0
            for j in range(tk):
                if keep[b, 0, j] and (not causal or j <= i):
                    a = (phi(q[b, i]) * phi(k[b, j])).sum()
                    num, den = num + a * v[b, j], den + a
            expected[b, i] = num / den if den else 0.0
    for form in (efficient.linear_attention, efficient.linear_attention_recurrent,
                 lambda *a, **kw: efficient.linear_attention_quadratic(*a, **kw)[0]):
        torch.testing.assert_close(form(q, k, v, mask=keep, causal=causal), expected, **TOL)


@pytest.mark.parametrize("t", [1, 2, 7, 16])
def test_sparse_masks_match_their_closed_forms_and_the_rule(t):
    for w in range(0, t + 2):
        for causal in (False, True):
            m = efficient.sliding_window_mask(t, w, causal=causal)
            assert efficient.mask_nnz(m) == efficient.sliding_window_nnz(t, w, causal=causal)
    for l in range(1, t + 2):
        for causal in (False, True):
            m = efficient.strided_mask(t, l, causal=causal)
            assert efficient.mask_nnz(m) == efficient.strided_nnz(t, l, causal=causal)
            rule = [[(abs(i - j) <= l or abs(i - j) % l == 0) and (not causal or j <= i) for j in range(t)]
                    for i in range(t)]
            assert m.tolist() == rule


# ---------------------------------------------------------------------------- dates: the whole range round-trips
def test_every_date_the_tasks_can_produce_reads_back():
    four_digit = [f for f in data.DATE_FORMATS if "YYYY" in f]
    two_digit = [f for f in data.DATE_FORMATS if "YYYY" not in f]
    days = []
    years = [*range(1, 1201), *range(1201, 9800, 7), *range(9800, 10000)]  # every short year, then a stride
    for year in years:  # first and last day of the year, 29 Feb where it exists, a mid-year day
        days += [dt.date(year, 1, 1), dt.date(year, 12, 31), dt.date(year, 7, 15 + year % 13)]
        if year % 4 == 0 and (year % 100 or year % 400 == 0):
            days.append(dt.date(year, 2, 29))
    for d in days:
        for f in four_digit:
            text = data.format_date(d, f)
            assert data.parse_date(text, f) == d, (d, f, text)
    assert data.format_date(dt.date(999, 1, 3), "YYYY/M/D") == "0999/1/3"
    assert data.format_date(dt.date(1, 2, 3), "DD.MM.YYYY") == "03.02.0001"
    start = dt.date(1950, 1, 1).toordinal()
    for n in range(0, dt.date(2049, 12, 31).toordinal() - start + 1, 5):  # every fifth day of 1950-2049
        d = dt.date.fromordinal(start + n)
        for f in two_digit:
            assert data.parse_date(data.format_date(d, f), f) == d
    for year in (1949, 2050, 1, 9999):
        for f in two_digit:
            with pytest.raises(ValueError, match="format_date"):
                data.format_date(dt.date(year, 6, 1), f)


def test_date_task_over_the_whole_calendar_round_trips():
    task = data.date_task(formats=[f for f in data.DATE_FORMATS if "YYYY" in f],
                          start=dt.date(1, 1, 1), end=dt.date(9999, 12, 31))
    for src, tgt in task.pairs(300, seed=3, split=None):
        assert data.parse_date(src) == dt.date.fromisoformat(tgt)
    assert all(c in task.src_vocab for src, _ in task.pairs(50, seed=4, split=None) for c in src)


# ---------------------------------------------------------------------------- invariances and determinism
def test_encoder_and_decoder_ignore_trailing_padding():
    model = _s2s(True, flow="luong")
    src2 = torch.cat([SRC, torch.zeros(2, 3, dtype=torch.long)], 1)
    a, b = model(SRC, MASK, TGT), model(src2, src2 != 0, TGT)
    torch.testing.assert_close(a.logits, b.logits, **TOL)
    torch.testing.assert_close(a.weights, b.weights[..., :4], **TOL)
    assert not b.weights[..., 4:].any()


def test_rows_of_a_batch_are_independent():
    model = _s2s()
    both = model(SRC, MASK, TGT).logits
    alone = model(SRC[1:, :2], MASK[1:, :2], TGT[1:]).logits
    torch.testing.assert_close(both[1:], alone, **TOL)


def test_seeded_things_are_deterministic():
    a, b = _lm(seed=5), _lm(seed=5)
    prefixes = torch.tensor([[1, 3], [1, 4]])
    assert torch.equal(a(prefixes), b(prefixes)) and not torch.equal(a(prefixes), _lm(seed=6)(prefixes))
    task = data.reversal_task()
    assert task.pairs(5, seed=1) == task.pairs(5, seed=1) != task.pairs(5, seed=2)
    assert data.split_of("abc") == "valid"  # CRC-32("abc") = 0x352441C2 = 891568578, mod 10 = 8
    assert zlib.crc32(b"abc") == 0x352441C2


def test_attention_scores_are_permutation_equivariant_in_the_keys():
    q, k = r(2, 3, 4), r(2, 5, 4, seed=1)
    perm = torch.tensor([3, 0, 4, 1, 2])
    for fn in (reference.dot_scores, reference.scaled_dot_scores):
        torch.testing.assert_close(fn(q, k[:, perm]), fn(q, k)[..., perm], **TOL)
    w_q, w_k, v_a = r(4, 3, seed=2), r(4, 3, seed=3), r(3, seed=4)
    torch.testing.assert_close(reference.additive_scores(q, k[:, perm], w_q, w_k, v_a),
                               reference.additive_scores(q, k, w_q, w_k, v_a)[..., perm], **TOL)


def test_show_source_of_a_shown_function_is_mostly_maths():
    # the checks live in one _check_<fn> call: at most that one line before the maths
    for fn, most in ((positional.apply_rope, 1), (rnn.SimpleRNN.from_torch, 1), (rnn.SimpleRNN.forward, 1),
                     (rnn.step_jacobians, 1), (seq2seq.Seq2Seq.decode, 1), (seq2seq.AttentionSeq2Seq.decode, 1), (reference.padding_mask, 1), (reference.causal_mask, 1),
                     (rnn.jacobian_product, 1), (rnn.clip_grad_norm, 1), (decoding.beam_search, 1),
                     (decoding.enumerate_sequences, 1), (decoding.random_tree_lm, 2),
                     (positional.alibi_bias, 2), (positional.sinusoidal_encoding, 2)):
        src, _, _ = source_of(fn)
        body = src.split('"""')[2]  # after the docstring
        checks = [line for line in body.splitlines() if re.search(r"check|raise ", line)]
        assert len(checks) <= most, (fn.__name__, checks)
    src = source_of(seq2seq.AttentionSeq2Seq.attend)[0].split('"""')[2]
    assert "raise" not in src and src.count("check") == 1
