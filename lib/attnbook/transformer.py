"""The complete encoder-decoder Transformer, assembled from the book's parts (chapter 10).

Vaswani et al. 2017 (section 3), built only from earlier chapters: ``MultiHeadAttention``
(chapter 05; every head through ``attnbook.attention``, so any backend can be switched in),
the positional encodings of chapter 06, ``FeedForward`` (chapter 07), ``LayerNorm`` (chapter
08) and the layers of ``blocks`` (``EncoderLayer``, chapter 08; ``DecoderLayer``, chapter 10).
What this module adds is ``Transformer``: embeddings scaled by sqrt(d_model), positions, N
encoder and N decoder layers, and ONE output projection after the decoder stack (finding 10.1:
the seed's diagram repeats ``Linear + Softmax`` inside every layer); decoding through the
``step(prefixes) -> log-probs`` protocol of chapter 02 (greedy and beam search shared with the
GRU models), with the key/value cache of ``cache``. Its training recipe (label-smoothed loss,
warm-up schedule) lives in ``train``.

Masks (appendix "记号与约定"): pad masks are bool ``(B, T)`` with True = a real token; the
decoder's self-attention is causal; padded source keys are hidden from the encoder's
self-attention and from every cross-attention. ``torch.nn.Transformer`` uses the opposite
polarity (True = padding); :meth:`Transformer.from_torch` documents the conversion. Padding
goes on the right (greedy and beam search then agree with the unpadded sentence).

Positions (``positions=``): ``"sinusoidal"`` (added table, chapter 06), ``"learned"`` (an
embedding table of ``max_len`` rows), ``"rope"`` (queries and keys of every SELF-attention are
rotated; cross-attention gets none, as in encoder-decoder models with relative positions) and
``"alibi"`` (a per-head linear bias in every self-attention: causal in the decoder, the
symmetric extension ``-m|i - j|`` in the encoder; none in cross-attention).

Empty inputs give empty outputs, as ``nn.Transformer``: a batch of 0 rows gives logits
``(0, T, V)`` and ``generate`` returns ``[]``; a source of length 0 leaves cross-attention
nothing to read (zero heads), a target of length 0 gives ``(B, 0, V)``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (check_bool, check_choice, check_device, check_dtype, check_float, check_int,
                      describe)
from ._transformer_checks import (_check_decode, _check_encode, _check_from_torch, _check_generate,
                                  _check_pair, _check_prefixes, _check_step_fn)
from .blocks import DecoderLayer, EncoderLayer, torch_layer_settings
from .cache import DecoderCache
from .decoding import beam_search, greedy_decode_batch
from .layers import ACTIVATIONS, LayerNorm
from .positional import alibi_bias, sinusoidal_encoding
from .reference import mask_to_additive
from .train import eval_mode

__all__ = ["POSITIONS", "AttentionMaps", "Transformer", "torch_masks"]

POSITIONS = ("sinusoidal", "rope", "alibi", "learned")


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
    ``DecoderLayer``; both come from ``blocks`` and take ``rope`` at construction. Every
    decoder layer's cross-attention reads the same ``memory``.
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
        check_float("eps", eps, fn=fn, minimum=0.0)
        check_dtype("dtype", dtype, fn=fn)
        check_device("device", device, fn=fn)
        factory = {"device": device, "dtype": dtype}
        layer_kw = dict(norm_first=norm_first, dropout=dropout, activation=activation, eps=eps,
                        rope=positions == "rope", backend=backend, **factory)

        self.src_embed = nn.Embedding(src_vocab, d_model, **factory)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, **factory)
        if positions == "learned":
            self.src_pos = nn.Embedding(max_len, d_model, **factory)
            self.tgt_pos = nn.Embedding(max_len, d_model, **factory)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, **layer_kw)
                                     for _ in range(n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, **layer_kw)
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

    # -------------------------------------------------------------------------------- forward
    def _embed(self, tokens, table, pos_table, start=0):
        """Emb(tokens) sqrt(d_model) + PE(start, start + 1, ...), then dropout.

        This is eq-ch10-embed.

        (An empty sequence, T = 0, still asks ``sinusoidal_encoding`` for one row: it
        needs >= 1.)
        """
        t = tokens.shape[1]
        x = table(tokens) * math.sqrt(self.d_model)                  # (B, T, d_model)
        if self.positions == "sinusoidal":
            pe = sinusoidal_encoding(max(start + t, 1), self.d_model, dtype=x.dtype,
                                     device=x.device)                # (start + T, d_model)
            x = x + pe[start:start + t]
        elif self.positions == "learned":
            x = x + pos_table(torch.arange(start, start + t, device=x.device))
        return self.dropout(x)

    def _self_mask(self, pad, tq, tk, causal, dtype):
        """The self-attention mask: key padding, plus ALiBi's bias (which holds the causal -inf)."""
        mask = None if pad is None else pad[:, None, None, :]               # (B, 1, 1, Tk)
        if self.positions != "alibi" or tk == 0:
            return mask, causal
        bias = alibi_bias(self.n_heads, tk, symmetric=not causal, dtype=dtype,
                          device=self.output.weight.device)[:, tk - tq:]     # (H, Tq, Tk): last rows
        if mask is not None:
            bias = bias + mask_to_additive(mask, dtype)                      # (B, H, Tq, Tk)
        return bias, False

    def encode(self, src: torch.Tensor, *, src_pad: torch.Tensor | None = None,
               need_weights: bool = False):
        """The encoder: ``memory`` ``(B, S, d_model)`` (and its attention maps if asked).

        Padded positions of ``memory`` hold values; every cross-attention masks them out.
        """
        _check_encode(self, src, src_pad, need_weights)
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

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, *,
               src_pad: torch.Tensor | None = None, tgt_pad: torch.Tensor | None = None,
               cache: DecoderCache | None = None, need_weights: bool = False):
        """The decoder and the output projection: logits ``(B, T, tgt_vocab)``.

        Args:
            tgt: target tokens ``(B, T)`` (teacher forcing: BOS y_1 .. y_{T-1}); with a
                ``cache``, only the NEW tokens, which continue the ``cache.length``
                earlier ones.
            memory: ``encode``'s output ``(B, S, d_model)``, or ``(1, S, d_model)``
                shared by every row.
            src_pad, tgt_pad: bool pad masks, True = real token (``tgt_pad`` not with a
                cache).
            cache: a ``DecoderCache`` (from :meth:`new_cache`), updated in place.
            need_weights: also return ``(self_maps, cross_maps)``, lists over layers.
        """
        _check_decode(self, tgt, memory, src_pad, tgt_pad, cache, need_weights)
        if cache is None and memory.shape[0] != tgt.shape[0]:      # one shared memory
            memory = memory.expand(tgt.shape[0], -1, -1)
        start = 0 if cache is None else cache.length
        t = tgt.shape[1]
        x = self._embed(tgt, self.tgt_embed, getattr(self, "tgt_pos", None), start)
        self_mask, causal = self._self_mask(tgt_pad, t, start + t, True, x.dtype)
        memory_mask = None if src_pad is None else src_pad[:, None, None, :]  # (B, 1, 1, S)
        self_maps, cross_maps = [], []
        for i, layer in enumerate(self.decoder):
            res = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                        causal=causal, cache=None if cache is None else cache.layers[i],
                        need_weights=need_weights)
            x = res.out
            self_maps.append(res.self_weights)
            cross_maps.append(res.cross_weights)
        if cache is not None:
            cache.length += t
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        logits = self.output(x)                                      # (B, T, tgt_vocab)
        return (logits, self_maps, cross_maps) if need_weights else logits

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, src_pad: torch.Tensor | None = None,
                tgt_pad: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: logits ``(B, T_tgt, tgt_vocab)``; row t scores the token after tgt[:, :t+1].

        Args:
            src: ``(B, S)`` long; tgt: ``(B, T)`` long (BOS y_1 .. y_{T-1}).
            src_pad, tgt_pad: bool ``(B, S)`` / ``(B, T)``, True = a real token (e.g.
                ``Batch.src_mask`` / ``Batch.tgt_mask``); None = no padding.
        """
        _check_pair(self, src, tgt, "Transformer.forward")
        memory = self.encode(src, src_pad=src_pad)
        return self.decode(tgt, memory, src_pad=src_pad, tgt_pad=tgt_pad)

    def attention_maps(self, src: torch.Tensor, tgt: torch.Tensor, *, src_pad=None,
                       tgt_pad=None) -> AttentionMaps:
        """Every attention map of a teacher-forced pass (no gradients), as ``AttentionMaps``."""
        _check_pair(self, src, tgt, "Transformer.attention_maps")
        with torch.no_grad():
            memory, enc = self.encode(src, src_pad=src_pad, need_weights=True)
            _, dec, cross = self.decode(tgt, memory, src_pad=src_pad, tgt_pad=tgt_pad, need_weights=True)
        return AttentionMaps(enc, dec, cross)

    # ------------------------------------------------------------------------------- decoding
    def new_cache(self) -> DecoderCache:
        """An empty ``DecoderCache`` for :meth:`decode`."""
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
            _check_prefixes(self, prefixes, memory, shared)
            n = prefixes.shape[0]
            with eval_mode(self), torch.no_grad():
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
            return F.log_softmax(logits, dim=-1)                             # (N, V)

        return step

    def step_fn(self, src: torch.Tensor, *, cache: bool = True, src_pad: torch.Tensor | None = None):
        """The decoding protocol for ONE source ``src`` (1-D): ``step(prefixes)``.

        Use it with ``beam_search``, ``greedy_decode`` or ``exact_map`` (chapter 02).
        ``src_pad`` (1-D bool, True = real token) hides padded source positions.
        """
        _check_step_fn(src, src_pad, cache)
        with eval_mode(self), torch.no_grad():
            memory = self.encode(src[None], src_pad=None if src_pad is None else src_pad[None])
        return self._step(memory, None if src_pad is None else src_pad[None], shared=True, cache=cache)

    def batch_step_fn(self, src: torch.Tensor, src_pad: torch.Tensor | None = None, *, cache: bool = True):
        """Like :meth:`step_fn` for a padded batch: row n of ``prefixes`` continues source n
        (the protocol of ``greedy_decode_batch``)."""
        check_bool("cache", cache, fn="Transformer.batch_step_fn")
        with eval_mode(self), torch.no_grad():
            memory = self.encode(src, src_pad=src_pad)
        return self._step(memory, src_pad, shared=False, cache=cache)

    def generate(self, src: torch.Tensor, *, bos: int, eos: int, max_len: int, beam_size: int = 1,
                 cache: bool = True, src_pad: torch.Tensor | None = None,
                 alpha: float = 0.0) -> list[list[int]]:
        """Decode every source row: greedy (``beam_size=1``, all rows at once) or beam search.

        Returns one token list per row: the generated ids without BOS, ending with ``eos``
        (forced at ``max_len``), exactly the ``tokens`` of chapter 02's ``Hypothesis``.
        ``cache`` toggles the key/value cache (the result is the same, only the cost differs);
        ``alpha`` >= 0 is beam search's length penalty (chapter 02). Both searches read every
        row with its ``src_pad`` (right padding: the result is the unpadded row's).
        """
        _check_generate(self, src, src_pad, bos, eos, max_len, beam_size, cache, alpha)
        if src.shape[0] == 0:
            return []
        if beam_size == 1:
            hyps = greedy_decode_batch(self.batch_step_fn(src, src_pad, cache=cache), batch_size=src.shape[0],
                                       bos=bos, eos=eos, max_len=max_len)
            return [list(h.tokens) for h in hyps]
        out = []
        for i in range(src.shape[0]):
            step = self.step_fn(src[i], cache=cache, src_pad=None if src_pad is None else src_pad[i])
            best = beam_search(step, bos=bos, eos=eos, beam_size=beam_size, max_len=max_len, alpha=alpha)[0]
            out.append(list(best.tokens))
        return out

    # ---------------------------------------------------------------------------- from torch
    @classmethod
    def from_torch(cls, model: nn.Transformer, src_embed: nn.Embedding, tgt_embed: nn.Embedding,
                   output: nn.Linear | None = None, *, backend: str = "auto") -> Transformer:
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
        _check_from_torch(model, src_embed, tgt_embed, output, fn)
        enc_layers, dec_layers = model.encoder.layers, model.decoder.layers
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


def torch_masks(src_pad: torch.Tensor, tgt_pad: torch.Tensor) -> dict:
    """The keyword masks of ``nn.Transformer.forward`` for this module's pad masks, all bool.

    ``src_pad`` ``(B, S)`` and ``tgt_pad`` ``(B, T)``: True = a real token (this module's
    polarity). Returns ``tgt_mask`` (the causal mask ``(T, T)``, True = hidden, the strict
    upper triangle) and the three ``*_key_padding_mask`` (True = padding). One mask type for
    all four: the float ``generate_square_subsequent_mask`` beside bool padding masks makes
    torch warn "Support for mismatched key_padding_mask and attn_mask is deprecated".
    """
    fn = "torch_masks"
    for name, pad in (("src_pad", src_pad), ("tgt_pad", tgt_pad)):
        if not isinstance(pad, torch.Tensor) or pad.dtype != torch.bool or pad.ndim != 2:
            got = describe(pad) if isinstance(pad, torch.Tensor) else type(pad).__name__
            raise TypeError(f"{fn}: `{name}` must be a bool tensor (B, T), got {got}")
    if src_pad.shape[0] != tgt_pad.shape[0]:
        raise ValueError(f"{fn}: `src_pad` and `tgt_pad` must have the same batch size, got "
                         f"{src_pad.shape[0]} and {tgt_pad.shape[0]}")
    t = tgt_pad.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=tgt_pad.device).triu(1)
    return {"tgt_mask": causal, "src_key_padding_mask": ~src_pad,
            "tgt_key_padding_mask": ~tgt_pad, "memory_key_padding_mask": ~src_pad}
