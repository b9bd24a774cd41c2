"""Chapter 03's build exercise ``ch03.bahdanau_step``: the three steps end to end, batched.

``ch03.bahdanau_step(s, H, mask, W_q, W_k, v)`` is one decoder step of Bahdanau attention for a
batch of padded source sentences: queries ``s (B, d_s)`` (the decoder states), encoder states
``H (B, n, d_h)``, ``mask (B, n)`` bool (True = a real source token; every row has at least
one), ``W_q (d_s, d_a)``, ``W_k (d_h, d_a)``, ``v (d_a,)`` in the book's row-vector convention.
It returns the context vectors ``(B, d_h)``: step 1 the additive scores
``e_bi = v . tanh(s_b W_q + h_bi W_k)`` (eq-ch03-additive), step 2 the softmax over the real
positions of row b (padding: weight exactly 0), step 3 ``c_b = sum_i alpha_bi h_bi``.

The hidden cases vary B, n and the three widths with the seed (B != n, d_s != d_h != d_a), give
each sentence its own length, put the largest score of a row on a padded position (whose
encoder state is garbage), make scores reach the thousands with rows of opposite sign (a
global max or no max at all fails), and one float32 case has a row entirely below -100.
"""
from __future__ import annotations

import torch

import torch.nn.functional as F

from .. import dispatch, flash
from ..reference import additive_scores as _lib_additive_scores
from ..reference import attention_ref as _lib_attention_ref
from ..reference import masked_softmax as _lib_masked_softmax
from ..seq2seq import AttentionSeq2Seq
from ._core import Case, Exercise, register
from ._report import close
from .additive import additive_score as _ex_score
from .additive import context as _ex_context

NEG_INF = float("-inf")


def bahdanau_step(s, H, mask, W_q, W_k, v):
    """One Bahdanau attention step for a padded batch (chapter 03): contexts ``(B, d_h)``."""
    e = _lib_additive_scores(s[:, None], H, W_q, W_k, v)               # (B, 1, n)
    alpha = _lib_masked_softmax(e.masked_fill(~mask[:, None], NEG_INF))
    return (alpha @ H)[:, 0]


def _scores(s, H, W_q, W_k, v):
    return torch.tanh((s @ W_q)[:, None] + H @ W_k) @ v                 # (B, n)


def _finish(e, H, mask):
    e = e.masked_fill(~mask, NEG_INF)
    alpha = torch.softmax(e, -1)
    return (alpha[:, None] @ H)[:, 0]


def _no_tanh(s, H, mask, W_q, W_k, v):
    return _finish(((s @ W_q)[:, None] + H @ W_k) @ v, H, mask)


def _v_ignored(s, H, mask, W_q, W_k, v):
    return _finish(torch.tanh((s @ W_q)[:, None] + H @ W_k).sum(-1), H, mask)


def _mask_inverted(s, H, mask, W_q, W_k, v):
    return _finish(_scores(s, H, W_q, W_k, v), H, ~mask)               # hides the real tokens


def _padding_attended(s, H, mask, W_q, W_k, v):
    return _finish(_scores(s, H, W_q, W_k, v), H, torch.ones_like(mask))


def _mask_after_softmax(s, H, mask, W_q, W_k, v):
    alpha = torch.softmax(_scores(s, H, W_q, W_k, v), -1) * mask        # no longer sums to 1
    return (alpha[:, None] @ H)[:, 0]


def _softmax_over_batch(s, H, mask, W_q, W_k, v):
    e = _scores(s, H, W_q, W_k, v).masked_fill(~mask, NEG_INF)
    alpha = torch.softmax(e, 0).nan_to_num(0.0)                         # over sentences
    return (alpha[:, None] @ H)[:, 0]


def _no_max(s, H, mask, W_q, W_k, v):
    p = torch.exp(_scores(s, H, W_q, W_k, v).masked_fill(~mask, NEG_INF))
    return ((p / p.sum(-1, keepdim=True))[:, None] @ H)[:, 0]


def _global_max(s, H, mask, W_q, W_k, v):
    e = _scores(s, H, W_q, W_k, v).masked_fill(~mask, NEG_INF)
    p = torch.exp(e - e.max())                                          # one max for the batch
    return ((p / p.sum(-1, keepdim=True))[:, None] @ H)[:, 0]


def _finite_fill(s, H, mask, W_q, W_k, v, fill=-1e4):
    e = _scores(s, H, W_q, W_k, v).masked_fill(~mask, fill)           # not below every score
    return (torch.softmax(e, -1)[:, None] @ H)[:, 0]


