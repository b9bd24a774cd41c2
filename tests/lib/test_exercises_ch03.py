"""Chapter 03's exercises (attnbook.exercises.additive): independent correct answers pass in
float32 and float64, the book's folded solutions pass, and plausible wrong answers outside the
galleries are rejected (each test could fail: the controls are wrong answers)."""
import contextlib
import io

import torch

from attnbook import exercises
from attnbook.exercises import check


def run(name, fn, seed=0):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, seed=seed)
    return bool(ok), buf.getvalue()


def score_einsum(s, H, W_q, W_k, v):  # the library's form: hidden (n, d_a), then v
    return torch.einsum("na,a->n", torch.tanh(torch.einsum("d,da->a", s, W_q)[None]
                                              + torch.einsum("nd,da->na", H, W_k)), v)


def score_float32(s, H, W_q, W_k, v):  # computed in float32, cast back to the inputs' dtype
    out = torch.tanh(s.float() @ W_q.float() + H.float() @ W_k.float()) @ v.float()
    return out.to(s.dtype)


def context_where(scores, H, mask):  # torch.where with -inf, then torch.softmax
    e = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    return torch.softmax(e, -1) @ H


def context_log_mask(scores, H, mask):  # an additive mask log(1) = 0, log(0) = -inf
    return torch.softmax(scores + torch.log(mask.to(scores.dtype)), -1) @ H


def test_independent_correct_answers_pass_on_several_seeds():
    for seed in (0, 1, 2):
        for fn in (score_einsum, exercises.get("ch03.additive_score").solution):
            assert run("ch03.additive_score", fn, seed)[0] is True
        for fn in (context_where, context_log_mask, exercises.get("ch03.context").solution):
            assert run("ch03.context", fn, seed)[0] is True


def test_float32_work_on_float64_inputs_is_rejected():
    ok, text = run("ch03.additive_score", score_float32)
    assert ok is False and "✗ ch03.additive_score" in text


def test_wrong_answers_outside_the_galleries_are_rejected():
    def relu_score(s, H, W_q, W_k, v):
        return torch.relu(s @ W_q + H @ W_k) @ v

    def weights_not_context(scores, H, mask):
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)

    def divided_by_n(scores, H, mask):
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ H / mask.sum()

    assert run("ch03.additive_score", relu_score)[0] is False
    for fn in (weights_not_context, divided_by_n):
        assert run("ch03.context", fn)[0] is False


def test_galleries_hold_the_classic_bugs():
    assert {"no_tanh", "tanh_after_v", "v_ignored", "weight_matrices_swapped"} \
        <= set(exercises.get("ch03.additive_score").bugs)
    assert {"softmax_over_queries", "padding_attended", "mask_after_softmax",
            "no_max_subtraction"} <= set(exercises.get("ch03.context").bugs)
