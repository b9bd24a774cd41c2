"""Chapter 09's exercises ``ch09.merge_partial`` and ``ch09.attention_backward``.

``merge_partial(o1, lse1, o2, lse2)``: two partial results of attention over two disjoint halves
of the keys -> the result over all keys, ``lse = logaddexp(lse1, lse2)``,
``O = exp(lse1 - lse) O1 + exp(lse2 - lse) O2`` (the split-KV / Flash-Decoding combine). The
classic bugs average the two outputs, take the max for lse, weight with the lse of the wrong
part, compute ``log(exp + exp)`` (overflow), get ``exp(-inf - (-inf)) = NaN`` when both parts
of a row are fully masked (the library's convention: O = 0, lse = -inf), or leave the weights
``(..., T)`` without ``[..., None]`` (they broadcast against the ``dv`` axis of ``O``).

``attention_backward(q, k, v, out, lse, dout, mask=None)``: the recomputation backward of eq.
eq-ch09-bwd -> ``(dq, dk, dv)``; ``P = exp(S - lse)`` is rebuilt from the saved lse. The bugs
drop ``D``, take ``D = rowsum(dP)``, forget ``1/sqrt(d)``, rebuild ``P`` without its
normaliser (``exp(S - rowmax S)``), ignore the mask when rebuilding ``S``, or get NaN in a fully
masked row (``exp(-inf - (-inf))``).
"""
from __future__ import annotations

import math

import torch

from ..reference import attention_ref
from ._core import Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- merge_partial
def _merge(o1, lse1, o2, lse2, *, guard=True, weights="total", lse_op="logaddexp"):
    if lse_op == "logaddexp":
        lse = torch.logaddexp(lse1, lse2)
    elif lse_op == "max":
        lse = torch.maximum(lse1, lse2)
    else:  # log(exp + exp): overflows
        lse = torch.log(torch.exp(lse1) + torch.exp(lse2))
    ref = {"total": lse, "first": lse1}[weights]
    if guard:
        ref = ref.masked_fill(torch.isneginf(ref), 0.0)  # no exp(-inf - (-inf))
    w1, w2 = torch.exp(lse1 - ref)[..., None], torch.exp(lse2 - ref)[..., None]
    return w1 * o1 + w2 * o2, lse


def _merge_flat(o1, lse1, o2, lse2):
    """The weights left as (..., T): times (..., T, dv) they broadcast on the last axis."""
    lse = torch.logaddexp(lse1, lse2)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)
    return torch.exp(lse1 - safe) * o1 + torch.exp(lse2 - safe) * o2, lse


def merge_partial(o1, lse1, o2, lse2):
    """Merge two partial attention results over disjoint key sets (chapter 09, exercise).

    Args: o1, o2: ``(..., T, dv)``; lse1, lse2: ``(..., T)`` (``-inf`` for a fully masked row,
    whose O is 0).  Returns: ``(O, lse)`` over the union of the two key sets.
    """
    return _merge(o1, lse1, o2, lse2)


MERGE_BUGS = {
    "outputs_averaged": lambda o1, lse1, o2, lse2: ((o1 + o2) / 2, torch.logaddexp(lse1, lse2)),
    "lse_is_the_max": lambda o1, lse1, o2, lse2: _merge(o1, lse1, o2, lse2, lse_op="max"),
    "weights_from_the_wrong_lse": lambda o1, lse1, o2, lse2: _merge(o1, lse1, o2, lse2,
                                                                   weights="first"),
    "log_of_exp_overflows": lambda o1, lse1, o2, lse2: _merge(o1, lse1, o2, lse2,
                                                             lse_op="naive"),
    "nan_when_both_parts_are_masked": lambda o1, lse1, o2, lse2: _merge(o1, lse1, o2, lse2,
                                                                       guard=False),
    "weights_without_last_axis": _merge_flat,
}


def _merge_run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return ret, {"O": ret[0], "lse": ret[1]}
    return ret, {"O": ret}


def _halves(g, b, h, t, tk, split, dv=None, scale=1.0, masked_rows=(), first_masked=(),
            dtype=torch.float64):
    d = 8
    dv = dv or d
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, tk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, tk, dv, generator=g, dtype=torch.float64)
    keep = torch.ones(b, 1, t, tk, dtype=torch.bool)
    for r in masked_rows:
        keep[..., r, :] = False
    for r in first_masked:
        keep[..., r, :split] = False
    one = attention_ref(q, k[..., :split, :], v[..., :split, :], mask=keep[..., :split])
    two = attention_ref(q, k[..., split:, :], v[..., split:, :], mask=keep[..., split:])
    return tuple(x.to(dtype) for x in (one.out, one.lse, two.out, two.lse))