def _mean_of_states(s, H, mask, W_q, W_k, v):
    return (H * mask[..., None]).sum(1) / mask.sum(-1, keepdim=True)   # uniform weights


BUGS = {
    "no_tanh": _no_tanh,
    "v_ignored": _v_ignored,
    "mask_polarity_flipped": _mask_inverted,
    "padding_attended": _padding_attended,
    "mask_after_softmax": _mask_after_softmax,
    "softmax_over_batch": _softmax_over_batch,
    "no_max_subtraction": _no_max,
    "global_max": _global_max,
    "scores_ignored": _mean_of_states,
    "finite_fill_minus_1e4": _finite_fill,
}


# --------------------------------------------------------------------------- hidden cases
def _lengths(g, b, n):
    """One length per sentence in [1, n], the first sentence full, the others shorter."""
    rest = torch.randint(1, n, (b - 1,), generator=g)
    return torch.cat([torch.tensor([n]), rest])


def _mask(lengths, n):
    return torch.arange(n)[None, :] < lengths[:, None]


def _solve(W, target):
    """A row x with x @ W = target (W has more rows than columns)."""
    return target @ torch.linalg.pinv(W)


def _cases(g):
    def r(*shape, scale=1.0, dtype=torch.float64):
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    def dims(k, low, high):
        return [int(i) + low for i in torch.randperm(high - low, generator=g)[:k]]

    cases = []
    # 1. a padded batch, every size its own
    sizes = dims(5, 2, 9)
    b = min(sizes)                                                     # 2 to 4
    n, d_s, d_h, d_a = [x for x in sizes if x != b]
    lengths = _lengths(g, b, n)
    cases.append(Case("一批长度不同的句子", (r(b, d_s), r(b, n, d_h), _mask(lengths, n),
                                           r(d_s, d_a), r(d_h, d_a), r(d_a)),
                      note=f"B = {b}，n = {n}，d_s = {d_s}，d_h = {d_h}，d_a = {d_a}；"
                           f"各句的真实长度是 {lengths.tolist()}，其余位置是填充。",
                      tags=frozenset({"padded"})))
    # 2. square weights: swapped or transposed matrices only show in the values
    b, n, d = dims(3, 2, 7)
    lengths = _lengths(g, b, n)
    cases.append(Case("d_s = d_h = d_a 的方阵", (r(b, d), r(b, n, d), _mask(lengths, n),
                                               r(d, d), r(d, d), r(d)),
                      note=f"B = {b}，n = {n}，d_s = d_h = d_a = {d}；真实长度 "
                           f"{lengths.tolist()}。",
                      tags=frozenset({"padded", "square"})))
    # 3. the largest score of each padded row sits on a padded position with garbage H
    b, n = 3, int(torch.randint(5, 8, (1,), generator=g))
    d_s, d_a = dims(2, 2, 5)
    d_h = d_a + 2
    W_q, W_k, v = r(d_s, d_a), r(d_h, d_a), r(d_a)
    v = v * (5000.0 / v.abs().sum())                                   # ||v||_1 = 5000
    H = r(b, n, d_h, scale=0.1)
    lengths = torch.tensor([n, n - 2, 2])
    mask = _mask(lengths, n)
    best = _solve(W_k, 6.0 * torch.sign(v))                            # tanh(.) -> sign(v)
    H[~mask] = best + 5.0 * r(int((~mask).sum()), d_h, scale=0.01)
    s = r(b, d_s, scale=0.1)
    cases.append(Case("填充位置的分数最大", (s, H, mask, W_q, W_k, v),
                      note=f"B = 3，n = {n}，真实长度 {lengths.tolist()}，‖v‖₁ = 5000；填充"
                           "位置的编码器状态是特意构造的：它们的分数接近 5000，比同一行的真实"
                           "位置大出上千。",
                      tags=frozenset({"padded", "garbage", "big"})))
    # 4. scores in the thousands, rows of opposite sign
    b, n = 3, int(torch.randint(4, 7, (1,), generator=g))
    d_a = int(torch.randint(2, 4, (1,), generator=g))
    d_s, d_h = d_a + 2, d_a + 1
    W_q, W_k = r(d_s, d_a), r(d_h, d_a)
    v = torch.sign(r(d_a)) * (2000.0 / d_a)                             # ||v||_1 = 2000
    sign = torch.tensor([1.0, -1.0, 0.3], dtype=torch.float64)[:, None]
    s = _solve(W_q, sign * 2.0 * torch.sign(v)) + r(b, d_s, scale=0.01)
    H = r(b, n, d_h, scale=0.5)
    lengths = _lengths(g, b, n)
    cases.append(Case("分数上千，各行的尺度相差很大", (s, H, _mask(lengths, n), W_q, W_k, v),
                      note="‖v‖₁ = 2000：第 0 句的分数在 +1900 上下，第 1 句在 −1900 上下；"
                           f"真实长度 {lengths.tolist()}。",
                      tags=frozenset({"padded", "big", "scales"})))
    # 5. float32, one row entirely below -100
    b, n = 2, int(torch.randint(3, 7, (1,), generator=g))
    d_a = int(torch.randint(2, 4, (1,), generator=g))
    d_s = d_h = d_a + 1
    W_q, W_k = r(d_s, d_a), r(d_h, d_a)
    v = torch.sign(r(d_a)) * (300.0 / d_a)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)[:, None]
    s = _solve(W_q, sign * 2.0 * torch.sign(v))
    H = r(b, n, d_h, scale=0.1)
    lengths = _lengths(g, b, n)
    args = (s, H, _mask(lengths, n), W_q, W_k, v)
    cases.append(Case("float32：一整行分数低于 −100",
                      tuple(a.float() if a.is_floating_point() else a for a in args),
                      note="float32 输入，‖v‖₁ = 300：第 1 句的每个分数都在 −200 以下，"
                           f"exp 在 float32 里下溢成 0；真实长度 {lengths.tolist()}。",
                      tags=frozenset({"padded", "big", "f32"})))
    # 6. a padded sentence whose real scores are all far below -10^4
    b, n = 2, int(torch.randint(4, 7, (1,), generator=g))
    d_a = int(torch.randint(2, 4, (1,), generator=g))
    d_s, d_h = d_a + 2, d_a + 1
    W_q, W_k = r(d_s, d_a), r(d_h, d_a)
    v = torch.sign(r(d_a)) * (30000.0 / d_a)                            # ||v||_1 = 30000
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64)[:, None]
    s = _solve(W_q, sign * 2.0 * torch.sign(v)) + r(b, d_s, scale=0.01)
    lengths = torch.tensor([n, int(torch.randint(1, n, (1,), generator=g))])
    cases.append(Case("一句的真实分数都低于 −10000", (s, r(b, n, d_h, scale=0.5), _mask(lengths, n),
                                                   W_q, W_k, v),
                      note="‖v‖₁ = 30000：第 0 句的分数在 +28000 上下，第 1 句在 −28000 上下；"
                           f"真实长度 {lengths.tolist()}。",
                      tags=frozenset({"padded", "deep"})))
    return cases


