"""Chapter 08's exercise ``ch08.layer_norm``: LayerNorm written out.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dim, with the *biased*
variance (divide by d) and eps *inside* the square root: what ``torch.nn.LayerNorm`` computes.
The classic bugs put eps outside the root, use the unbiased variance, normalize over the wrong
axis, divide by the variance instead of its root or forget the gain and shift. A row with a tiny variance makes the eps bug large.
"""
from __future__ import annotations

import torch

from ..layers import layer_norm as _lib_layer_norm
from ._core import Case, Exercise, register
from ._report import nearest


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim (chapter 08, eq-ch08-layernorm), biased variance, eps inside the root."""
    return _lib_layer_norm(x, weight, bias, eps)


def _variant(x, weight, bias, eps, *, outside=False, unbiased=False, dim=-1, affine=True,
             root=True):
    mean = x.mean(dim, keepdim=True)
    var = x.var(dim, keepdim=True, unbiased=unbiased)
    if not root:
        y = (x - mean) / (var + eps)
        return y * weight + bias if affine else y
    y = (x - mean) / (var.sqrt() + eps if outside else (var + eps).sqrt())
    return y * weight + bias if affine else y


def _eps_outside(x, weight, bias, eps=1e-5):
    return _variant(x, weight, bias, eps, outside=True)


def _unbiased(x, weight, bias, eps=1e-5):
    return _variant(x, weight, bias, eps, unbiased=True)


def _wrong_axis(x, weight, bias, eps=1e-5):
    return _variant(x, weight, bias, eps, dim=0)


def _no_affine(x, weight, bias, eps=1e-5):
    return _variant(x, weight, bias, eps, affine=False)


def _no_root(x, weight, bias, eps=1e-5):
    return _variant(x, weight, bias, eps, root=False)


BUGS = {
    "eps_outside_root": _eps_outside,
    "unbiased_variance": _unbiased,
    "normalized_over_wrong_axis": _wrong_axis,
    "weight_and_bias_ignored": _no_affine,
    "divides_by_variance": _no_root,
}


def _cases(g):
    def r(*shape, scale=1.0, shift=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift
    return [
        Case("小例子", (r(3, 4), r(4, scale=0.5, shift=1.0), r(4, scale=0.5), 1e-5),
             note="d = 4：每一行单独归一化。"),
        Case("方差很小的行", (r(2, 8, scale=0.003, shift=5.0), r(8, scale=0.5, shift=1.0),
                              r(8, scale=0.5), 1e-5),
             note="每行的标准差约 0.003，方差约 1e-5，与 eps 同一个量级。"),
        Case("批 (2, 3, 6)，eps = 0.1", (r(2, 3, 6, scale=2.0), r(6, scale=0.5, shift=1.0),
                                         r(6, scale=0.5), 0.1),
             note="eps 取传入的值 0.1，不是默认的 1e-5。"),
    ]


def _hint(f):
    if f.kind != "value":
        return None
    x, w, b, eps = (f.inputs[key] for key in ("x", "weight", "bias", "eps"))
    alts = [("ε 应加在根号里面：除以 sqrt(var + ε)，不是 sqrt(var) + ε（方差很小时两者差得很多）。",
             _variant(x, w, b, eps, outside=True)),
            (f"方差要用有偏估计（除以 d = {x.shape[-1]}，不是 d − 1）：x.var(-1, unbiased=False)，"
             "与 nn.LayerNorm 相同。", _variant(x, w, b, eps, unbiased=True)),
            ("均值和方差要沿最后一维（每个词元自己的 d 个特征，dim=-1）计算。",
             _variant(x, w, b, eps, dim=0)),
            ("均值和方差要沿最后一维（每个词元自己的 d 个特征，dim=-1）计算，不是整个张量一起。",
             _variant(x, w, b, eps, dim=tuple(range(x.ndim)))),
            ("要除以标准差 sqrt(var + ε)，不是方差 var + ε。", _variant(x, w, b, eps, root=False)),
            ("归一化之后还要乘以 weight（γ）、加上 bias（β）。", _variant(x, w, b, eps, affine=False))]
    if eps != 1e-5:
        alts.append(("用传入的 eps，不要写死 1e-5。", _variant(x, w, b, 1e-5)))
    return nearest(f.got, f.expected, alts)


register(Exercise("ch08.layer_norm", "LayerNorm", layer_norm, BUGS, _cases, (_hint,)))
