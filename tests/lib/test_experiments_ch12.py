"""Tests for attnbook.experiments.ch12: the poem stream, the measures, and the claim's rule."""
from __future__ import annotations

import json
import math

import pytest
import torch

from attnbook import experiments
from attnbook.data import BOS_ID, EOS_ID, PAD_ID
from attnbook.experiments import ch12, store


def test_streams_are_poems_end_to_end_and_windows_start_at_bos():
    c, train, valid, (tr_starts, va_starts) = ch12.streams()
    assert int((train == BOS_ID).sum()) == len(c.train) == int((train == EOS_ID).sum())
    assert int((valid == BOS_ID).sum()) == len(c.valid)
    assert not bool((train == PAD_ID).any())                        # no padding inside
    assert int(train[0]) == BOS_ID and int(train[-1]) == EOS_ID
    assert bool((tr_starts + ch12.T_TRAIN <= len(train)).all())
    ids = ch12.eval_windows()
    assert ids.shape == (ch12.N_EVAL, ch12.T_TRAIN)
    assert bool((ids[:, 0] == BOS_ID).all())
    assert len({tuple(r.tolist()) for r in ids}) == ch12.N_EVAL     # distinct windows
    assert torch.equal(ids, ch12.eval_windows())                    # the same for every seed
    # a window longer than a poem: the stream carries on into the next one
    assert bool(((ids[:, 1:] == BOS_ID).sum(1) >= 1).all())


def test_metrics_of_an_untrained_model_and_their_identities():
    model = ch12.new_model(seed=0).train()
    ids = ch12.eval_windows()[:4]
    m = ch12.sink_metrics(model, ids)
    assert model.training                                           # the mode is restored
    assert set(experiments.get("ch12.sinks").keys()) | set(experiments.get("ch12.sinks").quoted) \
        <= set(m)
    assert all(math.isfinite(v) for v in m.values())
    assert abs(m["loss_full"] - math.log(model.config.vocab_size)) < 0.5   # about uniform
    for k in ("window", "sinks", "sinks_abs"):
        assert m[f"gap_{k}"] == pytest.approx(m[f"loss_{k}"] - m["loss_full"], abs=1e-12)
    t, first = ids.shape[1], ch12.SINKS + ch12.WINDOW
    assert m["first_attn_uniform"] == pytest.approx(
        sum(1 / (i + 1) for i in range(first, t)) / (t - first), rel=1e-6)
    # a window so long that nothing is scored after the first eviction: an error, not a NaN
    with pytest.raises(ValueError, match="no prediction after the first eviction"):
        ch12.sink_metrics(model, ids, window=t - 2, sinks=1)
    one = ch12.sink_metrics(model, ids, window=t - 3, sinks=1)     # one prediction per row
    assert all(math.isfinite(v) for v in one.values())


def test_an_untrained_model_does_not_make_the_claim():
    m = ch12.sink_metrics(ch12.new_model(seed=1), ch12.eval_windows()[:8])
    assert not experiments.get("ch12.sinks").holds(m)


def _row(**changes):
    m = dict(gap_window=0.27, gap_sinks_abs=0.19, gap_sinks=0.45, first_attn_b1=0.06,
             first_attn_uniform=0.026, first_attn_b1_max_head=0.1, first_attn_b2_max_head=0.1)
    return {**m, **changes}


@pytest.mark.parametrize("changes", [
    dict(gap_window=0.03),                                  # the window costs (almost) nothing
    dict(first_attn_b1=0.02),                               # no more than uniform on token 0
    dict(first_attn_b1_max_head=0.6),                       # a real sink head in block 1
    dict(first_attn_b2_max_head=0.5),                       # ... or in block 2
])
def test_the_rule_rejects_each_wrong_outcome(changes):
    exp = experiments.get("ch12.sinks")
    assert exp.holds(_row())
    assert not exp.holds(_row(**changes))


def test_the_rates_over_runs():
    exp = experiments.get("ch12.sinks")
    worse, better = _row(), _row(gap_sinks=0.1)
    assert exp.holds_all([worse] * 3 + [better] * 7)        # at least 30 % worse
    assert not exp.holds_all([worse] * 2 + [better] * 8)    # re-basing nearly always helps
    assert not exp.holds_all([worse] * 10)                  # re-basing never helps: not ours
    no_help = _row(gap_sinks_abs=0.3)                       # sinks at text positions do not help
    assert exp.holds(no_help)                               # a rate since 2026-12-06, not per run
    assert exp.holds_all([worse] * 5 + [better] * 4 + [no_help])          # 1 of 10: still holds
    assert exp.holds_all([worse] * 2 + [better] * 7 + [no_help])          # no_help is worse too
    assert not exp.holds_all([worse] * 3 + [better] * 4 + [no_help] * 3)  # 3 of 10: fails


def test_committed_rows_cover_seeds_0_to_9_on_two_kernel_paths():
    data = json.loads((store.data_dir() / "ch12.json").read_text(encoding="utf-8"))
    rows = [r for r in data["rows"] if r["claim"] == "ch12.sinks"]
    by_env = {}
    for r in rows:
        by_env.setdefault(r["env"], set()).add(r["seed"])
    assert len(by_env) >= 2 and all(s >= set(range(10)) for s in by_env.values())
    assert experiments.committed()["ch12.sinks"]["holds"]


@pytest.mark.slow
def test_run_sinks_holds_on_seed_0():
    torch.set_num_threads(1)
    m = ch12.run_sinks(0)
    exp = experiments.get("ch12.sinks")
    assert set(exp.quoted) <= set(m) and exp.holds(m)
