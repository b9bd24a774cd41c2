"""Chapter 03's exercises ``ch03.additive_score`` and ``ch03.context``: steps 1 and 2-3.

``ch03.additive_score(s, H, W_q, W_k, v)`` is step 1 with Bahdanau's additive score in the
book's row-vector convention, ``e_i = v . tanh(s W_q + h_i W_k)`` (eq-ch03-additive with
``W_q = W_2^T``, ``W_k = W_1^T``): one query ``s (d_s,)``, keys ``H (n, d_h)``, ``W_q (d_s, d_a)``,
``W_k (d_h, d_a)``, ``v (d_a,)``; returns ``e (n,)``. The classic bugs drop the tanh, put it
after v, forget v (sum the hidden units), swap the two matrices, or return the softmax of e.

``ch03.context(scores, H, mask)`` is steps 2 and 3 (eq-ch03-softmax, eq-ch03-context) for
``T`` queries at once: ``scores (T, n)``, ``H (n, d)``, ``mask (n,)`` bool, True = a real
source token; returns the context vectors ``alpha H``, ``(T, d)``, with weight exactly 0 on
padding. The classic bugs take the softmax over the queries, ignore the padding, zero the
padding after the softmax without renormalising, skip the normalisation, use the raw scores as
weights, or overflow to NaN on large scores (no max subtraction).
"""
from __future__ import annotations

import torch

from ..reference import additive_scores as _lib_additive_scores
from ..reference import masked_softmax as _lib_masked_softmax
from ._core import Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- ch03.additive_score
def additive_score(s, H, W_q, W_k, v):
    """Additive scores of one query against n keys (chapter 03, eq-ch03-additive): ``(n,)``."""
    return _lib_additive_scores(s[None], H, W_q, W_k, v)[0]


def _no_tanh(s, H, W_q, W_k, v):
    return (s @ W_q + H @ W_k) @ v                          # a linear score: no hidden layer


def _tanh_after_v(s, H, W_q, W_k, v):
    return torch.tanh((s @ W_q + H @ W_k) @ v)              # tanh of the score, not of the units


def _v_ignored(s, H, W_q, W_k, v):
    return torch.tanh(s @ W_q + H @ W_k).sum(-1)            # v = (1, ..., 1)


def _swapped(s, H, W_q, W_k, v):
    return torch.tanh(s @ W_k + H @ W_q) @ v                # W_q on the keys, W_k on the query


def _returns_weights(s, H, W_q, W_k, v):
    return torch.softmax(torch.tanh(s @ W_q + H @ W_k) @ v, -1)  # step 2 already done


SCORE_BUGS = {
    "no_tanh": _no_tanh,
    "tanh_after_v": _tanh_after_v,
    "v_ignored": _v_ignored,
    "weight_matrices_swapped": _swapped,
    "returns_softmax_weights": _returns_weights,
}


def _v_on_the_left(s, H, W_q, W_k, v):
    return v @ torch.tanh(s @ W_q + H @ W_k)                # v on the wrong side


def _transposed(s, H, W_q, W_k, v):
    return torch.tanh(s @ W_q.T + H @ W_k.T) @ v            # the column-vector habit


def _dims(g, k, low=2, high=9):
    """``k`` distinct sizes in [low, high) drawn from ``g`` (every dimension its own size)."""
    return [int(i) + low for i in torch.randperm(high - low, generator=g)[:k]]


