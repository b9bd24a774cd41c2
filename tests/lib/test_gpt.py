"""Tests for attnbook.gpt (chapter 11's decoder-only model) and attnbook.poems (its measures)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbook.data import BOS_ID, EOS_ID, PAD_ID
from attnbook.gpt import GPT, DecoderBlock, GPTConfig, generate, lm_loss, perplexity
from attnbook.poems import (FINAL_GROUPS, NgramLM, attention_to, copied_ngrams, ngram_set, poem_form,
                            rhyme_groups, split_lines)
from attnbook.testing import F64_TOL, randomize


def _model(positions="learned", tie=True, seed=0, v=17):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(v, n_positions=24, d_model=16, n_heads=4, n_layers=2, d_ff=32,
                      positions=positions, tie_weights=tie)).double()
    randomize(m, seed, 0.5)
    if tie:                                  # randomize may have broken the shared storage
        m.lm_head.weight = m.tok_emb.weight
    return m.eval()


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_causal_future_tokens_do_not_change_past_logits(positions):
    m = _model(positions)
    ids = torch.randint(17, (2, 10))
    other = ids.clone()
    other[:, 6:] = torch.randint(17, (2, 4))
    a, b = m(ids).logits, m(other).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], **F64_TOL)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3          # control: the future does matter


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cache_equals_recomputation(positions):
    m = _model(positions)
    ids = torch.randint(17, (3, 12))
    full = m(ids).logits
    cache = m.new_cache()
    steps = [m(ids[:, :5], cache=cache).logits]                 # a prompt, then one at a time
    steps += [m(ids[:, t:t + 1], cache=cache).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **F64_TOL)
    assert len(cache[0]) == 12
    wrong = m(ids[:, 11:12]).logits                            # control: no cache, no context
    assert (wrong[:, 0] - full[:, 11]).abs().max() > 1e-3


def test_generate_with_and_without_cache_agree():
    m = _model("learned")
    prompt = torch.randint(4, 17, (4, 3))
    a = generate(m, prompt, max_new_tokens=10, generator=torch.Generator().manual_seed(1))
    b = generate(m, prompt, max_new_tokens=10, generator=torch.Generator().manual_seed(1),
                 use_cache=False)
    assert a.shape == (4, 13) and torch.equal(a, b) and torch.equal(a[:, :3], prompt)
    g0 = generate(m, prompt, max_new_tokens=6, temperature=0.0)
    greedy = prompt
    for _ in range(6):
        greedy = torch.cat([greedy, m(greedy).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(g0, greedy)


def test_generate_stops_rows_at_eos():
    m = _model("learned")
    with torch.no_grad():                    # all-zero logits: greedy picks id 0 every step
        m.lm_head.weight.zero_()
    prompt = torch.full((2, 1), BOS_ID)
    out = generate(m, prompt, max_new_tokens=8, temperature=0.0, eos_id=0)
    assert out.shape == (2, 2) and (out[:, 1] == 0).all()      # argmax of all-zero logits: id 0


def test_weight_tying_shares_one_matrix_and_counts_once():
    tied, untied = _model(tie=True), _model(tie=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 17 * 16


def test_lm_loss_is_the_shifted_cross_entropy_and_ignores_pad():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    ids = torch.tensor([[1, 4, 5, 6, 2], [1, 4, 2, 0, 0]])
    terms = [-F.log_softmax(logits[b, t], -1)[ids[b, t + 1]] for b in range(2) for t in range(4)
             if ids[b, t + 1] != PAD_ID]
    assert math.isclose(float(lm_loss(logits, ids)), float(sum(terms) / len(terms)), rel_tol=1e-12)
    unshifted = F.cross_entropy(logits.reshape(-1, 7), ids.reshape(-1), ignore_index=0)
    assert abs(float(unshifted) - float(lm_loss(logits, ids))) > 1e-3   # control


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    m = _model()
    with torch.no_grad():
        for p in m.lm_head.parameters():
            p.zero_()
    ids = torch.randint(4, 17, (5, 9))
    assert math.isclose(perplexity(m, ids), 17.0, rel_tol=1e-9)


def test_decoder_block_is_pre_ln():
    torch.manual_seed(0)
    blk = DecoderBlock(8, 2, 16).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    h = x + blk.self_attn(blk.norm1(x), causal=True).out
    ref = h + blk.ffn(blk.norm2(h))
    torch.testing.assert_close(blk(x)[0], ref, **F64_TOL)


def test_bad_inputs_name_the_function():
    m = _model()
    with pytest.raises(ValueError, match="GPT.forward: `ids`"):
        m(torch.randn(2, 3))
    with pytest.raises(ValueError, match="n_positions"):
        m(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"GPT.forward: `ids` must lie in \[0, 17\)"):
        m(torch.full((1, 3), 17))
    with pytest.raises(TypeError, match="GPT.forward: `cache`"):
        m(torch.zeros(1, 3, dtype=torch.long), cache=[])
    with pytest.raises(ValueError, match="lm_loss"):
        lm_loss(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="generate: prompt length"):
        generate(m, torch.zeros(1, 20, dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="GPTConfig: `positions`"):
        GPT(GPTConfig(5, positions="sinusoidal"))


# ------------------------------------------------------------------------------ poems measures
def test_split_lines_and_poem_form():
    assert split_lines("白日依山尽，黄河入海流。") == ["白日依山尽", "黄河入海流"]
    good = poem_form("白日依山尽，黄河入海流。欲穷千里目，更上一层楼。")
    assert good.well_formed and good.rhyme_ok                       # liu / lou: one group
    bad_len = poem_form("白日依山尽，黄河入海流。欲穷千里目，更上一层。")
    assert not bad_len.lengths_ok and not bad_len.well_formed
    swapped = poem_form("白日依山尽。黄河入海流，欲穷千里目，更上一层楼。")
    assert swapped.lengths_ok and not swapped.punct_ok
    no_rhyme = poem_form("白日依山尽，黄河入海流。欲穷千里目，更上一层山。")
    assert no_rhyme.well_formed and not no_rhyme.rhyme_ok


def test_rhyme_groups_fold_medials_and_separate_chance():
    g = rhyme_groups()
    assert g["天"] == g["山"] == g["关"] and g["流"] == g["楼"] and g["山"] != g["流"]
    assert len(g) > 4000 and set(g.values()) <= set(FINAL_GROUPS.values())
    from attnbook.data import load_poems
    c = load_poems()
    real = sum(poem_form(p).rhyme_ok for p in c.valid) / len(c.valid)
    odd = sum(g[split_lines(p)[0][-1]] == g[split_lines(p)[2][-1]] for p in c.valid) / len(c.valid)
    assert real > 0.75 and odd < 0.2                  # rhymed lines 2/4 vs unrhymed lines 1/3


def test_copied_ngrams():
    grams = ngram_set(["白日依山尽，黄河入海流。"], 4)
    assert copied_ngrams("白日依山尽，春风入海流。", grams) == 0.5   # 白日依山, 日依山尽 of 4
    assert copied_ngrams("春风吹又生，", grams) == 0.0


def test_ngram_lm_perplexities_and_samples():
    ids = torch.tensor([[BOS_ID, 4, 5, 4, 5, EOS_ID, PAD_ID]] * 3)
    uni, bi = NgramLM(ids, 6, order=1), NgramLM(ids, 6, order=2, lam=0.9)
    torch.testing.assert_close(bi.probs().sum(1), torch.ones(6, dtype=torch.float64))
    assert bi.perplexity(ids) < uni.perplexity(ids) < 6
    s = bi.sample(4, max_len=5, generator=torch.Generator().manual_seed(0))
    assert s.shape == (4, 6) and (s[:, 0] == BOS_ID).all()
    with pytest.raises(ValueError, match="NgramLM: `order`"):
        NgramLM(ids, 6, order=3)


def test_attention_to_picks_the_named_keys():
    # one 五言 poem: BOS + 24 tokens + EOS; weights put all mass on the previous line's slot
    t = 26
    ids = torch.tensor([[BOS_ID] + [4] * 24 + [EOS_ID]])
    w = torch.zeros(1, 2, t, t)
    for q in range(t):
        w[0, 0, q, max(q - 6, 0)] = 1.0                   # head 0: same slot, previous line
        w[0, 1, q, 0] = 1.0                               # head 1: BOS
    prev = attention_to(w, ids, "prev_line_same")
    bos = attention_to(w, ids, "bos")
    assert prev[0] == 1.0 and prev[1] == 0.0 and bos[1] == 1.0 and bos[0] < 0.5
    with pytest.raises(ValueError, match="attention_to: `kind`"):
        attention_to(w, ids, "rhyme")


def test_attention_to_rhyme_slot_is_one_query_on_line_2s_end():
    t = 26                                  # 五言: line 2 ends at 11, line 4 at 23
    ids = torch.tensor([[BOS_ID] + [4] * 24 + [EOS_ID]] * 2)
    w = torch.zeros(2, 2, t, t)
    w[:, 0, 22, 11] = 1.0                   # head 0: the query before line 4's end -> 11
    w[:, 1, 23, 11] = 1.0                   # head 1: one position late, must not count
    w[:, 1, 22, 10] = 1.0
    got = attention_to(w, ids, "rhyme_slot")
    assert got.tolist() == [1.0, 0.0]
    seven = torch.tensor([[BOS_ID] + [4] * 32 + [EOS_ID]])       # 七言: 15 and 30
    w7 = torch.zeros(1, 1, 34, 34)
    w7[0, 0, 30, 15] = 1.0
    assert attention_to(w7, seven, "rhyme_slot").tolist() == [1.0]
