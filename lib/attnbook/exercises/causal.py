"""Chapter 04's third exercise: ``ch04.causal_attention``, the causal mask when ``Tq != Tk``.

The queries are the *last* ``Tq`` positions of a sequence whose ``Tk`` keys and values are all
there (decoding with a key-value cache, or a chunk of new tokens after a cached prefix): query
``i`` sits at position ``i + (Tk - Tq)`` and may attend key ``j`` iff ``j <= i + (Tk - Tq)``.
This is the bottom-right alignment of flash-attn >= 2.1 and of
``torch.nn.attention.bias.causal_lower_right``; SDPA's ``is_causal=True`` and the book's
``causal=True`` are top-left aligned (``j <= i``), and both agree only when ``Tq == Tk``.
With ``Tq > Tk`` the first ``Tq - Tk`` queries see no key: by the book's convention they give
zeros. The classic bugs: the top-left mask, an offset off by one either way or of the wrong
sign, the triangle inverted, NaN on the rows with no key, and the last ``Tq`` rows of a
``Tk x Tk`` mask (too few rows when ``Tq > Tk``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import attention_ref
from ._core import Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")


def bottom_right(tq, tk, offset=0, device=None):
    """Bool ``(tq, tk)``: key ``j`` visible to query ``i`` iff ``j <= i + (tk - tq) + offset``."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq + offset)


def causal_attention(q, k, v):
    """Causal attention of the last ``Tq`` positions over all ``Tk`` keys (bottom-right
    aligned, chapter 04, exercise 4): eq-ch04-attention with key j hidden from query i when
    ``j > i + Tk - Tq``; a query with no key gives 0."""
    mask = bottom_right(q.shape[-2], k.shape[-2], device=q.device)
    return attention_ref(q, k, v, mask=mask).out


def _with_mask(mask_fn, guard=True):
    """A bug: attention with the mask ``mask_fn(tq, tk)``; ``guard=False`` lets NaN through."""
    def bug(q, k, v):
        mask = mask_fn(q.shape[-2], k.shape[-2])
        if guard:
            return attention_ref(q, k, v, mask=mask).out
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, NEG_INF)
        return torch.softmax(s, dim=-1) @ v
    return bug


def _sdpa_is_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # top-left aligned


def _last_rows_of_square(q, k, v):
    tq, tk = q.shape[-2], k.shape[-2]
    mask = torch.ones(tk, tk, dtype=torch.bool).tril()[-tq:]  # only Tk rows when Tq > Tk
    return attention_ref(q, k, v, mask=mask).out


BUGS = {
    "top_left_aligned": _with_mask(lambda tq, tk: torch.ones(tq, tk, dtype=torch.bool).tril()),
    "sdpa_is_causal": _sdpa_is_causal,
    "sees_one_future_key": _with_mask(lambda tq, tk: bottom_right(tq, tk, 1)),
    "misses_its_own_key": _with_mask(lambda tq, tk: bottom_right(tq, tk, -1)),
    "offset_sign_flipped": _with_mask(lambda tq, tk: bottom_right(tq, tk, 2 * (tq - tk))),
    "triangle_inverted": _with_mask(lambda tq, tk: ~bottom_right(tq, tk)),
    "nan_on_rows_without_keys": _with_mask(bottom_right, guard=False),
    "last_rows_of_a_square_mask": _last_rows_of_square,
}


def _randn(g, *shape):
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _qkv(g, lead, tq, tk, dk, dv):
    return _randn(g, *lead, tq, dk), _randn(g, *lead, tk, dk), _randn(g, *lead, tk, dv)


