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
                      check_tensor, check_tokens, describe)
from .blocks import DecoderLayer, EncoderLayer, torch_layer_settings
from .cache import DecoderCache
from .decoding import beam_search, greedy_decode_batch
from .layers import ACTIVATIONS, LayerNorm, RMSNorm
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
        """True if BOTH stacks end in a norm (a ``from_torch`` copy may have only one: see
        ``encoder_norm`` and ``decoder_norm``, each None or a norm)."""
        return self.encoder_norm is not None and self.decoder_norm is not None

    def extra_repr(self) -> str:
        order = "Pre-LN" if self.norm_first else "Post-LN"
        norms = (f"final_norm={self.final_norm}"
                 if (self.encoder_norm is None) == (self.decoder_norm is None) else
                 f"encoder_norm={self.encoder_norm is not None}, "
                 f"decoder_norm={self.decoder_norm is not None}")
        return (f"{order}, positions={self.positions!r}, tie_embeddings={self.tie_embeddings}, "
                f"{norms}")

    # -------------------------------------------------------------------------------- forward
    def embed(self, tokens: torch.Tensor, table: nn.Embedding,
              pos_table: nn.Embedding | None = None, start: int = 0) -> torch.Tensor:
        """Emb(tokens) sqrt(d_model) + PE(start, start + 1, ...), then dropout.

        This is eq-ch10-embed.

        Args:
            tokens: ``(B, T)`` ids of ``table``.
            table: ``src_embed`` or ``tgt_embed``.
            pos_table: ``src_pos`` / ``tgt_pos`` with learned positions, else None.
            start: position of ``tokens[:, 0]`` (a cache's length when decoding).
        Returns ``(B, T, d_model)``. (An empty sequence, T = 0, still asks
        ``sinusoidal_encoding`` for one row: it needs >= 1.)
        """
        _check_embed(self, tokens, table, pos_table, start)
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
        x = self.embed(src, self.src_embed, getattr(self, "src_pos", None))
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
        x = self.embed(tgt, self.tgt_embed, getattr(self, "tgt_pos", None), start)
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

    def memory_step_fn(self, memory: torch.Tensor, src_pad: torch.Tensor | None = None, *,
                       shared: bool, cache: bool = True):
        """The decoding protocol ``step(prefixes (N, t)) -> (N, V)`` over a ``memory``.

        Chapter 02's protocol (log-probs of the next token), used by chapter 10.

        ``memory``: ``encode``'s output, ``(1, S, d_model)`` read by every row when
        ``shared`` (one source, as in beam search), else ``(B, S, d_model)`` with row n
        of ``prefixes`` continuing source n; ``src_pad``: its bool pad mask
        ``(1 or B, S)``, True = real token. With ``cache``, a call whose prefixes each
        extend a prefix of the previous call (row n's parent found by value when
        ``shared``; row n itself otherwise) reuses the parents' keys and values and runs
        the decoder on the one new token; any other call starts a fresh cache from the
        whole prefix. ``step_fn`` and ``batch_step_fn`` call it.
        """
        _check_memory_step_fn(self, memory, src_pad, shared, cache)
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
        return self.memory_step_fn(memory, None if src_pad is None else src_pad[None], shared=True,
                                   cache=cache)

    def batch_step_fn(self, src: torch.Tensor, src_pad: torch.Tensor | None = None, *, cache: bool = True):
        """Like :meth:`step_fn` for a padded batch: row n of ``prefixes`` continues source n
        (the protocol of ``greedy_decode_batch``)."""
        check_bool("cache", cache, fn="Transformer.batch_step_fn")
        with eval_mode(self), torch.no_grad():
            memory = self.encode(src, src_pad=src_pad)
        return self.memory_step_fn(memory, src_pad, shared=False, cache=cache)

    _embed = embed                # the names chapter 10 showed before they were public
    _step = memory_step_fn

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
        with sinusoidal PE. ``nn.Transformer`` puts a LayerNorm after each stack, even in
        Post-LN order; a custom encoder or decoder may have ``norm=None``. Each stack's norm
        is copied on its own: an ``nn.LayerNorm`` (or ``nn.RMSNorm``) becomes
        ``encoder_norm``/``decoder_norm``, None or ``nn.Identity`` becomes None (no norm).
        Equal in eval mode, batch first; torch's masks (True = padding) become
        ``src_pad = ~src_key_padding_mask``.
        """
        fn = "Transformer.from_torch"
        _check_from_torch(model, src_embed, tgt_embed, output, fn)
        enc_layers, dec_layers = model.encoder.layers, model.decoder.layers
        tied = output is None or output.weight is tgt_embed.weight
        settings = torch_layer_settings(enc_layers[0], fn=fn)
        settings.pop("bias")  # the layers are replaced below by from_torch copies, biases included
        new = cls(src_embed.num_embeddings, tgt_embed.num_embeddings, n_layers=len(enc_layers),
                  positions="sinusoidal", tie_embeddings=tied, backend=backend, final_norm=False,
                  **settings)
        new.encoder = nn.ModuleList(EncoderLayer.from_torch(layer, backend=backend) for layer in enc_layers)
        new.decoder = nn.ModuleList(DecoderLayer.from_torch(layer, backend=backend) for layer in dec_layers)
        new.encoder_norm = _copy_norm(model.encoder.norm)    # each stack's own: a norm or None
        new.decoder_norm = _copy_norm(model.decoder.norm)
        with torch.no_grad():
            new.src_embed.weight.copy_(src_embed.weight)
            new.tgt_embed.weight.copy_(tgt_embed.weight)
            if not tied:
                new.output.weight.copy_(output.weight)
        return new


def _copy_norm(norm: nn.Module | None) -> nn.Module | None:
    """This library's copy of a PyTorch stack's final norm; None (no norm) for None or Identity."""
    if norm is None or isinstance(norm, nn.Identity):
        return None
    return (LayerNorm if isinstance(norm, nn.LayerNorm) else RMSNorm).from_torch(norm)


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


# ----------------------------------------------------------------------------------- checks
# Each ``_check_<method>`` validates one method's arguments (kept out of the methods the book
# shows) and raises ``TypeError``/``ValueError`` in the format of ``_checks``
# (``"fn: `arg` must be ..., got ..."``); ``m`` is the model.

def _check_tokens(m, name, t, vocab, fn) -> None:
    """``t``: token ids, a 2-D torch.long ``(B, T)`` tensor on the model's device, in [0, vocab)."""
    check_tokens(name, t, vocab, fn=fn, allow_empty=True)
    if t.device != m.output.weight.device:
        raise ValueError(f"{fn}: `{name}` is on {t.device} but the model is on {m.output.weight.device}")


