"""Chapter 03's exercises (attnbook.exercises.additive): independent correct answers pass in
float32 and float64, the book's folded solutions pass, and plausible wrong answers outside the
galleries are rejected (each test could fail: the controls are wrong answers)."""

import torch

from attnbook import exercises
from attnbook.exercises import check
from exercise_run import run


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


# --------------------------------------------------------------------------- issue 29
SEEDS = (0, 1, 2, 3)
NEG = float("-inf")


def test_additive_hints_name_the_real_mistake():
    def v_left(s, H, W_q, W_k, v):
        return v @ torch.tanh(s @ W_q + H @ W_k)

    def column_habit(s, H, W_q, W_k, v):
        return torch.tanh(s @ W_q.T + H @ W_k.T) @ v

    def swapped(s, H, W_q, W_k, v):
        return torch.tanh(s @ W_k + H @ W_q) @ v

    for seed in SEEDS:
        ok, text = run("ch03.additive_score", v_left, seed)
        assert ok is False and "v 放错了一边" in text and "互换" not in text
        ok, text = run("ch03.additive_score", column_habit, seed)
        assert ok is False and "多转置了一次" in text
        ok, text = run("ch03.additive_score", swapped, seed)
        assert ok is False and "用反了" in text


def test_additive_cases_vary_shapes_with_the_seed():
    ex = exercises.get("ch03.additive_score")
    shapes = {tuple(tuple(a.shape) for a in ex.cases(seed)[0].args) for seed in SEEDS}
    assert len(shapes) > 1
    for seed in SEEDS:  # the first case: every dimension its own size
        s, H, W_q, W_k, v = ex.cases(seed)[0].args
        assert len({s.shape[0], H.shape[0], H.shape[1], v.shape[0]}) == 4


def test_context_polarity_and_global_max_are_rejected_and_named():
    def inverted(scores, H, mask):
        return torch.softmax(scores.masked_fill(mask, NEG), -1) @ H

    def global_max(scores, H, mask):
        s = scores.masked_fill(~mask, NEG)
        e = torch.exp(s - s.max())
        return e / e.sum(-1, keepdim=True) @ H

    for seed in SEEDS:
        ok, text = run("ch03.context", inverted, seed)
        assert ok is False and "掩码的含义反了" in text
        assert run("ch03.context", global_max, seed)[0] is False


# ch03.bahdanau_step: the build exercise
def bahdanau_loop(s, H, mask, W_q, W_k, v):  # one sentence at a time, -1e9 instead of -inf
    out = []
    for b in range(s.shape[0]):
        e = torch.tanh(s[b] @ W_q + H[b] @ W_k) @ v
        e = torch.where(mask[b], e, torch.tensor(-1e9, dtype=e.dtype))
        out.append(torch.softmax(e, -1) @ H[b])
    return torch.stack(out)


def bahdanau_einsum(s, H, mask, W_q, W_k, v):  # selects the real positions, explicit max
    hidden = torch.tanh(torch.einsum("bd,da->ba", s, W_q)[:, None]
                        + torch.einsum("bnd,da->bna", H, W_k))
    e = torch.einsum("bna,a->bn", hidden, v).masked_fill(~mask, NEG)
    p = torch.exp(e - e.amax(-1, keepdim=True))
    return torch.einsum("bn,bnd->bd", p / p.sum(-1, keepdim=True), H)


def test_bahdanau_unusual_right_answers_pass():
    for seed in SEEDS:
        for fn in (bahdanau_loop, bahdanau_einsum):
            ok, text = run("ch03.bahdanau_step", fn, seed)
            assert ok is True, text


def test_bahdanau_wrong_answers_outside_the_gallery_are_rejected():
    def relu(s, H, mask, W_q, W_k, v):
        e = torch.relu((s @ W_q)[:, None] + H @ W_k) @ v
        return (torch.softmax(e.masked_fill(~mask, NEG), -1)[:, None] @ H)[:, 0]

    def max_before_mask(s, H, mask, W_q, W_k, v):
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        p = torch.exp(e - e.amax(-1, keepdim=True)) * mask
        return (p / p.sum(-1, keepdim=True))[:, None].matmul(H)[:, 0]

    def first_mask_for_all(s, H, mask, W_q, W_k, v):
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        return (torch.softmax(e.masked_fill(~mask[0], NEG), -1)[:, None] @ H)[:, 0]

    def mean_over_n(s, H, mask, W_q, W_k, v):
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        alpha = torch.softmax(e.masked_fill(~mask, NEG), -1)
        return (alpha[..., None] * H).mean(1)

    for seed in SEEDS:
        for fn in (relu, max_before_mask, first_mask_for_all, mean_over_n):
            assert run("ch03.bahdanau_step", fn, seed)[0] is False, (fn.__name__, seed)


