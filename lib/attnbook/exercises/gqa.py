"""Chapter 05's exercise ``ch05.repeat_kv``: grouped-query attention's KV sharing.

With ``H_kv`` key/value heads and ``H = H_kv * n_rep`` query heads, query head i reads
key/value head ``i // n_rep``: each KV head is repeated for ``n_rep`` CONSECUTIVE query heads,
``(B, H_kv, T, D) -> (B, H_kv * n_rep, T, D)``. The classic bugs tile the heads instead
(``x.repeat(1, n_rep, 1, 1)``: query head i reads KV head ``i % H_kv``, right shape, wrong
pairing), or repeat along the time or the feature axis. Pure data movement: exact comparison.
"""
from __future__ import annotations

import torch

from ..multihead import repeat_kv as _lib_repeat_kv
from ._core import Case, Exercise, register
from ._report import close


def repeat_kv(x, n_rep):
    """KV head j serves query heads ``j*n_rep .. (j+1)*n_rep - 1``.

    ``(B, H_kv, T, D) -> (B, H_kv*n_rep, T, D)``."""
    return _lib_repeat_kv(x, n_rep)


def _tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)                     # query head i reads KV head i % H_kv


def _tiled_by_expand(x, n_rep):
    b, h, t, d = x.shape
    return x[:, None].expand(b, n_rep, h, t, d).reshape(b, n_rep * h, t, d)   # also i % H_kv


def _time_axis(x, n_rep):
    return x.repeat_interleave(n_rep, dim=2)            # (B, H_kv, T * n_rep, D)


def _feature_axis(x, n_rep):
    return x.repeat_interleave(n_rep, dim=-1)           # (B, H_kv, T, D * n_rep)


BUGS = {
    "tiled_heads": _tiled,
    "tiled_by_expand_on_wrong_axis": _tiled_by_expand,
    "repeated_along_time": _time_axis,
    "repeated_along_features": _feature_axis,
}


def _cases(g):
    def x(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    return [
        Case("两组、每组两个查询头", (x(1, 2, 3, 4), 2), note="H_kv = 2，n_rep = 2：查询头 0、1 读键值头 0。"),
        Case("三组、每组四个查询头", (x(2, 3, 5, 2), 4), note="B = 2，H_kv = 3，H = 12。"),
        Case("多查询注意力（MQA）", (x(2, 1, 4, 3), 3), note="H_kv = 1：所有查询头读同一个键值头。"),
        Case("n_rep = 1", (x(1, 4, 2, 3), 1), note="每个查询头有自己的键值头：结果就是 x。"),
        _random_case(g),
    ]


def _random_case(g):
    """A case whose sizes change with the seed (B, H_kv, n_rep, T and D all different)."""
    b, h, n, t, d = [int(i) + 2 for i in torch.randperm(5, generator=g)]
    x = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    return Case("随种子变化的形状", (x, n), note=f"B = {b}，H_kv = {h}，n_rep = {n}，T = {t}，D = {d}。")


def _hint(f):
    if f.kind == "exception":
        text = str(f.exc)
        if "expand" in text:
            return ("expand 只能把长度为 1 的维扩展：先插入一个新轴 x[:, :, None]，expand 成 "
                    "(B, H_kv, n_rep, T, D)，再 reshape 成 (B, H_kv·n_rep, T, D)。")
        if isinstance(f.exc, IndexError):
            return ("下标越界：查询头 i 读键值头 i // n_rep（每组 n_rep 个查询头），不是 "
                    "i // H_kv；下标最大是 H_kv − 1。")
        return None
    if f.kind == "shape":
        got, want = tuple(f.got.shape), tuple(f.expected.shape)
        if len(got) == 1:
            return ("repeat_interleave 不给 dim 时先把张量展平成一维：写 "
                    "repeat_interleave(n_rep, dim=1)。")
        if len(got) == 4 and got[0] != want[0]:
            return "重复的是批这一维（第 0 维）：应该重复的是头这一维（第 1 维），B 不变。"
        if len(got) == 4 and got[2] != want[2] and got[-1] == want[-1]:
            return "重复的是时间维（第 2 维）：应该重复的是头这一维（第 1 维），T 不变。"
        if len(got) == 4 and got[-1] != want[-1]:
            return "重复的是特征维（最后一维）：每个头的宽度 D 不变，应该重复的是头这一维（第 1 维）。"
        return None
    if f.kind != "value":
        return None
    x, n = f.inputs["x"], f.inputs["n_rep"]
    if close(f.got, _tiled(x, n)):
        return ("形状对了，头却配错了：整块平铺（x.repeat(1, n_rep, 1, 1)）让查询头 i 读键值头 i % H_kv。"
                "GQA 里查询头 i 读键值头 i // n_rep：每个键值头连续重复 n_rep 次"
                "（repeat_interleave(n_rep, dim=1)，或在第 2 维插入新轴再 expand）。")
    return "查询头 i 应读键值头 i // n_rep：对照这一例的输入，看第 0 个和第 n_rep 个查询头各是谁。"


register(Exercise("ch05.repeat_kv", "GQA：共用键值头", repeat_kv, BUGS,
                  _cases, (_hint,)))
