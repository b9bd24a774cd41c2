"""Chapter 05's build exercise ``ch05.multi_head_attention``: multi-head attention from one-head
pieces, with explicit weights.

``ch05.multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None)``: queries
from ``x (B, Tq, d_model)``; keys and values from ``memory (B, Tk, d_mem)`` when it is given
(cross-attention), else from ``x`` (self-attention). Row-vector weights ``W_q (d_model,
d_model)``, ``W_k``, ``W_v (d_kv, d_model)`` (``d_kv`` = the width of what keys and values come
from), ``W_o (d_model, d_model)``, no biases. ``mask (B, Tq, Tk)`` bool, True = may attend, the
same for every head; every query may attend at least one key. Head i uses feature block
``[i d_k, (i+1) d_k)`` of each projection, ``d_k = d_model / n_heads``, scale ``1/sqrt(d_k)``;
the heads' outputs are concatenated in order and multiplied by ``W_o``: ``(B, Tq, d_model)``
(chapter 05, eq-ch05-multihead).

The hidden cases vary B, Tq, Tk, H and d_model with the seed; they leave ``mask`` and
``memory`` at their defaults once, include cross-attention with Tq != Tk and d_mem != d_model,
and a case with B == H (a mask not given its head axis then broadcasts over the wrong axis
without an error).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..cache import CachedAttention
from ..multihead import MultiHeadAttention
from ..multihead import merge_heads as _lib_merge_heads
from ..multihead import split_heads as _lib_split_heads
from ..reference import attention_ref as _lib_attention_ref
from ._core import Case, Exercise, register
from ._report import close
from .heads import merge_heads as _ex_merge
from .heads import split_heads as _ex_split


def multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    """Multi-head attention with explicit weights (chapter 05): ``(B, Tq, d_model)``."""
    kv = x if memory is None else memory
    q = _lib_split_heads(x @ W_q, n_heads)
    k = _lib_split_heads(kv @ W_k, n_heads)
    v = _lib_split_heads(kv @ W_v, n_heads)
    m = None if mask is None else mask[:, None]                          # (B, 1, Tq, Tk)
    return _lib_merge_heads(_lib_attention_ref(q, k, v, mask=m).out) @ W_o


# --------------------------------------------------------------------------- the gallery
def _split(t, h):
    b, n, d = t.shape
    return t.reshape(b, n, h, d // h).transpose(1, 2)


def _merge(o):
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


def _heads(x, W_q, W_k, W_v, n_heads, memory, split=_split):
    kv = x if memory is None else memory
    return split(x @ W_q, n_heads), split(kv @ W_k, n_heads), split(kv @ W_v, n_heads)


def _softmax(scores, mask, dim=-1):
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.softmax(scores, dim)


def _attend(q, k, v, mask, scale=None, dim=-1):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _softmax(q @ k.transpose(-2, -1) * scale, mask, dim) @ v


def _strided_split(t, h):
    b, n, d = t.shape
    return t.reshape(b, n, d // h, h).permute(0, 3, 1, 2)               # head i: every H-th


def _strided(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory, _strided_split)
    o = _attend(q, k, v, mask)
    b, h, n, d = o.shape
    return o.permute(0, 2, 3, 1).reshape(b, n, d * h) @ W_o             # its inverse


def _scale_d_model(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    return _merge(_attend(q, k, v, mask, scale=1 / math.sqrt(x.shape[-1]))) @ W_o


def _merge_no_transpose(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    o = _attend(q, k, v, mask)
    b, h, n, d = o.shape
    return o.reshape(b, n, h * d) @ W_o                                 # tokens mixed


def _no_w_o(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    return _merge(_attend(q, k, v, mask))


def _one_softmax(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask[:, None], float("-inf"))
    b, h, tq, tk = s.shape
    p = torch.softmax(s.transpose(1, 2).reshape(b, tq, h * tk), -1)    # all heads at once
    p = p.reshape(b, tq, h, tk).transpose(1, 2)
    return _merge(p @ v) @ W_o


def _over_queries(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    return _merge(_attend(q, k, v, mask, dim=-2).nan_to_num(0.0)) @ W_o


def _mask_no_head_axis(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    q, k, v = _heads(x, W_q, W_k, W_v, n_heads, memory)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))          # (B, Tq, Tk) against (B, H, Tq, Tk)
    return _merge(torch.softmax(s, -1).nan_to_num(0.0) @ v) @ W_o


def _memory_ignored(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
    return multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=mask)  # keys from x


BUGS = {
    "strided_heads": _strided,
    "scaled_by_sqrt_d_model": _scale_d_model,
    "merge_without_transpose": _merge_no_transpose,
    "output_projection_forgotten": _no_w_o,
    "one_softmax_over_all_heads": _one_softmax,
    "softmax_over_queries": _over_queries,
    "mask_without_head_axis": _mask_no_head_axis,
    "memory_ignored": _memory_ignored,
}


# --------------------------------------------------------------------------- hidden cases
def _cases(g):
    def r(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    def pick(options):
        return options[int(torch.randint(0, len(options), (1,), generator=g))]

    def weights(d_model, d_kv):
        s_in, s_kv = d_model ** -0.5, d_kv ** -0.5
        return (r(d_model, d_model, scale=2 * s_in), r(d_kv, d_model, scale=2 * s_kv),
                r(d_kv, d_model, scale=s_kv), r(d_model, d_model, scale=s_in))

    def mask(b, tq, tk):
        m = torch.rand(b, tq, tk, generator=g) < 0.6
        m[..., int(torch.randint(0, tk, (1,), generator=g))] = True     # never a full row
        return m

    cases = []
    h, d_k = pick([2, 3]), pick([2, 3])
    b, t = pick([2, 3]), pick([4, 5])
    d = h * d_k
    cases.append(Case("自注意力，不传 mask 和 memory", (r(b, t, d), *weights(d, d), h),
                      note=f"B = {b}，T = {t}，H = {h}，d_model = {d}（d_k = {d_k}）；"
                           "mask 和 memory 都用默认值 None。"))
    h, d_k = pick([3, 4]), pick([2, 4])
    b, t = pick([2, 5]), pick([5, 6])
    d = h * d_k
    cases.append(Case("自注意力，带掩码", (r(b, t, d), *weights(d, d), h),
                      {"mask": mask(b, t, t)},
                      note=f"B = {b}，T = {t}，H = {h}，d_model = {d}；mask (B, T, T) 每个"
                           "查询至少能看一个键，对所有头相同。", tags=frozenset({"mask"})))
    h, d_k = pick([2, 4]), pick([3, 2])
    b, tq, tk = pick([1, 3]), pick([2, 3]), pick([5, 6])
    d, d_mem = h * d_k, pick([5, 7])
    cases.append(Case("交叉注意力：Tq ≠ Tk，d_mem ≠ d_model", (r(b, tq, d), *weights(d, d_mem), h),
                      {"mask": mask(b, tq, tk), "memory": r(b, tk, d_mem)},
                      note=f"B = {b}，Tq = {tq}，Tk = {tk}，H = {h}，d_model = {d}；"
                           f"memory (B, {tk}, {d_mem})：键和值来自 memory，W_k、W_v 是 "
                           f"({d_mem}, {d})。", tags=frozenset({"mask", "cross"})))
    h = pick([2, 3])
    d, t = 2 * h, pick([3, 4])
    cases.append(Case("B = H，各句的掩码不同", (r(h, t, d), *weights(d, d), h),
                      {"mask": mask(h, t, t)},
                      note=f"B = H = {h}，T = {t}，d_model = {d}：掩码不插入头这一维时，"
                           "广播会把批的第 b 句的掩码错配给第 b 个头，而且不报错。",
                      tags=frozenset({"mask", "b_is_h"})))
    h = pick([4, 6])
    b, t, d = 2, pick([3, 5]), 4 * h
    cases.append(Case("头数多、d_model 大，分数较大", (r(b, t, d, scale=3.0), *weights(d, d), h),
                      note=f"B = {b}，T = {t}，H = {h}，d_model = {d}：按 √d_model 缩放与按"
                           " √d_k 缩放相差一倍。"))
    return cases


# --------------------------------------------------------------------------- hints
def _args(f):
    i = f.inputs
    return ((i["x"], i["W_q"], i["W_k"], i["W_v"], i["W_o"], i["n_heads"]),
            {"mask": i.get("mask"), "memory": i.get("memory")})


def _raises_like(f, bug) -> bool:
    args, kwargs = _args(f)
    try:
        bug(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return type(e) is type(f.exc) and str(e) == str(f.exc)
    return False


MEMORY = ("交叉注意力：传入 memory 时，键和值来自 memory（memory @ W_k、memory @ W_v），"
          "查询仍来自 x；memory 为 None 时才用 x 自己（自注意力）。")
HEAD_AXIS = ("掩码 (B, Tq, Tk) 要先插入头这一维，mask[:, None] 是 (B, 1, Tq, Tk)，才能对"
             "所有头广播；直接与 (B, H, Tq, Tk) 的分数对齐，会把批这一维对到头这一维上。")


def _hint(f):
    if f.kind == "exception":
        if _raises_like(f, _mask_no_head_axis):
            return HEAD_AXIS
        if _raises_like(f, _memory_ignored) or "cross" in f.case.tags and "mat" in str(f.exc):
            return MEMORY
        return None
    if f.kind == "shape":
        got, want = tuple(f.got.shape), tuple(f.expected.shape)
        if len(got) == 4:
            return ("返回的还是各头分开的 (B, H, Tq, d_k)：要把各头拼接回 (B, Tq, d_model)，"
                    "再乘 W_o。")
        if "cross" in f.case.tags and got[1] != want[1]:
            return "输出的长度应是查询的个数 Tq（x 的长度），不是键的个数 Tk。"
        return None
    if f.kind not in ("value", "nan"):
        return None
    args, kwargs = _args(f)
    for bug, text in (
            (_strided, "第 i 个头应取连续的第 i 块特征 [i·d_k, (i+1)·d_k)，而不是每隔 H 个取一个："
                       "reshape 成 (B, T, H, d_k)，不是 (B, T, d_k, H)。"),
            (_scale_d_model, "缩放因子用错了：每个头的分数除以 √d_k（d_k = d_model / H，"
                             "每个头的宽度），不是 √d_model。"),
            (_merge_no_transpose, "拼接前没有把头这一维移回去：(B, H, Tq, d_k) 要先 "
                                  "transpose(1, 2) 成 (B, Tq, H, d_k) 再 reshape，否则不同"
                                  "词元的输出混在一起。"),
            (_no_w_o, "少了输出投影：拼接各头之后还要乘 W_o，各头的结果才在这里混合。"),
            (_one_softmax, "每个头各做自己的 softmax（在 Tk 个键上，dim=-1）：把所有头的分数"
                           "放在一起做一次 softmax，各头的权重之和就不再各为 1。"),
            (_over_queries, "softmax 沿错了维度：每个查询在 Tk 个键上归一化，dim=-1。"),
            (_mask_no_head_axis, HEAD_AXIS),
            (_memory_ignored, MEMORY)):
        if close(f.got, bug(*args, **kwargs)):
            return text
    if "mask" in f.case.tags and close(f.got, multi_head_attention(*args, memory=kwargs["memory"])):
        return "掩码没有用上：分数在 softmax 之前把 mask 为 False 的位置置为 −inf。"
    return ("对照这一例，一个头一个头地算：Q_i = (x W_q) 的第 i 个列块，K_i、V_i 同理；"
            "head_i = softmax(Q_i K_iᵀ / √d_k) V_i；拼接后乘 W_o。")


FORBIDDEN = (
    (MultiHeadAttention.forward, "attnbook.MultiHeadAttention"),
    (CachedAttention.forward, "attnbook.cache.CachedAttention"),
    (_lib_split_heads, "attnbook.multihead.split_heads"),
    (_lib_merge_heads, "attnbook.multihead.merge_heads"),
    (_ex_split, "exercises.get('ch05.split_heads').solution"),
    (_ex_merge, "exercises.get('ch05.merge_heads').solution"),
    (F.multi_head_attention_forward, "F.multi_head_attention_forward"),
    (nn.MultiheadAttention.forward, "nn.MultiheadAttention"),
)

register(Exercise("ch05.multi_head_attention", "从单头拼出多头注意力", multi_head_attention,
                  BUGS, _cases, (_hint,), forbidden=FORBIDDEN, build=True))