def _pick(g, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _merge_cases(g):
    half = _pick(g, 4, 7)
    t2, tk2, dv2 = _pick(g, 5, 8), _pick(g, 9, 12), _pick(g, 3, 6)
    split2 = _pick(g, 3, tk2 - 3)
    return [
        Case(f"两半各 {half} 个键", _halves(g, 1, 1, _pick(g, 4, 7), 2 * half, half)),
        Case("多头、两半长度不同", _halves(g, 2, 3, t2, tk2, split2, dv=dv2),
             note=f"前一半 {split2} 个键，后一半 {tk2 - split2} 个；d_v = {dv2}。"),
        Case("lse 很大", _halves(g, 1, 2, 4, 10, 5, scale=30.0),
             note="分数可达上千，lse 也是：exp(lse) 在 float64 里超过 709 就溢出。"),
        Case("有的行前一半全被屏蔽，有的行整行被屏蔽", _halves(g, 1, 1, 6, 10, 5,
             masked_rows=(4,), first_masked=(1, 2)),
             note="第 1、2 行的前一半 lse = −inf；第 4 行两半都是 −inf（应输出 O = 0、lse = −inf）。",
             tags=frozenset({"masked"})),
        Case("float32", _halves(g, 1, 2, 6, 16, 9, dtype=torch.float32)),
    ]


def _merge_hint(f):
    a = [f.inputs[n] for n in ("o1", "lse1", "o2", "lse2")]
    if f.kind == "nan" and "masked" in f.case.tags:
        return ("两部分的 lse 都是 −inf 时，合并后的 lse 也是 −inf，exp(lse1 − lse) = exp(−inf − (−inf)) = NaN："
                "做减法之前把 −inf 的 lse 换成 0（这一行的权重就都是 0，输出 0）。")
    if f.kind == "exception" and isinstance(f.exc, RuntimeError) and "must match" in str(f.exc):
        return ("形状 (…, T) 的权重 exp(lse_k − lse) 和形状 (…, T, d_v) 的 O_k 相乘之前要先加一维："
                "exp(lse1 − lse)[..., None]；否则它沿 d_v 那一维广播（或者形状对不上）。")
    big = max(float(x.max()) for x in (a[1], a[3])) > 100
    if big and (f.kind in ("nan", "inf")
                or close(f.got, MERGE_BUGS["log_of_exp_overflows"](*a)[0])):
        return "log(exp(lse1) + exp(lse2)) 在 lse 很大时溢出：用 torch.logaddexp(lse1, lse2)。"
    if f.kind != "value":
        return None
    if f.label == "lse" and f.index is not None and bool(torch.isneginf(f.expected[f.index])):
        return ("两部分都整行被屏蔽时，合并后的 lse 应是 −inf（没有任何键：log 0），不是 "
                f"{float(f.got[f.index]):g}：只在计算权重时把 −inf 换成 0，返回的 lse 保持 "
                "logaddexp(lse1, lse2) 的原值。否则再和下一段合并时，这一行会被当成有分数的行。")
    if close(f.got, MERGE_BUGS["outputs_averaged"](*a)[0]):
        return "两部分不能平均：权重是各自的指数和所占的比例 exp(lse_k − lse)，不是 1/2。"
    if f.label == "lse" and close(f.got, torch.maximum(a[1], a[3])):
        return "lse 是 log(e^{lse1} + e^{lse2})，不是两者的最大值：用 torch.logaddexp。"
    if any(close(f.got, MERGE_BUGS[b](*a)[0])
           for b in ("weights_from_the_wrong_lse", "lse_is_the_max")):
        return ("权重 exp(lse_k − lse) 里的 lse 必须是合并后的总 lse = logaddexp(lse1, lse2)，"
                "不是最大值，也不是某一半的 lse：否则两个权重加起来不是 1。")
    return "对照：lse = logaddexp(lse1, lse2)，O = exp(lse1 − lse)·O1 + exp(lse2 − lse)·O2。"


register(Exercise("ch09.merge_partial", "合并两段部分注意力结果", merge_partial, MERGE_BUGS,
                  _merge_cases, (_merge_hint,), run=_merge_run))


# --------------------------------------------------------------------------- attention_backward
def _backward(q, k, v, out, lse, dout, mask=None, *, use_d="right", scale=True,
              normalise=True, mask_in_recompute=True, guard=True):
    c = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * c
    if mask is not None and mask_in_recompute:
        s = s.masked_fill(~mask, NEG_INF)
    if normalise:
        ref = lse[..., None]
    else:  # exp(S - rowmax S): the normaliser l is forgotten
        ref = s.amax(-1, keepdim=True)
    if guard:
        ref = ref.masked_fill(torch.isneginf(ref), 0.0)
    p = torch.exp(s - ref)  # P, rebuilt
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    d_rows = {"right": (dout * out).sum(-1, keepdim=True), "none": 0.0,
              "rowsum_dp": dp.sum(-1, keepdim=True)}[use_d]
    ds = p * (dp - d_rows)
    f = c if scale else 1.0
    return ds @ k * f, ds.transpose(-2, -1) @ q * f, dv


def attention_backward(q, k, v, out, lse, dout, mask=None):
    """The recomputation backward of eq. eq-ch09-bwd (chapter 09, exercise).

    Args: q ``(..., Tq, d)``, k ``(..., Tk, d)``, v ``(..., Tk, dv)``, out and lse from the
    forward, dout = dL/dO; mask: bool, True = may attend (broadcasts to the scores), or None.
    Returns: ``(dq, dk, dv)``; a fully masked row contributes nothing.
    """
    return _backward(q, k, v, out, lse, dout, mask)


BWD_BUGS = {
    "D_dropped": lambda *a, mask=None: _backward(*a, mask, use_d="none"),
    "D_is_rowsum_of_dP": lambda *a, mask=None: _backward(*a, mask, use_d="rowsum_dp"),
    "scale_forgotten": lambda *a, mask=None: _backward(*a, mask, scale=False),
    "P_not_normalised": lambda *a, mask=None: _backward(*a, mask, normalise=False),
    "mask_ignored_in_recompute": lambda *a, mask=None: _backward(*a, mask,
                                                                 mask_in_recompute=False),
    "nan_in_a_fully_masked_row": lambda *a, mask=None: _backward(*a, mask, guard=False),
}


def _bwd_run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 3:
        return ret, {"dq": ret[0], "dk": ret[1], "dv": ret[2]}
    return ret, {"dq": ret}


def _fwd_case(g, b, h, t, tk, d=8, dv=None, causal=False, masked_rows=(), pad=None,
              dtype=torch.float64):
    dv = dv or d
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, tk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, tk, dv, generator=g, dtype=torch.float64)
    dout = torch.randn(b, h, t, dv, generator=g, dtype=torch.float64)
    mask = None
    if causal or masked_rows or pad is not None:
        mask = torch.ones(b, 1, t, tk, dtype=torch.bool)
        if causal:
            mask &= torch.ones(t, tk, dtype=torch.bool).tril()
        for r in masked_rows:
            mask[..., r, :] = False
        if pad is not None:
            mask[..., pad:] = False
    ref = attention_ref(q, k, v, mask=mask)
    args = tuple(x.to(dtype) for x in (q, k, v, ref.out, ref.lse, dout))
    return args, ({} if mask is None else {"mask": mask})


