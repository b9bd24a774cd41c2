"""Chapter 09's empirical claim: random features approximate softmax attention, elu + 1 does not.

One seed draws ``q, k, v`` (``B = 1, H = 4, T = 128, d = 16``; q and k scaled by 1/2 so the
exponentials of the random features stay tame) and the Performer feature matrix ``W``
(``efficient.random_feature_map``). The metrics are the relative Frobenius error of linear
attention against softmax attention (``attention_ref``) for ``m = 16 .. 4096`` positive random
features, and the same error for the ``elu + 1`` map of Katharopoulos et al. (2020).
"""
from __future__ import annotations

import math

import torch

from ..efficient import elu_feature_map, linear_attention, random_feature_map
from ..reference import attention_ref
from .registry import register
from .rules import All, Between, Decreasing, Gt, Lt

__all__ = ["FEATURES", "performer_inputs", "performer_metrics", "run_performer"]

FEATURES = (16, 64, 256, 1024, 4096)


def performer_inputs(seed, t=128, d=16, heads=4, qk_scale=0.5):
    """``q, k, v`` of one seed (float64, ``(1, heads, t, d)``); q and k times ``qk_scale``."""
    g = torch.Generator().manual_seed(9000 + seed)
    q, k, v = (torch.randn(1, heads, t, d, generator=g, dtype=torch.float64) for _ in range(3))
    return q * qk_scale, k * qk_scale, v


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def performer_metrics(q, k, v, features=FEATURES, seed=0):
    """Relative errors vs softmax attention: ``err_m<m>`` per feature count, ``err_elu``,
    and ``slope``, the least-squares slope of log(error) against log(m) (-1/2 for Monte Carlo)."""
    soft = attention_ref(q, k, v).out
    d = q.shape[-1]
    out = {}
    for m in features:
        phi = random_feature_map(d, m, seed=seed)
        out[f"err_m{m}"] = _rel(linear_attention(q, k, v, feature_map=phi), soft)
    out["err_elu"] = _rel(linear_attention(q, k, v, feature_map=elu_feature_map), soft)
    xs = [math.log(m) for m in features]
    ys = [math.log(out[f"err_m{m}"]) for m in features]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    out["slope"] = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
                    / sum((x - mx) ** 2 for x in xs))
    return out


def run_performer(seed):
    """One seed of ``ch09.performer``."""
    q, k, v = performer_inputs(seed)
    return performer_metrics(q, k, v, seed=seed)


register("ch09.performer", chapter="09", run=run_performer,
         rule=All(Decreasing("err_m16", "err_m256", "err_m4096"), Between("slope", -0.7, -0.3),
                  Lt("err_m4096", 0.1), Gt("err_elu", 0.1), Gt("err_elu", "err_m4096", scale=2)),
         claim="正随机特征（Performer）逼近 softmax 注意力：特征数 F 从 16 增到 4096，相对误差按约 1/√F 下降、"
               "F = 4096 时低于 0.1；elu + 1 的线性注意力与 F 无关，误差停在 0.1 以上（它是另一个模型）",
         quoted=("err_m16", "err_m256", "err_m4096", "err_elu", "slope"), fmt=".3f")
