"""Tests for attnbook.experiments.ch11: the measures behave on real poems and the claims fit."""
from __future__ import annotations

import pytest
import torch

from attnbook import experiments
from attnbook.experiments import ch11


def test_form_metrics_on_real_poems_and_on_noise():
    c, _, _ = ch11.corpus()
    real = ch11.form_metrics(c.valid[:200])
    assert real["well_formed"] == 1.0 and real["lengths"] == 1.0
    assert 0.75 < real["rhyme_of_shaped"] < 0.95                   # the calibration quoted
    assert real["copied4"] < 0.2                                   # held-out poems are new
    copied = ch11.form_metrics(c.train[:50])
    assert copied["copied4"] == 1.0                                # control: training poems
    noise = ch11.form_metrics(["春风" * 12, "明月，" * 8])
    assert noise["well_formed"] == 0.0 and noise["rhyme"] == 0.0


POEM = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"   # 流/楼 rhyme (ou)


def test_one_unk_counts_as_one_character():
    from attnbook.data import UNK_ID
    from attnbook.poems import UNK_MARK, poem_form
    c, _, _ = ch11.corpus()
    unk = c.vocab.decode([UNK_ID])                                   # what the reader sees
    assert len(unk) == 5
    for mark in (unk, UNK_MARK):
        f = poem_form(POEM.replace("依", mark))                      # UNK inside line 1
        assert f.lengths_ok and f.well_formed and f.rhyme_ok
    seven = "天第一版白湘丝，未爱牵灯独浣尘。更墨海边年不住，岂争殿畔气西" + unk + "。"
    assert poem_form(seven).well_formed                              # the 7x4 sample with UNK
    # controls: a line genuinely one character short or long still fails
    assert not poem_form(POEM.replace("依山", "山")).lengths_ok
    assert not poem_form(POEM.replace("依", unk + "山")).lengths_ok
    m = ch11.form_metrics([POEM.replace("依", unk), POEM.replace("依山", "山")])
    assert m["lengths"] == m["well_formed"] == 0.5


def test_unk_at_a_rhyme_position_is_not_a_rhyme():
    from attnbook.poems import UNK_MARK, poem_form, rhymes
    c, _, _ = ch11.corpus()
    unk = c.vocab.decode([3])
    for mark in (unk, UNK_MARK):
        for end in ("流", "楼"):                                     # line 2's end, line 4's end
            f = poem_form(POEM.replace(end, mark))
            assert f.lengths_ok and not f.rhyme_ok
        both = POEM.replace("流", mark).replace("楼", mark)          # two UNKs: still no rhyme
        assert poem_form(both).lengths_ok and not poem_form(both).rhyme_ok
    g = {"流": "ou", "楼": "ou", UNK_MARK: "ou"}                     # even a table that lists it
    assert rhymes("流", "楼", g) and not rhymes(UNK_MARK, UNK_MARK, g)
    assert not rhymes("流", UNK_MARK, g) and not rhymes(UNK_MARK, "楼", g)
    with pytest.raises(TypeError, match="rhymes.*groups"):
        rhymes("流", "楼", [])
    with pytest.raises(TypeError, match="rhymes.*`a`"):
        rhymes(None, "楼", g)


def test_copied_ngrams_counts_unk_as_one_character():
    from attnbook.poems import copied_ngrams, ngram_set
    grams = ngram_set([POEM], 4)
    # line 1 with UNK: 白日□山尽 has 2 four-grams, both new; the other 6 are copied (6 / 8);
    # read as the text '<unk>' it would give 6 new four-grams in line 1 (6 / 12)
    assert copied_ngrams(POEM.replace("依", "<unk>"), grams) == 6 / 8
    assert copied_ngrams(POEM, grams) == 1.0


def test_unk_as_one_names_its_argument():
    from attnbook.poems import UNK_MARK, unk_as_one
    assert unk_as_one("春<unk>风<unk>") == "春" + UNK_MARK + "风" + UNK_MARK
    with pytest.raises(TypeError, match="unk_as_one.*`text`"):
        unk_as_one(3)


def test_sampled_poems_write_unk_as_one_character():
    from attnbook.poems import UNK_MARK
    b = ch11.baselines()
    poems = ch11.sample_poems(b["bigram"], 200, seed=0)              # the bigram samples UNK
    assert not any("<unk>" in p for p in poems)
    assert any(UNK_MARK in p for p in poems)


def test_rhyme_chance_pairs_endings_of_different_poems():
    a = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"           # ends 流 / 楼 (ou)
    b = "白日依山尽，黄河入海天。欲穷千里目，更上一层山。"           # ends 天 / 山 (an)
    assert ch11.rhyme_chance([a, b]) == 0.0          # 流-山, 天-楼: no pair across poems
    assert ch11.rhyme_chance([a, a]) == 1.0
    assert ch11.rhyme_chance([a]) == 0.0             # no pair at all
    c, _, _ = ch11.corpus()
    real = ch11.rhyme_chance(c.valid[:200])          # real endings paired at random
    assert 0.05 < real < 0.2