# --------------------------------------------------------------------------- hints
def _hint_shape(f):
    if f.kind == "shape":
        got, want = tuple(f.got.shape), tuple(f.expected.shape)
        b, n = f.inputs["mask"].shape
        if got == (b, n):
            return "返回的是权重 α (B, n)：还差第 3 步，用 α 给 H 加权求和，得到 (B, d_h)。"
        if got == (b, 1, want[-1]):
            return "多了一维：每个句子只有一个查询，返回 (B, d_h)，把长度为 1 的那一维去掉。"
        return None
    if f.kind == "exception" and "mat" in str(f.exc) and "shape" in str(f.exc).lower():
        return ("矩阵形状对不上：s (B, d_s) @ W_q 是 (B, d_a)，要插入一维成 (B, 1, d_a) 才能与"
                " H @ W_k (B, n, d_a) 相加；tanh(…) 在右边乘 v 得分数 (B, n)；W_q 乘 s，"
                "W_k 乘 H，d_s ≠ d_h 时不能互换。")
    if f.kind == "exception" and "size of tensor" in str(f.exc):
        return ("广播失败：s @ W_q 是 (B, d_a)，要写成 (s @ W_q)[:, None] 才能加到"
                " (B, n, d_a) 的每个位置上；掩码 (B, n) 与分数 (B, n) 同形。")
    return None


FINITE = ("填充值不够小：有的句子真实位置的分数比 −1e4 这样有限的填充值还小（隐藏例子里有的"
          "在 −2000、有的在 −28000 上下），softmax 之后填充位置反而拿走了权重。用 −inf"
          "（float('-inf')）填充，填充位置的权重才恰为 0。")


