"""Chapter 07's experiments (attnbook.experiments.ch07): the models, the measures and the
predicates; each predicate rejects the wrong finding. The full claims run in the experiments CLI."""
import math

import pytest
import torch

from attnbook import experiments
from attnbook.experiments import ch07


def test_one_position_attention_only_is_affine_and_two_positions_are_not():
    z, loss = ch07.train_xor(False, 1, seed=0, steps=20)
    assert abs((z[0] + z[3] - z[1] - z[2]).item()) < 1e-10            # eq. xor-identity
    z2, _ = ch07.train_xor(False, 2, seed=0, steps=20)
    assert abs((z2[0] + z2[3] - z2[1] - z2[2]).item()) > 1e-6          # not affine at n = 2
    with pytest.raises(ValueError, match="TwoBitModel: `positions`"):
        ch07.TwoBitModel(False, positions=3)


def test_an_exponential_decay_fails_the_loglog_test():
    # r_l = q^l (exponential): ln r_3 / ln r_2 = 1.5; the doubly exponential measure needs > 2
    q = 0.1
    assert math.log(q**3) / math.log(q**2) == pytest.approx(1.5)
    m = ch07.run_collapse(seed=0)
    assert m["attn_loglog"] == pytest.approx(math.log(m["attn_3"]) / math.log(m["attn_2"]))
    assert m["attn_3"] < m["attn_2"] < m["attn_1"]


def test_rank1_residual_reads_hand_built_inputs():
    same = torch.ones(2, 5, 3, dtype=torch.float64) * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert ch07.rank1_residual(same) < 1e-15                              # all rows equal
    x = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]], dtype=torch.float64)    # mean 0: all residual
    assert ch07.rank1_residual(x) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rank1_residual: `x` must be"):
        ch07.rank1_residual(torch.ones(3, 3))
    prof = ch07.collapse_profile("skip", seed=0, n_layers=3)
    assert len(prof) == 4 and prof[0] == pytest.approx(ch07.rank1_residual(
        torch.randn(8, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))), rel=0.2)
    with pytest.raises(ValueError, match="collapse_profile: `mode`"):
        ch07.collapse_profile("ffn", 0)


def test_equal_parameter_counts_and_mod_sum_data():
    counts = {}
    for act in ("relu", "gelu", "swiglu"):
        counts[act] = sum(p.numel() for p in ch07.ModSum(act).ffn.parameters())
    assert counts == dict(relu=4608, gelu=4608, swiglu=4608) == {a: 8 * 24**2 for a in counts}
    assert ch07.ffn_width("swiglu", 24) == 64 and ch07.ffn_width("relu", 24) == 96
    with pytest.raises(ValueError, match="ffn_width: `d` must be a multiple of 3"):
        ch07.ffn_width("swiglu", 32)
    ab, y = ch07.mod_sum_data(5)
    assert ab.shape == (25, 2) and torch.equal(y, (ab[:, 0] + ab[:, 1]) % 5)


def test_a_short_run_fails_the_activation_claim():
    _, loss, acc = ch07.train_mod_sum("relu", seed=0, steps=3)
    assert loss > 2.0 and acc < 0.3                                     # 3 steps learn nothing


GOOD_XOR = dict(one_att_identity=1e-14, one_att_loss=math.log(2), one_ffn_correct=4, one_ffn_loss=1e-4,
                two_att_correct=4, two_att_loss=1e-4, one_att_correct=2, two_att_identity=3.0,
                one_ffn_identity=9.0)
GOOD_COL = dict(attn_12=2e-16, attn_ffn_12=2e-16, skip_12=0.6, skip_ffn_12=0.5, attn_loglog=4.2)
GOOD_RATIO = dict(loss_r1=0.4, loss_r2=0.3, loss_r4=0.2, loss_r8=0.37, params_r1=7072, params_r2=7320,
                  params_r4=7008, params_r8=6552)
GOOD_ACT = dict(relu_ffn_params=4608, gelu_ffn_params=4608, swiglu_ffn_params=4608, relu_loss=0.2,
                gelu_loss=0.19, swiglu_loss=0.1, none_loss=1.5,
                best_other_over_swiglu_lo=1.2, best_other_over_swiglu_hi=1.5)


def test_ratio_configs_have_about_the_same_layer_parameters():
    counts = {r: ch07.layer_params(ch07.ModSum("relu", d=d, d_ff=r * d)) for r, d in ch07.RATIO_WIDTHS.items()}
    assert counts == {1: 7072, 2: 7320, 4: 7008, 8: 6552}
    assert counts[4] == ch07.layer_params(ch07.ModSum("relu"))            # the default is r = 4
    assert ch07.ModSum("relu", d=24, d_ff=48).ffn.d_ff == 48


@pytest.mark.parametrize("name,good,wrong", [
    ("ch07.xor", GOOD_XOR, dict(one_ffn_correct=3)),                  # the FFN does not help
    ("ch07.xor", GOOD_XOR, dict(two_att_loss=0.69)),                  # attention fails at n = 2
    ("ch07.xor", GOOD_XOR, dict(one_att_identity=1e-3)),              # not affine at n = 1
    ("ch07.rank_collapse", GOOD_COL, dict(attn_12=0.1)),              # no collapse
    ("ch07.rank_collapse", GOOD_COL, dict(skip_12=1e-8)),             # skips collapse too
    ("ch07.rank_collapse", GOOD_COL, dict(attn_loglog=1.4)),          # only exponential
    ("ch07.activations", GOOD_ACT, dict(swiglu_ffn_params=4000)),     # unequal parameters
    ("ch07.activations", GOOD_ACT, dict(swiglu_loss=0.3)),            # SwiGLU not lowest
    ("ch07.activations", GOOD_ACT, dict(relu_loss=0.5)),              # an FFN no better than none
    ("ch07.activations", GOOD_ACT, dict(best_other_over_swiglu_lo=0.9)),  # flips at lr 1e-3
    ("ch07.activations", GOOD_ACT, dict(best_other_over_swiglu_hi=0.9)),  # flips at lr 1e-2
    ("ch07.ffn_ratio", GOOD_RATIO, dict(loss_r8=0.1)),                # the widest ratio best
    ("ch07.ffn_ratio", GOOD_RATIO, dict(loss_r1=0.15)),               # the narrowest best
    ("ch07.ffn_ratio", GOOD_RATIO, dict(params_r8=4000)),             # not parameter-matched
])
def test_each_predicate_rejects_the_wrong_finding(name, good, wrong):
    exp = experiments.get(name)
    assert exp.holds_all([good])
    assert not exp.holds_all([dict(good, **wrong)])
