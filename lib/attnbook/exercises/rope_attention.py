"""Chapter 06's build exercise ``ch06.rope_attention``: RoPE applied inside attention.

The queries are turned by their own positions ``q_pos`` and the keys by theirs (``k_pos``), the
values not at all; then the scaled scores, the softmax over the keys and the weighted sum of the
values (chapter 06, eq-ch06-rope). Because ``R_m^T R_n = R_{n-m}``, the scores depend on the
positions only through ``n - m``: the second hidden case is the first one with every position
shifted by the same large offset, and its right answer is the same output. The decoding case
(``Tq < Tk``, queries at the end, ``B != Tq``) needs each side's own positions. The classic bugs
rotate only the queries, turn the keys the other way, rotate the values too, rotate the keys by
the queries' positions, ignore the given positions (0 .. T-1 instead), turn the queries by the
last key positions instead of ``q_pos`` (the last case has its queries in the middle) or leave
out 1/sqrt(D).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import dispatch, flash, reference
from ..positional import apply_rope
from ._core import Case, Exercise, register
from ._report import nearest
from .rope import rope as _rope_solution


def rope_attention(q, k, v, q_pos, k_pos):
    """softmax((q R_{q_pos}^T)(k R_{k_pos}^T)^T / sqrt(D)) v: interleaved RoPE on q and k
    (chapter 06, eq-ch06-rope), none on v; no mask."""
    qr, kr = apply_rope(q, q_pos), apply_rope(k, k_pos)
    return reference.attention_ref(qr, kr, v).out


def _attend(q, k, v, scale=True):
    s = q @ k.transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def _only_q(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, q_pos), k, v)


def _k_backwards(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, q_pos), apply_rope(k, -k_pos), v)


def _v_rotated(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, q_pos), apply_rope(k, k_pos), apply_rope(v, k_pos))


def _k_by_q_pos(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, q_pos), apply_rope(k, q_pos), v)


def _positions_ignored(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, torch.arange(q.shape[-2])),
                   apply_rope(k, torch.arange(k.shape[-2])), v)


def _q_at_the_end(q, k, v, q_pos, k_pos):    # q_pos unused: queries assumed to be the last keys
    return _attend(apply_rope(q, k_pos[-q.shape[-2]:]), apply_rope(k, k_pos), v)


def _no_scaling(q, k, v, q_pos, k_pos):
    return _attend(apply_rope(q, q_pos), apply_rope(k, k_pos), v, scale=False)


BUGS = {
    "only_q_rotated": _only_q,
    "k_rotated_the_other_way": _k_backwards,
    "v_rotated_too": _v_rotated,
    "k_rotated_by_query_positions": _k_by_q_pos,
    "positions_ignored": _positions_ignored,
    "q_assumed_at_the_end": _q_at_the_end,
    "no_scaling": _no_scaling,
}

_TEXTS = {
    "only_q_rotated": ("k 也要按它自己的位置旋转：只转 q 时，分数依赖查询的绝对位置 m，不只依赖 n − m"
                       "（把所有位置平移同一个数，结果就变了）。"),
    "k_rotated_the_other_way": ("k 要和 q 朝同一个方向转（第 i 对转过 +n·θ_i）：方向相反时，分数依赖"
                                " m + n，而不是 n − m。"),
    "v_rotated_too": "RoPE 只旋转 q 和 k，不旋转 v：位置只应进入分数，值原样加权求和。",
    "k_rotated_by_query_positions": ("k 要按 k_pos 旋转，q 按 q_pos 旋转：两者的位置不一样"
                                     "（解码时查询在序列末尾）。"),
    "positions_ignored": ("要用传入的 q_pos 和 k_pos：第 t 个查询的位置是 q_pos[t]，不一定是 t"
                          "（解码时新查询在序列的末尾）。"),
    "q_assumed_at_the_end": ("q 要按传入的 q_pos 旋转：查询不一定排在键的末尾（这一例的查询在"
                             "中间的位置），不能用 k_pos 的最后几个代替 q_pos。"),
    "no_scaling": "分数要除以 √D（D = q.shape[-1]）：旋转不改变向量的长度，缩放照旧。",
}


def _randn(g, *shape, scale=1.0):
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def _cases(g):
    t = 4 + int(torch.randint(0, 3, (1,), generator=g))
    shift = int(torch.randint(100, 5000, (1,), generator=g))
    q, k, v = _randn(g, t, 8), _randn(g, t, 8), _randn(g, t, 6)
    pos = torch.arange(t)
    b = 3 + int(torch.randint(0, 2, (1,), generator=g))
    scale = float(2.0 ** int(torch.randint(0, 3, (1,), generator=g)))
    gaps = torch.randint(1, 50, (6,), generator=g).cumsum(0)
    tk_mid = 7 + int(torch.randint(0, 3, (1,), generator=g))
    q_mid = torch.randperm(tk_mid - 2, generator=g)[:3].sort().values   # never the last 3 keys
    return [
        Case(f"自注意力，位置 0…{t - 1}", (q, k, v, pos, pos),
             note=f"T = {t}，D = 8（四对），d_v = 6；q_pos = k_pos = 0…{t - 1}。"),
        Case(f"同一组输入，所有位置都加上 {shift}",
             (q.clone(), k.clone(), v.clone(), pos + shift, pos + shift),
             note="分数只通过 n − m 依赖位置，所以结果应与上一例完全相同。",
             tags=frozenset({"shifted"})),
        Case("逐步解码：2 个新查询在 7 个键的末尾，批和多头",
             (_randn(g, b, 2, 2, 16, scale=scale), _randn(g, b, 2, 7, 16, scale=scale),
              _randn(g, b, 2, 7, 4), torch.tensor([5, 6]), torch.arange(7)),
             note=f"(B, H) = ({b}, 2)，Tq = 2，Tk = 7，D = 16：q_pos = [5, 6]，k_pos = 0…6；"
                  f"q、k 的尺度是 {scale:g}。", tags=frozenset({"decode"})),
        Case("位置不连续，数值很大",
             (_randn(g, 2, 6, 12), _randn(g, 2, 6, 12), _randn(g, 2, 6, 2), gaps, gaps),
             note=f"q_pos = k_pos = {gaps.tolist()}（例如几段打包在一起的序列）。"),
        Case("单精度（float32）",
             (_randn(g, 3, 5, 32).float(), _randn(g, 3, 9, 32).float(),
              _randn(g, 3, 9, 8).float(), torch.arange(4, 9), torch.arange(9)),
             note="Tq = 5，Tk = 9，D = 32：q_pos = 4…8，k_pos = 0…8；返回 float32。"),
        Case("查询在中间的位置（不在键的末尾）",
             (_randn(g, b, 3, 12), _randn(g, b, tk_mid, 12), _randn(g, b, tk_mid, 5),
              q_mid, torch.arange(tk_mid)),
             note=f"B = {b}，Tq = 3，Tk = {tk_mid}：q_pos = {q_mid.tolist()}，k_pos = 0…{tk_mid - 1}"
                  "（例如双向编码器只取几个位置的输出）。", tags=frozenset({"middle"})),
    ]


def _hint(f):
    x = f.inputs
    if f.kind == "exception":
        tq, tk = x["q"].shape[-2], x["k"].shape[-2]
        if tq != tk and "decode" in f.case.tags:
            return (f"这一例 Tq = {tq}，Tk = {tk}，查询和键的长度不同：q 按 q_pos（{tq} 个位置）"
                    f"旋转，k 按 k_pos（{tk} 个位置）旋转，分数的形状是 (…, {tq}, {tk})。")
        return None
    if f.kind != "value":
        return None
    args = (x["q"], x["k"], x["v"], x["q_pos"], x["k_pos"])
    alts = []
    for name, bug in BUGS.items():
        try:
            alts.append((_TEXTS[name], bug(*args)))
        except Exception:  # noqa: BLE001  (a bug that cannot run on this case)
            continue
    return nearest(f.got, f.expected, alts)


register(Exercise(
    "ch06.rope_attention", "注意力里的 RoPE", rope_attention, BUGS, _cases, (_hint,),
    forbidden=((reference.attention_ref, "attnbook.attention_ref"),
               (dispatch.attention, "attnbook.attention"),
               (flash.attention_tiled, "attnbook.flash.attention_tiled"),
               (F.scaled_dot_product_attention, "F.scaled_dot_product_attention"),
               (F.multi_head_attention_forward, "F.multi_head_attention_forward"),
               (_rope_solution, "exercises.get('ch06.rope').solution")),
    build=True))
