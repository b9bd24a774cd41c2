"""Chapter 08's build exercise ``ch08.residual_stack``: L residual sublayers stacked, and the
residual stream measured after every layer.

``residual_stack(x, w1s, w2s, norm_first)``: sublayer l is ``f_l(z) = relu(z @ w1s[l]) @ w2s[l]``;
Post-LN updates ``x <- LN(x + f_l(x))``, Pre-LN ``x <- x + f_l(LN(x))`` and applies one more LN
after the last layer (section sec-ch08-final-ln). LN has no gain or shift, eps 1e-5. Returns
``(out, rms)``: ``rms[l]`` is the root mean square of the whole residual stream after layer l
(before the final LN): ``sqrt(mean(x**2))``. Pre-LN's stream grows with depth, Post-LN's stays
at 1 (sec-ch08-stream-growth). The classic bugs forget Pre-LN's final LN, reuse the first
layer's weights, drop Pre-LN's residual, normalise Pre-LN's stream at every layer, measure the
stream after the final LN, or measure Post-LN's stream before its LN.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..blocks import EncoderLayer
from ..layers import ResidualBlock
from ..layers import layer_norm as _lib_layer_norm
from ._core import Case, Exercise, register
from ._report import close, nearest
from .layernorm import residual_block as _residual_block


def _ln(z):
    return _lib_layer_norm(z, None, None, 1e-5)


def _rms(z):
    return z.pow(2).mean().sqrt()


def _stack(x, w1s, w2s, norm_first, *, final=True, same=False, residual=True,
           pre_norm_stream=False, measure="stream"):
    rms = []
    for layer in range(w1s.shape[0]):
        w1, w2 = (w1s[0], w2s[0]) if same else (w1s[layer], w2s[layer])
        f = lambda z: torch.relu(z @ w1) @ w2  # noqa: E731
        if norm_first:
            h = _ln(x) if pre_norm_stream else x
            x = h + f(_ln(x)) if residual else f(_ln(x))
        else:
            pre = x + f(x)
            x = _ln(pre)
            if measure == "before_ln":
                rms.append(_rms(pre))
                continue
        rms.append(_rms(_ln(x) if measure == "after_final" and norm_first else x))
    out = _ln(x) if norm_first and final else x
    return out, torch.stack(rms)


def residual_stack(x, w1s, w2s, norm_first):
    """L residual FFN sublayers (chapter 08): Post-LN or Pre-LN with its final LN -> (out, rms)."""
    return _stack(x, w1s, w2s, norm_first)


def _bug(**kw):
    def bug(x, w1s, w2s, norm_first):
        return _stack(x, w1s, w2s, norm_first, **kw)
    bug.__name__ = "_" + "_".join(f"{k}_{v}" for k, v in kw.items())
    return bug


BUGS = {
    "final_ln_forgotten": _bug(final=False),
    "first_layer_weights_reused": _bug(same=True),
    "pre_ln_residual_dropped": _bug(residual=False),
    "pre_ln_stream_normalised": _bug(pre_norm_stream=True),
    "stream_measured_after_final_ln": _bug(measure="after_final"),
    "post_ln_stream_measured_before_ln": _bug(measure="before_ln"),
}


def _run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return ret, {"out": ret[0], "rms": ret[1]}
    return ret, {"out": ret}


def _cases(g):
    def r(*shape, scale=1.0, shift=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    def weights(n_layers, d, h, gain=1.0):
        return (r(n_layers, d, h, scale=gain * d ** -0.5),
                r(n_layers, h, d, scale=gain * h ** -0.5))

    d1, d2, d3 = pick(4, 7), pick(5, 9), pick(6, 8)
    return [
        Case("Pre-LN，3 层", (r(3, d1, scale=2.0, shift=1.0), *weights(3, d1, 2 * d1), True),
             note=f"x 的形状 (3, {d1})，3 层，每层的权重不同。", tags=frozenset({"pre"})),
        Case("Post-LN，3 层", (r(3, d1, scale=2.0, shift=1.0), *weights(3, d1, 2 * d1), False),
             note="Post-LN：每层之后的残差流都被归一化。", tags=frozenset({"post"})),
        Case("Pre-LN，批 (2, 4, d)，输入尺度很小",
             (r(2, 4, d2, scale=0.05), *weights(pick(2, 5), d2, 3 * d2, gain=2.0), True),
             note="输入的均方根约 0.05，子层的输出比它大得多。", tags=frozenset({"pre"})),
        Case("Post-LN，批 (2, 4, d)，输入尺度很大",
             (r(2, 4, d3, scale=30.0), *weights(pick(2, 5), d3, 2 * d3), False),
             tags=frozenset({"post"})),
        Case("只有 1 层的 Pre-LN", (r(5, d2, scale=3.0), *weights(1, d2, d2), True),
             tags=frozenset({"pre"})),
    ]


def _hint(f):
    if f.kind != "value":
        return None
    x, w1s, w2s, nf = (f.inputs[k] for k in ("x", "w1s", "w2s", "norm_first"))
    texts = {
        "final_ln_forgotten": ("Pre-LN 的残差流从不被归一化，所以最后一层之后还要再做一次 "
                               "LayerNorm：out = LN(x_L)；Post-LN 不需要。"),
        "first_layer_weights_reused": "第 l 层要用它自己的权重 w1s[l]、w2s[l]，不是每层都用第 0 层的。",
        "pre_ln_residual_dropped": "Pre-LN 每层是 x ← x + f(LN(x))：少了加回去的 x（残差）。",
        "pre_ln_stream_normalised": ("Pre-LN 的残差流里加的是原来的 x，不是 LN(x)：x ← x + f(LN(x))，"
                                     "归一化只在子层的入口。"),
        "stream_measured_after_final_ln": ("rms[l] 量的是第 l 层之后的残差流本身（最后的 LayerNorm "
                                           "之前）；归一化之后的值均方根总是约 1。"),
        "post_ln_stream_measured_before_ln": ("Post-LN 的残差流是 LN(x + f(x)) 之后的值：rms 要在 "
                                              "LayerNorm 之后量，所以每层都约为 1。"),
    }
    label = f.label if f.label in ("out", "rms") else "out"
    alts = []
    for bug, text in texts.items():
        try:
            alts.append((text, dict(zip(("out", "rms"), BUGS[bug](x, w1s, w2s, nf)))[label]))
        except Exception:  # noqa: BLE001  (a hint never hides the report)
            continue
    for text, alt in alts:
        if close(f.got, alt):
            return text
    return nearest(f.got, f.expected, alts)


register(Exercise(
    "ch08.residual_stack", "残差块的堆叠与残差流", residual_stack, BUGS, _cases, (_hint,),
    run=_run, build=True,
    forbidden=((ResidualBlock.forward, "attnbook.layers.ResidualBlock"),
               (EncoderLayer.forward, "attnbook.blocks.EncoderLayer"),
               (nn.TransformerEncoderLayer.forward, "nn.TransformerEncoderLayer"),
               (nn.TransformerEncoder.forward, "nn.TransformerEncoder"),
               (_residual_block, "exercises.get('ch08.residual_block').solution"))))
