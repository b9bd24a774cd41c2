"""The Transformer's encoder and decoder layers (chapters 08 and 10).

``EncoderLayer``: self-attention and FFN, each with residual + LayerNorm (chapter 08).
``DecoderLayer``: masked self-attention, cross-attention over the encoder's memory, and FFN,
each with residual + LayerNorm (chapter 10). Both come in Post-LN or Pre-LN order, both take the
positional scheme at construction (``rope=True``: the self-attention rotates queries and keys,
chapter 06), and both load the matching PyTorch layer exactly with ``from_torch`` (equal in eval
mode). The residual wiring is ``layers.ResidualBlock``'s, written out inline so that the
children keep the names of ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``.

Conventions: batch-first ``(B, T, d_model)``; boolean masks use True = may attend.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_float, check_tensor
from .cache import CachedAttention, KVCache
from .layers import FeedForward, LayerNorm
from .multihead import MultiHeadAttention

__all__ = ["DecoderLayer", "DecoderLayerOutput", "EncoderLayer", "torch_layer_settings"]


def torch_layer_settings(layer, *, fn: str) -> dict:
    """The constructor settings of a PyTorch ``nn.TransformerEncoderLayer`` / ``DecoderLayer``.

    ``d_model, n_heads, d_ff, norm_first, dropout, activation`` (relu or exact gelu; ValueError
    naming ``fn`` otherwise), ``eps``, ``bias``, ``device``, ``dtype``: what ``EncoderLayer`` and
    ``DecoderLayer`` take, so their ``from_torch`` read a PyTorch layer the same way.
    """
    if not isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        raise TypeError(f"{fn}: `layer` must be an nn.TransformerEncoderLayer or "
                        f"nn.TransformerDecoderLayer, got {type(layer).__name__}")
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        activation = "relu"
    elif act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        activation = "gelu"
    else:
        raise ValueError(f"{fn}: only relu and exact gelu activations are supported, got {act!r}")
    mha, w = layer.self_attn, layer.linear1.weight
    return dict(d_model=mha.embed_dim, n_heads=mha.num_heads, d_ff=layer.linear1.out_features,
                norm_first=layer.norm_first, dropout=layer.dropout.p, activation=activation,
                eps=layer.norm1.eps, bias=layer.linear1.bias is not None, device=w.device, dtype=w.dtype)


class EncoderLayer(nn.Module):
    """One Transformer encoder layer: self-attention and FFN, each with residual + LayerNorm (chapter 08,
    eq-ch08-encoder-layer).

    Post-LN (``norm_first=False``, Vaswani et al. 2017):
        x = LN_1(x + MHA(x));        x = LN_2(x + FFN(x))
    Pre-LN (``norm_first=True``, e.g. GPT-2; older than GPT-2, see chapter 08):
        x = x + MHA(LN_1(x));        x = x + FFN(LN_2(x))
    A Pre-LN stack needs one more LayerNorm after its last layer (chapter 08); it is not part
    of the layer.

    Children are named as in ``nn.TransformerEncoderLayer`` (``self_attn``, ``norm1``,
    ``norm2``, ``dropout1``, ``dropout2``; the FFN's ``linear1``/``linear2`` live in ``ffn``), and
    :meth:`from_torch` copies such a layer exactly. Dropout: on the attention output
    (``dropout1``), inside the FFN, and on the FFN output (``dropout2``), as in PyTorch.
    ``self_attn`` is chapter 05's ``MultiHeadAttention``; with ``rope=True`` it is a
    ``cache.CachedAttention`` that rotates queries and keys (chapter 06).

    Args:
        d_model: model width.
        n_heads: attention heads (must divide d_model).
        d_ff: FFN hidden size.
        norm_first: Pre-LN if True, Post-LN if False (the default, as in PyTorch).
        dropout: dropout probability (training only).
        activation: the FFN's ``"relu"``, ``"gelu"`` or ``"swiglu"``.
        eps: both LayerNorms' eps.
        bias: biases in attention, FFN and LayerNorms.
        rope: rotate the queries and keys of the self-attention (d_model / n_heads even).
        backend: the attention backend (see :func:`attnbook.attention`).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False,
                 dropout: float = 0.0, activation: str = "relu", eps: float = 1e-5, bias: bool = True,
                 rope: bool = False, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        fn = "EncoderLayer"
        self.norm_first = check_bool("norm_first", norm_first, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        kw = {"bias": bias, "backend": backend, "device": device, "dtype": dtype}
        if check_bool("rope", rope, fn=fn):
            self.self_attn = CachedAttention(d_model, n_heads, rope=True, **kw)
        else:
            self.self_attn = MultiHeadAttention(d_model, n_heads, **kw)
        factory = {"device": device, "dtype": dtype}
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout, **factory)
        self.norm1 = LayerNorm(d_model, eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps, bias=bias, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _sa(self, x, mask, causal):
        return self.dropout1(self.self_attn(x, mask=mask, causal=causal).out)

    def _ff(self, x):
        return self.dropout2(self.ffn(x))

    def forward(self, x: torch.Tensor, *, mask=None, causal: bool = False) -> torch.Tensor:
        """Apply the layer to ``x`` ``(B, T, d_model)``.

        Args:
            x: batch-first input ``(B, T, d_model)``.
            mask: bool (True = may attend) or additive float, broadcastable to
                ``(B, H, T, T)``; ``attnbook.padding_mask(lengths, T)`` hides padded
                keys.
            causal: query i attends only keys j <= i.
        Returns:
            ``(B, T, d_model)``.
        """
        if self.norm_first:                                   # Pre-LN: x + f(LN(x))
            x = x + self._sa(self.norm1(x), mask, causal)
            x = x + self._ff(self.norm2(x))
        else:                                                 # Post-LN: LN(x + f(x))
            x = self.norm1(x + self._sa(x, mask, causal))
            x = self.norm2(x + self._ff(x))
        return x

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer, *, backend: str = "auto") -> EncoderLayer:
        """An ``EncoderLayer`` with the weights and settings of a PyTorch encoder layer.

        Copies attention (:meth:`MultiHeadAttention.from_torch`), ``linear1``/``linear2``,
        both LayerNorms (with their eps), ``norm_first``, the activation (relu or exact gelu)
        and the dropout probability. The result is batch first whatever ``layer.batch_first``
        says, and equals ``layer`` in eval mode; PyTorch's ``src_key_padding_mask`` (True =
        padding) becomes ``mask=~src_key_padding_mask[:, None, None, :]`` here.
        """
        fn = "EncoderLayer.from_torch"
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"{fn}: `layer` must be an nn.TransformerEncoderLayer, got {type(layer).__name__}")
        new = cls(**torch_layer_settings(layer, fn=fn), backend=backend)
        new.self_attn = MultiHeadAttention.from_torch(layer.self_attn, backend=backend)
        new.norm1, new.norm2 = LayerNorm.from_torch(layer.norm1), LayerNorm.from_torch(layer.norm2)
        new.ffn.linear1.load_state_dict(layer.linear1.state_dict())
        new.ffn.linear2.load_state_dict(layer.linear2.state_dict())
        return new