def _cases(g):
    b = 3 + int(torch.randint(0, 2, (1,), generator=g))   # B never equals Tq below
    tq = 2 if b != 2 else 3
    return [
        Case("Tq = Tk（两种对齐方式相同）", _qkv(g, (), 4, 4, 3, 2),
             note="Tq = Tk = 4：这时左上对齐和右下对齐是同一个下三角。"),
        Case("逐步解码：1 个新查询，缓存里 5 个键", _qkv(g, (), 1, 5, 4, 3),
             note="Tq = 1，Tk = 5：这个查询在位置 4（从 0 数起，即最新的位置），可以关注全部 5 个键。",
             tags=frozenset({"decode"})),
        Case("一段 3 个新词元接在 2 个缓存的词元后面", _qkv(g, (), 3, 5, 4, 3),
             note="Tq = 3，Tk = 5：查询 i 在位置 i + 2，可以关注键 j ≤ i + 2。"),
        Case("批和多头", _qkv(g, (2, 3), 2, 6, 8, 5),
             note="(B, H) = (2, 3)，Tq = 2，Tk = 6：查询 i 可以关注键 j ≤ i + 4。"),
        Case("Tq > Tk：前面的查询没有键", _qkv(g, (), 5, 3, 4, 2),
             note="Tq = 5，Tk = 3：查询 i 可以关注 j ≤ i − 2，查询 0 和 1 一个键也没有（应输出 0）。",
             tags=frozenset({"more_queries"})),
        Case("批的大小和 Tq、Tk 都不同", _qkv(g, (1, 2), 3, 5, 4, 3),
             note="(B, H) = (1, 2)，Tq = 3，Tk = 5：Tq 是 q.shape[-2]，不是 len(q) 或 "
                  "q.shape[0]。", tags=frozenset({"batch"})),
        Case("三维输入，批比查询多", _qkv(g, (b,), tq, tq + 2, 4, 3),
             note=f"q 的形状 ({b}, {tq}, 4)，k 的形状 ({b}, {tq + 2}, 4)。",
             tags=frozenset({"batch"})),
    ]


def _alternatives(q, k, v):
    tq, tk = q.shape[-2], k.shape[-2]
    d = tk - tq
    return [
        ("你的掩码是左上角对齐的（查询 i 只看键 j ≤ i，也就是 SDPA 的 is_causal=True）："
         "查询是序列的最后 Tq 个位置，查询 i 在位置 i + (Tk − Tq)，应能关注 j ≤ i + (Tk − Tq)："
         f"这一例是 torch.ones(Tq, Tk).tril({d})。", BUGS["top_left_aligned"](q, k, v)),
        ("每个查询多看到了一个未来的键：tril 的偏移应是 Tk − Tq"
         f"（这一例是 {d}），不是 Tk − Tq + 1。", BUGS["sees_one_future_key"](q, k, v)),
        ("每个查询都看不到它自己所在位置的键：对角线要保留，条件是 j ≤ i + (Tk − Tq)（含等号），"
         f"偏移是 {d}，不是 {d - 1}。", BUGS["misses_its_own_key"](q, k, v)),
        (f"偏移的符号反了：应是 tril(Tk − Tq) = tril({d})，不是 tril(Tq − Tk) = tril({-d})。",
         BUGS["offset_sign_flipped"](q, k, v)),
        ("三角反了：要保留的是过去和现在的键（下三角 tril），屏蔽的是右上方的未来键。",
         BUGS["triangle_inverted"](q, k, v)),
    ]


def _hint(f):
    if f.kind == "exception" and "more_queries" in f.case.tags:
        return ("Tq > Tk 时掩码也要有 Tq 行：从 Tk×Tk 的下三角里取最后 Tq 行，只取得到 Tk 行。"
                "直接写 torch.ones(Tq, Tk).tril(Tk − Tq)：偏移可以是负的，"
                "前 Tq − Tk 个查询一个键也没有。")
    if f.kind == "nan" and "more_queries" in f.case.tags:
        return ("Tq > Tk 时，前 Tq − Tk 个查询在所有键之前，一个键也不能关注：这些行应输出 0 而不是 NaN"
                "（整行分数都是 −inf；交给练习 1 的 masked_softmax 或 attention_ref 处理）。")
    if "batch" in f.case.tags and f.kind in ("exception", "value", "nan"):
        q, k = f.inputs["q"], f.inputs["k"]
        return (f"Tq 和 Tk 要从倒数第二维读：Tq = q.shape[-2] = {q.shape[-2]}，Tk = "
                f"k.shape[-2] = {k.shape[-2]}；len(q) 和 q.shape[0] 是批的大小 "
                f"（这一例是 {q.shape[0]}）。")
    if f.kind not in ("value", "nan"):
        return None
    x = f.inputs
    for text, alt in _alternatives(x["q"], x["k"], x["v"]):
        if close(f.got, alt):
            return text
    tq, tk = x["q"].shape[-2], x["k"].shape[-2]
    if tq > tk and f.index is not None and f.index[-2] < tq - tk:
        return ("这个查询一个键也不能关注，应输出 0：用有限的大负数（−1e9）填充时，整行分数"
                "一样大，softmax 就平均分配（输出 v 的平均）。用 −inf 填充，并把这样的行置 0。")
    return ("查询 i 在整个序列里的位置是 i + (Tk − Tq)，它可以关注键 j 当且仅当 j ≤ i + (Tk − Tq)："
            "对照这一例手算第一行的掩码。")


register(Exercise("ch04.causal_attention", "右下角对齐的因果注意力",
                  causal_attention, BUGS, _cases, (_hint,)))
