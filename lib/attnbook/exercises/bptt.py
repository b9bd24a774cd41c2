"""Chapter 01's exercise ``ch01.jacobian_product``: the BPTT product
``dh_t/dh_k = J_t ... J_{k+1}``.

``factors`` has shape ``(B, T, d, d)`` with ``factors[:, j-1] = J_j`` (eq-ch01-step, numerator
layout); the answer has shape ``(B, d, d)``, the latest step on the left, and is the identity
when ``t == k`` (no step at all). The classic bugs put the earliest step on the left, transpose
every factor (the seed's denominator-layout factor), shift the index by one step (``factors[:, j]``
for ``J_j``), return ``J_t`` instead of the identity when ``t == k``, or multiply element-wise.
"""
from __future__ import annotations

import torch

from ..rnn import jacobian_product as _lib_jacobian_product
from ._core import Case, Exercise, register
from ._report import close


def jacobian_product(factors, t, k):
    """``J_t J_{t-1} ... J_{k+1}`` from ``factors[:, j-1] = J_j`` (chapter 01, eq-ch01-product)."""
    return _lib_jacobian_product(factors, t, k)


def _eye(factors):
    d = factors.shape[-1]
    return torch.eye(d, dtype=factors.dtype).expand(factors.shape[0], d, d).clone()


def _earliest_left(factors, t, k):
    prod = _eye(factors)
    for j in range(k + 1, t + 1):
        prod = prod @ factors[:, j - 1]                        # J_{k+1} ... J_t
    return prod


def _transposed(factors, t, k):
    prod = _eye(factors)
    for j in range(k + 1, t + 1):
        prod = factors[:, j - 1].transpose(-1, -2) @ prod      # J_t^T ... J_{k+1}^T
    return prod


def _shifted(factors, t, k):
    prod = _eye(factors)
    for j in range(k + 1, t + 1):
        prod = factors[:, j] @ prod                            # J_{j+1} where J_j was meant
    return prod


def _no_identity(factors, t, k):
    prod = factors[:, t - 1].clone()                           # starts from J_t even when t == k
    for j in range(t - 1, k, -1):
        prod = prod @ factors[:, j - 1]
    return prod


def _elementwise(factors, t, k):
    prod = _eye(factors)
    for j in range(k + 1, t + 1):
        prod = factors[:, j - 1] * prod                        # Hadamard, not a matrix product
    return prod


BUGS = {
    "earliest_step_on_the_left": _earliest_left,
    "factors_transposed": _transposed,
    "index_shifted_by_one": _shifted,
    "no_identity_when_t_equals_k": _no_identity,
    "elementwise_product": _elementwise,
}


def _factors(g, b, steps, d, scale=1.0):
    return scale * torch.randn(b, steps, d, d, generator=g, dtype=torch.float64) / d ** 0.5


def _cases(g):
    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    b, d, steps = pick(2, 3), pick(3, 5), pick(6, 8)       # shapes vary with the seed
    t, k = steps - 1, pick(0, 2)
    d4 = pick(2, 4)
    big = 1.5 + float(torch.rand(1, generator=g))           # so does the factors' scale
    return [
        Case(f"一般情形：B = {b}，T = {steps}，d = {d}，t = {t}，k = {k}",
             (_factors(g, b, steps, d), t, k),
             note=f"factors[:, j-1] 是 J_j；答案是 J_{t} ⋯ J_{k + 1}，形状 ({b}, {d}, {d})。"),
        Case("t == k：一步也不走", (_factors(g, 2, 5, 3), 3, 3),
             note="没有任何因子相乘，∂h_3/∂h_3 是单位矩阵。", tags=frozenset({"identity"})),
        Case("整条序列：t = T = 4，k = 0", (_factors(g, 1, 4, 4, big), 4, 0),
             note="J_4 J_3 J_2 J_1；factors[:, 3] 是最后一个因子；因子的范数大于 1。"),
        Case("只走一步：t = k + 1", (_factors(g, 3, 5, d4), 3, 2), note="答案就是 J_3 = factors[:, 2]。"),
    ]


def _hint(f):
    if f.kind == "exception" and isinstance(f.exc, IndexError):
        return ("下标越界：factors[:, j-1] 才是 J_j（Python 从 0 数起），用 factors[:, j] 会错开一步，"
                "j = T 时越界。")
    if f.kind != "value":
        return None
    factors, t, k = f.inputs["factors"], f.inputs["t"], f.inputs["k"]
    if "identity" in f.case.tags:
        return "t == k 时一步也不走：∂h_t/∂h_t 是单位矩阵，不是 J_t，也不是零矩阵。"
    guesses = [
        (_earliest_left, "乘法顺序反了：分子布局下后作用的一步在左边，应当是 J_t ⋯ J_{k+1}（最新的一步在最左边），"
                         "不是 J_{k+1} ⋯ J_t。"),
        (_transposed, "每个因子都被转置了：factors 里存的已经是雅可比矩阵 J_j = diag(σ′) W_hh^T，直接相乘，"
                      "不要再转置（原笔记的 W_h^T diag(σ′) 是分母布局）。"),
        (_elementwise, "用了逐元素乘法 *：雅可比矩阵要做矩阵乘法 @。"),
    ]
    if t < factors.shape[1]:
        guesses.append((_shifted, "下标错开了一步：factors[:, j-1] 才是 J_j（Python 从 0 数起），"
                                  "你的像是用 factors[:, j] 当作 J_j。"))
    for bug, text in guesses:
        if close(f.got, bug(factors, t, k)):
            return text
    return "从单位矩阵出发，j = k+1, …, t 依次左乘 factors[:, j-1]：prod = factors[:, j-1] @ prod。"


register(Exercise("ch01.jacobian_product", "沿时间反向的雅可比连乘积", jacobian_product, BUGS, _cases,
                  (_hint,)))
