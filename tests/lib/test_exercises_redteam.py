"""attnbook.exercises against the round-4 red team (shared/reviews/round4/rev4-exercises.md,
rev4-learner.md): the wrong answers it found accepted are rejected on several seeds, the
shortcuts are ruled out by name, and correct-but-unusual answers stay accepted."""
import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook.exercises import check

NEG_INF = float("-inf")
SEEDS = (0, 1, 2, 3)


def run(name, fn, seed=0):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, seed=seed)
    return bool(ok), buf.getvalue()


def _sm(s):
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


def _attn_masked(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, NEG_INF)
    return _sm(s) @ v


# --------------------------------------------------------------------------- wrong answers
def lp_one_hot(logits, tokens):
    return (logits.log_softmax(-1) * F.one_hot(tokens)).sum()


def lp_log_softmax_naive(logits, tokens):
    return torch.log(logits.softmax(-1)).gather(-1, tokens[:, None]).sum()


def ctx_global_max(scores, H, mask):
    s = scores.masked_fill(~mask, NEG_INF)
    e = torch.exp(s - s.max())
    return e / e.sum(-1, keepdim=True) @ H


def ms_global_max(scores, mask):
    s = scores.masked_fill(~mask, NEG_INF)
    m = s[torch.isfinite(s)].max()
    e = torch.exp(s - m)
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


def ms_max_before_mask(scores, mask):
    m = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - m) * mask
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


def ca_len_q(q, k, v):
    tq, tk = len(q), k.shape[-2]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    return _attn_masked(q, k, v, mask)


def ff_relu6(x, w1, b1, w2, b2):
    return F.relu6(x @ w1 + b1) @ w2 + b2


def os_m_zero(x, block):
    m = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    l = torch.zeros_like(m)
    for j in range(0, x.shape[-1], block):
        xb = x[..., j:j + block]
        mn = torch.maximum(m, xb.amax(-1, keepdim=True))
        l = torch.exp(m - mn) * l + torch.exp(xb - mn).sum(-1, keepdim=True)
        m = mn
    return torch.exp(x - m) / l.masked_fill(l == 0, 1.0)


def ln_default_eps(x, weight, bias, eps=1e-12):
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def rms_default_eps(x, weight, eps=1e-12):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def mp_lse_zero(o1, lse1, o2, lse2):  # lse = 0 instead of -inf for fully masked rows
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    o = torch.exp(lse1 - safe)[..., None] * o1 + torch.exp(lse2 - safe)[..., None] * o2
    return o, safe


def kv_top_left(q, k_new, v_new, k_cache, v_cache):  # tril() on the n x (t + n) scores
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    n, t_all = q.shape[-2], k_all.shape[-2]
    mask = torch.ones(n, t_all, dtype=torch.bool).tril()
    return _attn_masked(q, k_all, v_all, mask), k_all, v_all


def kv_sdpa_causal(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    n, t_all = q.shape[-2], k_all.shape[-2]
    mask = torch.ones(n, t_all, dtype=torch.bool).tril()
    w = _sm((q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, NEG_INF))
    return w @ v_all, k_all, v_all


def ctx_inverted(scores, H, mask):
    return _sm(scores.masked_fill(mask, NEG_INF)) @ H


WRONG = [
    ("ch02.sequence_logprob", lp_one_hot, None),
    ("ch02.sequence_logprob", lp_log_softmax_naive, None),
    ("ch03.context", ctx_global_max, None),
    ("ch03.context", ctx_inverted, "掩码的含义反了"),
    ("ch04.masked_softmax", ms_global_max, None),
    ("ch04.masked_softmax", ms_max_before_mask, None),
    ("ch04.causal_attention", ca_len_q, None),
    ("ch07.feed_forward", ff_relu6, None),
    ("ch09.online_softmax", os_m_zero, None),
    ("ch08.layer_norm", ln_default_eps, "eps"),
    ("ch08.rms_norm", rms_default_eps, "eps"),
    ("ch09.merge_partial", mp_lse_zero, "−inf"),
    ("ch11.kv_step", kv_top_left, "右下对齐"),
    ("ch11.kv_step", kv_sdpa_causal, "is_causal=True"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,fn,word", WRONG, ids=lambda x: getattr(x, "__name__", str(x)))
def test_the_wrong_answers_the_red_team_saw_accepted_are_rejected(name, fn, word, seed):
    ok, text = run(name, fn, seed)
    assert not ok, f"{name}: {fn.__name__} accepted at seed {seed}"
    if word is not None:
        assert word in text, text
