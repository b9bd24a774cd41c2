"""Chapter 10's exercises beyond the generic tests: the decoder-layer build exercise (correct
answers written another way pass, the library's and PyTorch's layers are refused by name, wrong
answers outside the gallery are rejected on seeds 0-3, each hint fires on its own mistake), and
the hints that replaced the generic ones (KL, mean of means, sqrt(d_model), the mask's dtype)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnbook import attention, exercises
from attnbook.blocks import DecoderLayer
from attnbook.exercises import check
from attnbook.exercises import decoder_layer as dl
from attnbook.multihead import merge_heads, split_heads
from exercise_run import run

SEEDS = range(4)
NAME = "ch10.decoder_layer"


def hint(text):
    return "".join(text[text.index("提示："):].split())


def _lin(w, name, t):
    return F.linear(t, w[name + ".weight"], w[name + ".bias"])


def _ln(w, name, t, eps=1e-5):
    return F.layer_norm(t, t.shape[-1:], w[name + ".weight"], w[name + ".bias"], eps)


def by_sdpa(x, memory, weights, n_heads, src_pad=None, *, act=F.relu, cross_causal=False,
            invert_pad=False, eps=1e-5):
    """SDPA with explicit bool masks (allowed), heads by unflatten/transpose."""
    def mha(prefix, q_in, kv_in, mask):
        def heads(t):
            return t.unflatten(-1, (n_heads, -1)).transpose(1, 2)
        q, k, v = (heads(_lin(weights, f"{prefix}.{p}", t)) for p, t in
                   (("q_proj", q_in), ("k_proj", kv_in), ("v_proj", kv_in)))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return _lin(weights, f"{prefix}.out_proj", o.transpose(1, 2).flatten(-2))

    t, s = x.shape[1], memory.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mem = None if src_pad is None else (~src_pad if invert_pad else src_pad)[:, None, None, :]
    if cross_causal:
        mem = torch.ones(t, s, dtype=torch.bool).tril() if mem is None else \
            mem & torch.ones(t, s, dtype=torch.bool).tril()
    a = _ln(weights, "norm1", x + mha("self_attn", x, x, causal), eps)
    c = _ln(weights, "norm2", a + mha("multihead_attn", a, memory, mem), eps)
    ff = _lin(weights, "ffn.linear2", act(_lin(weights, "ffn.linear1", c)))
    return _ln(weights, "norm3", c + ff, eps)


def by_library_pieces(x, memory, weights, n_heads, src_pad=None):
    """attnbook.attention with masks, split_heads/merge_heads, LayerNorm written out."""
    def norm(name, t):
        mu = t.mean(-1, keepdim=True)
        var = t.var(-1, unbiased=False, keepdim=True)
        return ((t - mu) / torch.sqrt(var + 1e-5) * weights[name + ".weight"]
                + weights[name + ".bias"])

    def mha(prefix, q_in, kv_in, mask):
        p = {n: (weights[f"{prefix}.{n}.weight"], weights[f"{prefix}.{n}.bias"])
             for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
        q = split_heads(q_in @ p["q_proj"][0].T + p["q_proj"][1], n_heads)
        k = split_heads(kv_in @ p["k_proj"][0].T + p["k_proj"][1], n_heads)
        v = split_heads(kv_in @ p["v_proj"][0].T + p["v_proj"][1], n_heads)
        o = merge_heads(attention(q, k, v, mask=mask))
        return o @ p["out_proj"][0].T + p["out_proj"][1]

    t = x.shape[1]
    causal = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    mem = None if src_pad is None else src_pad[:, None, None, :]
    a = norm("norm1", x + mha("self_attn", x, x, causal))
    c = norm("norm2", a + mha("multihead_attn", a, memory, mem))
    h = torch.clamp(c @ weights["ffn.linear1.weight"].T + weights["ffn.linear1.bias"], min=0)
    return norm("norm3", c + h @ weights["ffn.linear2.weight"].T + weights["ffn.linear2.bias"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [by_sdpa, by_library_pieces], ids=lambda f: f.__name__)
def test_decoder_layer_correct_answers_written_otherwise_pass(fn, seed):
    ok, text = run(NAME, fn, seed)
    assert ok, text


def test_decoder_layer_reference_is_the_library_layer_and_the_hand_variant():
    for seed in SEEDS:
        for case in exercises.get(NAME).cases(seed):
            want = exercises.get(NAME).solution(*case.args)
            torch.testing.assert_close(dl._variant(*case.args), want)
    sizes = [(c.args[0].shape, c.args[1].shape[1]) for c in exercises.get(NAME).cases(2)]
    assert any(shape[1] != s for shape, s in sizes[1:])                  # T != S
    assert len({shape[0] for shape, _ in sizes}) > 1                     # B varies


def test_decoder_layer_shortcuts_are_refused_by_name():
    def library(x, memory, weights, n_heads, src_pad=None):
        layer = DecoderLayer(x.shape[-1], n_heads, weights["ffn.linear1.weight"].shape[0],
                             dtype=x.dtype)
        layer.load_state_dict(weights)
        mask = None if src_pad is None else src_pad[:, None, None, :]
        return layer(x, memory, memory_mask=mask).out.detach()

    def torch_layer(x, memory, weights, n_heads, src_pad=None):
        d, d_ff = x.shape[-1], weights["ffn.linear1.weight"].shape[0]
        layer = nn.TransformerDecoderLayer(d, n_heads, d_ff, dropout=0.0, batch_first=True,
                                           dtype=x.dtype)
        sd = {}
        for ours, theirs in (("self_attn", "self_attn"), ("multihead_attn", "multihead_attn")):
            sd[f"{theirs}.in_proj_weight"] = torch.cat(
                [weights[f"{ours}.{p}_proj.weight"] for p in "qkv"])
            sd[f"{theirs}.in_proj_bias"] = torch.cat(
                [weights[f"{ours}.{p}_proj.bias"] for p in "qkv"])
            sd[f"{theirs}.out_proj.weight"] = weights[f"{ours}.out_proj.weight"]
            sd[f"{theirs}.out_proj.bias"] = weights[f"{ours}.out_proj.bias"]
        sd.update({k.replace("ffn.", ""): v for k, v in weights.items()
                   if k.startswith(("ffn.", "norm"))})
        layer.load_state_dict(sd)
        t = x.shape[1]
        kpm = None if src_pad is None else ~src_pad
        return layer.eval()(x, memory, tgt_mask=~torch.ones(t, t, dtype=torch.bool).tril(),
                            memory_key_padding_mask=kpm).detach()

    for fn, word in ((library, "attnbook.DecoderLayer"),
                     (torch_layer, "nn.TransformerDecoderLayer")):
        ok, text = run(NAME, fn)
        assert not ok and word in text and "不许" in text, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [
    lambda *a: by_sdpa(*a, act=F.gelu),                  # GELU instead of the chapter's ReLU
    lambda *a: by_sdpa(*a, cross_causal=True),           # a causal mask on the cross-attention
    lambda *a: by_sdpa(*a, invert_pad=True),             # src_pad read as True = PAD
    lambda *a: by_sdpa(*a, eps=1e-3),                    # LayerNorm's eps
], ids=["gelu", "cross_causal", "pad_polarity", "eps"])
def test_decoder_layer_wrong_answers_outside_the_gallery_are_rejected(fn, seed):
    ok, text = run(NAME, fn, seed)
    assert not ok, text


def test_decoder_layer_exception_hint_names_the_query_source_only_for_that_mistake():
    def memory_queries(x, memory, weights, n_heads, src_pad=None):   # raises once S != T
        if x.shape[1] == memory.shape[1]:
            return by_sdpa(x, memory, weights, n_heads, src_pad)
        return dl._variant(x, memory, weights, n_heads, src_pad, cross_q="memory")

    ok, text = run(NAME, memory_queries)
    assert not ok and "第 2 个隐藏测试" in text and "键和值来自记忆" in hint(text), text

    def causal_from_the_memory_length(x, memory, weights, n_heads, src_pad=None):
        if x.shape[1] == memory.shape[1]:
            return by_sdpa(x, memory, weights, n_heads, src_pad)
        s = memory.shape[1]
        return x @ torch.ones(s, s, dtype=x.dtype).tril()             # a size mismatch

    ok, text = run(NAME, causal_from_the_memory_length)
    assert not ok and "第 2 个隐藏测试" in text and "键和值来自记忆" not in hint(text), text


# ------------------------------------------------------------------ the other ch10 exercises
def test_smoothed_ce_kl_and_mean_of_means_get_their_own_hints():
    ex = exercises.get("ch10.smoothed_cross_entropy")
    for bug, word in (("kl_not_cross_entropy", "H(q)"), ("mean_of_sentence_means", "每句取平均")):
        for seed in SEEDS:
            ok, text = run(ex.name, ex.bugs[bug], seed)
            assert not ok and word in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_smoothed_ce_wrong_answers_outside_the_gallery_are_rejected(seed):
    def time_axis(logits, target, smoothing, pad_id):
        v = logits.shape[-1]
        q = torch.full_like(logits, smoothing / v).scatter_add(
            -1, target[..., None], torch.full_like(logits[..., :1], 1 - smoothing))
        loss = -(q * logits.log_softmax(1)).sum(-1)
        real = target != pad_id
        return loss[real].sum() / real.sum()

    def no_over_v(logits, target, smoothing, pad_id):
        lp = logits.log_softmax(-1)
        nll = -lp.gather(-1, target[..., None])[..., 0]
        loss = (1 - smoothing) * nll - smoothing * lp.sum(-1)
        real = target != pad_id
        return loss[real].mean()

    for fn in (time_axis, no_over_v):
        ok, text = run("ch10.smoothed_cross_entropy", fn, seed)
        assert not ok, text


def test_noam_lr_wrong_schedules_are_not_called_float32():
    def precedence(steps, d_model, warmup):
        return d_model ** -0.5 * torch.minimum(steps ** -1 / 2, steps * warmup ** -3 / 2)

    ok, text = run("ch10.noam_lr", precedence)
    assert not ok and "float32" not in hint(text), text
    ok, text = run("ch10.noam_lr", exercises.get("ch10.noam_lr").bugs["times_sqrt_d_model"])
    assert not ok and "√d_model" in hint(text)


def test_decoder_mask_reports_the_dtype_it_got():
    def float_mask(tgt_pad):
        t = tgt_pad.shape[-1]
        return torch.ones(t, t).tril() * tgt_pad[:, None, None, :].float()

    ok, text = run("ch10.decoder_mask", float_mask)
    assert not ok and "float32" in text and "int64" not in text and "bool" in hint(text), text


def _by_hand(x, memory, weights, n_heads, src_pad=None, *, diagonal=0, invert_pad=False):
    """masked_fill(-inf) + softmax by hand: a row with every key masked gives NaN."""
    def heads(t):
        return t.unflatten(-1, (n_heads, -1)).transpose(1, 2)

    def mha(prefix, q_in, kv_in, mask):
        q, k, v = (heads(_lin(weights, f"{prefix}.{p}", t)) for p, t in
                   (("q_proj", q_in), ("k_proj", kv_in), ("v_proj", kv_in)))
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, -1) @ v
        return _lin(weights, f"{prefix}.out_proj", o.transpose(1, 2).flatten(-2))
    t = x.shape[1]
    mem = None if src_pad is None else (~src_pad if invert_pad else src_pad)[:, None, None, :]
    causal = torch.ones(t, t, dtype=torch.bool).tril(diagonal)
    a = _ln(weights, "norm1", x + mha("self_attn", x, x, causal))
    c = _ln(weights, "norm2", a + mha("multihead_attn", a, memory, mem))
    return _ln(weights, "norm3", c + _lin(weights, "ffn.linear2",
                                          F.relu(_lin(weights, "ffn.linear1", c))))


@pytest.mark.parametrize("seed", SEEDS)
def test_decoder_layer_nan_hint_names_the_mask_that_empties_a_row(seed):
    ok, text = run(NAME, _by_hand, seed)                       # control: the hand version is right
    assert ok, text
    # src_pad read as True = PAD: the full-length source row has no key left -> NaN (case 2)
    ok, text = run(NAME, lambda *a, **k: _by_hand(*a, **k, invert_pad=True), seed)
    assert not ok and "极性不要弄反" in hint(text), text
    # the self-attention mask tril(-1): position 0 has no key left -> NaN (case 1, no src_pad)
    ok, text = run(NAME, lambda *a, **k: _by_hand(*a, **k, diagonal=-1), seed)
    assert not ok and "包括对角线" in hint(text) and "极性" not in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_decoder_layer_scale_by_sqrt_d_model_is_named(seed):
    def wide_scale(x, memory, weights, n_heads, src_pad=None):   # 1/sqrt(d_model), by hand
        w = {k: v for k, v in weights.items()}
        for att in ("self_attn", "multihead_attn"):              # fold 1/sqrt(H) into W_q, b_q
            w[f"{att}.q_proj.weight"] = weights[f"{att}.q_proj.weight"] / n_heads ** 0.5
            w[f"{att}.q_proj.bias"] = weights[f"{att}.q_proj.bias"] / n_heads ** 0.5
        return _by_hand(x, memory, w, n_heads, src_pad)
    ok, text = run(NAME, wide_scale, seed)
    assert not ok and "除以了√d_model" in hint(text), text