def test_bahdanau_shortcuts_are_rejected_by_name():
    from attnbook import additive_scores, masked_softmax

    def lib(s, H, mask, W_q, W_k, v):
        e = additive_scores(s[:, None], H, W_q, W_k, v).masked_fill(~mask[:, None], NEG)
        return (masked_softmax(e) @ H)[:, 0]

    def via_exercises(s, H, mask, W_q, W_k, v):
        e = torch.stack([exercises.get("ch03.additive_score").solution(s[b], H[b], W_q, W_k, v)
                         for b in range(len(s))])
        return torch.softmax(e.masked_fill(~mask, NEG), -1)[:, None].matmul(H)[:, 0]

    def solution(*args):
        return exercises.get("ch03.bahdanau_step").solution(*args)

    for fn, name in ((lib, "additive_scores"), (via_exercises, "ch03.additive_score"),
                     (solution, "solution")):
        ok, text = run("ch03.bahdanau_step", fn)
        assert ok is False and name in text, text


def test_bahdanau_hints_that_must_fire():
    def no_unsqueeze(s, H, mask, W_q, W_k, v):
        e = torch.tanh(s @ W_q + H @ W_k) @ v
        return (torch.softmax(e.masked_fill(~mask, NEG), -1)[:, None] @ H)[:, 0]

    def weights_only(s, H, mask, W_q, W_k, v):
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        return torch.softmax(e.masked_fill(~mask, NEG), -1)

    def swapped(s, H, mask, W_q, W_k, v):
        e = torch.tanh((s @ W_k)[:, None] + H @ W_q) @ v
        return (torch.softmax(e.masked_fill(~mask, NEG), -1)[:, None] @ H)[:, 0]

    ok, text = run("ch03.bahdanau_step", no_unsqueeze)
    assert ok is False and "[:, None]" in text
    ok, text = run("ch03.bahdanau_step", weights_only)
    assert ok is False and "第 3 步" in text
    ok, text = run("ch03.bahdanau_step", swapped)
    assert ok is False and ("用反了" in text or "不能互换" in text)


def test_bahdanau_cases_are_adversarial():
    ex = exercises.get("ch03.bahdanau_step")
    for seed in SEEDS:
        cases = ex.cases(seed)
        s, H, mask, W_q, W_k, v = cases[0].args
        assert len({s.shape[0], H.shape[1], s.shape[1], H.shape[2], v.shape[0]}) == 5
        assert len(set(mask.sum(-1).tolist())) > 1 or mask.shape[0] == 2
        s, H, mask, W_q, W_k, v = cases[2].args  # a padded position holds the row's max
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        for b in range(1, 3):
            assert e[b][~mask[b]].max() > e[b][mask[b]].max()
        s, H, mask, W_q, W_k, v = cases[4].args  # float32, a row entirely below -100
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        assert s.dtype == torch.float32 and (e[1] < -100).all()
    assert len({tuple(ex.cases(seed)[0].args[1].shape) for seed in SEEDS}) > 1


def test_bahdanau_through_the_score_module_is_caught_by_its_call():
    from attnbook.seq2seq import AttentionScore

    def module(s, H, mask, W_q, W_k, v):
        m = AttentionScore("additive", s.shape[-1], H.shape[-1], d_attn=v.shape[0]).to(s.dtype)
        with torch.no_grad():
            m.w_q.copy_(W_q), m.w_k.copy_(W_k), m.v_a.copy_(v)
        e = m(s[:, None], H)[:, 0].detach().masked_fill(~mask, NEG)
        return (torch.softmax(e, -1)[:, None] @ H)[:, 0]

    ok, text = run("ch03.bahdanau_step", module)
    assert ok is False and "additive_scores" in text


def test_bahdanau_finite_fill_is_rejected_and_named():
    """-1e4 (BERT's additive mask) or -1e3 as the padding fill: right while every real score is
    above it, wrong on the sentence whose real scores are near -28000 (review R1: -1e4 was
    accepted on every seed). -1e9 stays below every score and passes (bahdanau_loop)."""
    def fill(value):
        def fn(s, H, mask, W_q, W_k, v):
            e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
            return (torch.softmax(e.masked_fill(~mask, value), -1)[:, None] @ H)[:, 0]
        return fn
    for seed in SEEDS:
        for value in (-1e4, -1e3):
            ok, text = run("ch03.bahdanau_step", fill(value), seed)
            assert ok is False and "填充值不够小" in text.replace("\n", "").replace(" ", ""), (
                value, seed, text)
        s, H, mask, W_q, W_k, v = exercises.get("ch03.bahdanau_step").cases(seed)[5].args
        e = torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v
        assert (e[1][mask[1]] < -1e4).all() and not mask[1].all()
