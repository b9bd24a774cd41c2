"""Chapter 11's exercises beyond the generic tests: the target-shift build exercise (correct
answers written another way pass, the one-call losses are refused by name, wrong answers
outside the gallery are rejected on seeds 0-3), kv_step's hints for the top-left mask, the
1/d_k scale and a missing output, and its correct-but-unusual answers."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import check
from attnbook.exercises import lmshift
from attnbook.gpt import lm_loss
from exercise_run import run

SEEDS = range(4)


def hint(text):
    return "".join(text[text.index("提示："):].split())


# ------------------------------------------------------------------ ch11.lm_loss
def by_gather(logits, ids, pad_id=0):
    logp = logits[:, :-1].log_softmax(-1)
    target = ids[:, 1:]
    real = target != pad_id
    picked = logp.gather(-1, target.clamp(0, logits.shape[-1] - 1)[..., None])[..., 0]
    return -(picked * real).sum() / real.sum()


def by_loops(logits, ids, pad_id=0):
    total, n = logits.new_zeros(()), 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            y = int(ids[b, t + 1])
            if y != pad_id:
                row = logits[b, t]
                total = total - (row[y] - row.max() - (row - row.max()).exp().sum().log())
                n += 1
    return total / n


def by_onehot(logits, ids, pad_id=0):   # a one-hot dot product, PAD rows zeroed
    target = ids[:, 1:]
    real = target != pad_id
    oh = F.one_hot(torch.where(real, target, 0), logits.shape[-1]).to(logits.dtype)
    per = -(oh * logits[:, :-1].log_softmax(-1)).sum(-1)
    return per[real].mean()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [by_gather, by_loops, by_onehot], ids=lambda f: f.__name__)
def test_lm_loss_correct_answers_pass(fn, seed):
    ok, text = run("ch11.lm_loss", fn, seed)
    assert ok, text


def test_lm_loss_reference_is_the_library_and_the_hand_variant():
    ex = exercises.get("ch11.lm_loss")
    for seed in SEEDS:
        for case in ex.cases(seed):
            want = lm_loss(*case.args, **case.kwargs)
            torch.testing.assert_close(ex.solution(*case.args, **case.kwargs), want)
            torch.testing.assert_close(lmshift._variant(*case.args, **case.kwargs), want)
    cases = ex.cases(1)
    assert not cases[0].kwargs                                    # pad_id left at its default
    assert any(int(c.kwargs.get("pad_id", 0)) not in (0, c.args[0].shape[-1] - 1)
               for c in cases)                                    # PAD inside the vocabulary


def test_lm_loss_one_call_losses_are_refused_by_name():
    def torch_ce(logits, ids, pad_id=0):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(),
                               ignore_index=pad_id)

    def torch_nll(logits, ids, pad_id=0):
        return F.nll_loss(logits[:, :-1].log_softmax(-1).flatten(0, 1), ids[:, 1:].flatten(),
                          ignore_index=pad_id)

    def module(logits, ids, pad_id=0):
        return torch.nn.CrossEntropyLoss(ignore_index=pad_id)(
            logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    for fn, word in ((torch_ce, "F.cross_entropy"), (torch_nll, "F.nll_loss"),
                     (module, "F.cross_entropy"),
                     (lambda lo, i, pad_id=0: lm_loss(lo, i, pad_id=pad_id), "lm_loss")):
        ok, text = run("ch11.lm_loss", fn)
        assert not ok and word in text and "不许" in text, text


@pytest.mark.parametrize("seed", SEEDS)
def test_lm_loss_wrong_answers_outside_the_gallery_are_rejected(seed):
    def vocab_axis_wrong(logits, ids, pad_id=0):         # log_softmax over time
        lp = logits.log_softmax(1)[:, :-1]
        real = ids[:, 1:] != pad_id
        return -(lp.gather(-1, ids[:, 1:, None])[..., 0] * real).sum() / real.sum()

    def skips_first_target(logits, ids, pad_id=0):      # BOS's successor dropped
        return by_gather(logits[:, 1:], ids[:, 1:], pad_id)

    def negative_sign(logits, ids, pad_id=0):
        return -by_gather(logits, ids, pad_id)

    for fn in (vocab_axis_wrong, skips_first_target, negative_sign):
        ok, text = run("ch11.lm_loss", fn, seed)
        assert not ok, (fn.__name__, text)


def test_lm_loss_no_shift_hint_names_the_shift():
    ok, text = run("ch11.lm_loss", exercises.get("ch11.lm_loss").bugs["no_shift"])
    assert not ok and "logits[:,:-1]" in hint(text) and "ids[:,1:]" in hint(text)


# ------------------------------------------------------------------ ch11.kv_step
def kv_loop(q, k_new, v_new, k_cache, v_cache):          # one new token at a time
    k_all, v_all, outs = k_cache, v_cache, []
    for i in range(q.shape[-2]):
        k_all = torch.cat([k_all, k_new[..., i:i + 1, :]], -2)
        v_all = torch.cat([v_all, v_new[..., i:i + 1, :]], -2)
        s = q[..., i:i + 1, :] @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
        outs.append(torch.softmax(s, -1) @ v_all)
    return torch.cat(outs, -2), k_all, v_all


def kv_sdpa_mask(q, k_new, v_new, k_cache, v_cache):    # SDPA with an explicit mask: allowed
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    n, total = q.shape[-2], k_all.shape[-2]
    mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
    return [F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask), k_all, v_all]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [kv_loop, kv_sdpa_mask], ids=lambda f: f.__name__)
def test_kv_step_correct_answers_pass(fn, seed):
    ok, text = run("ch11.kv_step", fn, seed)
    assert ok, text


def test_kv_step_is_a_build_exercise_with_varied_shapes():
    ex = exercises.get("ch11.kv_step")
    assert ex.build
    shapes = [tuple(c.args[0].shape) for seed in SEEDS for c in ex.cases(seed)]
    assert any(s[0] != s[2] for s in shapes) and len(set(shapes)) > 4
    assert any(c.args[3].shape[-2] == 0 for c in ex.cases(0))      # an empty cache


def test_kv_step_hints_top_left_scale_and_missing_outputs():
    def top_left(q, k_new, v_new, k_cache, v_cache):
        k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
        s = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
        return torch.softmax(s, -1) @ v_all, k_all, v_all

    ok, text = run("ch11.kv_step", top_left)
    assert not ok and "左上角对齐" in hint(text) and "tril(diagonal=t)" in hint(text), text

    def sdpa_causal(q, k_new, v_new, k_cache, v_cache):
        k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
        return F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True), k_all, v_all

    ok, text = run("ch11.kv_step", sdpa_causal)
    assert not ok and "is_causal=True" in text and "不许" in text, text

    def over_d_k(q, k_new, v_new, k_cache, v_cache):
        return kv_loop(q * q.shape[-1] ** -0.5, k_new, v_new, k_cache, v_cache)

    ok, text = run("ch11.kv_step", over_d_k)
    assert not ok and "1/√d_k" in hint(text), text

    ok, text = run("ch11.kv_step", lambda *a: kv_loop(*a)[0])
    assert not ok and "缺少" in hint(text) and "忘了" not in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_kv_step_wrong_answers_outside_the_gallery_are_rejected(seed):
    def half_scale(q, k_new, v_new, k_cache, v_cache):   # 1/2 = 1/sqrt(4), right for d_k = 4 only
        return kv_loop(q * math.sqrt(q.shape[-1]) / 2, k_new, v_new, k_cache, v_cache)

    ok, text = run("ch11.kv_step", half_scale, seed)
    assert not ok, text


# ------------------------------------------------------------------ ch11.sampling_probs
@pytest.mark.parametrize("seed", SEEDS)
def test_sampling_probs_kthvalue_answer_passes(seed):
    def kth(logits, top_k=None, top_p=None):
        p = torch.softmax(logits, -1)
        keep = torch.ones_like(p, dtype=torch.bool)
        if top_k is not None:
            k = min(top_k, p.shape[-1])
            keep = p >= -torch.kthvalue(-p, k, -1, keepdim=True).values
        if top_p is not None:
            q = torch.where(keep, p, 0.0)
            q = q / q.sum(-1, keepdim=True)
            sq, idx = q.sort(-1, descending=True)
            kept = (sq.cumsum(-1) - sq) < top_p
            keep &= torch.zeros_like(keep).scatter(-1, idx, kept)
        out = torch.where(keep, p, 0.0)
        return out / out.sum(-1, keepdim=True)

    ok, text = run("ch11.sampling_probs", kth, seed)
    assert ok, text


def _flat(text):
    return text.replace("\n", "").replace(" ", "")


def test_kv_step_a_mask_that_hides_the_new_token_itself_is_named():
    def hides_itself(q, k_new, v_new, k_cache, v_cache):     # appended, but the diagonal masked
        k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
        n, tk = q.shape[-2], k_all.shape[-2]
        s = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~torch.ones(n, tk, dtype=torch.bool).tril(tk - n - 1), float("-inf"))
        return torch.softmax(s, -1) @ v_all, k_all, v_all
    ok, text = run("ch11.kv_step", hides_itself)
    assert ok is False and "掩码也不能挡住它自己" in _flat(text), text


@pytest.mark.parametrize("seed", range(4))
def test_sampling_probs_float32_work_is_not_blamed_on_the_sort_order(seed):
    def in_float32(logits, top_k=None, top_p=None):
        return torch.softmax(_filter32(logits.float(), top_k, top_p), -1).to(logits.dtype)
    ok, text = run("ch11.sampling_probs", in_float32, seed)
    assert ok is False and "词表顺序" not in _flat(text), text
    # the gallery's vocabulary-order bug keeps its hint
    ok, text = run("ch11.sampling_probs",
                   exercises.get("ch11.sampling_probs").bugs["cumsum_in_vocab_order"], seed)
    assert ok is False and "词表顺序" in _flat(text), text


def _filter32(x, top_k, top_p):
    if top_k is not None:
        kth = x.topk(min(top_k, x.shape[-1]), -1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None:
        srt, idx = x.sort(-1, descending=True)
        p = srt.softmax(-1)
        drop = (p.cumsum(-1) - p) >= top_p
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    return x


def test_kv_step_first_cases_vary_with_the_seed():
    ex = exercises.get("ch11.kv_step")
    firsts = {tuple(tuple(a.shape) for a in ex.cases(s)[0].args) for s in range(4)}
    seconds = {tuple(tuple(a.shape) for a in ex.cases(s)[1].args) for s in range(4)}
    assert len(firsts) > 1 and len(seconds) > 1
