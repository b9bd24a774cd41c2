"""Chapter 10's build exercise ``ch10.decoder_layer``: one Post-LN decoder layer from its weights.

The reader writes ``decoder_layer(x, memory, weights, n_heads, src_pad=None)``: ``x`` ``(B, T,
d_model)`` the target side, ``memory`` ``(B, S, d_model)`` the encoder's output, ``weights`` the
``state_dict()`` of the library's ``DecoderLayer`` (keys ``self_attn.q_proj.weight`` ...,
``multihead_attn.*``, ``ffn.linear1/2.*``, ``norm1..3.*``; ``nn.Linear`` layout ``y = x W^T +
b``), ``src_pad`` ``(B, S)`` bool, True = a real source token (None: no padding). Return the
layer's output ``(B, T, d_model)`` in the Post-LN order of eq-ch10-decoder-layer:

    A = LN_1(x + MHA_causal(x, x, x));   C = LN_2(A + MHA(A, M, M));   out = LN_3(C + FFN(C))

with ``n_heads`` heads of width d_model / n_heads, scores scaled by 1 / sqrt(d_k), ReLU in the
FFN and LayerNorm's eps = 1e-5 -- what ``attnbook.DecoderLayer(norm_first=False)`` computes
(the reference). Several steps: the multi-head projections, the causal mask, the memory's key
padding, three residual + LayerNorm sublayers. The library's layer and attention modules and
PyTorch's are off limits; ``attnbook.attention`` / SDPA with an explicit mask, ``split_heads``,
``F.layer_norm`` stay allowed (chapters 04, 05, 08 taught them).

The classic bugs: the causal mask missing, the cross-attention's queries taken from the memory
(and keys/values from the decoder), the cross-attention reading the decoder itself instead of
the memory, Pre-LN instead of Post-LN, the memory's padding ignored, the FFN before the
cross-attention, no 1/sqrt(d_k) or 1/sqrt(d_model) for it, heads split by a reshape without the
transpose.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import DecoderLayer
from ..cache import CachedAttention
from ..multihead import MultiHeadAttention
from ._core import Case, Exercise, register
from ._report import close

EPS = 1e-5


def decoder_layer(x, memory, weights, n_heads, src_pad=None):
    """attnbook.DecoderLayer (Post-LN, ReLU, eps 1e-5) with ``weights`` on (x, memory)."""
    d_model = x.shape[-1]
    d_ff = weights["ffn.linear1.weight"].shape[0]
    with torch.random.fork_rng(devices=[]):              # the layer's init draws: not the reader's
        layer = DecoderLayer(d_model, n_heads, d_ff, norm_first=False, backend="ref",
                             dtype=x.dtype)
    layer.load_state_dict(weights)
    mask = None if src_pad is None else src_pad[:, None, None, :]
    with torch.no_grad():
        return layer(x, memory, memory_mask=mask, causal=True).out


# ------------------------------------------------------------------ the gallery, by hand
def _mha(w, prefix, q_in, kv_in, n_heads, mask=None, *, scale=True, split="transpose"):
    def lin(t, name):
        return t @ w[f"{prefix}.{name}.weight"].T + w[f"{prefix}.{name}.bias"]

    def heads(t):
        b, n, d = t.shape
        if split == "transpose":
            return t.reshape(b, n, n_heads, d // n_heads).transpose(1, 2)
        return t.reshape(b, n_heads, n, d // n_heads)         # the reshape-only bug

    q, k, v = heads(lin(q_in, "q_proj")), heads(lin(kv_in, "k_proj")), heads(lin(kv_in, "v_proj"))
    s = q @ k.transpose(-2, -1)
    if scale == "d_model":                      # the bug: the model's width, not the head's
        s = s / math.sqrt(q.shape[-1] * n_heads)
    elif scale:
        s = s / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ v                                   # (B, H, Tq, d_k)
    b, h, tq, dk = o.shape
    return lin(o.transpose(1, 2).reshape(b, tq, h * dk), "out_proj")


def _ln(w, name, t):
    return F.layer_norm(t, t.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], EPS)


def _ffn(w, t):
    h = torch.relu(t @ w["ffn.linear1.weight"].T + w["ffn.linear1.bias"])
    return h @ w["ffn.linear2.weight"].T + w["ffn.linear2.bias"]


def _variant(x, memory, weights, n_heads, src_pad=None, *, causal=True, cross_q="decoder",
             cross_kv="memory", pre_ln=False, pad=True, ffn_first=False, scale=True,
             split="transpose"):
    w, t = weights, x.shape[1]
    self_mask = torch.ones(t, t, dtype=torch.bool).tril() if causal else None
    mem_mask = src_pad[:, None, None, :] if (pad and src_pad is not None) else None
    kw = dict(scale=scale, split=split)

    def sa(h):
        return _mha(w, "self_attn", h, h, n_heads, self_mask, **kw)

    def ca(h):
        if cross_q == "memory":                  # queries from M, keys/values from the decoder
            return _mha(w, "multihead_attn", memory, h, n_heads, None, **kw)
        kv = memory if cross_kv == "memory" else h
        return _mha(w, "multihead_attn", h, kv, n_heads,
                    mem_mask if cross_kv == "memory" else None, **kw)

    subs = [("norm1", sa), ("norm2", ca), ("norm3", lambda h: _ffn(w, h))]
    if ffn_first:
        subs = [subs[0], ("norm2", lambda h: _ffn(w, h)), ("norm3", ca)]
    for norm, f in subs:
        x = x + f(_ln(w, norm, x)) if pre_ln else _ln(w, norm, x + f(x))
    return x


BUGS = {
    "no_causal_mask": lambda *a, **k: _variant(*a, **k, causal=False),
    "cross_queries_from_memory": lambda *a, **k: _variant(*a, **k, cross_q="memory"),
    "cross_attends_to_the_decoder": lambda *a, **k: _variant(*a, **k, cross_kv="decoder"),
    "pre_ln_not_post_ln": lambda *a, **k: _variant(*a, **k, pre_ln=True),
    "memory_padding_ignored": lambda *a, **k: _variant(*a, **k, pad=False),
    "ffn_before_cross_attention": lambda *a, **k: _variant(*a, **k, ffn_first=True),
    "no_scale": lambda *a, **k: _variant(*a, **k, scale=False),
    "scale_sqrt_d_model": lambda *a, **k: _variant(*a, **k, scale="d_model"),
    "heads_reshaped_without_transpose": lambda *a, **k: _variant(*a, **k, split="reshape"),
}


# ------------------------------------------------------------------ hidden cases
def _weights(g, d, d_ff, dtype, scale):
    def r(*shape, s=1.0):
        return s * torch.randn(*shape, generator=g, dtype=dtype)

    w = {}
    for att in ("self_attn", "multihead_attn"):
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[f"{att}.{p}.weight"] = r(d, d, s=scale / math.sqrt(d))
            w[f"{att}.{p}.bias"] = r(d, s=0.2)
    w["ffn.linear1.weight"], w["ffn.linear1.bias"] = r(d_ff, d, s=1 / math.sqrt(d)), r(d_ff, s=0.2)
    w["ffn.linear2.weight"] = r(d, d_ff, s=1 / math.sqrt(d_ff))
    w["ffn.linear2.bias"] = r(d, s=0.2)
    for n in ("norm1", "norm2", "norm3"):
        w[f"{n}.weight"], w[f"{n}.bias"] = 1 + r(d, s=0.3), r(d, s=0.3)
    return w


def _case(g, b, t, s, h, d_k, lengths=None, *, dtype=torch.float64, x_scale=1.0, w_scale=2.0):
    d = h * d_k
    d_ff = int(torch.randint(d + 1, 3 * d, (1,), generator=g))
    x = x_scale * torch.randn(b, t, d, generator=g, dtype=dtype)
    memory = torch.randn(b, s, d, generator=g, dtype=dtype)
    pad = None
    if lengths is not None:
        pad = torch.arange(s) < torch.tensor(lengths)[:, None]
        memory = torch.where(pad[..., None], memory, 6 * memory)   # loud padded positions
    return x, memory, _weights(g, d, d_ff, dtype, w_scale), h, pad


def _cases(g):
    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    b, t, h, d_k = ri(2, 5), ri(3, 8), 2 ** ri(1, 3), 2 ** ri(1, 3)
    s = t + ri(1, 4) if ri(0, 2) else max(2, t - ri(1, 3))             # S != T
    lengths = [s] + [ri(1, s) for _ in range(b - 1)]
    x_scale = float(torch.empty(1).uniform_(0.3, 5.0, generator=g))
    one = _case(g, 1, 3, 3, 2, 2)
    return [
        Case("1 句、T = S = 3、d_model = 4（2 个头）、src_pad 不给（默认 None）", one[:4],
             note="最小的例子：目标和源一样长，没有填充；第一个位置只能看它自己。",
             tags=frozenset({"square"})),
        Case("2 句、T = 4 个目标位置、S = 6 个源位置，第二句的源只有 3 个真实词元",
             _case(g, 2, 4, 6, 2, 2, [6, 3]),
             note="src_pad 的 False 是 PAD：交叉注意力不能看这些键（它们的值被放大了 6 倍）。"),
        Case(f"B = {b}、T = {t}、S = {s}、{h} 个头（d_k = {d_k}），x 的尺度约 {x_scale:.1f}",
             _case(g, b, t, s, h, d_k, lengths, x_scale=x_scale),
             note=f"源句长度 {lengths}；T ≠ S。", tags=frozenset({"random"})),
        Case("float32：B = 3、T = 5、S = 7、4 个头（d_k = 4）",
             _case(g, 3, 5, 7, 4, 4, [7, 4, 1], dtype=torch.float32),
             note="float32 的输入：结果也是 float32。", tags=frozenset({"f32"})),
    ]


# ------------------------------------------------------------------ hints
MESSAGES = {
    "no_causal_mask": ("自注意力少了因果掩码：目标位置 i 只能看 j ≤ i 的目标词元"
                       "（下三角，torch.ones(T, T).tril()），否则训练时偷看了答案。"),
    "cross_queries_from_memory": ("交叉注意力的查询和键值来源弄反了：查询来自解码器（A W^Q），"
                                  "键和值来自记忆（M W^K、M W^V）。"),
    "cross_attends_to_the_decoder": ("交叉注意力的键和值要来自编码器的记忆 memory（M W^K、"
                                     "M W^V），不是解码器自己：否则它只是第二个自注意力。"),
    "pre_ln_not_post_ln": ("这是 Pre-LN 的顺序 x + f(LN(x))：本章的层是 Post-LN，"
                           "先加残差再归一化，LN(x + f(x))。"),
    "memory_padding_ignored": ("交叉注意力没有挡住源句的 PAD：用 src_pad 把 PAD 作为键的那些列挡住"
                               "（src_pad[:, None, None, :]，True = 真实词元）。"),
    "ffn_before_cross_attention": ("子层的顺序错了：自注意力之后是交叉注意力，最后才是 FFN"
                                   "（norm2 属于交叉注意力，norm3 属于 FFN）。"),
    "no_scale": "注意力分数要除以 √d_k（d_k = d_model / n_heads，每个头的宽度，不是 d_model）。",
    "scale_sqrt_d_model": ("分数除以了 √d_model：缩放用每个头的宽度 d_k = d_model / n_heads，"
                           "除以 √d_k。"),
    "heads_reshaped_without_transpose": ("分头时只做了 reshape(B, H, T, d_k)：要先 reshape 成 "
                                         "(B, T, H, d_k) 再 transpose(1, 2)，否则每个“头”混进了"
                                         "不同位置的特征。"),
}


def _same_error(f) -> bool:
    """Whether the queries-from-the-memory bug raises the reader's error on this case."""
    args = [f.inputs[k] for k in ("x", "memory", "weights", "n_heads", "src_pad")
            if k in f.inputs]
    try:
        BUGS["cross_queries_from_memory"](*args)
    except RuntimeError as e:
        return str(e) == str(f.exc)
    return False


