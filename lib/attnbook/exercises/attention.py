"""Chapter 04's exercises: ``ch04.masked_softmax`` and ``ch04.attention``.

Both follow the book's conventions: boolean masks with True = may attend, and a query row with
no allowed key gives zeros, never NaN. The hidden cases grow from a 3 x 5 example to heads with
a broadcast mask, large float32 logits and float16, so each classic bug meets the smallest case
that exposes it; the hints recognise a bug by recomputing what it would give.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

from .. import attention_ref
from .. import masked_softmax as _lib_masked_softmax
from ._core import Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- reference solutions
def masked_softmax(scores, mask):
    """Softmax over the last dim where ``mask`` is True (chapter 04, eq-ch04-softmax); a fully
    masked row -> 0."""
    return _lib_masked_softmax(scores.masked_fill(~mask, NEG_INF))


def attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k), masked) v (chapter 04, eq-ch04-attention); a fully masked
    row -> 0."""
    return attention_ref(q, k, v, mask=mask).out


def _softmax(s, dim=-1):
    """Guarded softmax of scores holding -inf: an all -inf slice gives zeros."""
    m = s.amax(dim, keepdim=True)
    e = torch.exp(s - m.masked_fill(torch.isinf(m), 0.0))
    return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


def _col_max_softmax(s):
    """exp(s - column max) / row sum: the max taken over the wrong axis (queries)."""
    m = s.amax(-2, keepdim=True)
    e = torch.exp(s - m.masked_fill(torch.isinf(m), 0.0))
    return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)