def _hint(f):
    if f.kind not in ("value", "nan", "inf"):
        return None
    a = [f.inputs[k] for k in ("s", "H", "mask", "W_q", "W_k", "v")]
    mask = a[2]
    if f.kind in ("nan", "inf") and "big" in f.case.tags:
        return ("分数上千（或整行低于 −100）时，不减最大值的 exp 上溢成 inf 或下溢成 0，"
                "得到 NaN。先减去每行（每个句子）自己的最大值，而且是屏蔽之后的最大值；"
                "减去整批的最大值也不行：别的句子的分数可能比这一句大几千。")
    whole_row = f.kind == "nan" and bool(mask[0].all()) and bool(torch.isnan(f.got[0]).all())
    if whole_row or close(f.got, _mask_inverted(*a)):
        return ("掩码的含义反了：本书的约定是 True = 真实词元（可以关注），要置为 −inf 的是 "
                "mask 为 False 的位置：masked_fill(~mask, −inf)。第 0 句没有填充，"
                "反过来的掩码把它整行遮住，softmax 得到 NaN。")
    if close(f.got, _no_tanh(*a)):
        return "少了 tanh：e = v·tanh(s W_q + h_i W_k)，tanh 作用在 d_a 维的隐层上，然后才与 v 做点积。"
    if close(f.got, _v_ignored(*a)):
        return "隐层的 d_a 个分量要按 v 加权：tanh(…) @ v，而不是直接 .sum(-1)（那等于 v 全是 1）。"
    if close(f.got, _padding_attended(*a)):
        return ("填充位置也分到了权重：softmax 之前把 mask 为 False 的分数置为 −inf。"
                "填充位置的 H 可以是任意的垃圾值，它们的权重必须恰为 0。")
    if close(f.got, _mask_after_softmax(*a)):
        return ("softmax 之后再把填充位置清零，剩下的权重之和就不再是 1："
                "应在 softmax 之前把填充位置的分数置为 −inf。")
    if close(f.got, _softmax_over_batch(*a)):
        return ("softmax 沿错了维度：每个句子（每一行）在自己的 n 个源位置上归一化，dim=-1，"
                "不是沿批这一维 dim=0。")
    if any(close(f.got, _finite_fill(*a, fill=-10.0 ** p)) for p in range(2, 8)):
        return FINITE
    if close(f.got, _mean_of_states(*a)):
        return "权重是均匀的：分数没有用上。第 1 步的分数经 softmax 变成权重，再给 H 加权。"
    if "deep" in f.case.tags:  # the first five cases passed: most likely a finite fill
        return FINITE
    if "square" in f.case.tags:
        s, H, mask, W_q, W_k, v = a
        if close(f.got, bahdanau_step(s, H, mask, W_k, W_q, v)):
            return "两个矩阵用反了：W_q (d_s, d_a) 乘查询 s，W_k (d_h, d_a) 乘编码器状态 H。"
        if close(f.got, bahdanau_step(s, H, mask, W_q.T, W_k.T, v)):
            return ("多转置了一次（列向量的习惯）：本书按行向量约定，W_q 的形状就是 (d_s, d_a)，"
                    "直接写 s @ W_q、H @ W_k，不要 .T。")
    if "scales" in f.case.tags or "garbage" in f.case.tags:
        return ("每一行要减去它自己的最大值，而且是屏蔽之后的最大值：各句尺度不同时，减去整批"
                "的最大值会让某些句子的 exp 下溢成 0；填充位置的分数最大时，屏蔽之前取的最大值"
                "会让整行下溢成 0。")
    return ("对照这一例的第 0 句手算三步：e_i = v·tanh(s W_q + h_i W_k)，填充处置为 −inf，"
            "α = softmax(e)，c = Σ_i α_i h_i。")


_FORBIDDEN = (
    (_lib_additive_scores, "attnbook.additive_scores"),
    (_lib_masked_softmax, "attnbook.masked_softmax"),
    (AttentionSeq2Seq.attend, "attnbook.seq2seq.AttentionSeq2Seq.attend"),
    (_ex_score, "exercises.get('ch03.additive_score').solution"),
    (_ex_context, "exercises.get('ch03.context').solution"),
    (_lib_attention_ref, "attnbook.attention_ref"),
    (dispatch.attention, "attnbook.attention"),
    (flash.attention_tiled, "attnbook.flash.attention_tiled"),
    (F.scaled_dot_product_attention, "F.scaled_dot_product_attention"),
)

register(Exercise("ch03.bahdanau_step", "Bahdanau 注意力的一步", bahdanau_step,
                  BUGS, _cases, (_hint_shape, _hint), forbidden=_FORBIDDEN, build=True))
