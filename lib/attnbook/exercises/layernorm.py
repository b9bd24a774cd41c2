"""Chapter 08's exercises ``ch08.layer_norm`` (LayerNorm written out) and ``ch08.rms_norm``.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dim, with the *biased*
variance (divide by d) and eps *inside* the square root: what ``torch.nn.LayerNorm`` computes.
The classic bugs put eps outside the root, use the unbiased variance, normalize over the wrong
axis, divide by the variance instead of its root or forget the gain and shift. A row with a tiny
variance makes the eps bug large.

``ch08.residual_block``: one sublayer ``f(z) = relu(z @ w1) @ w2`` wired as Post-LN,
``LN(x + f(x))``, or Pre-LN, ``x + f(LN(x))`` (LN without gain and shift, eps 1e-5;
eq-ch08-pre-post).
Its classic bugs swap the two orders, add the normalised input instead of ``x`` in Pre-LN,
normalise the Pre-LN output as well, drop the residual in Post-LN, or normalise ``x`` before
the sum in Post-LN (``LN(x) + f(x)``).

``ch08.rms_norm``: ``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dim (what
``torch.nn.RMSNorm`` computes with an explicit eps). Its classic bugs subtract the mean (that is
LayerNorm), put eps outside the root, divide by the L2 norm instead of the root *mean* square,
ignore the gain, or take the mean over the wrong axis. The rows have a mean far from 0, so
subtracting it shows.
"""
from __future__ import annotations

import torch

from ..layers import layer_norm as _lib_layer_norm
from ..layers import rms_norm as _lib_rms_norm
from ._core import Case, Exercise, register
from ._report import nearest


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim (eq-ch08-layernorm): biased variance, eps in the root."""
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
    d1, d2, d3 = (int(torch.randint(lo, lo + 4, (1,), generator=g)) for lo in (4, 7, 5))
    return [
        Case("小例子", (r(3, d1), r(d1, scale=0.5, shift=1.0), r(d1, scale=0.5), 1e-5),
             note=f"d = {d1}：每一行单独归一化。"),
        Case("方差很小的行", (r(2, d2, scale=0.003, shift=5.0), r(d2, scale=0.5, shift=1.0),
                              r(d2, scale=0.5), 1e-5),
             note="每行的标准差约 0.003，方差约 1e-5，与 eps 同一个量级。"),
        Case(f"批 (2, 3, {d3})，eps = 0.1", (r(2, 3, d3, scale=2.0), r(d3, scale=0.5, shift=1.0),
                                            r(d3, scale=0.5), 0.1),
             note="eps 取传入的值 0.1，不是默认的 1e-5。"),
        Case("不传 eps（用默认值）", (r(2, 6, scale=0.002, shift=-3.0),
                                     r(6, scale=0.5, shift=1.0), r(6, scale=0.5)),
             note="调用时没有传 eps：用签名里的默认值 eps=1e-5；每行的方差约 4e-6。",
             tags=frozenset({"default_eps"})),
    ]


def _hint(f):
    if f.kind != "value":
        return None
    if "default_eps" in f.case.tags:
        return ("这一例没有传 eps，用的是签名里的默认值：它应是 eps=1e-5（和 nn.LayerNorm 一样），"
                "检查你的 def 里写的默认值。")
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


# batch_norm over the transposed rows is LayerNorm without its affine part (review R3): one call too
register(Exercise("ch08.layer_norm", "LayerNorm", layer_norm, BUGS, _cases, (_hint,),
                  forbidden=((torch.nn.functional.batch_norm, "F.batch_norm"),
                             (torch.batch_norm, "torch.batch_norm"))))


# ---------------------------------------------------------------------------------------------
# ch08.rms_norm
# ---------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last dim (chapter 08, eq-ch08-rmsnorm): x / sqrt(mean(x^2) + eps) * w."""
    return _lib_rms_norm(x, weight, eps)


