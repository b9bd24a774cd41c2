"""Chapter 02's exercises (attnbook.exercises.lm, beam): wrong answers outside the galleries are
rejected on seeds 0-3 with the hint that names them (and no other), correct but unusual answers
pass, the shortcuts are rejected by name, and the beam search's hidden cases hold a model on
which beam k = 2 loses to greedy and one where k = 1 is greedy."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import decoding, exercises
from attnbook.exercises import check
from exercise_run import run

SEEDS = (0, 1, 2, 3)


def hint(text):
    return "".join(text[text.index("提示："):].split())


# --------------------------------------------------------------------------- sequence_logprob
def lp_one_hot(logits, tokens):  # F.one_hot without num_classes: too few columns
    return (logits.log_softmax(-1) * F.one_hot(tokens)).sum()


def lp_log_of_softmax(logits, tokens):  # log(softmax): underflows to -inf
    return torch.log(logits.softmax(-1).gather(-1, tokens[:, None])).sum()


def lp_first_dropped(logits, tokens):  # row 0 taken for a BOS row and skipped
    return logits.log_softmax(-1).gather(-1, tokens[:, None])[1:, 0].sum()


def lp_sign_flipped(logits, tokens):  # the negative log-likelihood
    return -logits.log_softmax(-1).gather(-1, tokens[:, None]).sum()


def lp_shift_other_way(logits, tokens):  # logits[1:] paired with tokens[:-1]
    return logits[1:].log_softmax(-1).gather(-1, tokens[:-1, None]).sum()


def lp_loop(logits, tokens):  # correct: a loop with logsumexp
    return sum(logits[t, tokens[t]] - torch.logsumexp(logits[t], 0) for t in range(len(tokens)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [lp_one_hot, lp_log_of_softmax])
def test_one_hot_and_log_of_softmax_are_rejected_on_every_seed(fn, seed):
    ok, text = run("ch02.sequence_logprob", fn, seed)
    assert not ok, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn,words,not_words", [
    (lp_first_dropped, ["少了第一项", "BOS"], ["EOS", "少了最后一项"]),
    (lp_sign_flipped, ["符号反了"], []),
    (lp_shift_other_way, ["错开了一位", "logits[1:]"], []),
])
def test_sequence_logprob_hints_name_the_real_mistake(fn, words, not_words, seed):
    ok, text = run("ch02.sequence_logprob", fn, seed)
    assert not ok
    for word in words:
        assert word in hint(text), text
    for word in not_words:
        assert word not in hint(text), text


def test_the_eos_hint_still_fires_on_the_eos_bug():
    bug = exercises.get("ch02.sequence_logprob").bugs["eos_term_dropped"]
    _, text = run("ch02.sequence_logprob", bug)
    assert "少了最后一项" in hint(text) and "少了第一项" not in hint(text)


@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_logprob_correct_unusual_answer_passes(seed):
    ok, text = run("ch02.sequence_logprob", lp_loop, seed)
    assert ok, text


def test_sequence_logprob_shapes_vary_with_the_seed():
    ex = exercises.get("ch02.sequence_logprob")
    assert len({tuple(ex.cases(s)[0].args[0].shape) for s in SEEDS}) > 1


# --------------------------------------------------------------------------- token_cross_entropy
def ce_ignore_index(logits, target, pad_id):  # the one-call equivalent
    return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad_id)


def ce_masked_reduction_none(logits, target, pad_id):  # correct: CE per token, masked by hand
    keep = target != pad_id
    nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return (nll * keep).sum() / keep.sum()


def ce_select(logits, target, pad_id):  # correct: boolean selection, then a hand-written NLL
    keep = target != pad_id
    return -logits[keep].log_softmax(-1).gather(-1, target[keep][:, None]).mean()


def ce_lm_shift(logits, target, pad_id):  # shifted as in LM training
    lg, tg = logits[:, :-1], target[:, 1:]
    keep = tg != pad_id
    nll = -lg.log_softmax(-1).gather(-1, tg[..., None])[..., 0]
    return (nll * keep).sum() / keep.sum()


def ce_pad_in_numerator(logits, target, pad_id):  # all positions summed, real count divides
    nll = -logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
    return nll.sum() / (target != pad_id).sum()


def ce_pad_largest(logits, target, pad_id):  # assumes PAD is the largest id
    keep = target < pad_id
    nll = -logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
    return (nll * keep).sum() / keep.sum()


def test_token_cross_entropy_rules_out_ignore_index_by_name():
    ok, text = run("ch02.token_cross_entropy", ce_ignore_index)
    assert not ok and "不许" in text and "ignore_index" in text, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [ce_masked_reduction_none, ce_select])
def test_token_cross_entropy_correct_unusual_answers_pass(fn, seed):
    ok, text = run("ch02.token_cross_entropy", fn, seed)
    assert ok, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn,word", [(ce_lm_shift, "错开了一位"),
                                     (ce_pad_in_numerator, "分子却把PAD"),
                                     (ce_pad_largest, "不能假定PAD是最大")])
def test_token_cross_entropy_wrong_answers_are_named(fn, word, seed):
    ok, text = run("ch02.token_cross_entropy", fn, seed)
    assert not ok and word in hint(text), text


# --------------------------------------------------------------------------- beam_search
def _step(logp):
    return lambda prefixes: logp[prefixes[:, -1]]


def beam_tensor(logp, bos, eos, k, max_len):  # correct: tensors, topk over the flattened scores
    live_toks = torch.full((1, 1), bos)
    live_lp = torch.zeros(1, dtype=logp.dtype)
    best = None
    for t in range(1, max_len + 1):
        cand = live_lp[:, None] + logp[live_toks[:, -1]]
        if t == max_len:
            cand = torch.full_like(cand, -math.inf).index_copy(1, torch.tensor([eos]),
                                                               cand[:, eos:eos + 1])
        vals, idx = cand.flatten().topk(min(k, cand.numel()))
        rows, toks = idx // cand.shape[1], idx % cand.shape[1]
        new = torch.cat([live_toks[rows], toks[:, None]], 1)
        done = (toks == eos) & torch.isfinite(vals)
        for r in done.nonzero()[:, 0].tolist():
            if best is None or vals[r] > best[1]:
                best = (new[r, 1:], vals[r])
        keep = ~done & torch.isfinite(vals)
        live_toks, live_lp = new[keep], vals[keep]
        if not len(live_lp):
            break
    return best


def beam_no_forced_eos(logp, bos, eos, k, max_len):  # stops at max_len without forcing EOS
    live, done = [((), 0.0)], []
    for _ in range(max_len):
        cands = [(p + (v,), s + float(logp[p[-1] if p else bos, v]))
                 for p, s in live for v in range(logp.shape[0])]
        cands.sort(key=lambda c: -c[1])
        live = [c for c in cands[:k] if c[0][-1] != eos]
        done += [c for c in cands[:k] if c[0][-1] == eos]
        if not live:
            break
    done = done or live
    best = max(done, key=lambda c: c[1])
    return torch.tensor(best[0]), torch.tensor(best[1], dtype=logp.dtype)


def beam_with_bos(logp, bos, eos, k, max_len):  # the output starts with BOS
    toks, lp = beam_tensor(logp, bos, eos, k, max_len)
    return torch.cat([torch.tensor([bos]), toks]), lp


def beam_library(logp, bos, eos, k, max_len):  # the shortcut
    h = decoding.beam_search(_step(logp), bos=bos, eos=eos, beam_size=k, max_len=max_len)[0]
    return list(h.tokens), h.logprob


def beam_list_of_tensors(logp, bos, eos, k, max_len):  # correct: a list of 0-dim tensors, a float
    toks, lp = beam_tensor(logp, bos, eos, k, max_len)
    return list(toks), float(lp)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [beam_tensor, beam_list_of_tensors])
def test_beam_correct_unusual_answer_passes(fn, seed):
    ok, text = run("ch02.beam_search", fn, seed)
    assert ok, text


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_wrong_answers_outside_the_gallery(seed):
    ok, text = run("ch02.beam_search", beam_no_forced_eos, seed)
    assert not ok and "以EOS结尾" in hint(text), text
    ok, text = run("ch02.beam_search", beam_with_bos, seed)
    assert not ok and "不要放BOS" in hint(text), text


def test_beam_library_call_is_ruled_out_by_name():
    ok, text = run("ch02.beam_search", beam_library)
    assert not ok and "不许" in text and "beam_search" in text, text
    ok, text = run("ch02.beam_search", lambda *a: exercises.get("ch02.beam_search").solution(*a))
    assert not ok and ".solution" in text


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_cases_show_beam_losing_to_greedy_and_k1_equal_to_greedy(seed):
    ex = exercises.get("ch02.beam_search")
    cases = ex.cases(seed)
    loses = [c for c in cases if "loses" in c.tags]
    greedy = [c for c in cases if "greedy" in c.tags]
    assert loses and len(greedy) >= 2
    for c in loses:
        logp, bos, eos, k, max_len = c.args
        g = decoding.greedy_decode(_step(logp), bos=bos, eos=eos, max_len=max_len)
        _, lp = ex.solution(*c.args)
        assert k == 2 and g.logprob > float(lp) + 0.5           # P: about .12 against .06
    for c in greedy:
        logp, bos, eos, k, max_len = c.args
        g = decoding.greedy_decode(_step(logp), bos=bos, eos=eos, max_len=max_len)
        toks, lp = ex.solution(*c.args)
        assert k == 1 and tuple(toks.tolist()) == g.tokens and abs(float(lp) - g.logprob) < 1e-12
    # the reference agrees with the library's beam search on every case
    for c in cases:
        logp, bos, eos, k, max_len = c.args
        h = decoding.beam_search(_step(logp), bos=bos, eos=eos, beam_size=k, max_len=max_len)[0]
        toks, lp = ex.solution(*c.args)
        assert tuple(toks.tolist()) == h.tokens and abs(float(lp) - h.logprob) < 1e-12
    assert len({c.args[0].shape for c in cases}) > 2


def test_beam_is_a_build_exercise_with_a_gallery():
    ex = exercises.get("ch02.beam_search")
    assert ex.build and len(ex.bugs) >= 5


# --------------------------------------------------------------------------- red-team regressions
def lp_item(logits, tokens):  # a Python float
    return logits.log_softmax(-1).gather(-1, tokens[:, None]).sum().item()


def lp_shape1(logits, tokens):  # shape (1,) instead of 0-dim
    return logits.log_softmax(-1).gather(-1, tokens[:, None]).sum(0)


def lp_float32(logits, tokens):  # computed in float32, cast back
    return logits.float().log_softmax(-1).gather(-1, tokens[:, None]).sum().to(logits.dtype)


def lp_lse_no_max_back(logits, tokens):  # logsumexp by hand, the max not added back
    m = logits.amax(-1, keepdim=True)
    lse = (logits - m).exp().sum(-1, keepdim=True).log()
    return (logits - lse).gather(-1, tokens[:, None]).sum()


def ce_no_flatten(logits, target, pad_id):  # (B, T, V) straight into cross_entropy
    keep = target != pad_id
    return (F.cross_entropy(logits, target, reduction="none") * keep).sum() / keep.sum()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,fn", [
    ("ch02.sequence_logprob", lp_item), ("ch02.sequence_logprob", lp_shape1),
    ("ch02.sequence_logprob", lp_float32), ("ch02.sequence_logprob", lp_lse_no_max_back),
    ("ch02.token_cross_entropy", ce_no_flatten)], ids=lambda x: getattr(x, "__name__", str(x)))
def test_red_team_wrong_answers_stay_rejected(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert not ok, text


def test_unflattened_cross_entropy_is_told_where_the_classes_go():
    ok, text = run("ch02.token_cross_entropy", ce_no_flatten)
    assert not ok and "类别在第1维" in hint(text), text


# --------------------------------------------------------------------------- R4 review
def ce_class_weight(logits, target, pad_id):  # ignore_index in disguise: weight 0 at PAD
    w = torch.ones(logits.shape[-1], dtype=logits.dtype)
    w[pad_id] = 0
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), weight=w)


def ce_naive_exp(logits, target, pad_id):  # exp(z) / exp(z).sum(): overflows at logit 1000
    e = logits.exp()
    nll = -torch.log((e / e.sum(-1, keepdim=True)).gather(-1, target[..., None])[..., 0])
    keep = target != pad_id
    return (nll * keep).sum() / keep.sum()


def ce_softmax_then_log(logits, target, pad_id):  # probability e^-900 underflows: log 0
    nll = -logits.softmax(-1).log().gather(-1, target[..., None])[..., 0]
    keep = target != pad_id
    return (nll * keep).sum() / keep.sum()


def ce_reduction_none(logits, target, pad_id):  # correct: per-position losses, masked mean
    losses = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return losses[target != pad_id].mean()


def beam_exact_map(logp, bos, eos, k, max_len):  # the exact MAP by dynamic programming
    best, live = None, {bos: (0.0, [])}
    for _ in range(max_len):
        for last, (s, toks) in live.items():
            c = (s + float(logp[last, eos]), toks + [eos])
            best = c if best is None or c[0] > best[0] else best
        nxt = {}
        for last, (s, toks) in live.items():
            for w in range(logp.shape[0]):
                if w != eos and (w not in nxt or s + float(logp[last, w]) > nxt[w][0]):
                    nxt[w] = (s + float(logp[last, w]), toks + [w])
        live = nxt
    return torch.tensor(best[1]), torch.tensor(best[0], dtype=logp.dtype)


def _beam(logp, bos, eos, k, max_len, *, stop_at_k=False, keep_finished=False):
    live, done = [((), 0.0)], []
    for t in range(1, max_len + 1):
        cands = [c for c in live if keep_finished and c[0] and c[0][-1] == eos]
        allowed = range(logp.shape[0]) if t < max_len else [eos]
        cands += [(toks + (v,), s + float(logp[toks[-1] if toks else bos, v]))
                  for toks, s in live if not (toks and toks[-1] == eos) for v in allowed]
        kept = sorted(cands, key=lambda c: c[1], reverse=True)[:k]
        if keep_finished:
            live = kept
            if all(c[0][-1] == eos for c in kept):
                break
            continue
        done += [c for c in kept if c[0][-1] == eos]
        live = [c for c in kept if c[0][-1] != eos]
        if not live or stop_at_k and len(done) >= k:
            break
    toks, s = max(live if keep_finished else done, key=lambda c: c[1])
    return torch.tensor(toks), torch.tensor(s, dtype=logp.dtype)


def beam_stop_at_k(*a):  # stops as soon as k outputs are finished (live prefixes dropped)
    return _beam(*a, stop_at_k=True)


def beam_finished_stay(*a):  # correct: finished outputs keep their slot (same best by log P)
    return _beam(*a, keep_finished=True)


def beam_private_search(logp, bos, eos, k, max_len):  # the function behind the .solution
    from attnbook.exercises import beam
    toks, s, _ = beam._search(logp, bos, eos, k, max_len)
    return torch.tensor(toks), torch.tensor(s, dtype=logp.dtype)


@pytest.mark.parametrize("seed", SEEDS)
def test_ce_class_weight_at_pad_is_ruled_out(seed):
    ok, text = run("ch02.token_cross_entropy", ce_class_weight, seed)
    assert not ok and "不许" in text and "weight" in text, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [ce_naive_exp, ce_softmax_then_log])
def test_ce_overflow_and_underflow_are_rejected_and_named(fn, seed):
    ok, text = run("ch02.token_cross_entropy", fn, seed)
    assert not ok and "log_softmax" in hint(text) and "0/0" not in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_ce_reduction_none_with_a_mask_passes(seed):
    ok, text = run("ch02.token_cross_entropy", ce_reduction_none, seed)
    assert ok, text


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_exact_map_is_rejected_and_named(seed):
    ok, text = run("ch02.beam_search", beam_exact_map, seed)
    assert not ok and "精确MAP" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_stopping_at_k_finished_is_rejected_and_named(seed):
    ok, text = run("ch02.beam_search", beam_stop_at_k, seed)
    assert not ok and "凑够k个完成的输出就停了" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_with_finished_outputs_kept_in_the_beam_passes(seed):
    ok, text = run("ch02.beam_search", beam_finished_stay, seed)
    assert ok, text


def test_beam_private_search_is_ruled_out_by_name():
    ok, text = run("ch02.beam_search", beam_private_search)
    assert not ok and "不许" in text and "_search" in text, text