def _bwd_cases(g):
    def case(title, note="", tags=frozenset(), **kw):
        args, kwargs = _fwd_case(g, **kw)
        return Case(title, args, kwargs, note=note, tags=tags)
    t2 = _pick(g, 3, 5)
    return [
        case("一个头，没有掩码", b=1, h=1, t=_pick(g, 4, 6), tk=_pick(g, 5, 8)),
        case("多头、T_q ≠ T_k、d_v ≠ d", b=2, h=_pick(g, 2, 3), t=t2, tk=t2 + _pick(g, 2, 4),
             dv=_pick(g, 3, 6)),
        case("因果掩码", b=1, h=2, t=6, tk=6, causal=True, note="mask = 下三角（True = 可以关注）。"),
        case("键的填充掩码，且有一行整行被屏蔽", b=1, h=1, t=5, tk=8, pad=6, masked_rows=(2,),
             note="后两个键被屏蔽；第 2 行整行被屏蔽（lse = −inf，O = 0）。",
             tags=frozenset({"masked"})),
        case("float32", b=1, h=2, t=9, tk=9, causal=True, dtype=torch.float32),
    ]


def _bwd_hint(f):
    names = ("q", "k", "v", "out", "lse", "dout")
    a = [f.inputs[n] for n in names]
    mask = f.inputs.get("mask")
    if f.kind == "nan" and "masked" in f.case.tags:
        return ("整行被屏蔽时 lse = −inf，S 的这一行也是 −inf：exp(S − lse) = exp(−inf − (−inf)) = NaN。"
                "重算 P 之前把 −inf 的 lse 换成 0，这一行的 P 就是 0。")
    if f.kind != "value":
        return None
    labels = {"dq": 0, "dk": 1, "dv": 2}
    i = labels.get(f.label, 0)
    for bug, text in (
            ("D_dropped", "dS = P ∘ (dP − D)，D_i = rowsum(dO ∘ O)：你的 dS 像是少了 D（只有 P ∘ dP）。"),
            ("D_is_rowsum_of_dP", "D_i = Σ_j P_ij dP_ij = dO_i · O_i，不是 Σ_j dP_ij：求和时要带上 P。"),
            ("scale_forgotten", "S = QKᵀ/√d，所以 dQ = dS K/√d、dK = dSᵀ Q/√d：别忘了 1/√d。"),
            ("P_not_normalised", "P = exp(S − lse)，lse = m + log ℓ；exp(S − rowmax S) 还没有除以 ℓ。"),
            ("mask_ignored_in_recompute", "重算 S 时要先把被屏蔽的位置填成 −inf，否则那里的 P 不是 0。")):
        try:
            if close(f.got, BWD_BUGS[bug](*a, mask=mask)[i]):
                return text
        except Exception:  # a hint never hides the report
            continue
    return "对照 eq-ch09-bwd：dV = PᵀdO，dP = dO Vᵀ，D = rowsum(dO∘O)，dS = P∘(dP − D)，dQ = dS K/√d，dK = dSᵀQ/√d。"


register(Exercise("ch09.attention_backward", "重算 P 的注意力反向传播", attention_backward,
                  BWD_BUGS, _bwd_cases, (_bwd_hint,), run=_bwd_run, autograd=False))
