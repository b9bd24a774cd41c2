"""Chapter 07's exercises ``ch07.feed_forward`` and ``ch07.swiglu`` (the two FFNs written out) and
the build exercise ``ch07.matched_swiglu`` (a SwiGLU FFN on a ReLU FFN's parameter budget).

``feed_forward``: ``max(0, x W_1 + b_1) W_2 + b_2`` on every row (row-vector convention,
``W_1: (d, d_ff)``). The classic bugs drop the ReLU (the whole map becomes affine), put a ReLU on
the output too, add ``b_1`` after the ReLU, use GELU, or forget ``b_2``.

``swiglu``: ``(SiLU(x W_g) * (x W_1)) W_2`` without biases (Shazeer 2020). The classic bugs put
the SiLU on the other branch, use a sigmoid gate (GLU) or a ReLU gate (ReGLU), drop the gate,
add the branches instead of multiplying them, apply the SiLU after the product, or put a SiLU
on both branches.
Every case has ``d != d_ff``, so a transposed weight fails loudly on the shapes.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from ..layers import FeedForward
from ._core import Case, Exercise, register
from ._report import nearest


def feed_forward(x, w1, b1, w2, b2):
    """Position-wise FFN (chapter 07, eq-ch07-ffn): max(0, x W_1 + b_1) W_2 + b_2, row by row."""
    return torch.clamp(x @ w1 + b1, min=0) @ w2 + b2


def swiglu(x, w_gate, w_up, w_down):
    """SwiGLU FFN without biases (chapter 07, eq-ch07-swiglu): (SiLU(x W_g) * (x W_1)) W_2."""
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


# ----------------------------------------------------------------------------- feed_forward bugs
def _ff(x, w1, b1, w2, b2, *, act=F.relu, out_relu=False, b1_after=False, use_b2=True):
    h = act(x @ w1) + b1 if b1_after else act(x @ w1 + b1)
    y = h @ w2 + (b2 if use_b2 else 0)
    return F.relu(y) if out_relu else y


def _no_relu(x, w1, b1, w2, b2):
    return _ff(x, w1, b1, w2, b2, act=lambda t: t)


def _relu_on_output(x, w1, b1, w2, b2):
    return _ff(x, w1, b1, w2, b2, out_relu=True)


def _b1_after_relu(x, w1, b1, w2, b2):
    return _ff(x, w1, b1, w2, b2, b1_after=True)


def _gelu(x, w1, b1, w2, b2):
    return _ff(x, w1, b1, w2, b2, act=F.gelu)


def _no_b2(x, w1, b1, w2, b2):
    return _ff(x, w1, b1, w2, b2, use_b2=False)


FF_BUGS = {
    "no_relu": _no_relu,
    "relu_on_output": _relu_on_output,
    "b1_added_after_relu": _b1_after_relu,
    "gelu_instead_of_relu": _gelu,
    "b2_forgotten": _no_b2,
}


def _r(g, *shape, scale=1.0):
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def _ri(g, lo, hi):
    return int(torch.randint(lo, hi, (1,), generator=g))


def _ff_cases(g):
    """Shapes and scales vary with the seed; d != d_ff in every case."""
    def args(lead, d, d_ff, x_scale=1.0, dtype=torch.float64):
        return tuple(a.to(dtype) for a in (
            _r(g, *lead, d, scale=x_scale), _r(g, d, d_ff, scale=d ** -0.5),
            _r(g, d_ff, scale=0.5), _r(g, d_ff, d, scale=d_ff ** -0.5), _r(g, d, scale=0.5)))
    n, d = _ri(g, 2, 5), _ri(g, 3, 7)
    b, t, d2, k2 = _ri(g, 2, 4), _ri(g, 3, 6), _ri(g, 5, 9), _ri(g, 2, 5)
    d3, x3 = _ri(g, 6, 11), float(2.0 ** _ri(g, -1, 3))
    return [
        Case(f"{n} 个位置，d = {d}，d_ff = {4 * d}", args((n,), d, 4 * d),
             note=f"x 是 ({n}, {d})，w1 是 (d, d_ff) = ({d}, {4 * d})，w2 是 ({4 * d}, {d})："
                  "行向量写法 x @ w1。"),
        Case(f"批 ({b}, {t}, {d2})，d_ff = {k2 * d2}", args((b, t), d2, k2 * d2),
             note="同一个映射作用在每个批、每个位置的每一行上。"),
        Case(f"单精度（float32），一个位置，d = {d3}，d_ff = {3 * d3}，输入的尺度是 {x3:g}",
             args((1,), d3, 3 * d3, x_scale=x3, dtype=torch.float32),
             note="输入是 float32，返回值也应是 float32。"),
        Case("隐藏层的值很大", _large(g),
             note="权重不缩小，b1 里有 8 以上的数：隐藏层（ReLU 之前）的值有的超过 6。",
             tags=frozenset({"large"})),
    ]


def _large(g):
    """Pre-activations well above 6 (relu6 / hardtanh / clamp-like activations fail)."""
    n = 3 + int(torch.randint(0, 3, (1,), generator=g))
    b1 = _r(g, 12, scale=2.0)
    b1[:4] = 8.0 + 4 * torch.rand(4, generator=g, dtype=torch.float64)
    return (_r(g, n, 5), _r(g, 5, 12), b1, _r(g, 12, 5, scale=0.5), _r(g, 5))


def _ff_hint(f):
    if f.kind != "value":
        return None
    x, w1, b1, w2, b2 = (f.inputs[k] for k in ("x", "w1", "b1", "w2", "b2"))
    capped = ("隐藏层的值超过 6 时你的结果就不对了：ReLU 是 max(0, h)，没有上限"
              "（不是 relu6、hardtanh 或 clamp(0, 6)）。")
    h = x @ w1 + b1
    if bool((h > 6).any()):
        hit = nearest(f.got, f.expected, [(capped, F.relu6(h) @ w2 + b2)])
        if hit:
            return hit
    alts = [("少了 ReLU：没有它，整个 FFN 只是一个仿射映射 x ↦ x W1 W2 + (b1 W2 + b2)。",
             _no_relu(x, w1, b1, w2, b2)),
            ("输出不过 ReLU：ReLU 只作用在隐藏层 x @ w1 + b1 上，压缩回 d 维之后直接加 b2。",
             _relu_on_output(x, w1, b1, w2, b2)),
            ("b1 要加在 ReLU 之前：max(0, x @ w1 + b1)，不是 max(0, x @ w1) + b1。",
             _b1_after_relu(x, w1, b1, w2, b2)),
            ("这里的激活是 ReLU，即 max(0, ·)（torch.relu 或 clamp(min=0)），不是 GELU。",
             _gelu(x, w1, b1, w2, b2)),
            ("最后还要加上输出偏置 b2。", _no_b2(x, w1, b1, w2, b2))]
    hit = nearest(f.got, f.expected, alts)
    return hit or (capped if "large" in f.case.tags else None)


# ----------------------------------------------------------------------------- swiglu bugs
def _sw(x, w_gate, w_up, w_down, *, gate=F.silu, swap=False, use_gate=True, add=False,
        after=False):
    u, v = (x @ w_up, x @ w_gate) if swap else (x @ w_gate, x @ w_up)
    if not use_gate:
        return F.silu(v) @ w_down
    if after:
        return F.silu(u * v) @ w_down
    return ((gate(u) + v) if add else gate(u) * v) @ w_down


def _swapped(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, swap=True)


def _sigmoid(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, gate=torch.sigmoid)


def _relu_gate(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, gate=F.relu)


def _no_gate(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, use_gate=False)


def _added(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, add=True)


def _after(x, w_gate, w_up, w_down):
    return _sw(x, w_gate, w_up, w_down, after=True)


def _both(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate) * F.silu(x @ w_up)) @ w_down


SW_BUGS = {
    "silu_on_the_up_branch": _swapped,
    "sigmoid_gate": _sigmoid,
    "relu_gate": _relu_gate,
    "gate_ignored": _no_gate,
    "branches_added": _added,
    "silu_after_product": _after,
    "silu_on_both_branches": _both,
}


def _sw_cases(g):
    """d_ff = 8d/3 in every case (the prompt says so); shapes and scales vary with the seed."""
    def args(lead, d, d_ff, x_scale=1.5, dtype=torch.float64):
        return tuple(a.to(dtype) for a in (
            _r(g, *lead, d, scale=x_scale), _r(g, d, d_ff, scale=d ** -0.5),
            _r(g, d, d_ff, scale=d ** -0.5), _r(g, d_ff, d, scale=d_ff ** -0.5)))
    n, d = _ri(g, 2, 5), 3 * _ri(g, 1, 3)
    b, t, d2 = _ri(g, 2, 4), _ri(g, 3, 6), 3 * _ri(g, 3, 5)
    d3, x3 = 3 * _ri(g, 2, 4), float(2.0 ** _ri(g, 0, 3))
    return [
        Case(f"{n} 个位置，d = {d}，d_ff = {8 * d // 3}", args((n,), d, 8 * d // 3),
             note=f"d_ff = {8 * d // 3} = 8d/3：w_gate、w_up 是 ({d}, {8 * d // 3})，"
                  f"w_down 是 ({8 * d // 3}, {d})。"),
        Case(f"批 ({b}, {t}, {d2})，d_ff = {8 * d2 // 3}", args((b, t), d2, 8 * d2 // 3),
             note="同一个映射作用在每个批、每个位置的每一行上。"),
        Case(f"单精度（float32），d = {d3}，d_ff = {8 * d3 // 3}，输入的尺度是 {x3:g}",
             args((2, 3), d3, 8 * d3 // 3, x_scale=x3, dtype=torch.float32),
             note="输入是 float32，返回值也应是 float32；门的输入有很负的值（SiLU 在那里接近 0）。"),
    ]


def _sw_hint(f):
    if f.kind != "value":
        return None
    x, wg, wu, wd = (f.inputs[k] for k in ("x", "w_gate", "w_up", "w_down"))
    alts = [("SiLU 作用在门那一支 x @ w_gate 上，另一支 x @ w_up 不过激活：两支用反了。",
             _swapped(x, wg, wu, wd)),
            ("门用的是 SiLU(u) = u·σ(u)（F.silu），不是 σ(u)：那是原始的 GLU。",
             _sigmoid(x, wg, wu, wd)),
            ("门用的是 SiLU（F.silu），不是 ReLU：那是 ReGLU。", _relu_gate(x, wg, wu, wd)),
            ("少了门：要把 SiLU(x @ w_gate) 与 x @ w_up 逐元素相乘。", _no_gate(x, wg, wu, wd)),
            ("两支要逐元素相乘（*），不是相加。", _added(x, wg, wu, wd)),
            ("SiLU 只作用在门 x @ w_gate 上，在相乘之前，不是作用在乘积上。",
             _after(x, wg, wu, wd)),
            ("另一支 x @ w_up 不过激活：只有门那一支过 SiLU，两支都过 SiLU 就不是 SwiGLU 了。",
             _both(x, wg, wu, wd))]
    return nearest(f.got, f.expected, alts)


register(Exercise("ch07.feed_forward", "逐位置 FFN", feed_forward, FF_BUGS, _ff_cases, (_ff_hint,)))
register(Exercise("ch07.swiglu", "SwiGLU FFN", swiglu, SW_BUGS, _sw_cases, (_sw_hint,)))


# ----------------------------------------------------------------------------- matched_swiglu
# The build exercise: a SwiGLU FFN with the parameter budget of a bias-free ReLU FFN of width
# d_ff. The reader gets the 2 d d_ff numbers as one flat vector and must find the hidden width
# (3 d h = 2 d d_ff, so h = 2 d_ff / 3), cut the vector into W_g, W_1, W_2 (row-major, in that
# order) and run the gated forward. Every case has d_ff != 4 d except one, so the 8d/3 rule of
# swiglu_hidden_size (which assumes d_ff = 4 d) is caught, and d != h, so a weight read in the
# column layout fails.
def matched_swiglu(x, params, d_ff):
    """SwiGLU with a d_ff-wide ReLU FFN's 2 d d_ff weights (chapter 07, eq-ch07-swiglu): hidden
    width h = 2 d_ff / 3; ``params`` = W_g (d x h) | W_1 (d x h) | W_2 (h x d), row-major."""
    d = x.shape[-1]
    h = 2 * d_ff // 3
    w_gate, w_up, w_down = params.split([d * h, d * h, h * d])
    return swiglu(x, w_gate.view(d, h), w_up.view(d, h), w_down.view(h, d))


def _cut(params, d, h, order=(0, 1, 2), transposed=False):
    """params cut at widths d*h into three matrices (the reader's possible slips)."""
    parts = [params[i * d * h:(i + 1) * d * h] for i in range(3)]
    wg, wu, wd = (parts[i] for i in order)
    if transposed:  # each matrix read in the column layout: (out, in), then transposed
        return wg.view(h, d).T, wu.view(h, d).T, wd.view(d, h).T
    return wg.view(d, h), wu.view(d, h), wd.view(h, d)


def _mb(h_rule=None, order=(0, 1, 2), transposed=False, form=swiglu):
    def bug(x, params, d_ff):
        d = x.shape[-1]
        h = 2 * d_ff // 3 if h_rule is None else h_rule(d, d_ff)
        return form(x, *_cut(params, d, h, order, transposed))
    return bug


MATCHED_BUGS = {
    "hidden_is_d_ff": _mb(h_rule=lambda d, d_ff: d_ff),
    "hidden_from_d_model": _mb(h_rule=lambda d, d_ff: 8 * d // 3),
    "gate_and_up_slices_swapped": _mb(order=(1, 0, 2)),
    "down_slice_first": _mb(order=(1, 2, 0)),
    "column_layout": _mb(transposed=True),
    "sigmoid_gate": _mb(form=_sigmoid),
    "gate_ignored": _mb(form=_no_gate),
}


def _matched_case(g, lead, d, d_ff, dtype=torch.float64, scale=1.0):
    h = 2 * d_ff // 3
    x = _r(g, *lead, d, scale=scale)
    params = torch.cat([_r(g, d * h, scale=d ** -0.5), _r(g, d * h, scale=d ** -0.5),
                        _r(g, h * d, scale=h ** -0.5)])
    return (x.to(dtype), params.to(dtype), d_ff)


def _matched_cases(g):
    d = 4 + 2 * int(torch.randint(0, 3, (1,), generator=g))         # 4, 6 or 8
    wide = 3 * (3 + 2 * int(torch.randint(0, 3, (1,), generator=g)))  # 9, 15 or 21: h = 6, 10, 14
    scale = float(2.0 ** int(torch.randint(0, 4, (1,), generator=g)))
    b = 2 + int(torch.randint(0, 3, (1,), generator=g))
    return [
        Case("3 个位置，d = 4，d_ff = 12（ReLU FFN 的宽度是 3d）", _matched_case(g, (3,), 4, 12),
             note="params 有 2·d·d_ff = 96 个数；SwiGLU 的隐藏宽度 h 要让 3·d·h 也等于 96。"),
        Case(f"批 ({b}, 5, 6)，d_ff = 24（= 4d）", _matched_case(g, (b, 5), 6, 24),
             note="d_ff = 4d：这时 h = 2·d_ff/3 = 16 也等于 8d/3。"),
        Case(f"d = {d}，d_ff = {wide}（不是 4d），输入的尺度是 {scale:g}",
             _matched_case(g, (1, 4), d, wide, scale=scale),
             note=f"h = 2·{wide}/3 = {2 * wide // 3}；不是 8d/3。", tags=frozenset({"narrow"})),
        Case("float32，d = 5，d_ff = 30（= 6d）",
             _matched_case(g, (2, 3), 5, 30, dtype=torch.float32),
             note="h = 20；返回 float32。"),
    ]


def _matched_hint(f):
    x, params, d_ff = f.inputs["x"], f.inputs["params"], f.inputs["d_ff"]
    d, h = x.shape[-1], 2 * d_ff // 3
    budget = (f"ReLU FFN 的两个矩阵共 2·d·d_ff = {2 * d * d_ff} 个数，SwiGLU 有三个 d×h 的矩阵，"
              f"3·d·h = 2·d·d_ff 给出 h = 2·d_ff/3 = {h}")
    if f.kind == "exception":
        text = str(f.exc)
        if "size" not in text:
            return None
        if _has_number(text, d_ff):
            return f"隐藏宽度不是 d_ff = {d_ff}：{budget}。"
        if _has_number(text, 8 * d // 3) and 8 * d // 3 != h:
            return (f"隐藏宽度 8d/3 = {8 * d // 3} 只在 d_ff = 4d 时成立：{budget}"
                    "（它由 d_ff 决定，不由 d 决定）。")
        return None
    if f.kind != "value":
        return None
    alts = [(f"用的是 8d/3 = {8 * d // 3} 作隐藏宽度：它只在 d_ff = 4d 时成立；{budget}。",
             _safe(MATCHED_BUGS["hidden_from_d_model"], x, params, d_ff)),
            ("前两段用反了：params 依次是 W_g、W_1、W_2，SiLU 作用在第一段 W_g 上。",
             MATCHED_BUGS["gate_and_up_slices_swapped"](x, params, d_ff)),
            ("三段的顺序不对：params 依次是 W_g（d×h）、W_1（d×h）、W_2（h×d）。",
             MATCHED_BUGS["down_slice_first"](x, params, d_ff)),
            ("每一段都按行展开：W_g 是 view(d, h)，不是先 view(h, d) 再转置（那是 nn.Linear.weight "
             "的列向量布局）。", MATCHED_BUGS["column_layout"](x, params, d_ff)),
            ("门用的是 SiLU(u) = u·σ(u)（F.silu），不是 σ(u)：那是原始的 GLU。",
             MATCHED_BUGS["sigmoid_gate"](x, params, d_ff)),
            ("少了门：要把 SiLU(x @ W_g) 与 x @ W_1 逐元素相乘。",
             MATCHED_BUGS["gate_ignored"](x, params, d_ff))]
    return nearest(f.got, f.expected, alts)


def _has_number(text, n) -> bool:
    """Whether the integer ``n`` appears as a whole number in ``text``."""
    return re.search(rf"(?<!\d){n}(?!\d)", text) is not None


def _safe(fn, *args):
    try:
        return fn(*args)
    except RuntimeError:
        return None


register(Exercise("ch07.matched_swiglu", "等参数量的 SwiGLU", matched_swiglu,
                  MATCHED_BUGS, _matched_cases, (_matched_hint,),
                  forbidden=((FeedForward.forward, "attnbook.layers.FeedForward"),
                             (swiglu, "exercises.get('ch07.swiglu').solution")),
                  build=True))
