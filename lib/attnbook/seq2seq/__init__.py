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

One concept per submodule, every name re-exported here (``from attnbook.seq2seq import X``):
``score`` (``AttentionScore``), ``encoder`` (``GRUEncoder``, ``EncoderOutput``), ``base``
(what both models share: teacher forcing, ``step_fn``), ``without_attention`` (``Seq2Seq``)
and ``with_attention`` (``AttentionSeq2Seq``, both data flows).
"""
from __future__ import annotations

from .base import Seq2SeqOutput
from .encoder import EncoderOutput, GRUEncoder
from .score import SCORES, AttentionScore
from .with_attention import FLOWS, AttentionSeq2Seq
from .without_attention import CONTEXTS, Seq2Seq

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
