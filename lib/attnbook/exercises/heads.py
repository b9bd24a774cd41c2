"""Chapter 05's exercise ``ch05.split_heads``: cut the features into heads, (B, T, H d_k) -> (B, H, T, d_k).

The classic bug reshapes straight to ``(B, H, T, d_k)``: the shape is right, but each "head"
then holds pieces of several tokens. Splitting is pure data movement, so the comparison is
exact (float64 tolerance) and the hints recognise the bug by recomputing what it gives.
"""
from __future__ import annotations

import torch

from ..multihead import split_heads as _lib_split_heads
from ._core import Case, Exercise, register
from ._report import close


def split_heads(x, n_heads):
    """Block i of the features becomes head i (chapter 05, step 1): ``(B, T, H*d_k) -> (B, H, T, d_k)``."""
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
    ]


def _hint(f):
    if f.kind != "value":
        return None
    x, h = f.inputs["x"], f.inputs["n_heads"]
    if close(f.got, _no_transpose(x, h)):
        return ("形状对了，数值却错位：直接 reshape 成 (B, H, T, d_k) 会把不同词元的特征混进同一个头。"
                "先 reshape 成 (B, T, H, d_k)，再 transpose(1, 2)。")
    if close(f.got, _strided(x, h)):
        return ("第 i 个头应是连续的第 i 块特征 x[..., i*d_k:(i+1)*d_k]，而不是每隔 H 个取一个："
                "reshape 的最后两维应是 (H, d_k)，不是 (d_k, H)。")
    return "第 i 个头应是 x[:, :, i*d_k:(i+1)*d_k]：对照这一例的输入手算一个头。"


def _hint_shape(f):
    if f.kind == "shape" and tuple(f.got.shape) == tuple(f.expected.shape[:2]) + tuple(
            f.expected.shape[:1:-1]):
        return "最后两维反了：应是 (B, H, T, d_k)，只交换 T 和 H 两维（transpose(1, 2)）。"


register(Exercise("ch05.split_heads", "把特征切成多个头", split_heads, BUGS, _cases,
                  (_hint_shape, _hint)))
