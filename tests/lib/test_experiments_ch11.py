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
    m = ch11.run_poems(0)
    for name in ("ch11.perplexity", "ch11.form", "ch11.sampling"):
        exp = experiments.get(name)
        assert set(exp.quoted) <= set(m) and exp.holds(m), name