def _score_cases(g):
    def r(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale
    n, d_s, d_h, d_a = _dims(g, 4)
    sq_n, sq_d = _dims(g, 2)
    bi_n, bi_s, bi_a = _dims(g, 3, 2, 7)
    big_n, big_d, big_a = _dims(g, 3)
    return [
        Case("每一维的大小都不同", (r(d_s), r(n, d_h), r(d_s, d_a), r(d_h, d_a), r(d_a)),
             note=f"s ({d_s},)，H ({n}, {d_h})，W_q ({d_s}, {d_a})，W_k ({d_h}, {d_a})，"
                  f"v ({d_a},)。"),
        Case("d_s = d_h = d_a 的方阵", (r(sq_d), r(sq_n, sq_d), r(sq_d, sq_d), r(sq_d, sq_d),
                                      r(sq_d)),
             note=f"一个查询 s ({sq_d},)，n = {sq_n} 个键，W_q、W_k 都是 {sq_d}×{sq_d}：形状"
                  "对得上，矩阵用反或多转置一次都只在数值上露出来。", tags=frozenset({"square"})),
        Case("双向编码器：d_h = 2 d_s", (r(bi_s), r(bi_n, 2 * bi_s), r(bi_s, bi_a),
                                      r(2 * bi_s, bi_a), r(bi_a)),
             note=f"s ({bi_s},)，H ({bi_n}, {2 * bi_s})，W_q ({bi_s}, {bi_a})，"
                  f"W_k ({2 * bi_s}, {bi_a})，v ({bi_a},)：两个矩阵的形状不同。"),
        Case("输入很大：tanh 饱和", (r(big_d, scale=30.0), r(big_n, big_d, scale=30.0),
                                r(big_d, big_a), r(big_d, big_a), r(big_a, scale=10.0)),
             note="s 和 H 的分量大到几十，分数仍被 ‖v‖₁ 限住。", tags=frozenset({"big"})),
    ]


def _raises_like(f, alt, args) -> bool:
    """Whether ``alt`` raises on this case the same exception as the reader's answer."""
    try:
        alt(*args)
    except Exception as e:  # noqa: BLE001
        return type(e) is type(f.exc) and str(e) == str(f.exc)
    return False


V_LEFT = ("v 放错了一边：tanh(s W_q + H W_k) 的形状是 (n, d_a)，每一行是一个键的 d_a 个隐层"
          "单元，要在右边乘 v：tanh(…) @ v，得到 (n,)。v @ tanh(…) 要求 d_a = n，那是另一回事。")
TRANSPOSED = ("多转置了一次（列向量的习惯）：本书按行向量约定，W_q 的形状就是 (d_s, d_a)，"
              "直接写 s @ W_q、H @ W_k，不要 .T。")
SWAPPED = "两个矩阵用反了：W_q (d_s, d_a) 乘查询 s，W_k (d_h, d_a) 乘键 h_i。"


def _score_hint(f):
    args = [f.inputs[k] for k in ("s", "H", "W_q", "W_k", "v")]
    if f.kind == "exception":
        if _raises_like(f, _v_on_the_left, args):
            return V_LEFT
        if _raises_like(f, _transposed, args):
            return TRANSPOSED
        if _raises_like(f, _swapped, args):
            return SWAPPED + "d_h ≠ d_s 时（双向编码器）两者不能互换。"
        if "mat" in str(f.exc) and "shape" in str(f.exc).lower():
            return ("矩阵形状对不上。逐个打印：s @ W_q 应是 (d_a,)，H @ W_k 应是 (n, d_a)，"
                    "两者相加后取 tanh 仍是 (n, d_a)，最后 @ v 得到 (n,)。")
        return None
    if f.kind != "value":
        return None
    if close(f.got, _no_tanh(*args)):
        return "少了 tanh：e_i = v·tanh(s W_q + h_i W_k)，tanh 作用在 d_a 维的隐层上，然后才与 v 做点积。"
    if close(f.got, _tanh_after_v(*args)):
        return ("tanh 放错了位置：先对 d_a 维的 s W_q + h_i W_k 逐元素取 tanh，再与 v 做点积；"
                "tanh(v·(…)) 把分数压进 (−1, 1)。")
    if close(f.got, _v_ignored(*args)):
        return "隐层的 d_a 个分量要按 v 加权：tanh(…) @ v，而不是直接 .sum(-1)（那等于 v 全是 1）。"
    if "square" in f.case.tags and close(f.got, _swapped(*args)):
        return SWAPPED
    if "square" in f.case.tags and close(f.got, _transposed(*args)):
        return TRANSPOSED
    if "square" in f.case.tags and close(f.got, _v_on_the_left(*args)):
        return V_LEFT
    if close(f.got, _returns_weights(*args)):
        return "这是第 1 步：返回分数 e 本身，softmax 是第 2 步。"
    return "对照这一例手算：e_i = v·tanh(s W_q + h_i W_k)，s W_q 对每个 h_i 都一样（广播）。"


# --------------------------------------------------------------------------- ch03.context
def context(scores, H, mask):
    """Context vectors ``softmax(scores masked) @ H`` (chapter 03, eq-ch03-context): ``(T, d)``."""
    return _lib_masked_softmax(scores.masked_fill(~mask, NEG_INF)) @ H


def _over_queries(scores, H, mask):
    return torch.softmax(scores.masked_fill(~mask, NEG_INF), 0).nan_to_num(0.0) @ H


def _padding_attended(scores, H, mask):
    return torch.softmax(scores, -1) @ H


def _mask_after_softmax(scores, H, mask):
    return (torch.softmax(scores, -1) * mask) @ H           # zeroed, but no longer sums to 1


def _not_normalised(scores, H, mask):
    e = scores.masked_fill(~mask, NEG_INF)
    return torch.exp(e - e.amax(-1, keepdim=True)) @ H


def _raw_scores(scores, H, mask):
    return scores.masked_fill(~mask, 0.0) @ H


def _no_max(scores, H, mask):
    p = torch.exp(scores.masked_fill(~mask, NEG_INF))
    return p / p.sum(-1, keepdim=True) @ H


def _mask_inverted(scores, H, mask):
    return torch.softmax(scores.masked_fill(mask, NEG_INF), -1) @ H   # hides the real tokens


CONTEXT_BUGS = {
    "mask_polarity_flipped": _mask_inverted,
    "softmax_over_queries": _over_queries,
    "padding_attended": _padding_attended,
    "mask_after_softmax": _mask_after_softmax,
    "not_normalised": _not_normalised,
    "scores_used_as_weights": _raw_scores,
    "no_max_subtraction": _no_max,
}


def _context_cases(g):
    def r(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale
    n1, d1 = _dims(g, 2, 3, 8)
    t2, n2, d2 = _dims(g, 3, 2, 8)
    n2 = max(n2, 4)
    padded = torch.ones(n2, dtype=torch.bool)
    padded[-2:] = False
    t3, n3, d3 = _dims(g, 3, 2, 7)
    return [
        Case("一个查询，没有填充", (r(1, n1), r(n1, d1), torch.ones(n1, dtype=torch.bool)),
             note=f"T = 1，n = {n1}，d = {d1}。"),
        Case("几个查询，最后两个位置是填充", (r(t2, n2), r(n2, d2), padded),
             note=f"T = {t2}，n = {n2}，d = {d2}；mask 的最后两个是 False：填充位置的权重应"
                  "恰为 0，其余权重之和为 1。", tags=frozenset({"padded"})),
        Case("分数很大", (1000.0 + r(t3, n3, scale=5.0), r(n3, d3),
                       torch.ones(n3, dtype=torch.bool)),
             note="分数在 1000 上下：exp(1000) 在 float64 里溢出成 inf。",
             tags=frozenset({"big"})),
        Case("各行的尺度相差很大，填充位置的分数最大", *_scaled_rows(g)[:1],
             note="第 0 行在 0 附近，第 1 行在 1000 附近，第 2 行在"
             " −900 附近；最后两个位置是填充，最后一个的分数比这一行的真实位置都大 800。",
             tags=frozenset({"padded", "scales"})),
    ]


def _scaled_rows(g):
    """Rows near 0, near +-1000 (a global max would zero or overflow the others), and each
    row's largest score on a padded position (a max taken before masking fails)."""
    t = 3 + int(torch.randint(0, 3, (1,), generator=g))
    n = 5 + int(torch.randint(0, 3, (1,), generator=g))
    offsets = torch.tensor([0.0, 1000.0, -900.0, 400.0, -50.0], dtype=torch.float64)[:t]
    scores = torch.randn(t, n, generator=g, dtype=torch.float64) * 3 + offsets[:, None]
    mask = torch.ones(n, dtype=torch.bool)
    mask[-2:] = False
    scores[:, -1] = scores.amax(-1) + 800.0  # a padded key outscores every real one
    H = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return ((scores, H, mask),)


def _context_hint(f):
    scores, H, mask = f.inputs["scores"], f.inputs["H"], f.inputs["mask"]
    if f.kind in ("nan", "inf") and "big" in f.case.tags:
        return "分数上千时 exp 溢出成 inf，inf/inf = NaN：先减去每行的最大值（softmax 不变），再取 exp。"
    if f.kind not in ("value", "nan"):
        return None
    if close(f.got, context(scores, H, ~mask)) or (f.kind == "nan" and bool(mask.all())
                                                    and bool(torch.isnan(f.got).all())):
        return ("掩码的含义反了：本书的约定是 True = 真实词元（可以关注），要屏蔽的是 mask 为 "
                "False 的位置：masked_fill(~mask, −inf)。")
    if "scales" in f.case.tags:
        row = f.index[:-1] if f.index is not None else ()
        return ("每一行要减去它自己的最大值，而且是屏蔽之后的最大值（amax(-1, keepdim=True) "
                "作用在已填 −inf 的分数上）：各行尺度不同时，减去全局最大值会让某些行 exp "
                "下溢成 0 或上溢；填充位置的分数最大时，屏蔽之前取的最大值会让整行下溢成 0。"
                + (f"（看第 {list(row)} 行。）" if row else ""))
    if close(f.got, _over_queries(scores, H, mask)):
        return "softmax 沿错了维度：每个查询（每一行）在 n 个源位置上归一化，dim=-1，不是 dim=0。"
    if close(f.got, _padding_attended(scores, H, mask)):
        return "填充位置也分到了权重：softmax 之前把 mask 为 False 的分数置为 −inf。"
    if close(f.got, _mask_after_softmax(scores, H, mask)):
        return ("softmax 之后再把填充位置清零，剩下的权重之和就不再是 1："
                "应在 softmax 之前把填充位置的分数置为 −inf。")
    if close(f.got, _not_normalised(scores, H, mask)):
        return "exp 之后还要除以每行的和，α 才是概率分布（Σ_i α_i = 1）。"
    if close(f.got, _raw_scores(scores, H, mask)):
        return "分数不能直接当权重用：先做 softmax（第 2 步），再加权求和（第 3 步）。"
    return "对照这一例：α = softmax(分数，填充处为 −inf)，每行和为 1；上下文 = α @ H。"


register(Exercise("ch03.additive_score", "加性（Bahdanau）分数", additive_score, SCORE_BUGS,
                  _score_cases, (_score_hint,)))
register(Exercise("ch03.context", "从分数到上下文向量", context, CONTEXT_BUGS,
                  _context_cases, (_context_hint,)))