def _rms_variant(x, weight, eps, *, center=False, outside=False, l2=False, dim=-1, affine=True):
    h = x - x.mean(dim, keepdim=True) if center else x
    ms = h.pow(2).sum(dim, keepdim=True) if l2 else h.pow(2).mean(dim, keepdim=True)
    y = h / (ms.sqrt() + eps if outside else (ms + eps).sqrt())
    return y * weight if affine else y


def _rms_centered(x, weight, eps=1e-6):
    return _rms_variant(x, weight, eps, center=True)


def _rms_eps_outside(x, weight, eps=1e-6):
    return _rms_variant(x, weight, eps, outside=True)


def _rms_l2(x, weight, eps=1e-6):
    return _rms_variant(x, weight, eps, l2=True)


def _rms_no_weight(x, weight, eps=1e-6):
    return _rms_variant(x, weight, eps, affine=False)


def _rms_wrong_axis(x, weight, eps=1e-6):
    return _rms_variant(x, weight, eps, dim=0)


RMS_BUGS = {
    "mean_subtracted": _rms_centered,
    "eps_outside_root": _rms_eps_outside,
    "l2_norm_not_rms": _rms_l2,
    "weight_ignored": _rms_no_weight,
    "normalized_over_wrong_axis": _rms_wrong_axis,
}


