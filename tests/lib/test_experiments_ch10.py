"""Tests for attnbook.experiments.ch10's reversal smoke test: the data, the alignment score,
the training helper's arguments and the claim's rule (no full training run here)."""
from __future__ import annotations

import math

import pytest
import torch

from attnbook import experiments
from attnbook.data import BOS_ID, EOS_ID, PAD_ID
from attnbook.experiments import ch10


def anti_diagonal(src_len, t_max, s_max):
    """A planted map: query t of row b puts all its weight on source src_len[b] - 1 - t."""
    w = torch.full((len(src_len), t_max, s_max), 0.01)
    for b, n in enumerate(src_len):
        for t in range(n):
            w[b, t, n - 1 - t] = 1.0
    return w / w.sum(-1, keepdim=True)


def test_reversal_data_is_the_mirror_of_its_input_with_lengths_3_to_8():
    task = ch10.reversal_data()
    pairs = task.pairs(300, seed=0)
    assert all(tgt == src[::-1] for src, tgt in pairs)
    assert {len(src) for src, _ in pairs} == set(range(3, 9))
    assert all(set(src) <= set("0123456789") for src, _ in pairs)
    assert len(task.src_vocab) == len(task.tgt_vocab) == 14        # 10 digits + PAD BOS EOS UNK
    b = task.batch(16, seed=1)
    for i in range(16):                                             # tgt_out = reversed src + EOS
        n = int(b.src_len[i])
        assert b.tgt_out[i, :n].tolist() == b.src[i, :n].flip(0).tolist()
        assert int(b.tgt_out[i, n]) == EOS_ID and int(b.tgt_in[i, 0]) == BOS_ID
        assert bool((b.src[i, n:] == PAD_ID).all())


def test_held_out_strings_never_appear_in_training():
    task = ch10.reversal_data()
    train = {s for s, _ in task.pairs(2000, seed=0)}
    test = {s for s, _ in task.pairs(500, seed=3, split="test")}
    assert not train & test


def test_mirror_alignment_of_a_planted_anti_diagonal_is_one():
    lens = [3, 8, 5]
    w = anti_diagonal(lens, 9, 8)
    assert ch10.mirror_alignment(w, torch.tensor(lens)) == 1.0
    assert ch10.mirror_alignment(w, lens) == 1.0                    # a list of ints is fine


def test_mirror_alignment_counts_each_real_target_token_once():
    lens = [3, 8, 5]
    diag = torch.zeros(3, 9, 8)                                     # the copy alignment t -> t
    for b, n in enumerate(lens):
        for t in range(n):
            diag[b, t, t] = 1.0
    # only the middle position of an odd length is its own mirror: 1 + 0 + 1 of 16 tokens
    assert ch10.mirror_alignment(diag, lens) == pytest.approx(2 / 16)
    w = anti_diagonal(lens, 9, 8)
    w[1, 0] = torch.tensor([1.0] + [0.0] * 7)                       # one of 16 tokens wrong
    assert ch10.mirror_alignment(w, lens) == pytest.approx(15 / 16)
    w = anti_diagonal(lens, 9, 8)
    w[0, 3:] = torch.rand(6, 8)                                     # EOS and padded queries
    assert ch10.mirror_alignment(w, lens) == 1.0                    # are not counted


@pytest.mark.parametrize("weights, src_len, match", [
    (torch.zeros(2, 3), [2, 2], "weights"),
    (torch.zeros(2, 3, 3, dtype=torch.long), [2, 2], "weights"),
    ("nope", [2, 2], "weights"),
    (torch.zeros(2, 3, 3), [2], "src_len"),
    (torch.zeros(2, 3, 3), [2.0, 2.0], "src_len"),
    (torch.zeros(2, 3, 3), [0, 2], "src_len"),
    (torch.zeros(2, 3, 3), [4, 2], "src_len"),
    (torch.full((2, 3, 3), math.nan), [2, 2], "weights"),
])
def test_mirror_alignment_refuses_bad_input(weights, src_len, match):
    with pytest.raises((TypeError, ValueError), match=match):
        ch10.mirror_alignment(weights, src_len)


def test_train_reversal_runs_and_refuses_bad_arguments():
    task = ch10.reversal_data()
    tiny = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16)
    model, losses = ch10.train_reversal(task, 0, steps=3, config=tiny)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert not model.training and model.d_model == 8
    again, losses2 = ch10.train_reversal(task, 0, steps=3, config=tiny)
    assert losses2 == losses                                        # seeded
    with pytest.raises(ValueError, match="seed"):
        ch10.train_reversal(task, -1, steps=3, config=tiny)
    with pytest.raises(ValueError, match="steps"):
        ch10.train_reversal(task, 0, steps=0, config=tiny)
    with pytest.raises(ValueError, match="losses"):
        ch10.reversal_metrics(model, task, losses)


def test_the_reversal_claim_reads_every_metric_and_uses_the_seeds_thresholds():
    exp = experiments.get("ch10.reversal")
    good = dict(exact_match=0.95, token_accuracy=0.99, loss_ratio=0.01, mirror_alignment=0.9,
                beam_greedy_agree=1.0, beam_less_probable=0.0, greedy_teacher_agree=0.99)
    assert exp.keys() <= set(good) and set(exp.quoted) <= set(good)
    typical = dict(good, mirror_alignment=0.65)                     # below 0.8, above 0.5
    assert exp.holds(good) and exp.holds_all([typical] * 10)
    for key, bad in [("loss_ratio", 0.11), ("beam_greedy_agree", 0.94)]:   # on every run
        assert not exp.holds(dict(good, **{key: bad})), key
    # the seed review's other thresholds, as rates over the runs: 10 runs, k of them failing
    for key, bad, k_fail in [("exact_match", 0.89, 3), ("token_accuracy", 0.96, 4),
                             ("greedy_teacher_agree", 0.94, 7), ("mirror_alignment", 0.85, 3),
                             ("mirror_alignment", 0.45, 6)]:
        runs = [dict(typical, **{key: bad})] * k_fail + [typical] * (10 - k_fail)
        assert exp.holds(runs[0]) and not exp.holds_all(runs), (key, bad)
        assert exp.holds_all(runs[1:] if k_fail == 1 else runs[k_fail - 1:]), (key, bad)
    assert exp.holds(dict(good, beam_less_probable=3.0))            # recorded, not ruled
