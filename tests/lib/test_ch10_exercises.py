"""Chapter 10's exercises: independent correct answers pass, every classic bug is rejected on
more draws than test_exercises runs, and the references agree with the library."""

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook import causal_mask
from attnbook.exercises import check
from attnbook.train import label_smoothed_cross_entropy, vaswani_lr
from exercise_run import run

NAMES = ("ch10.smoothed_cross_entropy", "ch10.noam_lr", "ch10.decoder_mask")
SEEDS = range(2, 6)


def torch_smoothed(logits, target, smoothing, pad_id):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id,
                           label_smoothing=smoothing)


def by_hand(logits, target, smoothing, pad_id):
    v = logits.shape[-1]
    q = torch.full_like(logits, smoothing / v)
    q.scatter_add_(-1, target[..., None], torch.full_like(logits[..., :1], 1 - smoothing))
    loss = -(q * logits.log_softmax(-1)).sum(-1)
    keep = target != pad_id
    return (loss * keep).sum() / keep.sum()


def noam_where(steps, d_model, warmup):
    rising = steps < warmup
    return torch.where(rising, steps * warmup ** -1.5, steps.rsqrt()) / d_model ** 0.5


def mask_by_loops(tgt_pad):
    b, t = tgt_pad.shape
    return torch.tensor([[[[j <= i and bool(tgt_pad[r, j]) for j in range(t)] for i in range(t)]]
                         for r in range(b)])


@pytest.mark.parametrize("name,fn", [(NAMES[0], by_hand),
                                     (NAMES[1], noam_where), (NAMES[2], mask_by_loops)])
@pytest.mark.parametrize("seed", (0, 1, 2))
def test_independent_correct_answers_pass(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert ok, text


def test_the_one_call_shortcuts_are_off_limits():
    """F.cross_entropy(label_smoothing=) gives the right numbers but skips the exercise; the
    library's own function and the schedule's too. Without label_smoothing it stays allowed."""
    ok, text = run(NAMES[0], torch_smoothed)
    assert not ok and "F.cross_entropy(label_smoothing=…)" in text and "不许" in text

    def nll_part_by_torch(logits, target, smoothing, pad_id):  # allowed: no label_smoothing
        lp = logits.log_softmax(-1)
        keep = target != pad_id
        nll = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id)
        smooth = -(lp.mean(-1) * keep).sum() / keep.sum()
        return (1 - smoothing) * nll + smoothing * smooth

    ok, text = run(NAMES[0], nll_part_by_torch)
    assert ok, text
    ok, text = run(NAMES[0], lambda lg, t, s, p: label_smoothed_cross_entropy(
        lg, t, smoothing=s, pad_id=p))
    assert not ok and "attnbook.train.label_smoothed_cross_entropy" in text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
def test_every_bug_is_rejected_on_more_draws(name, seed):
    ex = exercises.get(name)
    assert run(name, ex.solution, seed)[0]
    accepted = [bug for bug, fn in ex.bugs.items() if run(name, fn, seed)[0]]
    assert not accepted, accepted


def test_references_agree_with_the_library():
    steps = torch.arange(1, 3000, dtype=torch.float64)
    want = torch.tensor([vaswani_lr(int(s), d_model=64, warmup=50) for s in steps],
                        dtype=torch.float64)
    torch.testing.assert_close(exercises.get("ch10.noam_lr").solution(steps, 64, 50), want,
                               rtol=1e-12, atol=0)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    target = torch.randint(9, (3, 4), generator=g)
    got = exercises.get("ch10.smoothed_cross_entropy").solution(logits, target, 0.1, 2)
    torch.testing.assert_close(got, torch_smoothed(logits, target, 0.1, 2))
    assert got == label_smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=2)


def test_the_eps_over_V_minus_1_bug_is_a_real_distribution_not_the_chapter_one():
    # the bug is the other convention (a distribution), so only the value gives it away
    ex = exercises.get("ch10.smoothed_cross_entropy")
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    target = torch.randint(1, 6, (2, 3), generator=g)
    a = ex.bugs["eps_over_V_minus_1"](logits, target, 0.1, 0)
    assert (a - ex.solution(logits, target, 0.1, 0)).abs() > 1e-4


def test_the_mask_must_be_bool_and_equals_the_library_causal_mask_and_padding():
    ex = exercises.get("ch10.decoder_mask")
    ok, text = run("ch10.decoder_mask", lambda p: ex.solution(p).double())   # 0/1 floats
    assert not ok and "bool" in text
    pad = torch.tensor([[True, True, True, False], [True, False, False, False]])
    want = causal_mask(4, 4)[None, None] & pad[:, None, None, :]
    assert torch.equal(ex.solution(pad), want)
    assert not ex.solution(pad)[1, 0, :, 1:].any() and ex.solution(pad)[1, 0, :, 0].all()  # PAD keys