def test_rhyme_chance_rejects_poems_without_four_lines():
    a = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    for bad in ("白日依山尽，黄河入海流。", "白日依山尽，黄河入海流。欲穷千里目，。"):
        with pytest.raises(ValueError, match=r"rhyme_chance: `poems`\[1\] must have four lines"):
            ch11.rhyme_chance([a, bad])
    with pytest.raises(ValueError, match="rhyme_chance: `poems`"):
        ch11.rhyme_chance(["白日"])                  # checked even when there is no pair
    for bad in (a, [a, 3], None):
        with pytest.raises(TypeError, match="rhyme_chance: `poems` must be a list of str"):
            ch11.rhyme_chance(bad)


def test_train_model_on_step_sees_every_step_and_changes_nothing():
    from attnbook.gpt import lm_loss
    _, _, valid = ch11.corpus()
    plain = ch11.new_model(seed=3)
    h_plain = ch11.train_model(plain, seed=3, steps=6)
    seen, val = [], []

    def hook(step, loss, model):                    # what the chapter does: a valid loss
        seen.append((step, loss))
        was = model.training
        model.eval()
        with torch.no_grad():
            val.append(float(lm_loss(model(valid[:8]).logits, valid[:8])))
        model.train(was)

    hooked = ch11.new_model(seed=3)
    h_hooked = ch11.train_model(hooked, seed=3, steps=6, on_step=hook)
    assert [s for s, _ in seen] == list(range(1, 7)) and len(val) == 6
    assert [x for _, x in seen] == h_hooked.losses == h_plain.losses
    a, b = plain.state_dict(), hooked.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)   # bit for bit
    with pytest.raises(TypeError, match="`on_step`"):
        ch11.train_model(ch11.new_model(seed=3), seed=3, steps=1, on_step=3)


def test_bigram_samples_and_baseline_perplexities():
    b = ch11.baselines()
    assert b["ppl_bigram"] < 0.6 * b["ppl_unigram"]
    poems = ch11.sample_poems(b["bigram"], 20, seed=0)
    assert len(poems) == 20 and all(isinstance(p, str) for p in poems)
    assert poems == ch11.sample_poems(b["bigram"], 20, seed=0)     # seeded


def test_untrained_model_claims_fail_and_sweep_keys():
    model = ch11.new_model(seed=0)
    sweep = ch11.sweep_metrics(model, seed=0, n=5,
                               settings=ch11.SWEEP[:4] + ch11.SWEEP[5:])
    assert sweep["greedy"]["distinct"] == 1 / 5
    assert ch11.SWEEP_N == {"T=1": 200, "T=1.3": 200}              # the two compared
    summary = ch11.sweep_summary(sweep)
    quoted = set(experiments.get("ch11.sampling").quoted)
    assert quoted <= set(summary)
    c, _, valid = ch11.corpus()
    from attnbook.gpt import perplexity
    m = {"ppl_model": perplexity(model, valid[:64]), "ppl_init": 1.0,
         "ppl_bigram": ch11.baselines()["ppl_bigram"], "ppl_unigram": ch11.baselines()["ppl_unigram"]}
    assert not experiments.get("ch11.perplexity").holds(m)         # untrained: no claim


@pytest.mark.slow
def test_run_poems_holds_on_seed_0():
    torch.set_num_threads(1)
    for name in ("ch11.perplexity", "ch11.form", "ch11.sampling"):
        exp = experiments.get(name)
        m = exp.run(0)
        assert set(exp.quoted) <= set(m) and exp.holds(m), name
    assert set(ch11.run_poems_form(0)) - set(ch11.run_poems(0)) == {
        f"rhyme_chance_{w}" for w in ("gpt", "init", "bigram")}  # old rows lack only these


def test_heads_claim_is_a_rate_over_runs():
    exp = experiments.get("ch11.heads")
    kinds = ch11.HEAD_KINDS
    base = {f"head_{k}": 1.2 for k in kinds}

    def run(best, value):
        return {**base, f"head_{best}": value}

    varied = [run(kinds[i % len(kinds)], 30.0) for i in range(8)] + [run("rhyme_slot", 9.0)]
    flat = run("previous", 1.5)                             # no head at 2x uniform
    assert exp.holds_all(varied + [flat])                   # 1 of 10: still holds
    assert not exp.holds_all(varied[:7] + [flat] * 3)       # 3 of 10: fails
    assert not exp.holds_all([run("previous", 30.0)] * 10)  # never the rhyme slot, never varies
    assert exp.holds_all([run("previous", 30.0)] * 9 + [run("rhyme_slot", 9.0)])   # varies once
