"""Chapter 06's exercise ``ch06.rope``: rotate queries or keys by their positions (RoPE).

Pair i of the vector at position m, ``(x_{2i}, x_{2i+1})``, is turned by the angle
``m * theta_i``, ``theta_i = 10000 ** (-2i / D)``: ``(a, b) -> (a cos - b sin, a sin + b cos)``
(chapter 06's eq-ch06-rope-complex; Su et al. 2021, RoFormer §3.2, interleaved pairs as there).
The classic bugs turn the wrong way, pair ``(x_i, x_{i + D/2})`` (rotate_half) instead of
neighbours, give every column its own frequency, ignore the given positions (0 .. T-1
instead) or forget the 2 in the exponent.
"""
from __future__ import annotations

import math

import torch

from ..positional import apply_rope
from ._core import Case, Exercise, register
from ._report import close, precision_hint


def rope(x, positions):
    """``x``: (..., T, D) queries or keys; ``positions``: (T,) integers. Interleaved RoPE."""
    return apply_rope(x, positions)


def _angles(x, positions, exponent):
    theta = torch.exp(-math.log(10000.0) * exponent / x.shape[-1])
    return positions.to(torch.float64)[:, None] * theta            # (T, D/2) or (T, D)


def _turn(x, positions, exponent, sign=1.0):
    ang = _angles(x, positions, exponent)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - sign * b * sin, sign * a * sin + b * cos], -1).flatten(-2)


def _pairs(d):
    return torch.arange(0, d, 2, dtype=torch.float64)


def _wrong_direction(x, positions):
    return _turn(x, positions, _pairs(x.shape[-1]), sign=-1.0)


def _rotate_half(x, positions):
    return apply_rope(x, positions, pairing="half")


def _per_column_frequency(x, positions):
    d = x.shape[-1]
    ang = _angles(x, positions, torch.arange(d, dtype=torch.float64))
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)        # column j has its own angle
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos[:, 0::2] - b * sin[:, 1::2], a * sin[:, 0::2] + b * cos[:, 1::2]],
                       -1).flatten(-2)


def _positions_ignored(x, positions):
    return apply_rope(x, torch.arange(x.shape[-2]))


def _missing_two(x, positions):
    return _turn(x, positions, _pairs(x.shape[-1]) / 2)


BUGS = {
    "wrong_direction": _wrong_direction,
    "rotate_half_pairs": _rotate_half,
    "per_column_frequency": _per_column_frequency,
    "positions_ignored": _positions_ignored,
    "exponent_missing_2": _missing_two,
}

_HINTS = (
    (_wrong_direction, "转反了：一对 (a, b) 转过角度 mθ 后是 (a·cos − b·sin, a·sin + b·cos)；"
                       "你的结果是 (a·cos + b·sin, −a·sin + b·cos)，即转过 −mθ。"),
    (_rotate_half, "本练习按 RoFormer 把相邻的两维 (x_0, x_1), (x_2, x_3), … 配成一对；"
                   "你配的是 (x_i, x_{i+D/2})（rotate_half 的写法）。"),
    (_per_column_frequency, "同一对（第 2i 和 2i+1 列）要用同一个角度 m·θ_i，θ_i = 10000^(−2i/D)："
                            "频率按对的序号 i 取，不是按列号 j 取。"),
    (_positions_ignored, "要用传入的 positions：第 t 行的位置是 positions[t]，不一定是 t。"),
    (_missing_two, "频率是 θ_i = 10000^(−2i/D)：指数里是 2i/D，不是 i/D。"),
)


def _cases(g):
    """Shapes, scales and positions vary with the seed."""
    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    def x(*shape, scale=1.0):
        return scale * torch.randn(shape, generator=g, dtype=torch.float64)
    start = ri(3, 40)
    t2, d2 = ri(4, 8), 2 * ri(3, 6)
    b3, h3, t3, d3 = ri(1, 4), ri(2, 4), ri(4, 8), 2 * ri(6, 10)
    scale3 = float(2.0 ** ri(-2, 4))
    far = torch.cat([torch.tensor([0]), torch.randint(1, 5000, (3,), generator=g).sort().values])
    return [
        Case("一对分量、两个位置", (x(2, 2), torch.tensor([0, 1])),
             note="D = 2：只有一对，θ_0 = 1；位置 0 不转，位置 1 转 1 弧度。"),
        Case("从 0 开始的位置", (x(t2, d2), torch.arange(t2)),
             note=f"T = {t2}，D = {d2}（{d2 // 2} 对）。"),
        Case("不从 0 开始的位置", (x(b3, h3, t3, d3, scale=scale3), torch.arange(start, start + t3)),
             note=f"(B, H, T, D) = ({b3}, {h3}, {t3}, {d3})，位置 {start}…{start + t3 - 1}，"
                  f"x 的尺度是 {scale3:g}。"),
        Case("很大的位置", (x(4, 32), far), note="位置可以不连续，也可以很大。"),
    ]


def _hint(f):
    if f.kind != "value":
        return None
    x, pos = f.inputs["x"], f.inputs["positions"]
    for bug, text in _HINTS:
        if close(f.got, bug(x, pos), atol=1e-9):
            return text
    return precision_hint(f) or "逐对检查：第 i 对 (x_{2i}, x_{2i+1}) 在位置 m 转过 m·10000^(−2i/D) 弧度。"


register(Exercise("ch06.rope", "旋转位置编码（RoPE）", rope, BUGS, _cases, (_hint,)))