def _check_pad(name, pad, shape, fn) -> None:
    """``pad``: None or a bool tensor of ``shape`` (True = a real token)."""
    if pad is None:
        return
    check_tensor(name, pad, fn=fn, min_ndim=1, floating=False)
    if pad.dtype != torch.bool:
        raise TypeError(f"{fn}: `{name}` must be a bool tensor (True = real token), got {describe(pad)}")
    if tuple(pad.shape) != tuple(shape):
        raise ValueError(f"{fn}: `{name}` must have the shape of its tokens {tuple(shape)}, "
                         f"got {tuple(pad.shape)}")


def _check_length(m, name, length, fn) -> None:
    if m.positions == "learned" and length > m.max_len:
        raise ValueError(f"{fn}: learned positions cover {m.max_len} positions (max_len), "
                         f"got `{name}` reaching position {length}")


def _check_pair(m, src, tgt, fn) -> None:
    _check_tokens(m, "src", src, m.src_vocab, fn)
    _check_tokens(m, "tgt", tgt, m.tgt_vocab, fn)
    if tgt.shape[0] != src.shape[0]:
        raise ValueError(f"{fn}: `src` and `tgt` must share the batch size, got "
                         f"{tuple(src.shape)} and {tuple(tgt.shape)}")


def _check_encode(m, src, src_pad, need_weights) -> None:
    fn = "Transformer.encode"
    _check_tokens(m, "src", src, m.src_vocab, fn)
    _check_pad("src_pad", src_pad, src.shape, fn)
    _check_length(m, "src", src.shape[1], fn)
    check_bool("need_weights", need_weights, fn=fn)


def _check_decode(m, tgt, memory, src_pad, tgt_pad, cache, need_weights) -> None:
    fn = "Transformer.decode"
    _check_tokens(m, "tgt", tgt, m.tgt_vocab, fn)
    _check_pad("tgt_pad", tgt_pad, tgt.shape, fn)
    check_tensor("memory", memory, fn=fn, min_ndim=3)
    if memory.ndim != 3 or memory.shape[-1] != m.d_model or memory.shape[0] not in (1, tgt.shape[0]):
        raise ValueError(f"{fn}: `memory` must be (B or 1, S, d_model={m.d_model}) with B = "
                         f"{tgt.shape[0]}, got {describe(memory)}")
    weight = m.output.weight
    if memory.dtype != weight.dtype or memory.device != weight.device:
        raise TypeError(f"{fn}: `memory` must have the model's dtype and device ({weight.dtype}, "
                        f"{weight.device}), got {describe(memory)}")
    _check_pad("src_pad", src_pad, memory.shape[:2], fn)
    if cache is not None and not isinstance(cache, DecoderCache):
        raise TypeError(f"{fn}: `cache` must be a DecoderCache or None, got {type(cache).__name__}")
    if cache is not None and len(cache.layers) != m.n_layers:
        raise ValueError(f"{fn}: `cache` must hold one entry per decoder layer ({m.n_layers}), "
                         f"got {len(cache.layers)}; use new_cache()")
    if cache is not None and tgt_pad is not None:
        raise ValueError(f"{fn}: incremental decoding (a cache) takes no `tgt_pad`: every row "
                         f"holds the same number of real tokens")
    _check_length(m, "tgt", (0 if cache is None else cache.length) + tgt.shape[1], fn)
    check_bool("need_weights", need_weights, fn=fn)


