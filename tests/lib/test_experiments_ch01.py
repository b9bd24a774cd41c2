"""Chapter 01's experiments (attnbook.experiments.ch01): the models, the measurements and the predicates.

The full claims run over seeds in `make.py experiments`; here the pieces are checked on small,
hand-built inputs and short runs, and each predicate rejects the wrong finding."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import experiments
from attnbook.experiments import ch01


def test_the_comparison_is_parameter_matched():
    counts = {kind: ch01.recurrent_params(ch01.Recall(kind, d)) for kind, d in ch01.MODELS.items()}
    assert counts == {"rnn": 5248, "gru": 4800}
    # control: at the same d_h the GRU's recurrent layer is 3x the RNN's
    assert ch01.recurrent_params(ch01.Recall("gru", 64)) == 3 * counts["rnn"]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="Recall: `kind`"):
        ch01.Recall("lstm", 8)
    with pytest.raises(ValueError, match="update_gate: `model` must be a GRU"):
        ch01.update_gate(ch01.Recall("rnn", 8), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="train_recall: `lr`"):
        ch01.train_recall("rnn", 8, 5, -1.0, 0, steps=1)


def test_unrolled_states_and_update_gate_match_the_layers():
    torch.manual_seed(0)
    tokens = torch.randint(8, (4, 6))
    for kind in ("rnn", "gru"):
        model = ch01.Recall(kind, 5)
        states = ch01.unrolled_states(model, tokens)
        full, _ = model.rnn(model.emb(tokens))
        assert len(states) == 6
        torch.testing.assert_close(torch.stack(states, 1), full)
    # u_t from the formula against the GRU cell's own interpolation h_t = (1-u) n + u h_{t-1}
    model = ch01.Recall("gru", 5)
    u = ch01.update_gate(model, tokens)
    assert u.shape == (4, 6, 5) and ((u > 0) & (u < 1)).all()
    with torch.no_grad():
        model.rnn.bias_hh_l0[5:10] = 30.0                      # u -> 1: the state is kept
        states, _ = model.rnn(model.emb(tokens))
    assert ch01.update_gate(model, tokens).min() > 0.999
    torch.testing.assert_close(states[:, -1], torch.zeros(4, 5), atol=1e-6, rtol=0)


def test_gradient_ratio_is_one_for_one_step_and_small_for_a_vanishing_rnn():
    torch.manual_seed(0)
    model = ch01.Recall("rnn", 8)
    tokens, labels = torch.randint(8, (16, 1)), torch.randint(8, (16,))
    assert ch01.gradient_ratio(model, tokens, labels) == pytest.approx(1.0)     # h_1 = h_T
    with torch.no_grad():
        model.rnn.weight_hh_l0.mul_(0.1)
    long = torch.randint(8, (16, 30))
    assert ch01.gradient_ratio(model, long, labels) < 1e-10


def test_a_short_run_is_reproducible_and_fails_the_claims():
    m1, h1 = ch01.train_recall("gru", 8, 5, 0.03, seed=3, steps=3)
    m2, h2 = ch01.train_recall("gru", 8, 5, 0.03, seed=3, steps=3)
    assert h1.losses == h2.losses and len(h1.losses) == 3
    acc = ch01.recall_accuracy(m1, 5, seed=3, n=200)
    assert acc < 0.5                                          # control: 3 steps learn nothing
    assert not experiments.get("ch01.gru_T20").holds(
        dict(best_gru_T20=acc, best_rnn_T20=0.3, best_gap_T20=acc - 0.3))


def test_w_hh_scale_sets_the_spectrum_and_clipping_records_norms():
    model, hist = ch01.train_recall("rnn", 6, 4, 1e-9, seed=0, steps=2, optimizer="sgd", clip=1e30,
                                    w_hh_scale=1.5)
    sv = torch.linalg.svdvals(model.rnn.weight_hh_l0.detach())
    torch.testing.assert_close(sv, torch.full((6,), 1.5), rtol=1e-5, atol=1e-5)
    assert len(hist.grad_norms) == 2 and all(math.isfinite(n) and n > 0 for n in hist.grad_norms)
    runs = {"noclip": (model, hist), "clip": (model, hist)}
    m = ch01.clipping_metrics(runs, seed=0)
    assert m["noclip_max_grad"] == max(hist.grad_norms)
    assert m["noclip_loss"] == pytest.approx(sum(hist.losses[-20:]) / 20)
    assert not experiments.get("ch01.clipping_rescues").holds(m)   # equal runs: no rescue


GOOD_T20 = dict(best_gru_T20=1.0, best_rnn_T20=0.7, best_gap_T20=0.3)
GOOD_T50 = dict(best_rnn_T50=0.4, best_gru_T50=0.13)
GOOD_KEEP = dict(gru_u_median_T20=0.9, gru_ratio_T20=0.8)
GOOD_CLIP = dict(noclip_loss=2.0, clip_loss=0.4, noclip_acc=0.13, clip_acc=0.9, noclip_max_grad=17.0)


@pytest.mark.parametrize("name,good,wrong", [
    ("ch01.gru_T20", GOOD_T20, dict(best_gru_T20=0.6, best_gap_T20=-0.1)),   # the GRU did not learn
    ("ch01.gru_T20", GOOD_T20, dict(best_rnn_T20=0.99, best_gap_T20=0.01)),  # the RNN learned too
    ("ch01.gru_keeps", GOOD_KEEP, dict(gru_u_median_T20=0.5)),                # gate still at init
    ("ch01.gru_keeps", GOOD_KEEP, dict(gru_ratio_T20=1e-4)),                  # still vanishing
    ("ch01.clipping_rescues", GOOD_CLIP, dict(clip_loss=1.9)),                # no rescue
    ("ch01.clipping_rescues", GOOD_CLIP, dict(noclip_max_grad=0.5)),          # clipping never acted
    ("ch01.lr_reverses_T20", {"rnn_T20_lr0.01": 0.4, "gap_T20_lr0.01": -0.2},
     {"rnn_T20_lr0.01": 0.12}),  # RNN at chance
    ("ch01.T50_unsolved", GOOD_T50, dict(best_rnn_T50=0.99)),                   # RNN solved T = 50       # RNN solved T = 50
])
def test_each_predicate_rejects_the_wrong_finding(name, good, wrong):
    exp = experiments.get(name)
    assert exp.holds_all([good])
    assert not exp.holds_all([{**good, **wrong}])


def test_the_rates_over_the_runs():
    def rates(name, runs):
        return experiments.get(name).holds_all(runs)
    rnn = [dict(GOOD_T20, best_rnn_T20=a) for a in (0.5, 0.6, 1.0, 0.7, 0.4)]
    assert rates("ch01.gru_T20", rnn)                                 # the RNN learns on 1 of 5
    assert not rates("ch01.gru_T20", [dict(r, best_rnn_T20=1.0, best_gap_T20=0.0)
                                      for r in rnn[:3]] + rnn[3:])  # on 3 of 5: no longer a minority
    gap = [{"rnn_T20_lr0.01": 0.4, "gap_T20_lr0.01": g} for g in (-0.3, -0.1, 0.6, -0.5, -0.4)]
    assert rates("ch01.lr_reverses_T20", gap)
    assert not rates("ch01.lr_reverses_T20", [dict(m, **{"gap_T20_lr0.01": g}) for m, g in
                                              zip(gap, (-0.3, 0.1, 0.6, 0.5, -0.4))])
    t50 = [dict(GOOD_T50, best_gru_T50=a) for a in (1.0, 0.14, 0.12, 0.14, 0.13)]
    assert rates("ch01.T50_unsolved", t50)
    assert not rates("ch01.T50_unsolved", [dict(m, best_gru_T50=a) for m, a in
                                           zip(t50, (1.0, 1.0, 0.12, 1.0, 0.13))])
    clip = [dict(GOOD_CLIP, noclip_acc=a, clip_acc=a + 0.3) for a in (0.6, 0.7, 0.12, 0.65, 0.13)]
    assert not rates("ch01.clipping_rescues", clip)                   # the unclipped run learned


def test_recall_loss_is_the_cross_entropy_of_the_readout():
    torch.manual_seed(0)
    model = ch01.Recall("rnn", 4)
    tokens, labels = torch.randint(8, (5, 3)), torch.randint(8, (5,))
    torch.testing.assert_close(ch01.recall_loss(model, (tokens, labels)),
                               F.cross_entropy(model(tokens), labels))
