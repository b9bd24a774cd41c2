"""Chapter 04's build exercise ``ch04.self_attention``: causal self-attention over a padded batch,
from the projections to the output.

``x`` is ``(B, T, d_model)``; sequence ``b`` has ``lengths[b]`` real tokens, the rest is padding.
The five steps of the chapter: project ``Q = x W^Q``, ``K = x W^K``, ``V = x W^V`` (row-vector
convention, ``W: (d_model, d)``), scores ``Q K^T``, scale ``1/sqrt(d_k)``, softmax over the keys
that query ``i`` may see (``j <= i`` and ``j < lengths[b]``: causal and key padding together),
weighted sum of ``V``. A padded position still has an output as a query (it attends the real
keys before it); a sequence of length 0 has no key at all, and its rows are 0, never NaN or the
mean of ``V``. The classic bugs forget the scale or scale by ``d_model``, project the keys with
``W^Q``, turn the causal triangle the wrong way, drop the padding mask or put it on the queries,
fill with -1e9 (uniform rows for an empty sequence), or take the softmax over the queries.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import dispatch, flash, reference
from ..tolerance import max_abs_error, rounding_step
from ._core import OUT, Case, Exercise, _run, register
from ._report import nearest
from .attention import attention as _attention_solution
from .attention import masked_softmax as _masked_softmax_solution
from .causal import causal_attention as _causal_solution


def _mask(t, lengths, device=None):
    """(B, T, T) bool: key j visible to query i of sequence b iff j <= i and j < lengths[b]."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    real = torch.arange(t, device=device) < lengths.to(device)[:, None]  # (B, T): real keys
    return causal & real[:, None, :]


def self_attention(x, w_q, w_k, w_v, lengths):
    """Causal self-attention of a padded batch (chapter 04, eq-ch04-attention): the projections,
    the scaled scores, the causal and key-padding mask, the softmax and the weighted sum."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return reference.attention_ref(q, k, v, mask=_mask(x.shape[-2], lengths)).out


def _steps(x, w_q, w_k, w_v, lengths, *, scale="d_k", keys=None, mask="both", fill=-math.inf,
           dim=-1):
    """The five steps with the choices a bug may get wrong."""
    q, k, v = x @ w_q, x @ (w_q if keys == "w_q" else w_k), x @ w_v
    d = {"d_k": q.shape[-1], "d_model": x.shape[-1], "one": 1}[scale]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    t = x.shape[-2]
    real = torch.arange(t) < lengths[:, None]
    tri = torch.ones(t, t, dtype=torch.bool)
    m = {"both": tri.tril() & real[:, None, :], "causal_only": tri.tril().expand(len(x), t, t),
         "upper": tri.triu() & real[:, None, :],
         "queries": tri.tril() & real[:, :, None]}[mask]
    s = s.masked_fill(~m, fill)
    w = torch.softmax(s, dim=dim).nan_to_num(0.0)
    if dim != -1:
        w = w * m
    return w @ v


def _global_max(x, w_q, w_k, w_v, lengths):
    """One max for the whole batch (after masking) instead of each row's own."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    m = _mask(x.shape[-2], lengths)
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~m, -math.inf)
    e = torch.exp(s - s.max())
    return (e / e.sum(-1, keepdim=True)).nan_to_num(0.0) @ v