def _check_prefixes(m, prefixes, memory, shared) -> None:
    fn = "Transformer step"
    _check_tokens(m, "prefixes", prefixes, m.tgt_vocab, fn)
    if prefixes.shape[1] == 0:
        raise ValueError(f"{fn}: `prefixes` must hold at least the BOS token, got {describe(prefixes)}")
    if not shared and prefixes.shape[0] != memory.shape[0]:
        raise ValueError(f"{fn}: `prefixes` must have one row per source ({memory.shape[0]}), "
                         f"got {prefixes.shape[0]}")


def _check_embed(m, tokens, table, pos_table, start) -> None:
    fn = "Transformer.embed"
    learned = m.positions == "learned"
    for name, emb, required in (("table", table, True), ("pos_table", pos_table, learned)):
        if emb is None and not required:
            continue
        if not isinstance(emb, nn.Embedding) or emb.embedding_dim != m.d_model:
            raise TypeError(f"{fn}: `{name}` must be an nn.Embedding of width d_model = {m.d_model}"
                            f"{'' if name == 'table' else ' (learned positions)'}, got {emb!r:.60}")
    if pos_table is not None and m.positions != "learned":
        raise ValueError(f"{fn}: `pos_table` is only used with learned positions, got "
                         f"positions={m.positions!r}")
    _check_tokens(m, "tokens", tokens, table.num_embeddings, fn)
    start = check_int("start", start, fn=fn, minimum=0)
    _check_length(m, "tokens", start + tokens.shape[1], fn)


def _check_memory_step_fn(m, memory, src_pad, shared, cache) -> None:
    fn = "Transformer.memory_step_fn"
    check_bool("shared", shared, fn=fn)
    check_bool("cache", cache, fn=fn)
    check_tensor("memory", memory, fn=fn, min_ndim=3)
    weight = m.output.weight
    if memory.ndim != 3 or memory.shape[-1] != m.d_model or (shared and memory.shape[0] != 1):
        raise ValueError(f"{fn}: `memory` must be ({'1' if shared else 'B'}, S, d_model={m.d_model})"
                         f"{' with shared=True' if shared else ''}, got {describe(memory)}")
    if memory.dtype != weight.dtype or memory.device != weight.device:
        raise TypeError(f"{fn}: `memory` must have the model's dtype and device ({weight.dtype}, "
                        f"{weight.device}), got {describe(memory)}")
    _check_pad("src_pad", src_pad, memory.shape[:2], fn)


def _check_step_fn(src, src_pad, cache) -> None:
    fn = "Transformer.step_fn"
    check_tensor("src", src, fn=fn, min_ndim=1, floating=False)
    if src.ndim != 1:
        raise ValueError(f"{fn}: `src` must be one sentence, a 1-D tensor, got shape {tuple(src.shape)}; "
                         f"for a batch use batch_step_fn")
    _check_pad("src_pad", src_pad, src.shape, fn)
    check_bool("cache", cache, fn=fn)


def _check_generate(m, src, src_pad, bos, eos, max_len, beam_size, cache, alpha) -> None:
    fn = "Transformer.generate"
    _check_tokens(m, "src", src, m.src_vocab, fn)
    _check_pad("src_pad", src_pad, src.shape, fn)
    for name, tok in (("bos", bos), ("eos", eos)):
        if check_int(name, tok, fn=fn, minimum=0) >= m.tgt_vocab:
            raise ValueError(f"{fn}: `{name}` must be a target id in [0, {m.tgt_vocab}), got {tok}")
    check_int("max_len", max_len, fn=fn)
    check_int("beam_size", beam_size, fn=fn)
    check_bool("cache", cache, fn=fn)
    check_float("alpha", alpha, fn=fn, minimum=0.0)


def _check_from_torch(model, src_embed, tgt_embed, output, fn) -> None:
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
    for name, stack, kind in (("encoder", model.encoder, nn.TransformerEncoder),
                              ("decoder", model.decoder, nn.TransformerDecoder)):
        if not isinstance(stack, kind):
            raise TypeError(f"{fn}: `model.{name}` must be an nn.{kind.__name__}, got "
                            f"{type(stack).__name__}")
        norm = stack.norm
        if not (norm is None or isinstance(norm, (nn.Identity, nn.LayerNorm, nn.RMSNorm))):
            raise TypeError(f"{fn}: `model.{name}.norm` must be an nn.LayerNorm, nn.RMSNorm, "
                            f"nn.Identity or None, got {type(norm).__name__}")
    if len(model.encoder.layers) != len(model.decoder.layers):
        raise ValueError(f"{fn}: encoder and decoder must have as many layers, got "
                         f"{len(model.encoder.layers)} and {len(model.decoder.layers)}")
