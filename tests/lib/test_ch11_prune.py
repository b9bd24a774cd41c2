"""Tests for head pruning in attnbook.gpt (``head_mask``, ``mean_loss``, ``pruning_costs``)
and the chapter-11 claim ``ch11.prune`` built on them."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from attnbook import experiments
from attnbook.gpt import GPT, GPTConfig, head_mask, mean_loss, perplexity, pruning_costs
from attnbook.testing import F64_TOL, randomize


def _model(positions="learned", seed=0, v=17):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(v, n_positions=24, d_model=16, n_heads=4, n_layers=2, d_ff=32,
                      positions=positions)).double()
    randomize(m, seed, 0.5)
    m.lm_head.weight = m.tok_emb.weight
    return m.eval()


def _zero_wo_rows(model, layer, heads):
    """A copy of ``model`` whose block ``layer`` reads nothing from ``heads``: the rows of
    W^O (columns of ``out_proj.weight``, which computes x W^O as x @ weight.T) for them are 0."""
    m = copy.deepcopy(model)
    attn = m.blocks[layer].self_attn
    with torch.no_grad():
        for h in heads:
            attn.out_proj.weight[:, h * attn.d_k:(h + 1) * attn.d_k] = 0
    return m


@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("layer,head", [(0, 0), (0, 3), (1, 2)])
def test_masking_a_head_equals_zeroing_its_rows_of_w_o(positions, layer, head):
    m = _model(positions)
    ids = torch.randint(17, (3, 12))
    masked = m(ids, head_mask=head_mask(m, [(layer, head)])).logits
    torch.testing.assert_close(masked, _zero_wo_rows(m, layer, [head])(ids).logits, **F64_TOL)
    other = _zero_wo_rows(m, layer, [(head + 1) % 4])(ids).logits    # control: another head
    assert (masked - other).abs().max() > 1e-3
    assert (masked - m(ids).logits).abs().max() > 1e-3              # pruning does something


def test_no_pruned_head_equals_the_plain_forward():
    m = _model()
    ids = torch.randint(17, (2, 10))
    torch.testing.assert_close(m(ids, head_mask=head_mask(m)).logits, m(ids).logits, **F64_TOL)
    assert torch.equal(head_mask(m), torch.ones(2, 4, dtype=torch.float64))


def test_head_mask_with_cache_equals_full_forward():
    m = _model("rope")
    ids = torch.randint(17, (2, 9))
    mask = head_mask(m, [(1, 1), (0, 2)])
    full = m(ids, head_mask=mask).logits
    cache = m.new_cache()
    steps = [m(ids[:, :5], cache=cache, head_mask=mask).logits]
    steps += [m(ids[:, t:t + 1], cache=cache, head_mask=mask).logits for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **F64_TOL)


def test_mean_loss_and_pruning_costs():
    m = _model()
    ids = torch.randint(1, 17, (6, 12))
    ids[0, 8:] = 0                                                  # some padding
    assert math.isclose(math.exp(mean_loss(m, ids, batch_size=4)), perplexity(m, ids),
                        rel_tol=1e-12)
    r = pruning_costs(m, ids)
    assert r["heads"].shape == (2, 4) and r["layers"].shape == (2,)
    for layer, h in [(0, 1), (1, 3)]:
        want = mean_loss(_zero_wo_rows(m, layer, [h]), ids) - r["loss"]
        assert math.isclose(float(r["heads"][layer, h]), want, rel_tol=1e-9, abs_tol=1e-12)
    want = mean_loss(_zero_wo_rows(m, 1, range(4)), ids) - r["loss"]
    assert math.isclose(float(r["layers"][1]), want, rel_tol=1e-9, abs_tol=1e-12)
    assert len(set(r["heads"].flatten().tolist())) == 8             # the heads differ


@pytest.mark.parametrize("prune", [[(2, 0)], [(0, 4)], [(-1, 0)], [(0, True)], [("0", 1)],
                                   [0], [(0, 1, 2)]])
def test_bad_pruned_heads_are_rejected(prune):
    with pytest.raises(ValueError, match=r"head_mask: `prune` must hold \(layer, head\)"):
        head_mask(_model(), prune)


def test_bad_head_mask_tensor_is_rejected():
    m = _model()
    ids = torch.randint(17, (1, 5))
    with pytest.raises(ValueError, match=r"GPT.forward: `head_mask` must have shape"):
        m(ids, head_mask=torch.ones(4, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"GPT.forward: `head_mask` must have a floating"):
        m(ids, head_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"GPT.forward: `head_mask` must be a torch.Tensor"):
        m(ids, head_mask=[[1, 1, 1, 1], [1, 1, 1, 1]])


def test_prune_metrics_on_an_untrained_model_and_the_claim_rejects_it():
    import statistics

    from attnbook.experiments import ch11
    torch.set_num_threads(1)
    _, _, valid = ch11.corpus()
    model = ch11.new_model(seed=0).eval()
    m = ch11.prune_metrics(model, valid[:8])
    heads = [m[f"prune_b{l}h{h}"] for l in (1, 2) for h in range(4)]
    assert math.isclose(m["prune_median"], statistics.median(heads), abs_tol=1e-12)
    assert m["prune_max"] == max(heads) and m["prune_block2_max"] == max(heads[4:])
    assert m["prune_max_block"] == 1 + heads.index(max(heads)) // 4
    exp = experiments.get("ch11.prune")
    assert set(exp.quoted) <= set(m)
    m["head_rhyme_slot"] = 1.0
    # Untrained, pruning costs next to nothing: the magnitudes are rates over the runs since the
    # 25-run restatement (issue 28), so the claim is judged on runs, here 10 untrained ones.
    assert m["prune_max"] < 0.1
    assert not exp.holds_all([m] * 10)
    trained_like = dict(m, prune_max=0.2, prune_block1=0.5, prune_max_block=1, prune_block2=0.0,
                        prune_block2_max=0.0, head_rhyme_slot=6.0, prune_rhyme_slot_head=0.0,
                        prune_rhyme_slot_head_at_end=0.0)   # control: a trained model's figures
    assert exp.holds_all([trained_like] * 10)


def test_rhyme_queries_find_the_query_that_predicts_line_4s_last_character():
    from attnbook.data import BOS_ID, EOS_ID
    from attnbook.experiments import ch11
    c, _, valid = ch11.corpus()
    poem = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"        # 五言: period 6
    ids = c.encode([poem, c.valid[0][:10]])                       # a quatrain and a fragment
    rows, q = ch11.rhyme_queries(ids)
    assert rows.tolist() == [0] and q.tolist() == [22]
    assert int(ids[0, 22 + 1]) == c.vocab.encode("楼")[0]         # line 4's last character
    assert int(ids[0, 0]) == BOS_ID and int(ids[0, 25]) == EOS_ID
    rows, q = ch11.rhyme_queries(valid[:20])
    seven = [r for r, qq in zip(rows.tolist(), q.tolist()) if qq == 30]
    assert seven and all(c.vocab.decode([int(valid[r, 32])]) in "。！？" for r in seven)


def test_loss_at_the_rhyme_end_equals_the_per_position_cross_entropy():
    from attnbook.experiments import ch11
    torch.set_num_threads(1)
    _, _, valid = ch11.corpus()
    model = ch11.new_model(seed=1).eval()
    ids = valid[:12]
    rows, q = ch11.rhyme_queries(ids)
    mask = head_mask(model, [(1, 2)])
    with torch.no_grad():
        logp = model(ids, head_mask=mask).logits.double().log_softmax(-1)
    want = -float(torch.stack([logp[r, t, ids[r, t + 1]] for r, t in zip(rows, q)]).mean())
    assert math.isclose(ch11._loss_at(model, ids, rows, q, mask), want, rel_tol=1e-6)
    assert ch11._loss_at(model, ids, rows, q, mask) != ch11._loss_at(model, ids, rows, q)


def test_the_claim_rejects_a_rhyme_head_that_matters_at_the_rhyme_position():
    exp = experiments.get("ch11.prune")
    ok = {"prune_max_block": 1, "prune_max": 0.2, "prune_block2_max": 0.005,
          "prune_block2": 0.01, "prune_block1": 0.4, "head_rhyme_slot": 20.0,
          "prune_rhyme_slot_head": 0.004, "prune_rhyme_slot_head_at_end": 0.02}
    assert exp.holds(ok)
    assert not exp.holds({**ok, "prune_rhyme_slot_head": 0.02})        # used on average
    # used where it looks: a rate over the runs since the re-sweep of issue 33
    at_end = {**ok, "prune_rhyme_slot_head_at_end": 0.2}
    assert exp.holds(at_end) and exp.holds_all([ok] * 9 + [at_end])      # 1 of 10: a rate
    assert not exp.holds_all([ok] * 7 + [at_end] * 3)                    # 3 of 10: fails
    assert exp.holds_all([ok] * 7 + [{**at_end, "head_rhyme_slot": 4.0}] * 3)   # binds > 5
    assert not exp.holds({**ok, "prune_block2_max": 0.05})               # block 2 mattered
    assert not exp.holds({**ok, "prune_max_block": 2})
    assert exp.holds({**ok, "head_rhyme_slot": 1.5, "prune_rhyme_slot_head_at_end": 0.2})


def test_mean_loss_skips_a_chunk_of_pad_targets_and_rejects_none():
    m = _model()
    ids = torch.randint(1, 17, (4, 10))
    ids[2:, 1:] = 0                                   # the second chunk of 2: PAD targets only
    want = mean_loss(m, ids[:2])
    got = mean_loss(m, ids, batch_size=2)
    assert math.isfinite(got) and math.isclose(got, want, rel_tol=1e-12)
    with pytest.raises(ValueError, match=r"mean_loss: `ids` must hold at least one non-PAD"):
        mean_loss(m, ids[2:])


def test_perplexity_skips_a_chunk_of_pad_targets_and_rejects_none():
    m = _model()
    ids = torch.randint(1, 17, (4, 10))
    ids[2:, 1:] = 0                                   # the second chunk of 2: PAD targets only
    got = perplexity(m, ids, batch_size=2)
    assert math.isfinite(got) and math.isclose(got, perplexity(m, ids[:2]), rel_tol=1e-12)
    with pytest.raises(ValueError, match=r"perplexity: `ids` must hold at least one non-PAD"):
        perplexity(m, ids[2:])
