"""Chapter 11's exercise ``ch11.kv_step``: one step of attention with a key/value cache.

The reader writes ``kv_step(q, k_new, v_new, k_cache, v_cache)``: the cache holds the keys and
values of the t earlier positions ``(B, H, t, d_k)``; ``q, k_new, v_new`` ``(B, H, n, d_k)``
belong to the n new positions t, ..., t + n - 1. Append the new keys and values to the cache,
then let new query i attend to keys 0 .. t + i (causal), with the scale 1 / sqrt(d_k); return
``(out, k_all, v_all)``. The classic bugs attend before appending (the new token cannot see
itself), forget the causal mask among the new positions (harmless only for n = 1), keep only
the new keys (the cache is thrown away), append the values in the wrong order, drop the
scale or divide by d_k instead of sqrt(d_k), or align the causal mask top-left (``tril()`` on
the n x (t + n) scores, SDPA's ``is_causal=True``). A build exercise: the append, the
bottom-right causal mask, the scaled scores and the softmax are the steps.
"""
from __future__ import annotations


import torch

from ._report import close
from ._core import Case, Exercise, register

OUT, K, V = "out", "k_all", "v_all"


def kv_step(q, k_new, v_new, k_cache, v_cache):
    """Append the new keys/values, then causal attention of the new queries (chapter 11)."""
    return _variant(q, k_new, v_new, k_cache, v_cache)


def _variant(q, k_new, v_new, k_cache, v_cache, *, append_first=True, causal=True,
             keep_cache=True, v_order="cache_first", scale=True, top_left=False,
             scale_power=0.5):
    k_all = torch.cat([k_cache, k_new], -2) if keep_cache else k_new       # (B, H, t + n, d)
    v_all = (torch.cat([v_cache, v_new], -2) if v_order == "cache_first"
             else torch.cat([v_new, v_cache], -2)) if keep_cache else v_new
    k_seen, v_seen = (k_all, v_all) if append_first else (k_cache, v_cache)
    s = q @ k_seen.transpose(-2, -1)                                      # (B, H, n, T)
    if scale:
        s = s / q.shape[-1] ** scale_power
    n, tk = q.shape[-2], k_seen.shape[-2]
    if causal and append_first:                       # query i at position tk - n + i
        allowed = torch.ones(n, tk, dtype=torch.bool).tril(0 if top_left else tk - n)
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1) @ v_seen, k_all, v_all


BUGS = {
    "attends_before_appending": lambda *a: _variant(*a, append_first=False),
    "no_causal_mask_among_new": lambda *a: _variant(*a, causal=False),
    "cache_thrown_away": lambda *a: _variant(*a, keep_cache=False),
    "values_appended_in_front": lambda *a: _variant(*a, v_order="new_first"),
    "no_scale": lambda *a: _variant(*a, scale=False),
    "top_left_causal_mask": lambda *a: _variant(*a, top_left=True),
    "scale_one_over_d_k": lambda *a: _variant(*a, scale_power=1.0),
}


def _run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 3:
        return ret, dict(zip((OUT, K, V), ret))
    return ret, {OUT: ret}


def _is_stub(ret, outputs, case):
    return ret is None or ret is NotImplemented


def _tensors(g, b, h, t, n, d):
    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    return r(b, h, n, d), r(b, h, n, d), r(b, h, n, d), r(b, h, t, d), r(b, h, t, d)


def _cases(g):
    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    b, h, t, n, d = ri(2, 5), ri(1, 4), ri(2, 9), ri(2, 6), 2 ** ri(2, 5)
    while n == b:                                           # B != n, n != t + n
        n = ri(2, 6)
    sharp = list(_tensors(g, b, h, t, n, d))
    sharp[0] = sharp[0] * float(torch.empty(1).uniform_(2.0, 6.0, generator=g))  # peaked rows
    sharp[2] = sharp[2] * torch.logspace(-2, 2, b, dtype=torch.float64)[:, None, None, None]
    t1, t2, n2 = ri(3, 9), ri(2, 7), ri(2, 5)                  # vary with the seed too
    return [
        Case("生成时的一步：1 个新位置", _tensors(g, 2, 2, t1, 1, 4),
             note=f"缓存里有 {t1} 个位置，新来 1 个：新查询看全部 {t1 + 1} 个键（包括它自己的）。",
             tags=frozenset({"one"})),
        Case(f"一次读入 {n2} 个新位置（读提示词）", _tensors(g, 1, 2, t2, n2, 4),
             note=f"缓存 {t2} 个位置，新来 {n2} 个：第 i 个新查询只看位置 0 … {t2} + i（因果）。",
             tags=frozenset({"many"})),
        Case("d_k = 16", _tensors(g, 1, 3, 3, 2, 16),
             note="d_k = 16：分数要除以 √16 = 4。", tags=frozenset({"scale"})),
        Case("缓存是空的（t = 0）：读入提示词的第一步", _tensors(g, 2, 2, 0, 4, 8),
             note="k_cache 的形状是 (2, 2, 0, 8)：这一步就是普通的因果自注意力。"),
        Case(f"B = {b}、{h} 个头、缓存 t = {t}、新来 n = {n} 个、d_k = {d}；查询放大了，"
             "各句的值尺度从 0.01 倍到 100 倍", tuple(sharp),
             note="softmax 很尖：因果掩码的对齐错一位，结果就差得很远。",
             tags=frozenset({"many", "scale"})),
    ]


MESSAGES = {
    "attends_before_appending": ("新位置要能看到它自己的键：先把新的键和值追加进缓存，再做注意力；"
                                 "掩码也不能挡住它自己（第 i 个新查询看键 0 … t + i，"
                                 "包括 t + i）。"),
    "no_causal_mask_among_new": ("一次来多个新位置时，它们之间也要因果掩码：第 i 个新查询在位置 "
                                 "t + i，只能看键 0 … t + i，看不到排在它后面的新位置。"),
    "cache_thrown_away": "k_all / v_all 要包含缓存里的：torch.cat([k_cache, k_new], dim=-2)。",
    "values_appended_in_front": "v_all 的顺序要和 k_all 一致：先缓存里的，再新的。",
    "no_scale": "分数要除以 √d_k。",
    "scale_one_over_d_k": "分数除以了 d_k：缩放是 1/√d_k（d_k 的平方根），不是 1/d_k。",
    "top_left_causal_mask": ("你的因果掩码是左上角对齐的（torch.ones(n, t + n).tril()，也就是 SDPA 的 "
                             "is_causal=True）：新查询 i 在位置 t + i，要右下对齐，看键 0 … t + i："
                             "tril(diagonal=t)。"),
}


def _hint(f):
    if f.kind == "shape" and f.label == OUT:
        return "输出应是 (B, H, n, d_k)：每个新查询一行。"
    if f.kind == "shape":
        return "k_all / v_all 应是 (B, H, t + n, d_k)：把新的键和值接在缓存后面（沿倒数第二维）。"
    if f.kind != "value":
        return None
    args = [f.inputs[k] for k in ("q", "k_new", "v_new", "k_cache", "v_cache")]
    for name, bug in BUGS.items():                     # which classic bug gives this output?
        out = dict(zip((OUT, K, V), bug(*args)))[f.label]
        if close(f.got, out, rtol=1e-9, atol=1e-9):
            return MESSAGES[name]
    return None


register(Exercise("ch11.kv_step", "键值缓存的一步", kv_step, BUGS, _cases, (_hint,), run=_run,
                  is_stub=_is_stub, build=True))
