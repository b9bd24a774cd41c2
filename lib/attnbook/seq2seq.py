"""GRU encoder-decoder models, without attention (chapter 02) and with attention (chapter 03).

Two families, both batched over padded source sentences (bool masks, True = real token):

* ``Seq2Seq``: no attention, one fixed context vector ``c`` (the encoder's last hidden state).
  ``context="every_step"`` is Cho et al. 2014: ``c`` enters every decoder step,
  ``s_t = f(s_{t-1}, y_{t-1}, c)`` and ``P(y_t | ...) = g(s_t, y_{t-1}, c)``.
  ``context="init"`` is Sutskever et al. 2014: ``c`` only initialises the decoder,
  ``s_t = f(s_{t-1}, y_{t-1})`` and ``P(y_t | ...) = softmax(W_o s_t)`` (they also reversed the
  source, used 4-layer LSTMs and took c itself as the initial state; here it is one GRU layer
  and ``s_0 = tanh(W_init c)`` in both modes).
* ``AttentionSeq2Seq``: a new context ``c_t`` at every step, from the three steps of chapter 03
  (score, masked softmax, weighted sum). Two data flows, chosen with ``flow``:

  - ``"bahdanau"`` (Bahdanau, Cho, Bengio 2015): bidirectional encoder, ``h_j = [fwd h_j; bwd h_j]``;
    the query is the *previous* state ``s_{t-1}``; the context enters the recurrence,
    ``s_t = f(s_{t-1}, y_{t-1}, c_t)``; output ``g(s_t, y_{t-1}, c_t)`` (linear here, maxout in
    the paper); ``s_0 = tanh(W_init bwd h_1)``.
  - ``"luong"`` (Luong, Pham, Manning 2015): unidirectional encoder; the query is the *current*
    state ``s_t = f(s_{t-1}, y_{t-1})``; attentional state ``h~_t = tanh(W_c [c_t; s_t])`` and
    ``P(y_t | ...) = softmax(W_s h~_t)``; with ``input_feeding=True`` ``h~_{t-1}`` is also fed to
    the next step, ``s_t = f(s_{t-1}, [y_{t-1}; h~_{t-1}])``. Here ``s_0 = tanh(W_init h_n)``.

The scores are the library's own ``dot_scores``, ``scaled_dot_scores``, ``general_scores`` and
``additive_scores`` (``AttentionScore``), normalised with ``masked_softmax`` after the source
padding is set to ``-inf``; PAD positions get weight exactly 0 and never influence anything.

Decoding: ``model.step_fn(src)`` returns a function ``step(prefixes (N, t)) -> (N, V)``
log-probabilities of the next token (``prefixes[:, 0]`` is BOS), the protocol of
``greedy_decode``, ``beam_search`` and ``exact_map`` (import them from ``attnbook.decoding``);
``model.batch_step_fn(src, src_mask)`` serves ``greedy_decode_batch`` (row n = source n).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ._checks import (check_bool, check_choice, check_float, check_int, check_src_mask, check_tensor,
                      check_tokens, describe)
from .reference import additive_scores, dot_scores, general_scores, masked_softmax, scaled_dot_scores

__all__ = [
    "FLOWS",
    "SCORES",
    "AttentionScore",
    "AttentionSeq2Seq",
    "EncoderOutput",
    "GRUEncoder",
    "Seq2Seq",
    "Seq2SeqOutput",
]

SCORES = ("dot", "scaled_dot", "general", "additive")
FLOWS = ("bahdanau", "luong")
CONTEXTS = ("every_step", "init")


class EncoderOutput(NamedTuple):
    """What the decoder reads from the encoder."""

    memory: torch.Tensor   # (B, S, D_k) encoder states h_1..h_S (zeros at PAD)
    mask: torch.Tensor     # (B, S) bool, True = real token
    summary: torch.Tensor  # (B, d_enc) fwd h_m (unidirectional) or bwd h_1 (bidirectional)


class Seq2SeqOutput(NamedTuple):
    """Teacher-forced outputs for target inputs ``y_0 = BOS, y_1, ..., y_{T-1}``."""

    logits: torch.Tensor                 # (B, T, V): row t predicts y_{t+1}
    weights: torch.Tensor | None         # (B, T, S) attention weights, None without attention
    states: torch.Tensor                 # (B, T + 1, d_hidden): s_0, s_1, ..., s_T
    contexts: torch.Tensor               # (B, T, D_k): c_1..c_T (the fixed c repeated if no attention)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _check_sizes(fn: str, *, src_vocab, tgt_vocab, d_emb, d_hidden, pad_id) -> None:
    for name, value in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("d_emb", d_emb),
                        ("d_hidden", d_hidden)):
        check_int(name, value, fn=fn)
    check_int("pad_id", pad_id, fn=fn, minimum=0)
    if pad_id >= min(src_vocab, tgt_vocab):
        raise ValueError(f"{fn}: `pad_id` must be a token id of both vocabularies (< "
                         f"{min(src_vocab, tgt_vocab)}), got {pad_id}")


def _check_pad_id(fn: str, pad_id, vocab_size: int) -> int:
    pad_id = check_int("pad_id", pad_id, fn=fn, minimum=0)
    if pad_id >= vocab_size:
        raise ValueError(f"{fn}: `pad_id` must be a token id of the vocabulary (< {vocab_size}), got {pad_id}")
    return pad_id


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------

class AttentionScore(nn.Module):
    """Step 1 of the three steps: a score for every query s_t and key h_j (chapter 03).

    The scores are eq-ch03-dot, eq-ch03-scaled, eq-ch03-general and eq-ch03-additive.

    ``kind`` picks one of the library's score functions (no second implementation here):
    ``"dot"``: ``s . h`` (needs ``d_query == d_key``, no parameters); ``"scaled_dot"``:
    ``s . h / sqrt(d)``; ``"general"``: ``s W_a h^T`` with ``W_a (d_query, d_key)``
    (Luong); ``"additive"``: ``v_a . tanh(s W_q + h W_k)`` with
    ``W_q (d_query, d_attn)``, ``W_k (d_key, d_attn)``, ``v_a (d_attn,)`` (Bahdanau;
    Luong's "concat"), bounded by ``||v_a||_1``. Row-vector convention: ``s W_q``
    multiplies on the right.

    Forward: query ``(..., Tq, d_query)``, keys ``(..., Tk, d_key)`` -> scores
    ``(..., Tq, Tk)``.
    """

    def __init__(self, kind: str, d_query: int, d_key: int, *,
                 d_attn: int | None = None):
        super().__init__()
        self.kind, self.d_query, self.d_key, self.d_attn = _check_attention_score(
            kind, d_query, d_key, d_attn)
        if kind == "general":
            self.weight = nn.Parameter(torch.randn(d_query, d_key) / math.sqrt(d_key))
        elif kind == "additive":
            self.w_q = nn.Parameter(torch.randn(d_query, self.d_attn)
                                    / math.sqrt(d_query))
            self.w_k = nn.Parameter(torch.randn(d_key, self.d_attn) / math.sqrt(d_key))
            self.v_a = nn.Parameter(torch.randn(self.d_attn) / math.sqrt(self.d_attn))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if self.kind == "dot":
            return dot_scores(query, keys)
        if self.kind == "scaled_dot":
            return scaled_dot_scores(query, keys)
        if self.kind == "general":
            return general_scores(query, keys, self.weight)
        return additive_scores(query, keys, self.w_q, self.w_k, self.v_a)

    def extra_repr(self) -> str:
        extra = f", d_attn={self.d_attn}" if self.d_attn else ""
        return f"kind={self.kind!r}, d_query={self.d_query}, d_key={self.d_key}{extra}"


def _check_attention_score(kind, d_query, d_key, d_attn) -> tuple[str, int, int, int | None]:
    """``AttentionScore``'s arguments; returns (kind, d_query, d_key, d_attn or None)."""
    fn = "AttentionScore"
    kind = check_choice("kind", kind, SCORES, fn=fn)
    d_query, d_key = check_int("d_query", d_query, fn=fn), check_int("d_key", d_key, fn=fn)
    if kind in ("dot", "scaled_dot") and d_query != d_key:
        raise ValueError(f"{fn}: {kind!r} scores need d_query == d_key (s . h is only defined "
                         f"for equal sizes), got d_query={d_query}, d_key={d_key}; "
                         f"use 'general' or 'additive', or match the sizes")
    if d_attn is not None and kind != "additive":
        raise ValueError(f"{fn}: `d_attn` is only used by 'additive' scores, got kind={kind!r}")
    if kind != "additive":
        return kind, d_query, d_key, None
    return kind, d_query, d_key, (d_query if d_attn is None else check_int("d_attn", d_attn, fn=fn))


class GRUEncoder(nn.Module):
    """The encoder of chapters 02-03: embeddings and a (bi)directional GRU over padded sources.

    Padded positions are skipped (``pack_padded_sequence``): the states of the real tokens and the
    summary do not depend on how much padding follows. ``memory`` is zero at PAD.
    ``summary`` is the forward state at the last real token ``h_m`` (unidirectional) or the
    backward state at the first token (bidirectional; Bahdanau's initialiser of ``s_0``).
    """

    def __init__(self, vocab_size: int, d_emb: int, d_hidden: int, *, bidirectional: bool = False,
                 pad_id: int = 0):
        super().__init__()
        fn = "GRUEncoder"
        self.vocab_size = check_int("vocab_size", vocab_size, fn=fn)
        check_int("d_emb", d_emb, fn=fn)
        self.d_hidden = check_int("d_hidden", d_hidden, fn=fn)
        self.bidirectional = check_bool("bidirectional", bidirectional, fn=fn)
        self.pad_id = _check_pad_id(fn, pad_id, self.vocab_size)
        self.d_out = d_hidden * (2 if bidirectional else 1)
        self.embed = nn.Embedding(vocab_size, d_emb, padding_idx=pad_id)
        self.rnn = nn.GRU(d_emb, d_hidden, batch_first=True, bidirectional=bidirectional)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> EncoderOutput:
        """src ``(B, S)`` long, src_mask ``(B, S)`` bool (right-padded) -> ``EncoderOutput``."""
        check_tokens("src", src, self.vocab_size, fn="GRUEncoder")
        check_src_mask(src, src_mask, fn="GRUEncoder")
        lengths = src_mask.sum(1).cpu()
        packed = pack_padded_sequence(self.embed(src), lengths, batch_first=True,
                                      enforce_sorted=False)
        out, h_n = self.rnn(packed)                      # h_n: (dirs, B, d_hidden)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        summary = h_n[-1]                                # fwd h_m, or bwd h_1 when bidirectional
        return EncoderOutput(memory, src_mask, summary)  # (B, S, d_out), (B, S), (B, d_hidden)


# ---------------------------------------------------------------------------------------------
# Shared behaviour of both model families
# ---------------------------------------------------------------------------------------------

def _check_encoder_output(fn: str, enc, encoder: GRUEncoder, weight: torch.Tensor) -> None:
    """``enc`` is what ``model.encode`` returns for this model: an ``EncoderOutput`` of
    memory (B, S, D_k), mask (B, S) bool and summary (B, d_enc), in the model's dtype and device."""
    if not isinstance(enc, EncoderOutput):
        raise TypeError(f"{fn}: `enc` must be an EncoderOutput (from model.encode(src, src_mask)), "
                        f"got {type(enc).__name__}")
    memory, mask, summary = enc
    for name, t in (("enc.memory", memory), ("enc.summary", summary)):
        check_tensor(name, t, fn=fn, min_ndim=2)
        if t.dtype != weight.dtype or t.device != weight.device:
            raise TypeError(f"{fn}: `{name}` must have the model's dtype {weight.dtype} and device "
                            f"{weight.device}, got {describe(t)}")
    check_tensor("enc.mask", mask, fn=fn, min_ndim=2, floating=False)
    b = memory.shape[0]
    if (memory.ndim != 3 or memory.shape[-1] != encoder.d_out or mask.dtype != torch.bool
            or mask.shape != memory.shape[:2] or summary.shape != (b, encoder.d_hidden)):
        raise ValueError(f"{fn}: `enc` must hold memory (B, S, {encoder.d_out}), a bool mask (B, S) and "
                         f"summary (B, {encoder.d_hidden}), got memory {describe(memory)}, mask "
                         f"{describe(mask)}, summary {describe(summary)}")
    if b and not bool(mask[:, 0].all()):
        raise ValueError(f"{fn}: every source needs at least one real token (`enc.mask[:, 0]` must be True)")


class _Seq2SeqBase(nn.Module):
    encoder: GRUEncoder
    tgt_vocab: int

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> EncoderOutput:
        """Run the encoder once: ``EncoderOutput(memory, mask, summary)``."""
        return self.encoder(src, src_mask)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor,
                **kwargs) -> Seq2SeqOutput:
        """Teacher forcing: src ``(B, S)``, src_mask ``(B, S)`` bool, tgt_in ``(B, T)`` = BOS y_1..y_{T-1}.

        Returns ``Seq2SeqOutput``; ``logits[:, t]`` scores ``y_{t+1}`` given ``tgt_in[:, :t+1]``.
        """
        fn = type(self).__name__
        check_tokens("src", src, self.encoder.vocab_size, fn=fn)
        check_tokens("tgt_in", tgt_in, self.tgt_vocab, fn=fn)
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"{fn}: src and tgt_in need the same batch size, got "
                             f"{src.shape[0]} and {tgt_in.shape[0]}")
        return self.decode(tgt_in, self.encode(src, src_mask), **kwargs)

    def _step(self, enc: EncoderOutput, broadcast: bool, kwargs: dict):
        name = f"{type(self).__name__} step"

        def step(prefixes: torch.Tensor) -> torch.Tensor:
            check_tokens("prefixes", prefixes, self.tgt_vocab, fn=name)
            n, b = prefixes.shape[0], enc.memory.shape[0]
            if broadcast:
                rows = EncoderOutput(*(x.expand(n, *x.shape[1:]) for x in enc))
            elif n != b:
                raise ValueError(f"{name}: `prefixes` must have one row per source ({b}), got {n}")
            else:
                rows = enc
            was_training = self.training
            self.eval()
            try:
                with torch.no_grad():
                    logits = self.decode(prefixes, rows, **kwargs).logits[:, -1]
            finally:
                self.train(was_training)
            return F.log_softmax(logits, dim=-1)  # (N, V)

        return step

    def _check_decode(self, tgt_in, enc, *, s0=None, temperature=1.0) -> float:
        """Every check of ``decode``'s arguments (and of ``attend``'s ``enc``); returns the temperature."""
        fn = f"{type(self).__name__}.decode"
        check_tokens("tgt_in", tgt_in, self.tgt_vocab, fn=fn)
        _check_encoder_output(fn, enc, self.encoder, self.init.weight)
        if enc.memory.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"{fn}: `enc` holds {enc.memory.shape[0]} sources but `tgt_in` has "
                             f"{tgt_in.shape[0]} rows")
        if s0 is not None:
            check_tensor("s0", s0, fn=fn, min_ndim=2)
            if s0.shape != (tgt_in.shape[0], self.d_hidden):
                raise ValueError(f"{fn}: `s0` must have shape (B, d_hidden) = {(tgt_in.shape[0], self.d_hidden)}, "
                                 f"got {tuple(s0.shape)}")
            if s0.dtype != self.init.weight.dtype or s0.device != self.init.weight.device:
                raise TypeError(f"{fn}: `s0` must have the model's dtype {self.init.weight.dtype} and device "
                                f"{self.init.weight.device}, got {describe(s0)}")
        return check_float("temperature", temperature, fn=fn, minimum=0.0, inclusive=False)

    def step_fn(self, src: torch.Tensor, **kwargs) -> Callable[[torch.Tensor], torch.Tensor]:
        """The decoding protocol for one source sentence ``src`` (1-D, no padding).

        Returns ``step(prefixes (N, t)) -> (N, V)``: log P(next token | prefix, src) for each of
        N hypotheses (``prefixes[:, 0]`` is BOS), in eval mode without gradients, by running the
        teacher-forced decoder over the prefix (so it equals ``forward``'s log-softmax). Use it
        with ``greedy_decode``, ``beam_search`` and ``exact_map``. ``kwargs`` go to ``decode``.
        """
        fn = f"{type(self).__name__}.step_fn"
        check_tensor("src", src, fn=fn, min_ndim=1, floating=False)
        if src.ndim != 1:
            raise ValueError(f"{fn}: `src` must be one sentence, a 1-D tensor, got shape "
                             f"{tuple(src.shape)}; for a batch use batch_step_fn")
        src = src[None]
        with torch.no_grad():
            enc = self.encode(src, torch.ones_like(src, dtype=torch.bool))
        return self._step(enc, True, kwargs)

    def batch_step_fn(self, src: torch.Tensor, src_mask: torch.Tensor,
                      **kwargs) -> Callable[[torch.Tensor], torch.Tensor]:
        """Like ``step_fn`` for a padded batch: row n of ``prefixes`` continues source n.

        The protocol of ``greedy_decode_batch`` (``batch_size = B``). ``kwargs`` go to ``decode``.
        """
        with torch.no_grad():
            enc = self.encode(src, src_mask)
        return self._step(enc, False, kwargs)