def _rms_cases(g):
    def r(*shape, scale=1.0, shift=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift
    d1, d2, d3 = (int(torch.randint(lo, lo + 4, (1,), generator=g)) for lo in (4, 7, 5))
    return [
        Case("小例子，均值不为 0", (r(3, d1, shift=1.5), r(d1, scale=0.5, shift=1.0), 1e-6),
             note=f"d = {d1}，每行的均值约 1.5：RMSNorm 不减均值。"),
        Case("尺度很小的行", (r(2, d2, scale=0.002, shift=0.001), r(d2, scale=0.5, shift=1.0),
                              1e-5),
             note="每行的均方根约 0.002，均方约 4e-6，与 eps = 1e-5 同一个量级。"),
        Case(f"批 (2, 3, {d3})，eps = 0.1", (r(2, 3, d3, scale=2.0, shift=1.0),
                                            r(d3, scale=0.5, shift=1.0), 0.1),
             note="eps 取传入的值 0.1。"),
        Case("不传 eps（用默认值）", (r(2, 6, scale=0.001), r(6, scale=0.5, shift=1.0)),
             note="调用时没有传 eps：用签名里的默认值 eps=1e-6；每行的均方约 1e-6。",
             tags=frozenset({"default_eps"})),
    ]


def _rms_hint(f):
    if f.kind != "value":
        return None
    if "default_eps" in f.case.tags:
        return ("这一例没有传 eps，用的是签名里的默认值：它应是 eps=1e-6，检查你的 def 里写的"
                "默认值。")
    x, w, eps = (f.inputs[key] for key in ("x", "weight", "eps"))
    d = x.shape[-1]
    alts = [("RMSNorm 不减均值：直接除以 sqrt(mean(x²) + ε)；减去均值再除，就成了 LayerNorm。",
             _rms_variant(x, w, eps, center=True)),
            ("ε 应加在根号里面：除以 sqrt(mean(x²) + ε)，不是 sqrt(mean(x²)) + ε。",
             _rms_variant(x, w, eps, outside=True)),
            (f"要除以均方根 sqrt(mean(x²))，不是 L2 范数 sqrt(sum(x²))：后者大了 √d = √{d} 倍。",
             _rms_variant(x, w, eps, l2=True)),
            ("归一化之后还要乘以 weight（γ）。", _rms_variant(x, w, eps, affine=False)),
            ("均方要沿最后一维（每个词元自己的 d 个特征，dim=-1）计算。",
             _rms_variant(x, w, eps, dim=0))]
    return nearest(f.got, f.expected, alts)


register(Exercise("ch08.rms_norm", "RMSNorm", rms_norm, RMS_BUGS, _rms_cases, (_rms_hint,)))


# ---------------------------------------------------------------------------------------------
# ch08.residual_block
# ---------------------------------------------------------------------------------------------

def _ffn(z, w1, w2):
    return torch.relu(z @ w1) @ w2


def _ln(z):
    return _lib_layer_norm(z, None, None, 1e-5)


def residual_block(x, w1, w2, norm_first):
    """One residual sublayer (chapter 08, eq-ch08-pre-post): LN(x + f(x)) or x + f(LN(x))."""
    return x + _ffn(_ln(x), w1, w2) if norm_first else _ln(x + _ffn(x, w1, w2))


def _block_variant(x, w1, w2, norm_first, kind):
    f = lambda z: _ffn(z, w1, w2)  # noqa: E731
    if kind == "swapped":
        norm_first = not norm_first
        return x + f(_ln(x)) if norm_first else _ln(x + f(x))
    if kind == "adds_normalised":
        return _ln(x) + f(_ln(x)) if norm_first else _ln(x + f(x))
    if kind == "pre_output_normalised":
        return _ln(x + f(_ln(x))) if norm_first else _ln(x + f(x))
    if kind == "post_no_residual":
        return x + f(_ln(x)) if norm_first else _ln(f(x))
    if kind == "post_ln_before_sum":
        return x + f(_ln(x)) if norm_first else _ln(x) + f(x)
    raise ValueError(kind)


def _bug(kind):
    def bug(x, w1, w2, norm_first):
        return _block_variant(x, w1, w2, norm_first, kind)
    bug.__name__ = f"_{kind}"
    return bug


BLOCK_BUGS = {
    "orders_swapped": _bug("swapped"),
    "pre_ln_adds_normalised_input": _bug("adds_normalised"),
    "pre_ln_output_normalised": _bug("pre_output_normalised"),
    "post_ln_residual_dropped": _bug("post_no_residual"),
    "post_ln_normalises_before_sum": _bug("post_ln_before_sum"),
}


def _block_cases(g):
    def r(*shape, scale=1.0, shift=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift
    d = int(torch.randint(5, 9, (1,), generator=g))
    h = 2 * d
    w = lambda: (r(d, h, scale=d ** -0.5), r(h, d, scale=h ** -0.5))  # noqa: E731
    return [
        Case("Post-LN（norm_first=False）", (r(3, d, scale=2.0, shift=1.0), *w(), False),
             note="x 的每行均值约 1、标准差约 2：Post-LN 的输出每行均值 0、方差约 1。",
             tags=frozenset({"post"})),
        Case("Pre-LN（norm_first=True）", (r(3, d, scale=2.0, shift=1.0), *w(), True),
             note="Pre-LN 的输出是 x 加上子层的修正：它不被归一化。", tags=frozenset({"pre"})),
        Case("批 (2, 4, 6)，Pre-LN", (r(2, 4, d, scale=3.0), *w(), True),
             note="Pre-LN，输入有批和时间两维。", tags=frozenset({"pre"})),
    ]


def _block_hint(f):
    if f.kind != "value":
        return None
    x, w1, w2, nf = (f.inputs[k] for k in ("x", "w1", "w2", "norm_first"))
    texts = {
        "swapped": "两种顺序用反了：norm_first=True 是 Pre-LN，x + f(LN(x))；"
                   "norm_first=False 是 Post-LN，LN(x + f(x))。",
        "adds_normalised": "Pre-LN 的残差加的是原来的 x，不是 LN(x)：x + f(LN(x))，"
                           "残差流本身不被归一化。",
        "pre_output_normalised": "Pre-LN 的输出不再过 LayerNorm：x + f(LN(x))；"
                                 "归一化只在子层的入口（最后一层之后另有一个）。",
        "post_no_residual": "Post-LN 少了残差：是 LN(x + f(x))，不是 LN(f(x))。",
        "post_ln_before_sum": "Post-LN 先相加再归一化：LN(x + f(x))，不是 LN(x) + f(x)。",
    }
    alts = [(text, _block_variant(x, w1, w2, nf, kind)) for kind, text in texts.items()]
    return nearest(f.got, f.expected, alts)


register(Exercise("ch08.residual_block", "Pre-LN 与 Post-LN 的残差块", residual_block, BLOCK_BUGS,
                  _block_cases, (_block_hint,)))
