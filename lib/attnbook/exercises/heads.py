"""Chapter 05's exercises on the head layout.

``ch05.split_heads``: cut the features into heads, (B, T, H d_k) -> (B, H, T, d_k). The classic
bug reshapes straight to ``(B, H, T, d_k)``: the shape is right, but each "head" then holds
pieces of several tokens.

``ch05.merge_heads``: the inverse, Concat(head_1, ..., head_H) (chapter 05, step 2),
(B, H, T, d_v) -> (B, T, H d_v). The classic bugs reshape without moving the head axis next to
the features (tokens mixed), interleave the heads' features, or sum the heads instead of
concatenating them (the sum comes only after W^O).

Both are pure data movement, so the comparison is exact (float64 tolerance) and the hints
recognise the bug by recomputing what it gives.
"""
from __future__ import annotations

import torch

from ..multihead import merge_heads as _lib_merge_heads
from ..multihead import split_heads as _lib_split_heads
from ._core import Case, Exercise, register
from ._report import close


def split_heads(x, n_heads):
    """Block i of the features becomes head i (chapter 05, step 1).

    ``(B, T, H*d_k) -> (B, H, T, d_k)``."""
    return _lib_split_heads(x, n_heads)


def _no_transpose(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, n_heads, t, d // n_heads)  # right shape, tokens mixed into heads


def _strided(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, d // n_heads, n_heads).permute(0, 3, 1, 2)  # head i = every H-th feature


def _last_two_swapped(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).permute(0, 2, 3, 1)  # (B, H, d_k, T)


BUGS = {
    "missing_transpose_before_head_reshape": _no_transpose,
    "strided_heads": _strided,
    "transpose_of_wrong_dims": _last_two_swapped,
}


def _cases(g):
    def x(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    return [
        Case("两个头的小例子", (x(1, 3, 4), 2), note="B = 1，T = 3，H = 2，d_k = 2。"),
        Case("批、T ≠ H", (x(2, 5, 12), 3), note="B = 2，T = 5，H = 3，d_k = 4。"),
        Case("只有一个头", (x(2, 4, 6), 1), note="H = 1：结果就是多出一维的 x。"),
        Case("头比词元多", (x(3, 2, 8), 4), note="B = 3，T = 2，H = 4，d_k = 2。"),
        _random_split_case(g),
    ]


def _random_split_case(g):
    """A case whose sizes change with the seed (B, T, H and d_k all different)."""
    b, t, h, d_k = [int(i) + 2 for i in torch.randperm(5, generator=g)[:4]]
    x = torch.randn(b, t, h * d_k, generator=g, dtype=torch.float64)
    return Case("随种子变化的形状", (x, h), note=f"B = {b}，T = {t}，H = {h}，d_k = {d_k}。")


def _transpose_first(x, n_heads):
    b, t, d = x.shape
    return x.transpose(1, 2).reshape(b, n_heads, t, d // n_heads)   # features, then time


def _batch_mixed(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b * t, n_heads, d // n_heads).transpose(0, 1).reshape(b, n_heads, t, -1)


def _hint(f):
    if f.kind == "exception" and "view size is not compatible" in str(f.exc):
        return VIEW
    if f.kind != "value":
        return None
    x, h = f.inputs["x"], f.inputs["n_heads"]
    b, t, d = x.shape
    if close(f.got, x.reshape(b, t, h, d // h).transpose(1, 3).reshape(b, h, t, d // h)):
        return ("transpose(1, 3) 交换的是时间和 d_k：从 (B, T, H, d_k) 出发只交换第 1、2 维"
                "（transpose(1, 2)），不需要再 reshape。")
    if close(f.got, _transpose_first(x, h)):
        return ("先转置、后 reshape 会把时间和特征搅在一起：先把最后一维拆成 (H, d_k)，"
                "reshape 成 (B, T, H, d_k)，再 transpose(1, 2)。")
    if close(f.got, _batch_mixed(x, h)):
        return ("批和时间混在了一起（B = 1 时才碰巧对）：保持批这一维不动，"
                "reshape(B, T, H, d_k) 再 transpose(1, 2)。")
    if close(f.got, _no_transpose(x, h)):
        return ("形状对了，数值却错位：直接 reshape 成 (B, H, T, d_k) 会把不同词元的特征混进同一个头。"
                "先 reshape 成 (B, T, H, d_k)，再 transpose(1, 2)。")
    if close(f.got, _strided(x, h)):
        return ("第 i 个头应是连续的第 i 块特征 x[..., i*d_k:(i+1)*d_k]，而不是每隔 H 个取一个："
                "reshape 的最后两维应是 (H, d_k)，不是 (d_k, H)。")
    return "第 i 个头应是 x[:, :, i*d_k:(i+1)*d_k]：对照这一例的输入手算一个头。"


VIEW = (".view 要求张量在内存里连续，transpose 之后不再连续：用 .reshape（必要时它会复制），"
        "或先 .contiguous() 再 .view。")


def _hint_shape(f):
    if f.kind == "shape":
        got, want = tuple(f.got.shape), tuple(f.expected.shape)
        if got == (want[0] * want[1],) + want[2:]:
            return ("(B·H, T, d_k) 是 nn.MultiheadAttention 内部的布局；本题要 (B, H, T, d_k)："
                    "批和头是分开的两维。")
        if len(got) == 4 and (got[0], got[2]) == (want[0], want[2]) and (got[1], got[3]) == (
                want[3], want[1]) and got[1] != got[3]:
            return ("切出了 d_k 个宽 H 的块（x.split(n_heads, -1) 的第一个参数是每块的宽度）："
                    "要的是 H 个宽 d_k 的块，x.split(d_k, -1) 或 x.chunk(n_heads, -1)。")
        if len(got) == 4 and sorted(got) == sorted(want) and got[:2] != want[:2]:
            return (f"维度的顺序不对：得到 {got}，应是 (B, H, T, d_k) = {want}。先 reshape 成 "
                    "(B, T, H, d_k)，再只交换第 1、2 维（transpose(1, 2)）。")
    if f.kind == "shape" and tuple(f.got.shape) == tuple(f.expected.shape[:2]) + tuple(
            f.expected.shape[:1:-1]):
        return "最后两维反了：应是 (B, H, T, d_k)，只交换 T 和 H 两维（transpose(1, 2)）。"
    return None


register(Exercise("ch05.split_heads", "把特征切成多个头", split_heads, BUGS, _cases,
                  (_hint_shape, _hint)))


def merge_heads(x):
    """Concat(head_1, ..., head_H) (chapter 05, step 2): ``(B, H, T, d_v) -> (B, T, H*d_v)``."""
    return _lib_merge_heads(x)


def _merge_no_transpose(x):
    b, h, t, d = x.shape
    return x.reshape(b, t, h * d)                      # right shape, tokens mixed


def _merge_interleaved(x):
    b, h, t, d = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, t, d * h)  # feature l from head l % H


def _merge_sum(x):
    return x.sum(1)                                    # (B, T, d_v): a sum is not a concat


def _merge_cat_on_time(x):
    return torch.cat(x.unbind(1), dim=1)               # (B, H*T, d_v): heads stacked as tokens


MERGE_BUGS = {
    "reshape_without_transpose": _merge_no_transpose,
    "interleaved_features": _merge_interleaved,
    "sum_instead_of_concat": _merge_sum,
    "concat_along_time": _merge_cat_on_time,
}


def _merge_cases(g):
    def x(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    return [
        Case("两个头的小例子", (x(1, 2, 3, 2),), note="B = 1，H = 2，T = 3，d_v = 2。"),
        Case("批、T ≠ H", (x(2, 3, 5, 4),), note="B = 2，H = 3，T = 5，d_v = 4。"),
        Case("只有一个头", (x(2, 1, 4, 3),), note="H = 1：结果就是去掉头这一维。"),
        Case("头比词元多", (x(1, 4, 2, 3),), note="B = 1，H = 4，T = 2，d_v = 3。"),
        _random_merge_case(g),
    ]


def _random_merge_case(g):
    """A case whose sizes change with the seed (B, H, T and d_v all different)."""
    b, h, t, d = [int(i) + 2 for i in torch.randperm(5, generator=g)[:4]]
    x = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    return Case("随种子变化的形状", (x,), note=f"B = {b}，H = {h}，T = {t}，d_v = {d}。")


def _merge_hint(f):
    x = f.inputs["x"]
    if f.kind == "exception" and "view size is not compatible" in str(f.exc):
        return VIEW
    if f.kind == "shape":
        got = tuple(f.got.shape)
        if got == tuple(_merge_sum(x).shape):
            return ("最后一维只有 d_v：把各头加起来不是拼接。拼接把 H 个 (T, d_v) 并排放成 (T, H·d_v)；"
                    "“求和”要到乘过 W^O 之后才出现（Σ_i head_i W^O_i）。")
        if got == tuple(_merge_cat_on_time(x).shape):
            return "拼接沿错了维度：各头应沿最后一维（特征）并排，而不是沿时间维接成 H·T 个位置。"
        b, h, t, d = x.shape
        if len(got) == 3 and got[0] == b and got[1] != t:
            return (f"第 1 维应是 T = {t}（词元），得到的是 {got[1]}：x 的形状是 (B, H, T, d_v)，"
                    "按这个顺序取 b, h, t, d = x.shape。")
        return None
    if f.kind != "value":
        return None
    if close(f.got, _merge_no_transpose(x)):
        return ("形状对了，数值却错位：直接 reshape 成 (B, T, H·d_v) 会把不同词元的输出混在一起。"
                "先 transpose(1, 2) 成 (B, T, H, d_v)，再 reshape。")
    b, h, t, d = x.shape
    if close(f.got, x.transpose(1, 3).reshape(b, t, h * d)) or close(
            f.got, x.transpose(1, 3).reshape(b, -1, h * d)):
        return ("transpose(1, 3) 交换的是头和特征：应交换头和时间，transpose(1, 2) 得到 "
                "(B, T, H, d_v)，再 reshape。")
    if close(f.got, _merge_interleaved(x)):
        return ("第 i 个头应占连续的第 i 块特征 [i*d_v, (i+1)*d_v)，而不是与其他头交错："
                "transpose(1, 2) 之后最后两维是 (H, d_v)，不要再换成 (d_v, H)。")
    return "输出的第 i 块特征 [..., i*d_v:(i+1)*d_v] 应是第 i 个头：对照这一例的输入手算一个位置。"


register(Exercise("ch05.merge_heads", "把各头的输出拼接起来", merge_heads, MERGE_BUGS, _merge_cases,
                  (_merge_hint,)))