def _hint(f):
    if f.kind == "shape":
        return "输出和 x 的形状一样，是 (B, T, d_model)：每个目标位置一行（不是每个源位置）。"
    if f.kind == "exception" and _same_error(f):
        return ("形状对不上：交叉注意力的查询来自解码器（长 T），键和值来自记忆 memory（长 S），"
                "输出的长度跟着查询走，是 T；T 和 S 一般不相等。")
    if f.kind == "nan":
        causal = ("自注意力的因果掩码要包括对角线：位置 i 能看它自己（tril()，不是 tril(-1)），"
                  "第 0 个位置只剩它自己这一个键。")
        if f.inputs.get("src_pad") is None:
            return "出现了 NaN：某一行的键全被挡住了，softmax 的分母是 0。" + causal
        return ("出现了 NaN：某一行的键全被挡住了，softmax 的分母是 0。" + causal
                + "src_pad 的 True 是真实词元（可以看），False 才是要挡住的 PAD：极性不要弄反。")
    if f.kind != "value":
        return None
    args = [f.inputs[k] for k in ("x", "memory", "weights", "n_heads", "src_pad")
            if k in f.inputs]
    for name, message in MESSAGES.items():
        try:
            alt = BUGS[name](*args)
        except RuntimeError:                     # e.g. queries from M when S != T
            continue
        if close(f.got, alt, rtol=1e-6, atol=1e-6):
            return message
    return None


FORBIDDEN = ((DecoderLayer.forward, "attnbook.DecoderLayer"),
             (MultiHeadAttention.forward, "attnbook.MultiHeadAttention"),
             (CachedAttention.forward, "attnbook.cache.CachedAttention"),
             (nn.TransformerDecoderLayer.forward, "nn.TransformerDecoderLayer"),
             (nn.TransformerDecoder.forward, "nn.TransformerDecoder"),
             (nn.MultiheadAttention.forward, "nn.MultiheadAttention"),
             (F.multi_head_attention_forward, "F.multi_head_attention_forward"))

register(Exercise("ch10.decoder_layer", "搭一个解码器层", decoder_layer, BUGS,
                  _cases, (_hint,), forbidden=FORBIDDEN, build=True))
