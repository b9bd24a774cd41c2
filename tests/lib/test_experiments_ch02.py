"""attnbook.experiments.ch02: the chapter's evaluation by length, the step-budgeted training,
the metrics the claims quote, and the toy's search rates (group 0 = the chapter's 200 models)."""
import pytest
import torch

from attnbook import experiments
from attnbook.data import reversal_task
from attnbook.decoding import exact_map, greedy_decode, random_tree_lm
from attnbook.experiments import ch02


def test_search_rates_of_group_0_are_the_chapters_counts_and_depend_on_temperature():
    t1 = ch02.search_rates(0, 1.0)
    assert t1["greedy_error"] == 103 / 200 and t1["empty_map"] == 125 / 200
    t025 = ch02.search_rates(0, 0.25)
    assert t025["greedy_error"] < t1["greedy_error"] / 2          # sharper toy: fewer errors
    assert abs(t025["empty_map"] - t1["empty_map"]) > 0.2


def test_search_rates_count_what_greedy_and_exact_map_return():
    kw = dict(bos=4, eos=0, max_len=5)
    err = empty = 0
    for s in range(40, 60):                                       # group 2 of 20 models
        lm = random_tree_lm(4, eos=0, seed=s, temperature=0.5, max_len=5)
        best = exact_map(lm, vocab_size=4, **kw).tokens
        err += greedy_decode(lm, **kw).tokens != best
        empty += best == (0,)
    r = ch02.search_rates(2, 0.5, n_models=20)
    assert (r["greedy_error"], r["empty_map"]) == (err / 20, empty / 20)
    assert 0 < r["p_empty"] < 1


def test_teacher_forced_accuracy_is_per_position_over_the_real_tokens():
    model = ch02.new_model(0)
    sets = {m: reversal_task(min_len=m, max_len=m).batch(6, seed=m, split="test")
            for m in (3, 5)}
    rows = ch02.accuracy_by_length(model, sets)
    for m, tb in sets.items():
        with torch.no_grad():
            pred = model(tb.src, tb.src_mask, tb.tgt_in).logits.argmax(-1)
        want = ((pred == tb.tgt_out) & tb.tgt_mask).sum() / tb.tgt_mask.sum()
        assert rows[m][2] == pytest.approx(want.item(), abs=1e-12)
    assert model.training                                          # mode restored


def test_training_is_a_step_budget():
    model = ch02.new_model(1, d_hidden=8)
    history = ch02.train_bottleneck(model, seed=1, steps=3)
    assert len(history.losses) == 3 and history.stopped_by == "steps"


def test_bottleneck_metrics_and_the_registered_claims():
    rows = {n: (1.0 - n / 20, 1.0 - n / 30, 1.0 - n / 40) for n in range(3, 13)}
    m = ch02.bottleneck_metrics(rows, "long_")
    assert m["long_tf_drop"] == pytest.approx(rows[3][2] - rows[12][2])
    assert m["long_em_8"] == rows[8][0] and m["long_greedy_12"] == rows[12][1]
    names = [n for n in experiments.names() if n.startswith("ch02.")]
    assert names == ["ch02.bottleneck", "ch02.bottleneck_controls", "ch02.search_rates"]
    base = experiments.get("ch02.bottleneck")
    good = dict(em_3=1.0, em_12=0.0, tf_drop=0.33, tf_12=0.66, greedy_12=0.4)
    assert base.holds(good)
    assert not base.holds(good | {"em_12": 0.5})                  # no decline: rejected
    assert not base.holds(good | {"greedy_12": 0.65})             # no cost of feeding back


def test_the_controls_claim_needs_both_controls_to_improve_length_8():
    ctl = experiments.get("ch02.bottleneck_controls")
    good = dict(em_8=0.19, tf_12=0.66)
    for p in ("long_", "wide_"):
        good |= {f"{p}em_3": 1.0, f"{p}em_12": 0.0, f"{p}tf_drop": 0.25, f"{p}em_8": 0.4}
    good["long_tf_12"] = 0.75
    assert ctl.holds(good)
    assert not ctl.holds(good | {"wide_em_8": 0.19})     # the wider model no better at m = 8
    assert not ctl.holds(good | {"long_em_8": 0.19})     # nor the longer run
    assert not ctl.holds(good | {"wide_tf_drop": 0.05})  # the decline gone in a control