# ---------------------------------------------------------------------------------------------
# Without attention (chapter 02)
# ---------------------------------------------------------------------------------------------

class Seq2Seq(_Seq2SeqBase):
    """GRU encoder-decoder with one fixed context vector ``c = h_m`` (chapter 02).

    ``context="every_step"`` (Cho et al. 2014): ``s_0 = tanh(W_init c)``,
    ``s_t = GRU(s_{t-1}, [emb(y_{t-1}); c])``, ``logits_t = W_o [s_t; emb(y_{t-1}); c]``.
    ``context="init"`` (Sutskever et al. 2014): ``s_0 = tanh(W_init c)``,
    ``s_t = GRU(s_{t-1}, emb(y_{t-1}))``, ``logits_t = W_o s_t``.

    Args: src_vocab, tgt_vocab (sizes), d_emb, d_hidden (encoder and decoder), context, pad_id.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, *, d_emb: int = 32, d_hidden: int = 64,
                 context: str = "every_step", pad_id: int = 0):
        super().__init__()
        fn = "Seq2Seq"
        _check_sizes(fn, src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_emb=d_emb,
                     d_hidden=d_hidden, pad_id=pad_id)
        self.tgt_vocab = tgt_vocab
        self.context = check_choice("context", context, CONTEXTS, fn=fn)
        self.encoder = GRUEncoder(src_vocab, d_emb, d_hidden, pad_id=pad_id)
        self.d_hidden = d_hidden
        self.embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
        self.init = nn.Linear(d_hidden, d_hidden)
        every = context == "every_step"
        self.rnn = nn.GRU(d_emb + (d_hidden if every else 0), d_hidden, batch_first=True)
        self.out = nn.Linear(d_hidden + (d_emb + d_hidden if every else 0), tgt_vocab)

    def decode(self, tgt_in: torch.Tensor, enc: EncoderOutput, *,
               s0: torch.Tensor | None = None) -> Seq2SeqOutput:
        """Decoder given the encoder's output.

        ``s0``, if given, overrides ``tanh(W_init c)``.
        """
        self._check_decode(tgt_in, enc, s0=s0)
        c = enc.summary                                            # (B, d_hidden)
        s0 = torch.tanh(self.init(c)) if s0 is None else s0       # s_0 = tanh(W_init c)
        e = self.embed(tgt_in)                                     # (B, T, d_emb)
        c_all = c[:, None].expand(-1, tgt_in.shape[1], -1)         # (B, T, d_hidden)
        if self.context == "every_step":
            # s_t = f(s, y, c)
            s, _ = self.rnn(torch.cat([e, c_all], -1), s0[None].contiguous())
            logits = self.out(torch.cat([s, e, c_all], -1))        # g(s_t, y_{t-1}, c)
        else:
            s, _ = self.rnn(e, s0[None].contiguous())  # s_t = f(s_{t-1}, y_{t-1})
            logits = self.out(s)                                   # softmax(W_o s_t)
        states = torch.cat([s0[:, None], s], 1)                    # (B, T + 1, d_hidden)
        return Seq2SeqOutput(logits, None, states, c_all)


# ---------------------------------------------------------------------------------------------
# With attention (chapter 03)
# ---------------------------------------------------------------------------------------------

class AttentionSeq2Seq(_Seq2SeqBase):
    """GRU encoder-decoder with attention, Bahdanau or Luong data flow (chapter 03, eq-ch03-bahdanau,
    eq-ch03-luong).

    Args:
        src_vocab, tgt_vocab: vocabulary sizes.
        d_emb: embedding size; d_hidden: decoder state size ``d``.
        d_enc: encoder GRU size per direction (default ``d_hidden``); keys have size
            ``D_k = 2 d_enc`` (bidirectional) or ``d_enc``.
        score: ``"dot" | "scaled_dot" | "general" | "additive"`` (``AttentionScore``).
        flow: ``"bahdanau"`` (query s_{t-1}, context in the recurrence) or ``"luong"`` (query
            s_t, attentional state ``tanh(W_c [c_t; s_t])``); see the module docstring.
        bidirectional: encoder direction (default: True for bahdanau, False for luong).
        input_feeding: Luong only; feed ``h~_{t-1}`` into step t.
        d_attn: hidden size of the additive score (default ``d_hidden``).
        pad_id: PAD token id of both vocabularies.

    ``forward(src, src_mask, tgt_in, *, temperature=1.0)``: the softmax uses ``e / temperature``
    (1 = the model as trained; any finite T > 0; as T -> 0 the weights become hard attention, uniform
    over the keys that tie for the highest score, and a T so small that ``e / T`` overflows gives
    that limit, never NaN; see ``attend``). Returns ``Seq2SeqOutput`` with weights ``(B, T, S)``.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, *, d_emb: int = 32, d_hidden: int = 64,
                 d_enc: int | None = None, score: str = "additive", flow: str = "bahdanau",
                 bidirectional: bool | None = None, input_feeding: bool = False,
                 d_attn: int | None = None, pad_id: int = 0):
        super().__init__()
        fn = "AttentionSeq2Seq"
        _check_sizes(fn, src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_emb=d_emb,
                     d_hidden=d_hidden, pad_id=pad_id)
        self.tgt_vocab = tgt_vocab
        self.flow = check_choice("flow", flow, FLOWS, fn=fn)
        score = check_choice("score", score, SCORES, fn=fn)
        d_enc = d_hidden if d_enc is None else check_int("d_enc", d_enc, fn=fn)
        if bidirectional is None:
            bidirectional = flow == "bahdanau"
        bidirectional = check_bool("bidirectional", bidirectional, fn=fn)
        self.input_feeding = check_bool("input_feeding", input_feeding, fn=fn)
        if input_feeding and flow != "luong":
            raise ValueError(f"{fn}: `input_feeding` is part of the Luong flow; with "
                             f"flow={flow!r} the context already enters the recurrence")
        self.d_hidden = d_hidden
        self.encoder = GRUEncoder(src_vocab, d_emb, d_enc, bidirectional=bidirectional,
                                  pad_id=pad_id)
        d_key = self.encoder.d_out
        if score in ("dot", "scaled_dot") and d_key != d_hidden:
            raise ValueError(
                f"{fn}: {score!r} scores need dim(s) == dim(h), but d_hidden={d_hidden} and the "
                f"keys have size {d_key} ({'2 x ' if bidirectional else ''}d_enc); pass "
                f"d_enc={d_hidden // (2 if bidirectional else 1)} or use 'general'/'additive'")
        self.score = AttentionScore(score, d_hidden, d_key, d_attn=d_attn)
        self.embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
        self.init = nn.Linear(d_enc, d_hidden)
        if flow == "bahdanau":
            self.cell = nn.GRUCell(d_emb + d_key, d_hidden)              # f(s_{t-1}, y_{t-1}, c_t)
            self.out = nn.Linear(d_hidden + d_emb + d_key, tgt_vocab)     # g(s_t, y_{t-1}, c_t)
        else:
            if input_feeding:
                self.cell = nn.GRUCell(d_emb + d_hidden, d_hidden)        # f(s, [y; h~_{t-1}])
            else:
                self.rnn = nn.GRU(d_emb, d_hidden, batch_first=True)      # f(s_{t-1}, y_{t-1})
            self.combine = nn.Linear(d_key + d_hidden, d_hidden, bias=False)  # W_c
            self.out = nn.Linear(d_hidden, tgt_vocab)                     # W_s

    def attend(self, query: torch.Tensor, enc: EncoderOutput, *,
               temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The three steps for queries ``(B, Tq, d_hidden)`` (chapter 03).

        These are eq-ch03-softmax and eq-ch03-context:

        1. ``e = score(query, memory)``; PAD keys -> ``-inf``;
        2. ``alpha = masked_softmax(e / temperature)`` (exactly 0 on PAD, > 0 elsewhere),
           computed as ``softmax((e - max e) / T)``, the same by shift invariance: the
           best key's logit is then exactly 0 for every T, so T -> 0 gives hard attention
           (uniform over tied best keys) and not inf - inf = NaN. A T below
           ``torch.finfo(dtype).tiny`` acts as that number (``0 / T`` is never
           ``0 / 0``); every key not within ~100 tiny of the best score then gets
           weight 0;
        3. ``c = alpha H`` (weighted sum of the encoder states).
        Returns ``(contexts (B, Tq, D_k), weights (B, Tq, S))``.
        """
        temperature = self._check_attend(query, enc, temperature)
        scores = self.score(query, enc.memory)                            # (B, Tq, S)
        scores = scores.masked_fill(~enc.mask[:, None, :], float("-inf"))
        # softmax(e / T) = softmax((e - max e) / T): the best key's logit is then
        # exactly 0 however small T is (T -> 0 is hard attention; e / T alone would give
        # inf - inf = NaN); the shift is a constant: no gradient
        shifted = scores - scores.amax(-1, keepdim=True).detach()
        weights = masked_softmax(shifted / temperature)
        return weights @ enc.memory, weights                              # (B, Tq, D_k)

    def _check_attend(self, query, enc, temperature) -> float:
        fn = "AttentionSeq2Seq.attend"
        _check_encoder_output(fn, enc, self.encoder, self.init.weight)
        check_tensor("query", query, fn=fn, min_ndim=3)
        if query.ndim != 3 or query.shape[0] != enc.memory.shape[0] or query.shape[-1] != self.d_hidden:
            raise ValueError(f"{fn}: `query` must be (B={enc.memory.shape[0]}, Tq, d_hidden={self.d_hidden}), "
                             f"got {describe(query)}")
        if query.dtype != self.init.weight.dtype or query.device != self.init.weight.device:
            raise TypeError(f"{fn}: `query` must have the model's dtype {self.init.weight.dtype} and device "
                            f"{self.init.weight.device}, got {describe(query)}")
        temperature = check_float("temperature", temperature, fn=fn, minimum=0.0, inclusive=False)
        return max(temperature, torch.finfo(self.init.weight.dtype).tiny)  # see step 2 above

    def decode(self, tgt_in: torch.Tensor, enc: EncoderOutput, *,
               temperature: float = 1.0) -> Seq2SeqOutput:
        """Decoder given the encoder's output (teacher forcing over ``tgt_in``)."""
        temperature = self._check_decode(tgt_in, enc, temperature=temperature)
        e = self.embed(tgt_in)                                     # (B, T, d_emb)
        s = torch.tanh(self.init(enc.summary))                     # s_0: (B, d_hidden)
        if self.flow == "bahdanau":
            states, contexts, weights = [s], [], []
            for t in range(tgt_in.shape[1]):
                # query s_{t-1}
                c, a = self.attend(s[:, None], enc, temperature=temperature)
                s = self.cell(torch.cat([e[:, t], c[:, 0]], -1), s)           # s_t
                states.append(s)
                contexts.append(c[:, 0])
                weights.append(a[:, 0])
            states, contexts = torch.stack(states, 1), torch.stack(contexts, 1)
            logits = self.out(torch.cat([states[:, 1:], e, contexts], -1))
            return Seq2SeqOutput(logits, torch.stack(weights, 1), states, contexts)
        if not self.input_feeding:
            s_all, _ = self.rnn(e, s[None].contiguous())  # s_1..s_T: (B, T, d_hidden)
            # query s_t
            contexts, weights = self.attend(s_all, enc, temperature=temperature)
            h_tilde = torch.tanh(self.combine(torch.cat([contexts, s_all], -1)))  # h~_t
            states = torch.cat([s[:, None], s_all], 1)
            return Seq2SeqOutput(self.out(h_tilde), weights, states, contexts)
        h_tilde = torch.zeros_like(s)                              # h~_0 = 0
        states, contexts, weights, tildes = [s], [], [], []
        for t in range(tgt_in.shape[1]):
            # s_t = f(s_{t-1}, [y; h~])
            s = self.cell(torch.cat([e[:, t], h_tilde], -1), s)
            c, a = self.attend(s[:, None], enc, temperature=temperature)  # query s_t
            h_tilde = torch.tanh(self.combine(torch.cat([c[:, 0], s], -1)))
            states.append(s)
            contexts.append(c[:, 0])
            weights.append(a[:, 0])
            tildes.append(h_tilde)
        logits = self.out(torch.stack(tildes, 1))
        return Seq2SeqOutput(logits, torch.stack(weights, 1), torch.stack(states, 1),
                             torch.stack(contexts, 1))
