"""Chapter 11's exercise ``ch11.kv_step``: one step of attention with a key/value cache.

The reader writes ``kv_step(q, k_new, v_new, k_cache, v_cache)``: the cache holds the keys and
values of the t earlier positions ``(B, H, t, d_k)``; ``q, k_new, v_new`` ``(B, H, n, d_k)``
belong to the n new positions t, ..., t + n - 1. Append the new keys and values to the cache,
then let new query i attend to keys 0 .. t + i (causal), with the scale 1 / sqrt(d_k); return
``(out, k_all, v_all)``. The classic bugs attend before appending (the new token cannot see
itself), forget the causal mask among the new positions (harmless only for n = 1), keep only
the new keys (the cache is thrown away), append the values in the wrong order, or drop the
scale.
"""
from __future__ import annotations

import math

import torch

from ._report import close
from ._core import Case, Exercise, register

OUT, K, V = "out", "k_all", "v_all"


def kv_step(q, k_new, v_new, k_cache, v_cache):
    """Append the new keys/values, then causal attention of the new queries (chapter 11)."""
    return _variant(q, k_new, v_new, k_cache, v_cache)


def _variant(q, k_new, v_new, k_cache, v_cache, *, append_first=True, causal=True,
             keep_cache=True, v_order="cache_first", scale=True, top_left=False):
    k_all = torch.cat([k_cache, k_new], -2) if keep_cache else k_new       # (B, H, t + n, d)
    v_all = (torch.cat([v_cache, v_new], -2) if v_order == "cache_first"
             else torch.cat([v_new, v_cache], -2)) if keep_cache else v_new
    k_seen, v_seen = (k_all, v_all) if append_first else (k_cache, v_cache)
    s = q @ k_seen.transpose(-2, -1)                                      # (B, H, n, T)
    if scale:
        s = s / math.sqrt(q.shape[-1])
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
    return [
        Case("生成时的一步：1 个新位置", _tensors(g, 2, 2, 5, 1, 4),
             note="缓存里有 5 个位置，新来 1 个：新查询看全部 6 个键（包括它自己的）。",
             tags=frozenset({"one"})),
        Case("一次读入 3 个新位置（读提示词）", _tensors(g, 1, 2, 4, 3, 4),
             note="缓存 4 个位置，新来 3 个：第 i 个新查询只看位置 0 … 4 + i（因果）。",
             tags=frozenset({"many"})),
        Case("d_k = 16", _tensors(g, 1, 3, 3, 2, 16),
             note="d_k = 16：分数要除以 √16 = 4。", tags=frozenset({"scale"})),
    ]


MESSAGES = {
    "attends_before_appending": "先把新的键和值追加进缓存，再做注意力：新位置要能看到它自己的键。",
    "no_causal_mask_among_new": ("一次来多个新位置时，它们之间也要因果掩码：第 i 个新查询在位置 "
                                 "t + i，只能看键 0 … t + i，看不到排在它后面的新位置。"),
    "cache_thrown_away": "k_all / v_all 要包含缓存里的：torch.cat([k_cache, k_new], dim=-2)。",
    "values_appended_in_front": "v_all 的顺序要和 k_all 一致：先缓存里的，再新的。",
    "no_scale": "分数要除以 √d_k。",
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
                  is_stub=_is_stub))