def _attn(q, k, v, mask=None, scale=None, dim=-1, kt=True, how="fill"):
    """Attention in float64 with the choices a bug may get wrong (for the hints). ``how``:
    "fill" (right), "multiply" (scores * mask), "after" (softmax, then * mask)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ (k.transpose(-2, -1) if kt else k)) * scale
    if mask is not None and how == "multiply":
        return torch.softmax(s * mask, dim) @ v
    if mask is not None and how == "after":
        return (torch.softmax(s, dim) * mask) @ v
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF)
    return _softmax(s, dim) @ v


# --------------------------------------------------------------------------- the gallery of bugs
def _fill_1e9(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def _no_guard(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def _wrong_axis(scores, mask):
    return _softmax(scores.masked_fill(~mask, float("-inf")), dim=-2)


def _inverted(scores, mask):
    return masked_softmax(scores, ~mask)


def _boolean_index(scores, mask):
    s = scores.clone()
    s[~mask] = float("-inf")  # needs mask.shape == scores.shape: no broadcasting
    return torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)


def _no_max_subtraction(scores, mask):
    e = torch.exp(scores) * mask
    den = e.sum(-1, keepdim=True)
    return torch.where(den > 0, e / den, 0.0)


def _fp16_unsafe(scores, mask):
    w = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    return w * mask.any(-1, keepdim=True)  # fully masked rows -> 0


def _max_wrong_axis(scores, mask):
    return _col_max_softmax(scores.masked_fill(~mask, NEG_INF))


def _mask_multiplies(scores, mask):
    return torch.softmax(scores * mask, dim=-1) * mask.any(-1, keepdim=True)


def _after_softmax(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


def _eps_denominator(scores, mask):
    s = scores.masked_fill(~mask, NEG_INF)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m.masked_fill(torch.isinf(m), 0.0))
    return e / (e.sum(-1, keepdim=True) + 1e-6)


def _in_place(scores, mask):
    scores.masked_fill_(~mask, NEG_INF)  # the caller's scores are changed
    return masked_softmax(scores, mask)


def _float32(scores, mask):
    return masked_softmax(scores.float(), mask)


SOFTMAX_BUGS = {
    "wrong_axis": _wrong_axis,
    "fill_minus_1e9": _fill_1e9,
    "nan_on_fully_masked_row": _no_guard,
    "mask_polarity_inverted": _inverted,
    "mask_not_broadcast": _boolean_index,
    "no_max_subtraction": _no_max_subtraction,
    "float16_unsafe_fill": _fp16_unsafe,
    "max_over_wrong_axis": _max_wrong_axis,
    "mask_multiplies_scores": _mask_multiplies,
    "masked_after_softmax": _after_softmax,
    "epsilon_in_denominator": _eps_denominator,
    "scores_modified_in_place": _in_place,
    "float32_result": _float32,
}


def _attn_bug(scale="sqrt_dk", fill=NEG_INF, guard=True, dim=-1, kt=True, invert=False,
              index=False, none_ok=True, how="fill", vt=False):
    def bug(q, k, v, mask=None):
        d = {"sqrt_dk": math.sqrt(q.shape[-1]), "one": 1.0, "dk": q.shape[-1],
             "sqrt_dv": math.sqrt(v.shape[-1]), "sqrt_tk": math.sqrt(k.shape[-2]),
             "sqrt_dmodel": math.sqrt(q.shape[-1] * (q.shape[1] if q.ndim == 4 else 1))}[scale]
        s = (q @ (k.transpose(-2, -1) if kt else k)) / d
        if how != "fill" and mask is not None:
            return _attn(q, k, v, mask, 1.0 / d, how=how)
        if mask is not None or not none_ok:
            keep = ~mask if invert else mask
            if index:
                s[~keep] = fill
            else:
                s = s.masked_fill(~keep, fill)
        w = torch.softmax(s, dim=dim)
        if guard and mask is not None:
            w = torch.nan_to_num(w, nan=0.0) * (~mask if invert else mask).any(-1, keepdim=True)
        return w @ (v.transpose(-2, -1) if vt else v)
    return bug


def _q_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.shape[-1])  # the caller's queries are changed
    return _attn_bug(scale="one")(q, k, v, mask)


ATTENTION_BUGS = {
    "wrong_axis": _attn_bug(dim=-2),
    "no_scaling": _attn_bug(scale="one"),
    "scale_by_d_k": _attn_bug(scale="dk"),
    "scale_by_sqrt_d_v": _attn_bug(scale="sqrt_dv"),
    "scale_by_sqrt_d_model": _attn_bug(scale="sqrt_dmodel"),
    "missing_transpose": _attn_bug(kt=False),
    "fill_minus_1e9": _attn_bug(fill=-1e9, guard=False),
    "nan_on_fully_masked_row": _attn_bug(guard=False),
    "mask_polarity_inverted": _attn_bug(invert=True),
    "mask_not_broadcast": _attn_bug(index=True),
    "float16_unsafe_fill": _attn_bug(fill=-1e9),
    "mask_none_not_handled": _attn_bug(none_ok=False),
    "v_transposed": _attn_bug(vt=True),
    "scale_by_sqrt_T_k": _attn_bug(scale="sqrt_tk"),
    "mask_multiplies_scores": _attn_bug(how="multiply"),
    "masked_after_softmax": _attn_bug(how="after"),
    "q_scaled_in_place": _q_in_place,
}


# --------------------------------------------------------------------------- hidden cases
def _mask(g, shape, *, full_row=None):
    """A random bool mask (True = attend) with a True in every row and column, except row
    ``full_row`` (an index tuple into the leading dims + row), which is all False."""
    while True:
        m = torch.rand(shape, generator=g) < 0.6
        if m.any(-1).all() and m.any(-2).all() and not m.all():
            break
    if full_row is not None:
        m[full_row] = False
    return m


def _randn(g, *shape, dtype=torch.float64, scale=1.0):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _first_allowed(g, mask):
    """For each row of a 2-D+ mask, a random index it allows (every row allows one)."""
    pick = torch.rand(mask.shape, generator=g).masked_fill(~mask, -1.0)
    return pick.argmax(-1, keepdim=True)


def _large_scores(g):
    """float32 scores in which every row has an allowed score in [100, 120): exp overflows."""
    mask = _mask(g, (3, 6))
    s = _randn(g, 3, 6, scale=20.0)
    s.scatter_(-1, _first_allowed(g, mask), 100 + 20 * torch.rand(3, 1, generator=g, dtype=s.dtype))
    return s.float(), mask


def _large_qkv(g):
    """float32 q, k, v where query 0 of each batch scores 120 (after 1/sqrt(16)) on an allowed
    key."""
    q, k, v = _randn(g, 2, 5, 16, scale=2.0), _randn(g, 2, 7, 16, scale=2.0), _randn(g, 2, 7, 4)
    mask = _mask(g, (2, 5, 7))
    j = _first_allowed(g, mask)[:, 0, 0]
    for b in range(2):
        k[b, j[b]] = q[b, 0] * (120 * 4 / q[b, 0].pow(2).sum())
    return q.float(), k.float(), v.float(), mask


def _softmax_cases(g):
    r = int(torch.randint(1, 4, (1,), generator=g))
    return [
        Case("没有整行被屏蔽的小例子", (_randn(g, 3, 5), _mask(g, (3, 5))),
             note="mask 里 True 表示可以关注。"),
        Case("有一行整行被屏蔽", (_randn(g, 4, 6), _mask(g, (4, 6), full_row=r)),
             note=f"第 {r} 行的 mask 全是 False。", tags=frozenset({"full"})),
        Case("批和多头：mask 在头这一维上广播",
             (_randn(g, 2, 3, 4, 5), _mask(g, (2, 1, 4, 5), full_row=(1, 0, r))),
             note=f"mask 的第 1 维长度是 1，要广播到 3 个头；mask[1, 0, {r}] 整行是 False。",
             tags=frozenset({"broadcast", "full"})),
        Case("分数很大（float32）", _large_scores(g), note="每一行都有一个可关注的分数在 100 以上。",
             tags=frozenset({"large"})),
        Case("半精度（float16），有一行整行被屏蔽",
             (_randn(g, 2, 4, 6, dtype=torch.float16), _mask(g, (2, 4, 6), full_row=(0, r))),
             note=f"mask[0, {r}] 整行是 False。", tags=frozenset({"half", "full"})),
        Case("各行尺度相差很大（float32），被屏蔽的位置分数最大", _scaled_rows(g),
             note="各行分别在 0、150、−120、40 附近；每行有一个被屏蔽的位置，分数比这一行"
                  "可关注的分数都大 1000。", tags=frozenset({"scales"})),
    ]


def _scaled_rows(g):
    """float32 rows near 0, 150, -120, 40 (one max for the whole tensor zeroes some rows), each
    with a hidden score 1000 above its row (a max taken before masking zeroes the row)."""
    n = 5 + int(torch.randint(0, 3, (1,), generator=g))
    offsets = torch.tensor([0.0, 150.0, -120.0, 40.0], dtype=torch.float64)
    s = _randn(g, 4, n, scale=3.0) + offsets[:, None]
    mask = _mask(g, (4, n))
    hidden = (~mask).float().argmax(-1, keepdim=True)
    for i in range(4):
        if bool(mask[i].all()):
            mask[i, hidden[i]] = False
    s.scatter_(-1, hidden, s.amax(-1, keepdim=True) + 1000.0)
    return s.float(), mask


def _attention_cases(g):
    r = int(torch.randint(1, 4, (1,), generator=g))
    return [
        Case("单个序列，不传掩码", (_randn(g, 3, 4), _randn(g, 5, 4), _randn(g, 5, 6)),
             note="Tq = 3，Tk = 5，d_k = 4，d_v = 6；不传 mask（默认 None）。"),
        Case("有掩码，没有整行被屏蔽",
             (_randn(g, 4, 8), _randn(g, 6, 8), _randn(g, 6, 3), _mask(g, (4, 6))),
             note="mask 里 True 表示可以关注。"),
        Case("有一行整行被屏蔽",
             (_randn(g, 4, 8), _randn(g, 5, 8), _randn(g, 5, 3), _mask(g, (4, 5), full_row=r)),
             note=f"第 {r} 行的 mask 全是 False。", tags=frozenset({"full"})),
        Case("批和多头：mask 在头这一维上广播",
             (_randn(g, 2, 3, 4, 8), _randn(g, 2, 3, 6, 8), _randn(g, 2, 3, 6, 5),
              _mask(g, (2, 1, 4, 6), full_row=(1, 0, r))),
             note=f"(B, H) = (2, 3)；mask 的第 1 维长度是 1，要广播到 3 个头；"
                  f"mask[1, 0, {r}] 整行是 False。", tags=frozenset({"broadcast", "full"})),
        Case("分数很大（float32）", _large_qkv(g), note="第 0 个查询对一个可关注的键的分数（缩放后）是 120。",
             tags=frozenset({"large"})),
        Case("半精度（float16），有一行整行被屏蔽",
             (_randn(g, 1, 2, 4, 8, dtype=torch.float16),
              _randn(g, 1, 2, 6, 8, dtype=torch.float16),
              _randn(g, 1, 2, 6, 5, dtype=torch.float16),
              _mask(g, (1, 1, 4, 6), full_row=(0, 0, r))),
             note=f"mask[0, 0, {r}] 整行是 False。", tags=frozenset({"half", "full"})),
    ]


# --------------------------------------------------------------------------- hints
def _hint_half(f):
    if f.kind == "exception" and "half" in f.case.tags and "overflow" in str(f.exc):
        return ("float16 最大只能表示约 ±65504，填充值（例如 −1e9 或 float32 的最小值）在 float16 "
                "下溢出（PyTorch 报 overflow）：用 float('-inf') 填充，再单独把整行被屏蔽的行置 0。"
                "torch.finfo(x.dtype).min 虽然不溢出，但整行被屏蔽时给出均匀分布（仍要单独置 0），"
                "再加上别的偏置还会变成 −inf（float16 里 finfo.min − 16 就是 −inf）。")


def _hint_broadcast(f):
    if f.kind == "exception" and "mask" in f.inputs and "shape of the mask" in str(f.exc):
        return (f"这一例的 mask 形状是 {tuple(f.inputs['mask'].shape)}，要靠广播才能和分数对齐："
                "布尔索引 s[~mask] 要求形状完全相同；用 s.masked_fill(~mask, …) 或 "
                "torch.where(mask, s, …)，它们会按广播规则扩展 mask。")


def _matmul_left(text):
    """The last two sizes of the left operand of a failed matmul, read from its message."""
    hit = re.search(r"\((\d+)x(\d+) and \d+x\d+\)", text)  # 2-D: "(3x5 and 6x5)"
    if hit:
        return int(hit[1]), int(hit[2])
    hit = re.search(r"batch2 tensor to be: \[(\d+), (\d+)\]", text)  # batched: [b, n]
    return (None, int(hit[2])) if hit else None


def _reversed_all(f):
    """Whether ``q @ k.T`` (all dims reversed) raises the error ``fn`` raised: k.T on batched k."""
    q, k = f.inputs.get("q"), f.inputs.get("k")
    if q is None or k is None or k.ndim < 3:
        return False
    try:
        q @ k.permute(*reversed(range(k.ndim)))
    except RuntimeError as err:
        return str(err) == str(f.exc)
    return False


def _hint_transpose(f):
    text = str(f.exc) if f.kind == "exception" else ""
    if text and _reversed_all(f):
        return ("k.T 在多于两维时把所有维度都倒过来（批和头也换了位置），matmul 就对不上："
                "只转置最后两维，写 k.transpose(-2, -1)（或 k.mT）。")
    if "cannot be multiplied" not in text and "Expected size for first two dimensions" not in text:
        return None
    left = _matmul_left(text)
    tk = f.inputs["k"].shape[-2] if "k" in f.inputs else None
    if left is not None and left[1] == tk and tk != f.inputs["q"].shape[-1]:
        return ("出错的是 weights @ v：权重的形状是 (Tq, Tk)，v 是 (Tk, d_v)，v 不用转置；"
                "输出的形状是 (Tq, d_v)。")
    return ("分数应是 q @ k.transpose(-2, -1)，形状 (Tq, Tk)：q 的每一行要和 k 的每一行做点积，"
            "所以 k 要先转置（少了这次转置，形状就对不上）。")


def _hint_none(f):
    if f.kind == "exception" and "mask" not in f.inputs and "NoneType" in str(f.exc):
        return "不传 mask 时它是 None：先判断 `if mask is not None:` 再做屏蔽。"
    if f.kind == "exception" and "mask" in f.inputs and "is ambiguous" in str(f.exc):
        return ("`if mask:` 要把整个布尔张量当成一个真假值，PyTorch 拒绝（ambiguous）："
                "判断有没有传入掩码要写 `if mask is not None:`。")


def _fully_masked_row(f):
    """The row (index tuple) of the failure if the mask hides every key of it, else None."""
    if f.index is None or "mask" not in f.inputs:
        return None
    mask = f.inputs["mask"]
    row = f.index[:-1]
    shape = f.expected.shape[:-1] + (mask.shape[-1],)
    full = ~mask.expand(torch.broadcast_shapes(mask.shape, shape)).any(-1)
    return row if bool(full[row]) else None


def _hint_full_row(f):
    row = _fully_masked_row(f)
    if row is None or f.kind not in ("nan", "value"):
        return None
    if torch.isnan(f.got[row]).any():
        return ("整行被屏蔽时应该输出 0，而不是 NaN：这一行的分数全是 −inf，减去的行最大值也是 −inf，"
                "exp 之后是 0/0。把这样的行单独置 0（例如把行最大值里的 −inf 换成 0、分母 clamp_min）。")
    inputs = f.inputs
    uniform = (inputs["v"].mean(-2).expand(f.expected.shape)[row] if "v" in inputs
               else torch.full_like(f.expected[row], 1.0 / f.expected.shape[-1]))
    if close(f.got[row], uniform):
        what = "，输出成了 v 各行的平均" if "v" in inputs else ""
        return (f"整行被屏蔽时应该输出 0，而不是均匀分布（每个键的权重都是 1/Tk{what}）："
                "用一个有限的大负数（−1e9、−1e4 或 finfo.min）代替 −inf 填充时，整行的分数一样大，"
                "softmax 就平均分配。用 −inf 填充，并把这样的行置 0。")
    return "整行被屏蔽时应该输出 0：这一行没有可以关注的键。"


_MULTIPLY = ("把分数乘以掩码（s * mask）并不能屏蔽键：要屏蔽的分数只是变成 0，exp(0) = 1 "
             "照样分到权重。应把它们填成 −inf（masked_fill(~mask, float('-inf'))）。")
_AFTER = ("先 softmax 再乘以掩码，剩下的权重之和就不再是 1：应先把要屏蔽的分数填成 −inf，"
          "再做 softmax。")
_WRONG_MAX = ("减去的最大值应是每一行自己的最大值（amax(-1, keepdim=True)）：softmax 只对"
              "整行加减同一个数不变，减去按列取的最大值（dim=-2）会改变结果。")


def _alternatives(f):
    """(hint, what the bug would give) for the bugs recognised by recomputation."""
    x = f.inputs
    if "scores" in x:
        s, m = x["scores"], x["mask"]
        return [("掩码的含义反了：本书（和 SDPA）的约定是 True = 可以关注，应屏蔽 mask 为 False 的位置。",
                 masked_softmax(s, ~m)),
                ("softmax 沿错了维度：应对每一行（最后一维，dim=-1：同一个查询对所有键）归一化，"
                 "你的结果是每一列之和为 1。", _softmax(s.masked_fill(~m, NEG_INF), -2)),
                (_WRONG_MAX, _col_max_softmax(s.masked_fill(~m, NEG_INF))),
                (_MULTIPLY, torch.softmax(s * m, -1)),
                (_MULTIPLY, torch.softmax(s * m, -1) * m.any(-1, keepdim=True)),
                (_AFTER, torch.softmax(s, -1) * m)] + ([
                ("softmax 沿错了维度：dim=1 是头这一维；应对每一行（dim=-1：同一个查询对所有键）"
                 "归一化。", _softmax(s.masked_fill(~m, NEG_INF), 1))] if s.ndim == 4 else [])
    q, k, v, m = x["q"], x["k"], x["v"], x.get("mask")
    dk, dv = q.shape[-1], v.shape[-1]
    alts = [(f"没有缩放：分数要乘以 1/√d_k（d_k = q.shape[-1] = {dk}）。", _attn(q, k, v, m, 1.0)),
            (f"缩放因子应是 1/√d_k = 1/√{dk}，你用的像是 1/d_k = 1/{dk}。", _attn(q, k, v, m, 1 / dk)),
            (f"缩放用的是 √d_v（v 的最后一维，{dv}），应是 √d_k（q、k 的最后一维，{dk}）。",
             _attn(q, k, v, m, dv ** -0.5)),
            ("softmax 沿错了维度：应对每一行（dim=-1：同一个查询对所有键）归一化。",
             _attn(q, k, v, m, dim=-2)),
            ("缩放要作用在分数上、softmax 之前：softmax(q kᵀ/√d_k) v，不是 softmax(q kᵀ) v/√d_k。",
             _attn(q, k, v, m, 1.0) / math.sqrt(dk))]
    tk = k.shape[-2]
    alts.append((f"缩放用的是 √T_k（键的个数，{tk}），应是 √d_k（q、k 的最后一维，{dk}）。",
                 _attn(q, k, v, m, tk ** -0.5)))
    if q.ndim == 4:
        alts.append((f"缩放用的是 √(H·d_k) = √d_model = √{q.shape[1] * dk}，应是每个头的 √d_k = √{dk}。",
                     _attn(q, k, v, m, (q.shape[1] * dk) ** -0.5)))
        alts.append(("softmax 沿错了维度：dim=1 是头这一维；应对每一行（dim=-1：同一个查询对所有键）"
                     "归一化。", _attn(q, k, v, m, dim=1)))
    if m is not None:
        alts.append(("掩码的含义反了：本书（和 SDPA）的约定是 True = 可以关注，应屏蔽 mask 为 False 的位置。",
                     _attn(q, k, v, ~m)))
        alts.append((_MULTIPLY, _attn(q, k, v, m, how="multiply")))
        alts.append((_AFTER, _attn(q, k, v, m, how="after")))
    if k.shape[-2] == k.shape[-1]:
        alts.append(("少了转置：分数应是 q @ k.transpose(-2, -1)，不是 q @ k。",
                     _attn(q, k, v, m, kt=False)))
    return alts


def _hint_alternative(f):
    if f.kind not in ("value", "nan"):
        return None
    for text, alt in _alternatives(f):
        if close(f.got, alt):
            return text


def _hint_large(f):
    if "large" in f.case.tags and f.kind in ("nan", "inf"):
        return ("分数很大时 exp 会溢出成 inf（float32 在 exp(88) 以上溢出），inf/inf = NaN："
                "先减去每行的最大值再取 exp，softmax 的结果不变。")


def _hint_scales(f):
    if "scales" not in f.case.tags or f.kind not in ("value", "nan"):
        return None
    return ("减去的应是每一行自己的、屏蔽之后的最大值：先 masked_fill(~mask, −inf)，再 "
            "amax(-1, keepdim=True)。整个张量只减一个最大值，尺度小的行 exp 会下溢成 0；"
            "在屏蔽之前取最大值，被屏蔽的大分数会让整行下溢成 0。")


def _hint_epsilon(f):
    """Every row a little short of 1, by the same factor: a constant added to the denominator."""
    if f.kind != "value" or "scores" not in f.inputs:
        return None
    sums = f.got.double().sum(-1)
    live = f.expected.sum(-1) > 0.5
    short = 1 - sums[live]
    if bool(live.any()) and bool((short > 1e-12).all()) and float(short.max()) < 1e-3:
        return (f"每一行之和略小于 1（例如 {float(sums[live][0]):.7f}）：像是分母加了一个小常数 ε"
                "（e / (sum + ε)），它让每一行都偏小。只在分母为 0（整行被屏蔽）时替换它，"
                "例如 clamp_min(torch.finfo(e.dtype).tiny) 或 torch.where(den > 0, …)。")


def _hint_rows(f):
    if f.kind != "value" or "scores" not in f.inputs or _fully_masked_row(f) is not None:
        return None
    row = f.index[:-1]
    total = float(f.got[row].double().sum())
    if abs(total - 1) > 1e-3:
        return (f"没有被整行屏蔽的每一行之和应为 1，你的第 {list(row)} 行之和是 {total:.4f}："
                "检查 softmax 的维度（dim=-1）和分母。")
    if not bool(f.inputs["mask"].expand(f.expected.shape)[f.index]):
        return "被屏蔽（mask 为 False）的位置权重应为 0。"


HINTS = (_hint_half, _hint_broadcast, _hint_transpose, _hint_none, _hint_full_row,
         _hint_alternative, _hint_large, _hint_scales, _hint_epsilon, _hint_rows)

# SDPA with k = v = I and scale 1 returns the masked softmax of q itself (review R1)
register(Exercise("ch04.masked_softmax", "带掩码的 softmax", masked_softmax, SOFTMAX_BUGS,
                  _softmax_cases, HINTS,
                  forbidden=((F.scaled_dot_product_attention,
                              "F.scaled_dot_product_attention"),)))
register(Exercise("ch04.attention", "带掩码的缩放点积注意力", attention, ATTENTION_BUGS,
                  _attention_cases, HINTS))
