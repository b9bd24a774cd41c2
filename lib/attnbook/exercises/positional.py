"""Chapter 06's exercise ``ch06.sinusoidal``: the sinusoidal positional encoding.

``PE[p, 2i] = sin(p * omega_i)``, ``PE[p, 2i + 1] = cos(p * omega_i)``,
``omega_i = 10000 ** (-2i / d)`` (Vaswani et al. 2017, section 3.5), interleaved as in the paper.
The classic bugs swap sin and cos, concatenate ``[sin | cos]`` halves, give the two columns of a
pair different frequencies, count positions from 1, or use another base than 10000; the hints
also name tensor2tensor's spacing ``10000 ** (-i / (d/2 - 1))``. The table must be float64 (a
float32 table is rejected by its dtype).
"""
from __future__ import annotations

import math

import torch

from ..positional import sinusoidal_encoding
from ._core import Case, Exercise, register
from ._report import close, precision_hint


def sinusoidal(n_positions, d_model):
    """``(n_positions, d_model)``: row p is PE(p) (chapter 06, eq-ch06-sinusoid), in float64."""
    return sinusoidal_encoding(n_positions, d_model, dtype=torch.float64)


def _angles(n, d, exponent, start=0, base=10000.0):
    p = torch.arange(start, start + n, dtype=torch.float64)[:, None]
    return p * torch.exp(-math.log(base) * exponent / d)


def _interleave(even, odd):
    return torch.stack([even, odd], dim=-1).flatten(-2)


def _swapped(n_positions, d_model):
    a = _angles(n_positions, d_model, torch.arange(0, d_model, 2, dtype=torch.float64))
    return _interleave(torch.cos(a), torch.sin(a))


def _halves(n_positions, d_model):
    a = _angles(n_positions, d_model, torch.arange(0, d_model, 2, dtype=torch.float64))
    return torch.cat([torch.sin(a), torch.cos(a)], dim=-1)


def _pair_frequencies_differ(n_positions, d_model):
    a = _angles(n_positions, d_model, torch.arange(d_model, dtype=torch.float64))
    return _interleave(torch.sin(a[:, 0::2]), torch.cos(a[:, 1::2]))


def _from_one(n_positions, d_model):
    a = _angles(n_positions, d_model, torch.arange(0, d_model, 2, dtype=torch.float64), start=1)
    return _interleave(torch.sin(a), torch.cos(a))


def _base(n_positions, d_model, base):
    a = _angles(n_positions, d_model, torch.arange(0, d_model, 2, dtype=torch.float64), base=base)
    return _interleave(torch.sin(a), torch.cos(a))


def _base_1000(n_positions, d_model):
    return _base(n_positions, d_model, 1000.0)


BUGS = {
    "sin_cos_swapped": _swapped,
    "halves_concatenated": _halves,
    "pair_frequencies_differ": _pair_frequencies_differ,
    "positions_from_one": _from_one,
    "base_1000": _base_1000,
}

def _t2t(n_positions, d_model):
    """tensor2tensor's spacing: omega_i = 10000 ** (-i / (d/2 - 1)) (the chapter discusses it)."""
    half = d_model // 2
    if half < 2:
        return None
    p = torch.arange(n_positions, dtype=torch.float64)[:, None]
    a = p * torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / (half - 1))
    return _interleave(torch.sin(a), torch.cos(a))


_HINTS = (
    (_t2t, "你的频率是 tensor2tensor 的间距 ω_i = 10000^(−i/(d/2 − 1))（最慢的一对正好是 1/10000）；"
           "本题按原论文：ω_i = 10000^(−2i/d)。"),
    (_swapped, "sin 和 cos 的位置反了：偶数列 2i 是 sin(p·ω_i)，奇数列 2i+1 是 cos(p·ω_i)；"
               "所以 PE(0) 应是 [0, 1, 0, 1, …]。"),
    (_halves, "本书按论文交错排列：第 2i、2i+1 列是同一个频率的一对 sin、cos，"
              "不是前一半全是 sin、后一半全是 cos。"),
    (_pair_frequencies_differ, "同一对（第 2i 和 2i+1 列）要用同一个频率 ω_i = 10000^(−2i/d)："
                               "指数里是对的序号 2i，不是列号 j。"),
    (_from_one, "位置从 0 开始：第 0 行是 PE(0) = [0, 1, 0, 1, …]。"),
)


def _cases(g):
    """n_positions and d_model vary with the seed (d_model even)."""
    extra = int(torch.randint(0, 8, (1,), generator=g))
    d2 = 2 * int(torch.randint(4, 10, (1,), generator=g))
    n3 = int(torch.randint(40, 61, (1,), generator=g))
    d3 = 8 * int(torch.randint(3, 6, (1,), generator=g))
    return [
        Case("很小的例子", (4, 6), note="4 个位置，d_model = 6（三对 sin/cos）。"),
        Case("中等大小", (10 + extra, d2)),
        Case("位置多、维度大", (n3, d3), note=f"角度 p·ω 最大到 {n3 - 1}。"),
    ]


def _hint(f):
    if f.kind != "value":
        return None
    n, d = f.inputs["n_positions"], f.inputs["d_model"]
    for bug, text in _HINTS:
        if close(f.got, bug(n, d), atol=1e-3):
            return text
    ones = _interleave(*(f(torch.arange(n, dtype=torch.float64)[:, None].expand(n, d // 2))
                         for f in (torch.sin, torch.cos)))
    if close(f.got, ones, atol=1e-3):
        return ("你的频率全是 1：指数 2i/d 像是用了整数除法（//），结果都是 0。"
                "用浮点数计算指数：torch.arange(0, d, 2, dtype=torch.float64) / d。")
    if n > 1 and d >= 4:  # read omega_1 off PE(1)[2] = sin(omega_1), then the base it implies
        omega = math.asin(max(-1.0, min(1.0, float(f.got[1, 2]))))
        base = omega ** (-d / 2) if 0 < omega < 1 else None
        if base and abs(base - 1e4) > 1 and close(f.got, _base(n, d, base), atol=1e-3):
            if abs(base - 100) < 0.5:
                return ("指数应是 2i/d（i 是第几对，2i 是这一对的偶数列号）：ω_i = 10000^(−2i/d)；"
                        "你的结果像是 10000^(−i/d)，少了那个 2（等价于底数 100）。")
            if abs(base - 1) < 1e-6:
                return ("你的频率全是 1：指数 2i/d 像是用了整数除法（//），结果都是 0。"
                        "用浮点数计算指数：torch.arange(0, d, 2, dtype=torch.float64) / d。")
            return (f"频率的底数应是 10000：ω_i = 10000^(−2i/d)；你的结果像是用了 {base:.6g}。"
                    "第 0、1 列（i = 0，ω_0 = 1）与底数无关，所以从第 2 列开始不同。")
    return precision_hint(f) or ("逐列检查：第 2i 列是 sin(p / 10000^(2i/d))，"
                                 "第 2i+1 列是 cos(p / 10000^(2i/d))。")


def _low_atol(case, dtype):
    """Rounding of the angles (up to n * eps) and of sin / cos, with a margin of 8."""
    return 8 * torch.finfo(dtype).eps * max(1, case.args[0])


register(Exercise("ch06.sinusoidal", "正弦位置编码", sinusoidal, BUGS, _cases, (_hint,),
                  low_atol=_low_atol, dtypes=(torch.float64,)))
