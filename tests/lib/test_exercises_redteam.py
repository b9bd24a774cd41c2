"""attnbook.exercises against the round-4 red team (shared/reviews/round4/rev4-exercises.md,
rev4-learner.md): the wrong answers it found accepted are rejected on several seeds, the
shortcuts are ruled out by name, and correct-but-unusual answers stay accepted."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook.exercises import check
from exercise_run import run

NEG_INF = float("-inf")
SEEDS = (0, 1, 2, 3)


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


def os_m_zero(x_blocks):  # the running max started at 0 (one pass over the streamed blocks)
    m = l = None
    for xb in x_blocks:
        if m is None:
            m = torch.zeros(xb.shape[:-1], dtype=xb.dtype)
            l = torch.zeros_like(m)
        mn = torch.maximum(m, xb.amax(-1))
        l = torch.exp(m - mn) * l + torch.exp(xb - mn[..., None]).sum(-1)
        m = mn
    return m, l


def _os_stats_of(blocks):  # the row's max over all blocks, then the sum: two passes
    m = None
    for xb in blocks:
        m = xb.amax(-1) if m is None else torch.maximum(m, xb.amax(-1))
    safe = m.masked_fill(torch.isneginf(m), 0.0)
    return m, sum(torch.exp(xb - safe[..., None]).sum(-1) for xb in blocks)


def os_two_pass_list(x_blocks):  # the blocks materialised into a list, then read twice
    return _os_stats_of(list(x_blocks))


def os_two_pass_reiterated(x_blocks):  # the stream itself iterated twice
    return _os_stats_of(x_blocks)


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
    ("ch09.online_softmax", os_m_zero, "−inf"),
    ("ch09.online_softmax", os_two_pass_list, "只看一遍"),
    ("ch09.online_softmax", os_two_pass_reiterated, "只能遍历一次"),
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


# --------------------------------------------------------------------------- shortcuts
def _solution_of(name):
    from attnbook import exercises
    return lambda *a, **k: exercises.get(name).solution(*a, **k)


def _autograd_backward(q, k, v, out, lse, dout, mask=None):
    with torch.enable_grad():
        q_, k_, v_ = (t.detach().clone().requires_grad_() for t in (q, k, v))
        s = q_ @ k_.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, NEG_INF)
        o = _sm(s) @ v_
        return torch.autograd.grad(o, (q_, k_, v_), dout)


def _shortcuts():
    from attnbook import masked_softmax as lib_masked_softmax
    from attnbook.positional import apply_rope
    from attnbook.sampling import filter_logits
    from attnbook import attention_ref
    from torch.nn.attention.bias import causal_lower_right
    return [
        ("ch06.rope", lambda x, positions: apply_rope(x, positions), "apply_rope"),
        ("ch11.sampling_probs", lambda logits, top_k=None, top_p=None: torch.softmax(
            filter_logits(logits, top_k=top_k, top_p=top_p), -1), "filter_logits"),
        ("ch04.masked_softmax", lambda s, m: lib_masked_softmax(s.masked_fill(~m, NEG_INF)),
         "attnbook.masked_softmax"),
        ("ch09.attention_backward", _autograd_backward, "autograd"),
        ("ch04.causal_attention", lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2])),
         "causal_lower_right"),
        ("ch04.causal_attention", lambda q, k, v: attention_ref(q, k, v, causal="bottom_right").out,
         "attention_ref(causal=…)"),
    ]


def ca_explicit_mask_sdpa(q, k, v):  # attention by SDPA, the alignment built by hand: allowed
    tq, tk = q.shape[-2], k.shape[-2]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("name,fn,word", _shortcuts(), ids=lambda x: str(x)[:30])
def test_the_shortcuts_are_ruled_out_by_name(name, fn, word):
    ok, text = run(name, fn)
    assert not ok and "不许" in text and word in text, text


def aten_attention(q, k, v, mask=None):  # torch.ops.aten below F.scaled_dot_product_attention
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0]


def aten_online_softmax(x_blocks):  # aten.logsumexp below torch.logsumexp, block by block
    m = lse = None
    for xb in x_blocks:
        lse_b = torch.ops.aten.logsumexp(xb, [-1])
        m = xb.amax(-1) if m is None else torch.maximum(m, xb.amax(-1))
        lse = lse_b if lse is None else torch.logaddexp(lse, lse_b)
    return m, torch.exp(lse - m.masked_fill(torch.isneginf(m), 0.0))


def aten_layer_norm(x, weight, bias, eps=1e-5):  # aten.native_layer_norm below F.layer_norm
    return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)[0]


@pytest.mark.parametrize("name,fn,word", [
    ("ch04.attention", aten_attention, "scaled_dot_product_attention"),
    ("ch09.online_softmax", aten_online_softmax, "logsumexp"),
    ("ch08.layer_norm", aten_layer_norm, "layer_norm")], ids=lambda x: str(x)[:30])
def test_a_shortcut_through_torch_ops_aten_is_ruled_out(name, fn, word):
    ok, text = run(name, fn)
    assert not ok and "不许" in text and word in text, text


def test_a_plain_answer_is_not_ruled_out_by_the_aten_names():  # control: the pair by hand passes
    def my_online_softmax(x_blocks):
        m = s = None
        for b in x_blocks:
            if m is None:
                m = torch.full_like(b[..., 0], -math.inf)
                s = torch.zeros_like(m)
            m_new = torch.maximum(m, b.amax(-1))
            scale = torch.where(m_new == -math.inf, 0.0, torch.exp(m - m_new))
            s = s * scale + torch.where(b == -math.inf, 0.0,
                                        torch.exp(b - m_new[..., None])).sum(-1)
            m = m_new
        return m, s
    ok, text = run("ch09.online_softmax", my_online_softmax)
    assert ok, text


@pytest.mark.parametrize("name", ["ch04.masked_softmax", "ch06.rope", "ch08.layer_norm",
                                  "ch09.merge_partial", "ch11.kv_step", "ch01.clip_grad_norm"])
def test_calling_the_exercises_own_solution_is_ruled_out(name):
    ok, text = run(name, _solution_of(name))
    assert not ok and ".solution" in text and "不许" in text, text


# --------------------------------------------------------------------------- correct, unusual
def ctx_log_mask(scores, H, mask):
    return _sm(scores + torch.log(mask.to(scores.dtype))) @ H


def ms_manual(scores, mask):
    s = scores.masked_fill(~mask, NEG_INF)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    den = e.sum(-1, keepdim=True)
    return torch.where(den > 0, e / den, torch.zeros_like(e))


def ca_positions(q, k, v):
    tq, tk = q.shape[-2], k.shape[-2]
    q_pos = torch.arange(tq)[:, None] + tk - tq
    return _attn_masked(q, k, v, torch.arange(tk)[None, :] <= q_pos)


def ff_mask(x, w1, b1, w2, b2):
    h = x @ w1 + b1
    return (h * (h > 0)) @ w2 + b2


def ln_var_mean(x, weight, bias, eps=1e-5):
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def rms_rsqrt(x, weight, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def os_python_blocks(x_blocks):  # (m, l) kept as Python lists of per-block tensors' results
    m = l = None
    for xb in x_blocks:
        if m is None:
            m = torch.full(xb.shape[:-1], NEG_INF, dtype=xb.dtype)
            l = torch.zeros_like(m)
        mn = torch.maximum(m, xb.amax(-1))
        safe = mn.masked_fill(torch.isneginf(mn), 0.0)
        l = torch.exp(m - safe) * l + torch.exp(xb - safe[..., None]).sum(-1)
        m = mn
    return [m, l]


def mp_list(o1, lse1, o2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    return [torch.exp(lse1 - safe)[..., None] * o1 + torch.exp(lse2 - safe)[..., None] * o2, lse]


def lp_ce(logits, tokens):
    return -F.cross_entropy(logits, tokens, reduction="sum")


def kv_list(q, k_new, v_new, k_cache, v_cache):
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    n, t_all = q.shape[-2], k_all.shape[-2]
    mask = torch.ones(n, t_all, dtype=torch.bool).tril(t_all - n)
    return [_attn_masked(q, k_all, v_all, mask), k_all, v_all]


UNUSUAL = [("ch03.context", ctx_log_mask), ("ch04.masked_softmax", ms_manual),
           ("ch04.causal_attention", ca_positions),
           ("ch04.causal_attention", ca_explicit_mask_sdpa), ("ch07.feed_forward", ff_mask),
           ("ch08.layer_norm", ln_var_mean), ("ch08.rms_norm", rms_rsqrt),
           ("ch09.online_softmax", os_python_blocks), ("ch09.merge_partial", mp_list),
           ("ch02.sequence_logprob", lp_ce), ("ch11.kv_step", kv_list)]


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("name,fn", UNUSUAL, ids=lambda x: getattr(x, "__name__", str(x)))
def test_correct_but_unusual_answers_stay_accepted(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert ok, text


# --------------------------------------------------------------------------- check itself
def test_the_verdict_is_a_bool_that_ipython_does_not_echo():
    from attnbook.exercises import _core
    ok = check("ch04.masked_softmax", ms_manual)
    bad = check("ch04.masked_softmax", ms_global_max)
    assert isinstance(ok, _core.Verdict) and ok and not bad
    assert ok == True and bad == False and repr(ok) == "True" and repr(bad) == "False"  # noqa: E712
    assert not any([bad, bad]) and all([ok])
    assert ok._ipython_display_() is None  # IPython calls this instead of printing a repr


def test_printed_output_is_captured_and_cut_before_the_verdict():
    def chatty(scores, mask):
        for i in range(500):
            print("line", i)
        return ms_manual(scores, mask)

    ok, text = run("ch04.masked_softmax", chatty)
    assert ok and "line 0" in text and "line 30" not in text and "一共打印了" in text
    assert text.rstrip().splitlines()[-1].startswith("✓ ")


def test_a_case_that_runs_too_long_is_stopped_and_reported(monkeypatch):
    from attnbook.exercises import _core
    monkeypatch.setattr(_core, "TIME_LIMIT", 0.5)

    def forever(scores, mask):
        try:
            while True:
                pass
        except Exception:  # the reader's catch-all does not swallow the stop
            return scores

    ok, text = run("ch04.masked_softmax", forever)
    assert not ok and "运行太久" in text


@pytest.mark.parametrize("result,word", [
    (lambda s, m: ms_manual(s, m).to_sparse(), "sparse"),
    (lambda s, m: ms_manual(s, m).to(torch.complex128), "实数"),
    (lambda s, m: [ms_manual(s, m)], "列表"),
    (lambda s, m: ms_manual(s, m).to("meta"), "meta"),
])
def test_unusual_returns_are_reported_never_raised(result, word):
    ok, text = run("ch04.masked_softmax", result)
    assert not ok and word in text, text


def test_a_missing_second_output_is_named_not_a_missing_return():
    def only_o(o1, lse1, o2, lse2):
        return mp_list(o1, lse1, o2, lse2)[0]

    ok, text = run("ch09.merge_partial", only_o)
    assert not ok and "应返回 2 个值" in text and "lse" in text and "忘了 `return`" not in text


def test_the_float32_hint_only_for_float32_sized_errors():
    def eps_squared(x, weight, bias, eps=1e-5):  # a real mistake, float64 throughout
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + eps ** 2) * weight + bias

    def in_float32(x, weight, bias, eps=1e-5):  # the right formula, float32 inside
        return ln_var_mean(x.float(), weight.float(), bias.float(), eps).double()

    ok, text = run("ch08.layer_norm", eps_squared)
    assert not ok and "float32" not in text.split("提示：")[1], text
    ok, text = run("ch08.layer_norm", in_float32)
    assert not ok and "float32" in text.split("提示：")[1], text


def test_a_bug_equal_to_the_answer_on_the_case_is_not_named():
    """ch06.rope with float32 angles: the 'positions ignored' bug equals the right answer when
    positions = arange, so it must not be the hint."""
    def rope_float32_angles(x, positions):
        d = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = (positions.float()[:, None] * theta).double()
        c, s = torch.cos(ang), torch.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)

    ok, text = run("ch06.rope", rope_float32_angles)
    assert not ok and "positions" not in text.split("提示：")[1], text


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64])
def test_decoder_mask_reports_the_dtype_actually_returned(dtype):
    def mask_in(tgt_pad):
        t = tgt_pad.shape[1]
        return (torch.ones(t, t, dtype=torch.bool).tril()[None, None]
                & tgt_pad[:, None, None, :]).to(dtype)

    ok, text = run("ch10.decoder_mask", mask_in)
    name = str(dtype).replace("torch.", "")
    assert not ok and f"应是 bool 张量" in text and f"dtype 是 {name}" in text, text
    assert "浮点" not in text


def _pe(n, d, exponent):
    p = torch.arange(n, dtype=torch.float64)[:, None]
    a = p * torch.exp(-math.log(1e4) * exponent / d)
    return torch.stack([torch.sin(a), torch.cos(a)], -1).flatten(-2)


@pytest.mark.parametrize("exponent,word", [
    (lambda d: torch.arange(0, d, 2, dtype=torch.float64) / 2, "少了那个 2"),
    (lambda d: torch.div(torch.arange(0, d, 2), d, rounding_mode="floor").double() * d,
     "整数除法"),
])
def test_sinusoidal_hints_name_the_exponent_mistake(exponent, word):
    ok, text = run("ch06.sinusoidal", lambda n, d: _pe(n, d, exponent(d)))
    assert not ok and "".join(word.split()) in "".join(text.split("提示：")[1].split()), text


def test_a_wrong_schedule_is_not_called_float32():
    def precedence(steps, d_model, warmup):  # warmup ** -3/2 = warmup^-3 / 2
        return d_model ** -0.5 * torch.minimum(steps ** -0.5, steps * warmup ** -3 / 2)

    ok, text = run("ch10.noam_lr", precedence)
    assert not ok and "float32" not in text.split("提示：")[1], text


def test_ipython_shows_no_repr_for_the_verdict():
    ipython = pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    data, _ = shell.display_formatter.format(check("ch04.masked_softmax", ms_global_max))
    assert data == {}
    data, _ = shell.display_formatter.format(False)  # control: a bare bool is shown
    assert data.get("text/plain") == "False"
    assert ipython


def test_check_restores_the_profiler_and_the_torch_function_modes():
    import sys
    from torch.overrides import _get_current_function_mode_stack

    def boom(scores, mask):
        raise RuntimeError("boom")

    marker = []
    prof = lambda frame, event, arg: marker.append(event) if False else None  # noqa: E731
    sys.setprofile(prof)
    try:
        for fn in (boom, ms_manual, _solution_of("ch04.masked_softmax")):
            run("ch04.masked_softmax", fn)
            assert sys.getprofile() is prof
    finally:
        sys.setprofile(None)
    assert _get_current_function_mode_stack() == []
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    run("ch09.attention_backward", _autograd_backward)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