def _max_before_masking(x, w_q, w_k, w_v, lengths):
    """Each row's max taken over every key, the hidden ones included, then the mask applied."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    m = _mask(x.shape[-2], lengths)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = torch.exp(s - s.amax(-1, keepdim=True)) * m
    return (e / e.sum(-1, keepdim=True)).nan_to_num(0.0) @ v


def _bug(**how):
    def bug(x, w_q, w_k, w_v, lengths):
        return _steps(x, w_q, w_k, w_v, lengths, **how)
    return bug


BUGS = {
    "no_scaling": _bug(scale="one"),
    "scale_by_sqrt_d_model": _bug(scale="d_model"),
    "keys_projected_with_w_q": _bug(keys="w_q"),
    "causal_triangle_inverted": _bug(mask="upper"),
    "padding_mask_forgotten": _bug(mask="causal_only"),
    "padding_mask_on_the_queries": _bug(mask="queries"),
    "fill_minus_1e9": _bug(fill=-1e9),
    "softmax_over_the_queries": _bug(dim=-2),
    "global_max": _global_max,
    "max_before_masking": _max_before_masking,
}

_TEXTS = {
    "no_scaling": "没有缩放：分数要乘以 1/√d_k（d_k = w_q.shape[1]，q 的最后一维）。",
    "scale_by_sqrt_d_model": ("缩放用的是 √d_model（x 的最后一维），应是 √d_k（投影之后 q、k 的"
                              "最后一维）。"),
    "keys_projected_with_w_q": "键要用 w_k 投影：K = x @ w_k，不是 x @ w_q。",
    "causal_triangle_inverted": ("因果掩码的三角反了：查询 i 只能看 j ≤ i 的键（下三角 tril），"
                                 "屏蔽的是右上方的未来键。"),
    "padding_mask_forgotten": ("少了填充掩码：补齐的位置（j ≥ lengths[b]）不是真的词元，"
                               "任何查询都不应关注它们；因果掩码之外还要屏蔽这些键。"),
    "padding_mask_on_the_queries": ("填充掩码屏蔽的是键（列 j ≥ lengths[b]），不是查询（行）："
                                    "补齐位置作为查询照样有输出，它关注它之前的真实键。"),
    "fill_minus_1e9": ("一条全是填充的序列（lengths[b] = 0）没有任何可关注的键，应输出 0：用有限的"
                       "大负数（−1e9）填充时整行分数一样大，softmax 平均分配（输出 v 的平均）。"
                       "用 −inf 填充，并把这样的行置 0。"),
    "softmax_over_the_queries": ("softmax 沿错了维度：应对每一行（dim=-1：同一个查询对所有键）"
                                 "归一化。"),
}
_MAX = ("每一行要减去它自己的最大值，而且是屏蔽之后的最大值（amax(-1, keepdim=True) 作用在已填"
        " −inf 的分数上）：两条序列的分数尺度相差上千时，减去整批的最大值会让小的那条 exp 全部"
        "下溢成 0；被屏蔽的键分数最大时，屏蔽之前取的最大值会让整行下溢成 0。")
_TEXTS["global_max"] = _TEXTS["max_before_masking"] = _MAX


def _randn(g, *shape, scale=1.0, dtype=torch.float64):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _args(g, b, t, d_model, d_k, d_v, lengths, scale=1.0, dtype=torch.float64):
    return (_randn(g, b, t, d_model, scale=scale, dtype=dtype),
            _randn(g, d_model, d_k, scale=d_model ** -0.5, dtype=dtype),
            _randn(g, d_model, d_k, scale=d_model ** -0.5, dtype=dtype),
            _randn(g, d_model, d_v, scale=d_model ** -0.5, dtype=dtype),
            torch.tensor(lengths))


def _cases(g):
    t = 5 + int(torch.randint(0, 3, (1,), generator=g))
    l1, l2 = (1 + int(torch.randint(0, t - 1, (1,), generator=g)) for _ in range(2))
    r = 2 + int(torch.randint(0, 3, (1,), generator=g))
    scale = float(2.0 ** int(torch.randint(1, 4, (1,), generator=g)))
    return [
        Case("一条序列，没有填充", _args(g, 1, 4, 6, 4, 3, [4]),
             note="B = 1，T = 4，d_model = 6，d_k = 4，d_v = 3；lengths = [4]：只有因果掩码。"),
        Case("一批有填充的序列", _args(g, 3, t, 8, 5, 2, [t, l1, l2]),
             note=f"B = 3，T = {t}；lengths = {[t, l1, l2]}：补齐的位置作为查询照样有输出，"
                  "它只关注它之前的真实键。", tags=frozenset({"padding"})),
        Case("有一条序列全是填充", _args(g, 2, 4, 6, 3, 4, [0, r]),
             note=f"lengths = [0, {r}]：第 0 条序列没有任何真实的键，它的每一行都应输出 0。",
             tags=frozenset({"empty"})),
        Case("float32，分数很大，B ≠ T", _args(g, 2, 7, 12, 8, 6, [7, 4], scale=scale,
                                              dtype=torch.float32),
             note=f"x 的尺度是 {scale:g}（分数可达几十到几百）；B = 2，T = 7；返回 float32。",
             tags=frozenset({"large"})),
        _scales_case(g),
    ]


def _scales_case(g):
    """Sequence 0 with scores near 0, sequence 1 with scores in the thousands; sequence 1's two
    padded positions are x and -x with |x| ~ 400: as keys they give every query scores of
    opposite sign and about 10^4 (each row's largest score is on a hidden key), as queries one
    of them scores some real key at thousands (the batch's largest visible score)."""
    t = 5 + int(torch.randint(0, 3, (1,), generator=g))
    d_model, d_k, d_v = (int(i) + 3 for i in torch.randperm(5, generator=g)[:3])
    x, w_q, w_k, w_v, _ = _args(g, 2, t, d_model, d_k, d_v, [t, t - 2])
    x[0] *= 0.5
    x[1] *= 40.0
    x[1, t - 1] = _randn(g, d_model, scale=400.0)
    x[1, t - 2] = -x[1, t - 1]
    return Case("两条序列的分数尺度相差上千，被屏蔽的键分数最大",
                (x, w_q, w_k, w_v, torch.tensor([t, t - 2])),
                note=f"B = 2，T = {t}，d_model = {d_model}，d_k = {d_k}，d_v = {d_v}；lengths = "
                     f"[{t}, {t - 2}]。第 0 条序列的分数在 0 附近，第 1 条的上千；第 1 条最后"
                     "两个位置是填充（x 与 −x，分量上百），这两个键给每个查询的分数一正一负、"
                     "大小上万：每一行最大的分数都在一个被屏蔽的键上。",
                tags=frozenset({"padding", "scales"}))


def _hint(f):
    if f.kind == "nan" and "empty" in f.case.tags:
        return ("第 0 条序列没有任何可关注的键，这些行的分数全是 −inf，softmax 给出 0/0 = NaN："
                "按本书的约定，这样的行输出 0。")
    if f.kind == "exception" and "cannot be multiplied" in str(f.exc):
        return ("行向量写法：投影是 x @ w_q（w_q 的形状是 (d_model, d_k)），分数是 "
                "q @ k.transpose(-2, -1)，形状 (B, T, T)。")
    if f.kind not in ("value", "nan"):
        return None
    if f.kind == "nan" and f.case.tags & {"scales", "large"}:  # exp underflowed or overflowed
        return _MAX
    x = f.inputs
    dt = f.got.dtype  # recomputed in the answer's dtype: float32 underflows where float64 does not
    args = (x["x"].to(dt), x["w_q"].to(dt), x["w_k"].to(dt), x["w_v"].to(dt), x["lengths"])
    alts = [(_TEXTS[name], bug(*args)) for name, bug in BUGS.items()]
    return nearest(f.got, f.expected, alts)


def _low_atol(case, dtype):
    """FlashAttention's rule (twice the solution's own error in ``dtype`` plus one rounding step)
    widened by the conditioning: a score s rounded in ``dtype`` is off by about eps |s|, which
    moves an output by about eps |s| max|v|. Another right order of the same operations (a loop
    over the sequences, q scaled before the product) may land anywhere within that."""
    expected = _run(SELF, self_attention, case, torch.float64)[1][OUT]
    naive = _run(SELF, self_attention, case, dtype)[1][OUT]
    x, w_q, w_k, w_v, _ = (a.double() if a.is_floating_point() else a for a in case.args)
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    s = (q @ k.transpose(-2, -1)).abs().max() / math.sqrt(q.shape[-1])
    cond = 0.5 * torch.finfo(dtype).eps * (float(s) + 1.0) * float(v.abs().max())
    return 2 * max_abs_error(naive, expected) + rounding_step(expected, dtype) + cond


SELF = register(Exercise(
    "ch04.self_attention", "有填充的因果自注意力", self_attention, BUGS, _cases, (_hint,),
    forbidden=((reference.attention_ref, "attnbook.attention_ref"),
               (dispatch.attention, "attnbook.attention"),
               (flash.attention_tiled, "attnbook.flash.attention_tiled"),
               (reference.masked_softmax, "attnbook.masked_softmax"),
               (reference.causal_mask, "attnbook.causal_mask"),
               (reference.padding_mask, "attnbook.padding_mask"),
               (F.scaled_dot_product_attention, "F.scaled_dot_product_attention"),
               (F.multi_head_attention_forward, "F.multi_head_attention_forward"),
               (_masked_softmax_solution, "exercises.get('ch04.masked_softmax').solution"),
               (_attention_solution, "exercises.get('ch04.attention').solution"),
               (_causal_solution, "exercises.get('ch04.causal_attention').solution")),
    low_atol=_low_atol, build=True))