class DecoderLayerOutput(NamedTuple):
    """What :class:`DecoderLayer` returns; the weights only with ``need_weights=True``."""

    out: torch.Tensor                    # (B, T, d_model)
    self_weights: torch.Tensor | None    # (B, H, T, T_total) masked self-attention
    cross_weights: torch.Tensor | None   # (B, H, T, S) cross-attention over the memory


class DecoderLayer(nn.Module):
    """One Transformer decoder layer (chapter 10, eq-ch10-decoder-layer).

    Post-LN (``norm_first=False``, Vaswani et al. 2017):
        x = LN_1(x + SelfAttn(x));   x = LN_2(x + CrossAttn(x, memory));   x = LN_3(x + FFN(x))
    Pre-LN (``norm_first=True``):
        x = x + SelfAttn(LN_1(x));   x = x + CrossAttn(LN_2(x), memory);   x = x + FFN(LN_3(x))
    The self-attention is causal; the cross-attention takes its queries from the decoder and its
    keys and values from ``memory``, the encoder's final output (the same for every layer).
    There is no output projection here: it comes once, after the last layer (finding 10.1).
    Both attentions are ``cache.CachedAttention``, so incremental decoding can pass a cache.

    Children are named as in ``nn.TransformerDecoderLayer`` (``self_attn``, ``multihead_attn``,
    ``norm1..3``, ``dropout1..3``; ``linear1``/``linear2`` live in ``ffn``), and
    :meth:`from_torch` copies such a layer exactly (equal in eval mode).

    Args: as :class:`EncoderLayer` (``rope`` rotates the self-attention only; cross-attention
    gets no positions).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False,
                 dropout: float = 0.0, activation: str = "relu", eps: float = 1e-5, bias: bool = True,
                 rope: bool = False, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        fn = "DecoderLayer"
        self.norm_first = check_bool("norm_first", norm_first, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        factory = {"device": device, "dtype": dtype}
        kw = {"bias": bias, "backend": backend, **factory}
        self.self_attn = CachedAttention(d_model, n_heads, rope=check_bool("rope", rope, fn=fn), **kw)
        self.multihead_attn = CachedAttention(d_model, n_heads, **kw)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout, **factory)
        self.norm1 = LayerNorm(d_model, eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps, bias=bias, **factory)
        self.norm3 = LayerNorm(d_model, eps, bias=bias, **factory)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x: torch.Tensor, memory: torch.Tensor, *, self_mask=None,
                memory_mask=None, causal: bool = True,
                cache: tuple[KVCache, KVCache] | None = None,
                need_weights: bool = False) -> DecoderLayerOutput:
        """Apply the layer to ``x`` (B, T, d_model) given ``memory`` (B or 1, S, d_model).

        Args:
            self_mask: bool (True = may attend) or additive float, broadcastable to
                ``(B, H, T, T_total)``, e.g. the target's key padding; ``causal`` adds
                to it.
            memory_mask: broadcastable to (B, H, T, S), e.g. ``src_pad[:, None, None, :]``.
            cache: ``(self_cache, cross_cache)`` for incremental decoding (one pair of
                ``DecoderCache.layers``), or None.
            need_weights: also return both attention maps (computed with ``attention_ref``).
        """
        _check_decoder_forward(x, memory, cache)
        sc, cc = (None, None) if cache is None else cache
        w = {}

        def sa(h):
            res = self.self_attn(h, mask=self_mask, causal=causal,
                                 need_weights=need_weights, cache=sc)
            w["self"] = res.weights
            return self.dropout1(res.out)

        def ca(h):
            res = self.multihead_attn(h, memory, mask=memory_mask,
                                      need_weights=need_weights, cache=cc)
            w["cross"] = res.weights
            return self.dropout2(res.out)

        def ff(h):
            return self.dropout3(self.ffn(h))

        if self.norm_first:                                   # Pre-LN: x + f(LN(x))
            x = x + sa(self.norm1(x))
            x = x + ca(self.norm2(x))
            x = x + ff(self.norm3(x))
        else:                                                 # Post-LN: LN(x + f(x))
            x = self.norm1(x + sa(x))
            x = self.norm2(x + ca(x))
            x = self.norm3(x + ff(x))
        return DecoderLayerOutput(x, w["self"], w["cross"])

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer, *, backend: str = "auto") -> DecoderLayer:
        """A ``DecoderLayer`` with the weights and settings of a PyTorch decoder layer.

        Batch first whatever ``layer.batch_first`` says; equal to ``layer`` in eval mode (the
        attention-weight dropout of ``nn.MultiheadAttention`` has no counterpart here).
        """
        fn = "DecoderLayer.from_torch"
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"{fn}: `layer` must be an nn.TransformerDecoderLayer, got {type(layer).__name__}")
        new = cls(**torch_layer_settings(layer, fn=fn), backend=backend)
        new.self_attn = CachedAttention.from_torch(layer.self_attn, backend=backend)
        new.multihead_attn = CachedAttention.from_torch(layer.multihead_attn, backend=backend)
        new.norm1, new.norm2, new.norm3 = (LayerNorm.from_torch(n) for n in
                                           (layer.norm1, layer.norm2, layer.norm3))
        new.ffn.linear1.load_state_dict(layer.linear1.state_dict())
        new.ffn.linear2.load_state_dict(layer.linear2.state_dict())
        return new


def _check_decoder_forward(x, memory, cache) -> None:
    fn = "DecoderLayer.forward"
    check_tensor("x", x, fn=fn)
    check_tensor("memory", memory, fn=fn)       # None would make the cross-attention read x itself
    if x.ndim != 3 or memory.ndim != 3 or memory.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"{fn}: `x` must be (B, T, d_model) and `memory` (B or 1, S, d_model), got "
                         f"x {tuple(x.shape)}, memory {tuple(memory.shape)}")
    ok = cache is None or (isinstance(cache, (tuple, list)) and len(cache) == 2
                           and all(isinstance(c, KVCache) for c in cache))
    if not ok:
        raise TypeError(f"DecoderLayer.forward: `cache` must be None or a (self_cache, cross_cache) "
                        f"pair of KVCache (one entry of DecoderCache.layers), got {cache!r:.80}")
