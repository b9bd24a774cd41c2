"""The complete encoder-decoder Transformer, assembled from the book's parts (chapter 10).

Vaswani et al. 2017 (section 3), built only from earlier chapters: ``MultiHeadAttention``
(chapter 05; every head through ``attnbook.attention``, so any backend can be switched in),
the positional encodings of chapter 06, ``FeedForward`` (chapter 07), ``LayerNorm`` and
``EncoderLayer`` (chapter 08). What this module adds:

- ``Attention``: ``MultiHeadAttention`` plus RoPE on queries and keys and a key/value cache;
- ``DecoderLayer``: masked self-attention, cross-attention over the encoder's memory, FFN,
  each with residual + LayerNorm, in Post-LN or Pre-LN order;
- ``Transformer``: embeddings scaled by sqrt(d_model), positions, N encoder and N decoder
  layers, and ONE output projection after the decoder stack (finding 10.1: the seed's
  diagram repeats ``Linear + Softmax`` inside every layer);
- decoding through the ``step(prefixes) -> log-probs`` protocol of chapter 02 (greedy and
  beam search shared with the GRU models), with an optional key/value cache;
- the training recipe: label-smoothed cross-entropy and the warm-up schedule of the paper.

Masks (appendix "记号与约定"): pad masks are bool ``(B, T)`` with True = a real token; the
decoder's self-attention is causal; padded source keys are hidden from the encoder's
self-attention and from every cross-attention. ``torch.nn.Transformer`` uses the opposite
polarity (True = padding); :meth:`Transformer.from_torch` documents the conversion.

Positions (``positions=``): ``"sinusoidal"`` (added table, chapter 06), ``"learned"`` (an
embedding table of ``max_len`` rows), ``"rope"`` (queries and keys of every SELF-attention are
rotated; cross-attention gets none, as in encoder-decoder models with relative positions) and
``"alibi"`` (a per-head linear bias in every self-attention: causal in the decoder, the
symmetric extension ``-m|i - j|`` in the encoder; none in cross-attention).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_choice, check_float, check_int, check_tensor, describe
from .decoding import beam_search, greedy_decode_batch
from .dispatch import attention
from .layers import ACTIVATIONS, EncoderLayer, FeedForward, LayerNorm, torch_layer_settings
from .multihead import MultiHeadAttention, MultiHeadOutput, merge_heads, repeat_kv, split_heads
from .positional import alibi_bias, apply_rope, sinusoidal_encoding
from .reference import attention_ref, mask_to_additive

__all__ = [
    "POSITIONS",
    "Attention",
    "AttentionMaps",
    "DecoderCache",
    "DecoderLayer",
    "DecoderLayerOutput",
    "KVCache",
    "Transformer",
    "label_smoothed_cross_entropy",
    "vaswani_lr",
]

POSITIONS = ("sinusoidal", "rope", "alibi", "learned")


# ---------------------------------------------------------------------------------------------
# Attention with RoPE and a key/value cache
# ---------------------------------------------------------------------------------------------

class KVCache:
    """The keys and values one attention module has already computed (chapter 10).

    ``k``, ``v``: ``(B, H_kv, t, d_k)`` after the projection (and RoPE), or None while empty.
    A self-attention cache grows by the new positions at every call; a cross-attention cache
    (``static=True``) is filled once from the encoder's memory and then only read.
    """

    def __init__(self, *, static: bool = False):
        self.static = check_bool("static", static, fn="KVCache")
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def select(self, rows: torch.Tensor) -> "KVCache":
        """A cache whose batch row n is row ``rows[n]`` of this one (beam search reorders rows).

        A static cache with batch size 1 (one source shared by every hypothesis) is kept as is,
        and so is any cache when ``rows`` is ``0, 1, ..., B - 1`` (then the result is ``self``).
        """
        if self.k is not None and len(rows) == self.k.shape[0] and torch.equal(
                rows, torch.arange(len(rows), device=rows.device)):
            return self                                       # nothing moves: no copy
        new = KVCache(static=self.static)
        if self.k is not None:
            keep = self.static and self.k.shape[0] == 1
            new.k = self.k if keep else self.k.index_select(0, rows)
            new.v = self.v if keep else self.v.index_select(0, rows)
        return new


class Attention(MultiHeadAttention):
    """Multi-head attention (chapter 05) with RoPE and a key/value cache (chapters 06, 10).

    Without RoPE and without a cache it IS ``MultiHeadAttention.forward``. With ``rope=True``
    queries and keys are rotated per head after the projection (``apply_rope``, chapter 06):
    key j sits at position j, and the Tq queries are the LAST Tq positions (Tk - Tq + i), which
    is where the new tokens are when a cache holds the earlier ones. With a ``cache``:

    - self-attention (``cache.static`` False): the keys and values of the new positions are
      appended to the cache and the queries attend to all of them; ``causal=True`` then means
      query i (at position Tk - Tq + i) sees keys j <= Tk - Tq + i (bottom-right aligned,
      unlike ``attention``'s top-left causal, which is only right when Tq = Tk);
    - cross-attention (``cache.static`` True): ``key``/``value`` are projected once, on the
      first call, and reused afterwards; a cache of batch 1 is shared by every query row.

    Args: as ``MultiHeadAttention``, plus ``rope`` (rotate queries and keys; d_k must be even).
    """

    def __init__(self, d_model: int, n_heads: int, *, rope: bool = False, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.rope = check_bool("rope", rope, fn="Attention")
        if self.rope and self.d_k % 2:
            raise ValueError(f"Attention: RoPE rotates pairs of features, so d_k = d_model / n_heads "
                             f"must be even, got d_k = {self.d_k}")

    def extra_repr(self) -> str:
        return super().extra_repr() + (", rope=True" if self.rope else "")

    def forward(self, query, key=None, value=None, *, mask=None, causal=False, need_weights=False,
                head_mask=None, cache: KVCache | None = None) -> MultiHeadOutput:
        """Attention of ``query`` ``(B, Tq, d_model)`` over ``key``/``value`` (default: query).

        ``mask`` broadcasts to ``(B, H, Tq, Tk)`` where Tk counts the cached keys too. Returns
        ``MultiHeadOutput(out, weights)`` like ``MultiHeadAttention``.
        """
        fn = "Attention.forward"
        if not self.rope and cache is None:
            return super().forward(query, key, value, mask=mask, causal=causal,
                                   need_weights=need_weights, head_mask=head_mask)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"{fn}: `cache` must be a KVCache or None, got {type(cache).__name__}")
        key = query if key is None else key
        value = key if value is None else value
        shared = all(isinstance(t, torch.Tensor) and t.ndim == 3 for t in (query, key, value)) \
            and key.shape[0] == value.shape[0] == 1 != query.shape[0]   # one memory for every row
        if shared:
            self._check_inputs(query, *(t.expand(query.shape[0], -1, -1) for t in (key, value)),
                               None, head_mask)
        else:
            self._check_inputs(query, key, value, None, head_mask)
        causal = check_bool("causal", causal, fn=fn)
        need_weights = check_bool("need_weights", need_weights, fn=fn)
        b, tq = query.shape[:2]
        q = split_heads(self.q_proj(query), self.n_heads)                     # (B, H, Tq, d_k)
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v                                           # memory: done once
        else:
            past = 0 if cache is None or cache.static else len(cache)
            k = split_heads(self.k_proj(key), self.n_kv_heads)                # (B, H_kv, Tk', d_k)
            v = split_heads(self.v_proj(value), self.n_kv_heads)
            if self.rope:                                                     # key j at position j
                k = apply_rope(k, past + torch.arange(k.shape[2], device=k.device))
            if cache is not None:
                if past:
                    k, v = torch.cat([cache.k, k], 2), torch.cat([cache.v, v], 2)  # (B, H_kv, Tk, d_k)
                cache.k, cache.v = k, v
        if k.shape[0] != b:                                                   # a shared memory
            k, v = k.expand(b, *k.shape[1:]), v.expand(b, *v.shape[1:])
        tk = k.shape[2]
        if self.rope:                                                         # the last Tq positions
            q = apply_rope(q, tk - tq + torch.arange(tq, device=q.device))
        if causal and tq != tk:                                               # bottom-right aligned
            allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
            if mask is None or mask.dtype == torch.bool:
                mask = allowed if mask is None else mask & allowed
            else:
                mask = mask.masked_fill(~allowed, float("-inf"))
            causal = False
        if mask is not None:
            self._check_mask(mask, (b, self.n_heads, tq, tk), fn, hint="Tk counts the cached keys")
        group = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, group), repeat_kv(v, group)                       # (B, H, Tk, d_k)
        if need_weights:
            res = attention_ref(q, k, v, mask=mask, causal=causal)
            heads, weights = res.out, res.weights
        else:
            heads = attention(q, k, v, mask=mask, causal=causal, backend=self.backend)
            weights = None
        if head_mask is not None:
            heads = heads * head_mask.to(heads.dtype)[:, None, None]
        return MultiHeadOutput(self.out_proj(merge_heads(heads)), weights)    # (B, Tq, d_model)


# ---------------------------------------------------------------------------------------------
# Decoder layer
# ---------------------------------------------------------------------------------------------

class DecoderLayerOutput(NamedTuple):
    """What :class:`DecoderLayer` returns; the weights only with ``need_weights=True``."""

    out: torch.Tensor                    # (B, T, d_model)
    self_weights: torch.Tensor | None    # (B, H, T, T_total) masked self-attention
    cross_weights: torch.Tensor | None   # (B, H, T, S) cross-attention over the memory


class DecoderLayer(nn.Module):
    """One Transformer decoder layer (chapter 10, eq. eq-ch10-decoder-layer).

    Post-LN (``norm_first=False``, Vaswani et al. 2017):
        x = LN_1(x + SelfAttn(x));   x = LN_2(x + CrossAttn(x, memory));   x = LN_3(x + FFN(x))
    Pre-LN (``norm_first=True``):
        x = x + SelfAttn(LN_1(x));   x = x + CrossAttn(LN_2(x), memory);   x = x + FFN(LN_3(x))
    The self-attention is causal; the cross-attention takes its queries from the decoder and its
    keys and values from ``memory``, the encoder's final output (the same for every layer).
    There is no output projection here: it comes once, after the last layer (finding 10.1).

    Children are named as in ``nn.TransformerDecoderLayer`` (``self_attn``, ``multihead_attn``,
    ``norm1..3``, ``dropout1..3``; ``linear1``/``linear2`` live in ``ffn``), and
    :meth:`from_torch` copies such a layer exactly (equal in eval mode).

    Args: d_model, n_heads, d_ff, norm_first, dropout, activation, eps, bias, backend as
    ``EncoderLayer``; rope: rotate queries and keys of the self-attention (chapter 06).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False,
                 dropout: float = 0.0, activation: str = "relu", eps: float = 1e-5, bias: bool = True,
                 rope: bool = False, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        fn = "DecoderLayer"
        self.norm_first = check_bool("norm_first", norm_first, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        factory = {"device": device, "dtype": dtype}
        self.self_attn = Attention(d_model, n_heads, rope=rope, bias=bias, backend=backend, **factory)
        self.multihead_attn = Attention(d_model, n_heads, bias=bias, backend=backend, **factory)
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
                ``(B, H, T, T_total)``, e.g. the target's key padding; ``causal`` adds to it.
            memory_mask: broadcastable to (B, H, T, S), e.g. ``src_pad[:, None, None, :]``.
            cache: ``(self_cache, cross_cache)`` for incremental decoding, or None.
            need_weights: also return both attention maps (computed with ``attention_ref``).
        """
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
    def from_torch(cls, layer: nn.TransformerDecoderLayer, *, backend: str = "auto") -> "DecoderLayer":
        """A ``DecoderLayer`` with the weights and settings of a PyTorch decoder layer.

        Batch first whatever ``layer.batch_first`` says; equal to ``layer`` in eval mode (the
        attention-weight dropout of ``nn.MultiheadAttention`` has no counterpart here).
        """
        fn = "DecoderLayer.from_torch"
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"{fn}: `layer` must be an nn.TransformerDecoderLayer, got {type(layer).__name__}")
        new = cls(**torch_layer_settings(layer, fn=fn), backend=backend)
        new.self_attn = Attention.from_torch(layer.self_attn, backend=backend)
        new.multihead_attn = Attention.from_torch(layer.multihead_attn, backend=backend)
        new.norm1, new.norm2, new.norm3 = (LayerNorm.from_torch(n) for n in
                                           (layer.norm1, layer.norm2, layer.norm3))
        new.ffn.linear1.load_state_dict(layer.linear1.state_dict())
        new.ffn.linear2.load_state_dict(layer.linear2.state_dict())
        return new


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

class DecoderCache:
    """Everything incremental decoding keeps between steps: one self- and one cross-attention
    :class:`KVCache` per decoder layer, and how many target positions are already inside."""

    def __init__(self, n_layers: int):
        self.layers = [(KVCache(), KVCache(static=True)) for _ in range(n_layers)]
        self.length = 0

    def select(self, rows: torch.Tensor) -> "DecoderCache":
        """The cache for hypotheses whose row n continues row ``rows[n]`` of this one."""
        new = DecoderCache(0)
        new.layers = [(s.select(rows), c.select(rows)) for s, c in self.layers]
        new.length = self.length
        return new


class AttentionMaps(NamedTuple):
    """Per-layer attention weights ``(B, H, Tq, Tk)`` of a forward pass, first layer first."""

    encoder: list[torch.Tensor]   # (B, H, S, S)
    decoder: list[torch.Tensor]   # (B, H, T, T), masked (causal) self-attention
    cross: list[torch.Tensor]     # (B, H, T, S)


class Transformer(nn.Module):
    """The encoder-decoder Transformer (chapter 10; Vaswani et al. 2017, section 3).

        x_src = Emb_src(src) sqrt(d_model) + PE        memory = Encoder^N(x_src)
        x_tgt = Emb_tgt(tgt) sqrt(d_model) + PE        h = Decoder^N(x_tgt, memory)
        logits = h W_out                               (one projection, after the N layers)

    The encoder layers are chapter 08's ``EncoderLayer``; the decoder layers are
    :class:`DecoderLayer`. Every decoder layer's cross-attention reads the same ``memory``.
    With ``final_norm`` (default: True for Pre-LN, where the residual stream is never
    normalised otherwise, chapter 08; False for Post-LN as in the paper) one LayerNorm follows
    each stack; ``nn.Transformer`` always has both, and :meth:`from_torch` copies them.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes.
        d_model, n_heads, n_layers (encoder and decoder each), d_ff: sizes.
        norm_first: Pre-LN if True, Post-LN (the paper) if False.
        positions: ``"sinusoidal"``, ``"rope"``, ``"alibi"`` or ``"learned"`` (module docstring).
        tie_embeddings: the output projection reuses the target embedding matrix (Press & Wolf
            2017; the paper also shares it with the source embedding, since its source and
            target share one BPE vocabulary; here the two vocabularies may differ).
        dropout: on the embeddings + positions and in every sublayer (training only).
        backend: the ``attnbook.attention`` backend of every attention module.
        activation: the FFN's ``"relu"``, ``"gelu"`` or ``"swiglu"``.
        final_norm: LayerNorm after each stack (None: ``norm_first``).
        max_len: rows of the learned position table (only ``"learned"`` is limited by it).
        eps: every LayerNorm's eps.

    Initialisation: embeddings N(0, 1/d_model) as in fairseq (so the scaled embedding has
    unit-variance entries and tied logits start of order 1), learned positions N(0, 1/d_model), the layers
    as chapters 05, 07, 08 initialise them; an untied output projection as ``nn.Linear``.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, *, d_model: int, n_heads: int, n_layers: int,
                 d_ff: int, norm_first: bool = False, positions: str = "sinusoidal",
                 tie_embeddings: bool = True, dropout: float = 0.0, backend: str = "auto",
                 activation: str = "relu", final_norm: bool | None = None, max_len: int = 256,
                 eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        fn = "Transformer"
        self.src_vocab = check_int("src_vocab", src_vocab, fn=fn)
        self.tgt_vocab = check_int("tgt_vocab", tgt_vocab, fn=fn)
        self.d_model = check_int("d_model", d_model, fn=fn)
        self.n_heads = check_int("n_heads", n_heads, fn=fn)
        self.n_layers = check_int("n_layers", n_layers, fn=fn)
        check_int("d_ff", d_ff, fn=fn)
        if d_model % n_heads:
            raise ValueError(f"{fn}: `n_heads` must divide `d_model`, got d_model={d_model}, n_heads={n_heads}")
        self.norm_first = check_bool("norm_first", norm_first, fn=fn)
        self.positions = check_choice("positions", positions, POSITIONS, fn=fn)
        if positions == "sinusoidal" and d_model % 2:
            raise ValueError(f"{fn}: sinusoidal positions come in (sin, cos) pairs, so `d_model` must be "
                             f"even, got {d_model}")
        if positions == "rope" and (d_model // n_heads) % 2:
            raise ValueError(f"{fn}: RoPE rotates pairs of features, so d_k = d_model / n_heads must be "
                             f"even, got d_k = {d_model // n_heads}")
        tie = check_bool("tie_embeddings", tie_embeddings, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        check_choice("activation", activation, ACTIVATIONS, fn=fn)
        final_norm = norm_first if final_norm is None else check_bool("final_norm", final_norm, fn=fn)
        self.max_len = check_int("max_len", max_len, fn=fn)
        factory = {"device": device, "dtype": dtype}
        layer_kw = dict(norm_first=norm_first, dropout=dropout, activation=activation, eps=eps,
                        backend=backend, **factory)
        rope = positions == "rope"

        self.src_embed = nn.Embedding(src_vocab, d_model, **factory)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, **factory)
        if positions == "learned":
            self.src_pos = nn.Embedding(max_len, d_model, **factory)
            self.tgt_pos = nn.Embedding(max_len, d_model, **factory)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList()
        for _ in range(n_layers):
            layer = EncoderLayer(d_model, n_heads, d_ff, **layer_kw)
            if rope:   # chapter 08's layer with a self-attention that rotates q and k
                layer.self_attn = Attention(d_model, n_heads, rope=True, backend=backend, **factory)
            self.encoder.append(layer)
        self.decoder = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, rope=rope, **layer_kw)
                                     for _ in range(n_layers))
        self.encoder_norm = LayerNorm(d_model, eps, **factory) if final_norm else None
        self.decoder_norm = LayerNorm(d_model, eps, **factory) if final_norm else None
        self.output = nn.Linear(d_model, tgt_vocab, bias=False, **factory)   # W_out = output.weight.T
        with torch.no_grad():
            tables = [self.src_embed, self.tgt_embed]
            if positions == "learned":
                tables += [self.src_pos, self.tgt_pos]
            for emb in tables:
                emb.weight.normal_(0.0, d_model ** -0.5)
        if tie:
            self.output.weight = self.tgt_embed.weight                         # one shared matrix

    @property
    def tie_embeddings(self) -> bool:
        return self.output.weight is self.tgt_embed.weight

    @property
    def final_norm(self) -> bool:
        return self.encoder_norm is not None

    def extra_repr(self) -> str:
        order = "Pre-LN" if self.norm_first else "Post-LN"
        return (f"{order}, positions={self.positions!r}, tie_embeddings={self.tie_embeddings}, "
                f"final_norm={self.final_norm}")

    # --------------------------------------------------------------------------------- inputs
    def _check_tokens(self, name, t, vocab, fn):
        check_tensor(name, t, fn=fn, min_ndim=2, floating=False)
        if t.ndim != 2 or t.dtype != torch.long:
            raise TypeError(f"{fn}: `{name}` must be a 2-D torch.long tensor (B, T) of token ids, got {describe(t)}")
        if t.shape[1] == 0:
            raise ValueError(f"{fn}: `{name}` must hold at least one position, got {describe(t)}")
        if t.numel() and ((t < 0).any() or (t >= vocab).any()):
            raise ValueError(f"{fn}: `{name}` must hold ids in [0, {vocab}), got min {int(t.min())}, "
                             f"max {int(t.max())}")
        if t.device != self.output.weight.device:
            raise ValueError(f"{fn}: `{name}` is on {t.device} but the model is on {self.output.weight.device}")

    @staticmethod
    def _check_pad(name, pad, tokens, fn):
        if pad is None:
            return None
        check_tensor(name, pad, fn=fn, min_ndim=2, floating=False)
        if pad.dtype != torch.bool:
            raise TypeError(f"{fn}: `{name}` must be a bool tensor (True = real token), got {describe(pad)}")
        if pad.shape != tokens.shape:
            raise ValueError(f"{fn}: `{name}` must have the shape of its tokens {tuple(tokens.shape)}, "
                             f"got {tuple(pad.shape)}")
        return pad

    def _embed(self, tokens, table, pos_table, start=0):
        """Emb(tokens) sqrt(d_model) + PE(start, start + 1, ...), then dropout (eq-ch10-embed)."""
        t = tokens.shape[1]
        x = table(tokens) * math.sqrt(self.d_model)                  # (B, T, d_model)
        if self.positions == "sinusoidal":
            pe = sinusoidal_encoding(start + t, self.d_model, dtype=x.dtype,
                                     device=x.device)                # (start + T, d_model)
            x = x + pe[start:]
        elif self.positions == "learned":
            if start + t > self.max_len:
                raise ValueError(f"Transformer: learned positions cover {self.max_len} "
                                 f"positions (max_len), got a sequence of {start + t}")
            x = x + pos_table(torch.arange(start, start + t, device=x.device))
        return self.dropout(x)

    def _self_mask(self, pad, tq, tk, causal, dtype):
        """The self-attention mask: key padding, plus ALiBi's bias (which holds the causal -inf)."""
        mask = None if pad is None else pad[:, None, None, :]               # (B, 1, 1, Tk)
        if self.positions != "alibi":
            return mask, causal
        bias = alibi_bias(self.n_heads, tk, symmetric=not causal, dtype=dtype,
                          device=self.output.weight.device)[:, tk - tq:]     # (H, Tq, Tk): last rows
        if mask is not None:
            bias = bias + mask_to_additive(mask, dtype)                      # (B, H, Tq, Tk)
        return bias, False

    # -------------------------------------------------------------------------------- forward
    def encode(self, src: torch.Tensor, *, src_pad: torch.Tensor | None = None,
               need_weights: bool = False):
        """The encoder: ``memory`` ``(B, S, d_model)`` (and its attention maps if asked).

        Padded positions of ``memory`` hold values; every cross-attention masks them out.
        """
        fn = "Transformer.encode"
        self._check_tokens("src", src, self.src_vocab, fn)
        src_pad = self._check_pad("src_pad", src_pad, src, fn)
        x = self._embed(src, self.src_embed, getattr(self, "src_pos", None))
        mask, _ = self._self_mask(src_pad, src.shape[1], src.shape[1], False, x.dtype)
        maps = []
        for layer in self.encoder:
            if need_weights:   # the layer's own attention call, once more, for the weights
                h = layer.norm1(x) if layer.norm_first else x
                maps.append(layer.self_attn(h, mask=mask, need_weights=True).weights)
            x = layer(x, mask=mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return (x, maps) if need_weights else x

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, *, src_pad: torch.Tensor | None = None,
               tgt_pad: torch.Tensor | None = None, cache: DecoderCache | None = None,
               need_weights: bool = False):
        """The decoder and the output projection: logits ``(B, T, tgt_vocab)``.

        Args:
            tgt: target tokens ``(B, T)`` (teacher forcing: BOS y_1 .. y_{T-1}); with a
                ``cache``, only the NEW tokens, which continue the ``cache.length`` earlier ones.
            memory: ``encode``'s output ``(B, S, d_model)``, or ``(1, S, d_model)`` shared by
                every row.
            src_pad, tgt_pad: bool pad masks, True = real token (``tgt_pad`` not with a cache).
            cache: a :class:`DecoderCache` (from :meth:`new_cache`), updated in place.
            need_weights: also return ``(self_maps, cross_maps)``, lists over layers.
        """
        fn = "Transformer.decode"
        self._check_tokens("tgt", tgt, self.tgt_vocab, fn)
        tgt_pad = self._check_pad("tgt_pad", tgt_pad, tgt, fn)
        check_tensor("memory", memory, fn=fn, min_ndim=3)
        if memory.ndim != 3 or memory.shape[-1] != self.d_model or memory.shape[0] not in (1, tgt.shape[0]):
            raise ValueError(f"{fn}: `memory` must be (B or 1, S, d_model={self.d_model}) with B = "
                             f"{tgt.shape[0]}, got {describe(memory)}")
        if src_pad is not None:
            check_tensor("src_pad", src_pad, fn=fn, min_ndim=2, floating=False)
            if src_pad.dtype != torch.bool or src_pad.shape != memory.shape[:2]:
                raise ValueError(f"{fn}: `src_pad` must be bool (B, S) = {tuple(memory.shape[:2])}, "
                                 f"got {describe(src_pad)}")
        if cache is not None and not isinstance(cache, DecoderCache):
            raise TypeError(f"{fn}: `cache` must be a DecoderCache or None, got {type(cache).__name__}")
        if cache is not None and tgt_pad is not None:
            raise ValueError(f"{fn}: incremental decoding (a cache) takes no `tgt_pad`: every row "
                             f"holds the same number of real tokens")
        if cache is None and memory.shape[0] != tgt.shape[0]:                  # one shared memory
            memory = memory.expand(tgt.shape[0], -1, -1)
        start = 0 if cache is None else cache.length
        t = tgt.shape[1]
        x = self._embed(tgt, self.tgt_embed, getattr(self, "tgt_pos", None), start)
        self_mask, causal = self._self_mask(tgt_pad, t, start + t, True, x.dtype)
        memory_mask = None if src_pad is None else src_pad[:, None, None, :]    # (B, 1, 1, S)
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.decoder):
            res = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, causal=causal,
                        cache=None if cache is None else cache.layers[i], need_weights=need_weights)
            x = res.out
            self_maps.append(res.self_weights)
            cross_maps.append(res.cross_weights)
        if cache is not None:
            cache.length += t
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        logits = self.output(x)                                              # (B, T, tgt_vocab)
        return (logits, self_maps, cross_maps) if need_weights else logits

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, src_pad: torch.Tensor | None = None,
                tgt_pad: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: logits ``(B, T_tgt, tgt_vocab)``; row t scores the token after tgt[:, :t+1].

        Args:
            src: ``(B, S)`` long; tgt: ``(B, T)`` long (BOS y_1 .. y_{T-1}).
            src_pad, tgt_pad: bool ``(B, S)`` / ``(B, T)``, True = a real token (e.g.
                ``Batch.src_mask`` / ``Batch.tgt_mask``); None = no padding.
        """
        self._check_tokens("tgt", tgt, self.tgt_vocab, "Transformer.forward")
        if tgt.shape[0] != src.shape[0]:
            raise ValueError(f"Transformer.forward: `src` and `tgt` must share the batch size, got "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)}")
        memory = self.encode(src, src_pad=src_pad)
        return self.decode(tgt, memory, src_pad=src_pad, tgt_pad=tgt_pad)

    def attention_maps(self, src: torch.Tensor, tgt: torch.Tensor, *, src_pad=None,
                       tgt_pad=None) -> AttentionMaps:
        """Every attention map of a teacher-forced pass (no gradients), as ``AttentionMaps``."""
        with torch.no_grad():
            memory, enc = self.encode(src, src_pad=src_pad, need_weights=True)
            _, dec, cross = self.decode(tgt, memory, src_pad=src_pad, tgt_pad=tgt_pad, need_weights=True)
        return AttentionMaps(enc, dec, cross)

    # ------------------------------------------------------------------------------- decoding
    def new_cache(self) -> DecoderCache:
        """An empty :class:`DecoderCache` for :meth:`decode`."""
        return DecoderCache(self.n_layers)

    def _step(self, memory, src_pad, *, shared: bool, cache: bool):
        """``step(prefixes (N, t)) -> (N, V)`` log-probs (the protocol of chapter 02).

        With ``cache``, a call whose prefixes each extend a prefix of the previous call
        (row n's parent found by value when ``shared``, i.e. one source for every row as in
        beam search; row n itself otherwise) reuses the parents' keys and values and runs
        the decoder on the one new token; any other call starts a fresh cache from the
        whole prefix.
        """
        state = {"prefixes": None, "cache": None}
        fn = "Transformer step"

        def parents(prefixes):
            prev = state["prefixes"]
            if prev is None or prev.shape[1] != prefixes.shape[1] - 1:
                return None
            if not shared:
                same = (prev.shape[0] == prefixes.shape[0]
                        and torch.equal(prev, prefixes[:, :-1]))
                return torch.arange(prefixes.shape[0]) if same else None
            row_of = {tuple(r): i for i, r in enumerate(prev.tolist())}
            rows = [row_of.get(tuple(r)) for r in prefixes[:, :-1].tolist()]
            return None if None in rows else torch.tensor(rows)

        def step(prefixes: torch.Tensor) -> torch.Tensor:
            self._check_tokens("prefixes", prefixes, self.tgt_vocab, fn)
            n = prefixes.shape[0]
            if not shared and n != memory.shape[0]:
                raise ValueError(f"{fn}: `prefixes` must have one row per source "
                                 f"({memory.shape[0]}), got {n}")
            was_training = self.training
            if was_training:                  # toggling walks every module: only if needed
                self.eval()
            try:
                with torch.no_grad():
                    if not cache:
                        mem = memory.expand(n, *memory.shape[1:]) if shared else memory
                        pad = None if src_pad is None else src_pad.expand(n, -1)
                        logits = self.decode(prefixes, mem, src_pad=pad)[:, -1]
                    else:
                        rows = parents(prefixes)
                        if rows is None:
                            c, new = self.new_cache(), prefixes
                        else:
                            c, new = state["cache"].select(rows), prefixes[:, -1:]
                        logits = self.decode(new, memory, src_pad=src_pad, cache=c)[:, -1]
                        state["prefixes"], state["cache"] = prefixes, c
            finally:
                if was_training:
                    self.train()
            return F.log_softmax(logits, dim=-1)                             # (N, V)

        return step

    def step_fn(self, src: torch.Tensor, *, cache: bool = True):
        """The decoding protocol for ONE source ``src`` (1-D, no padding): ``step(prefixes)``.

        Use it with ``beam_search``, ``greedy_decode`` or ``exact_map`` (chapter 02).
        """
        fn = "Transformer.step_fn"
        check_tensor("src", src, fn=fn, min_ndim=1, floating=False)
        if src.ndim != 1:
            raise ValueError(f"{fn}: `src` must be one sentence, a 1-D tensor, got shape {tuple(src.shape)}; "
                             f"for a batch use batch_step_fn")
        cache = check_bool("cache", cache, fn=fn)
        with torch.no_grad():
            was_training = self.training
            self.eval()
            memory = self.encode(src[None])
            self.train(was_training)
        return self._step(memory, None, shared=True, cache=cache)

    def batch_step_fn(self, src: torch.Tensor, src_pad: torch.Tensor | None = None, *, cache: bool = True):
        """Like :meth:`step_fn` for a padded batch: row n of ``prefixes`` continues source n
        (the protocol of ``greedy_decode_batch``)."""
        cache = check_bool("cache", cache, fn="Transformer.batch_step_fn")
        with torch.no_grad():
            was_training = self.training
            self.eval()
            memory = self.encode(src, src_pad=src_pad)
            self.train(was_training)
        return self._step(memory, src_pad, shared=False, cache=cache)

    def generate(self, src: torch.Tensor, *, bos: int, eos: int, max_len: int, beam_size: int = 1,
                 cache: bool = True, src_pad: torch.Tensor | None = None,
                 alpha: float = 0.0) -> list[list[int]]:
        """Decode every source row: greedy (``beam_size=1``, all rows at once) or beam search.

        Returns one token list per row: the generated ids without BOS, ending with ``eos``
        (forced at ``max_len``), exactly the ``tokens`` of chapter 02's ``Hypothesis``.
        ``cache`` toggles the key/value cache (the result is the same, only the cost differs).
        """
        fn = "Transformer.generate"
        self._check_tokens("src", src, self.src_vocab, fn)
        src_pad = self._check_pad("src_pad", src_pad, src, fn)
        beam_size = check_int("beam_size", beam_size, fn=fn)
        cache = check_bool("cache", cache, fn=fn)
        if beam_size == 1:
            hyps = greedy_decode_batch(self.batch_step_fn(src, src_pad, cache=cache), batch_size=src.shape[0],
                                       bos=bos, eos=eos, max_len=max_len)
            return [list(h.tokens) for h in hyps]
        out = []
        for i in range(src.shape[0]):
            row = src[i] if src_pad is None else src[i][src_pad[i]]
            best = beam_search(self.step_fn(row, cache=cache), bos=bos, eos=eos, beam_size=beam_size,
                               max_len=max_len, alpha=alpha)[0]
            out.append(list(best.tokens))
        return out

    # ---------------------------------------------------------------------------- from torch
    @classmethod
    def from_torch(cls, model: nn.Transformer, src_embed: nn.Embedding, tgt_embed: nn.Embedding,
                   output: nn.Linear | None = None, *, backend: str = "auto") -> "Transformer":
        """A ``Transformer`` with the weights of ``torch.nn.Transformer`` plus its embeddings and output.

        ``nn.Transformer`` has no embeddings and no output layer, so they are passed separately:
        ``src_embed``, ``tgt_embed`` (``nn.Embedding``) and ``output`` (``nn.Linear`` without
        bias; None, or a layer whose weight IS ``tgt_embed.weight``, means tied). The reference
        computation is ``output(model(Emb_src(src) sqrt(d) + PE, Emb_tgt(tgt) sqrt(d) + PE))``
        with sinusoidal PE. ``nn.Transformer`` always puts a LayerNorm after each stack, even
        in Post-LN order, so the copy has ``final_norm=True``. Equal in eval mode, batch first;
        torch's masks (True = padding) become ``src_pad = ~src_key_padding_mask``.
        """
        fn = "Transformer.from_torch"
        if not isinstance(model, nn.Transformer):
            raise TypeError(f"{fn}: `model` must be an nn.Transformer, got {type(model).__name__}")
        for name, emb in (("src_embed", src_embed), ("tgt_embed", tgt_embed)):
            if not isinstance(emb, nn.Embedding):
                raise TypeError(f"{fn}: `{name}` must be an nn.Embedding, got {type(emb).__name__}")
            if emb.embedding_dim != model.d_model:
                raise ValueError(f"{fn}: `{name}` must have embedding_dim d_model = {model.d_model}, "
                                 f"got {emb.embedding_dim}")
        if output is not None:
            if not isinstance(output, nn.Linear):
                raise TypeError(f"{fn}: `output` must be an nn.Linear or None, got {type(output).__name__}")
            if output.bias is not None or output.weight.shape != tgt_embed.weight.shape:
                raise ValueError(f"{fn}: `output` must be nn.Linear(d_model, tgt_vocab, bias=False) with "
                                 f"weight {tuple(tgt_embed.weight.shape)}, got weight "
                                 f"{tuple(output.weight.shape)}, bias {output.bias is not None}")
        enc_layers, dec_layers = model.encoder.layers, model.decoder.layers
        if len(enc_layers) != len(dec_layers):
            raise ValueError(f"{fn}: encoder and decoder must have as many layers, got "
                             f"{len(enc_layers)} and {len(dec_layers)}")
        tied = output is None or output.weight is tgt_embed.weight
        settings = torch_layer_settings(enc_layers[0], fn=fn)
        settings.pop("bias")  # the layers are replaced below by from_torch copies, biases included
        new = cls(src_embed.num_embeddings, tgt_embed.num_embeddings, n_layers=len(enc_layers),
                  positions="sinusoidal", tie_embeddings=tied, backend=backend,
                  final_norm=model.encoder.norm is not None, **settings)
        new.encoder = nn.ModuleList(EncoderLayer.from_torch(layer, backend=backend) for layer in enc_layers)
        new.decoder = nn.ModuleList(DecoderLayer.from_torch(layer, backend=backend) for layer in dec_layers)
        if model.encoder.norm is not None:
            new.encoder_norm = LayerNorm.from_torch(model.encoder.norm)
            new.decoder_norm = LayerNorm.from_torch(model.decoder.norm)
        with torch.no_grad():
            new.src_embed.weight.copy_(src_embed.weight)
            new.tgt_embed.weight.copy_(tgt_embed.weight)
            if not tied:
                new.output.weight.copy_(output.weight)
        return new


# ---------------------------------------------------------------------------------------------
# The training recipe (Vaswani et al. 2017, section 5)
# ---------------------------------------------------------------------------------------------

def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *,
                                 smoothing: float, pad_id: int = 0) -> torch.Tensor:
    """Cross-entropy against the smoothed target (1 - eps) onehot(y) + eps / V (chapter 10).

    loss = mean over non-PAD positions of
           (1 - eps) (-log p_y) + (eps / V) sum_c (-log p_c),
    the definition of Szegedy et al. 2016 and of ``F.cross_entropy(label_smoothing=eps)``:
    every one of the V classes, the true one and PAD included, gets eps / V.
    ``eps = 0`` is ``train.token_cross_entropy``.

    Args: logits ``(B, T, V)``; target ``(B, T)`` long; smoothing eps in [0, 1]; pad_id.
    Returns a scalar tensor.
    """
    fn = "label_smoothed_cross_entropy"
    check_tensor("logits", logits, fn=fn, min_ndim=2)
    check_tensor("target", target, fn=fn, min_ndim=1, floating=False)
    if target.dtype != torch.long or logits.shape[:-1] != target.shape:
        raise ValueError(f"{fn}: `target` must be torch.long of shape "
                         f"{tuple(logits.shape[:-1])} (logits without the last dim), "
                         f"got {describe(target)}")
    eps = check_float("smoothing", smoothing, fn=fn, minimum=0.0, maximum=1.0)
    pad_id = check_int("pad_id", pad_id, fn=fn, minimum=0)
    logp = F.log_softmax(logits, dim=-1)                           # (..., V)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)       # -log p_y
    uniform = -logp.mean(-1)                                       # (1/V) sum_c -log p_c
    real = target != pad_id
    loss = (1 - eps) * nll + eps * uniform
    return loss[real].sum() / real.sum().clamp(min=1)


def vaswani_lr(step: int, *, d_model: int, warmup: int = 4000) -> float:
    """The learning rate of Vaswani et al. 2017, eq. 3 (chapter 10, eq. eq-ch10-lr).

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): a linear rise for ``warmup``
    steps, then decay as 1/sqrt(step); the peak, at step = warmup, is (d_model * warmup)^-0.5.
    Steps count from 1.
    """
    fn = "vaswani_lr"
    step = check_int("step", step, fn=fn)
    d_model = check_int("d_model", d_model, fn=fn)
    warmup = check_int("warmup", warmup, fn=fn)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
