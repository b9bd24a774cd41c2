"""The GRU encoder-decoder with attention, Bahdanau or Luong data flow (chapter 03)."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_choice, check_float, check_int, check_tensor, describe
from ..reference import masked_softmax
from .base import Seq2SeqOutput, _check_encoder_output, _check_sizes, _Seq2SeqBase
from .encoder import EncoderOutput, GRUEncoder
from .score import SCORES, AttentionScore

__all__ = ["FLOWS", "AttentionSeq2Seq"]

FLOWS = ("bahdanau", "luong")


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

    ``forward(..., alpha_fn=f)`` (also ``decode``, ``attend``, ``step_fn``, ``batch_step_fn``) is an
    intervention: ``f(alpha, t)`` receives the model's own weights ``alpha (B, Tq, S)`` for the
    queries of decoder steps ``t, t+1, ..., t+Tq-1`` (Bahdanau and input feeding call it once per
    step with ``Tq = 1``; plain Luong once with all ``T`` steps and ``t = 0``) and returns the weights
    to use instead: same shape, dtype and device, finite, >= 0, exactly 0 on PAD keys, each row
    summing to 1 (within 1e-4). The context is then ``f(alpha, t) @ H`` and the output's weights are
    the replaced ones. ``alpha_fn=None`` (default) is the model itself.
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

    def attend(self, query: torch.Tensor, enc: EncoderOutput, *, temperature: float = 1.0,
               alpha_fn=None, t: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
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

        ``alpha_fn`` (see the class docstring): replaces alpha before step 3; ``t`` is
        the decoder step of the first query (passed to ``alpha_fn``).
        """
        temperature = self._check_attend(query, enc, temperature)
        scores = self.score(query, enc.memory)                            # (B, Tq, S)
        scores = scores.masked_fill(~enc.mask[:, None, :], float("-inf"))
        # softmax(e / T) = softmax((e - max e) / T): the best key's logit is then
        # exactly 0 however small T is (T -> 0 is hard attention; e / T alone would give
        # inf - inf = NaN); the shift is a constant: no gradient
        shifted = scores - scores.amax(-1, keepdim=True).detach()
        weights = masked_softmax(shifted / temperature)
        if alpha_fn is not None:
            weights = _replace_weights(alpha_fn, weights, enc.mask, t)
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

    def _check_decode_alpha(self, tgt_in, enc, temperature, alpha_fn) -> float:
        _check_alpha_fn(alpha_fn)
        return self._check_decode(tgt_in, enc, temperature=temperature)

    def decode(self, tgt_in: torch.Tensor, enc: EncoderOutput, *, temperature: float = 1.0,
               alpha_fn=None) -> Seq2SeqOutput:
        """Decoder given the encoder's output (teacher forcing over ``tgt_in``);
        ``alpha_fn``: the intervention on the attention weights (class docstring)."""
        temperature = self._check_decode_alpha(tgt_in, enc, temperature, alpha_fn)
        e = self.embed(tgt_in)                                     # (B, T, d_emb)
        s = torch.tanh(self.init(enc.summary))                     # s_0: (B, d_hidden)
        if self.flow == "bahdanau":
            states, contexts, weights = [s], [], []
            for t in range(tgt_in.shape[1]):
                # query s_{t-1}
                c, a = self.attend(s[:, None], enc, temperature=temperature,
                                   alpha_fn=alpha_fn, t=t)
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
            contexts, weights = self.attend(s_all, enc, temperature=temperature,
                                            alpha_fn=alpha_fn)
            h_tilde = torch.tanh(self.combine(torch.cat([contexts, s_all], -1)))  # h~_t
            states = torch.cat([s[:, None], s_all], 1)
            return Seq2SeqOutput(self.out(h_tilde), weights, states, contexts)
        h_tilde = torch.zeros_like(s)                              # h~_0 = 0
        states, contexts, weights, tildes = [s], [], [], []
        for t in range(tgt_in.shape[1]):
            # s_t = f(s_{t-1}, [y; h~])
            s = self.cell(torch.cat([e[:, t], h_tilde], -1), s)
            c, a = self.attend(s[:, None], enc, temperature=temperature,
                               alpha_fn=alpha_fn, t=t)                # query s_t
            h_tilde = torch.tanh(self.combine(torch.cat([c[:, 0], s], -1)))
            states.append(s)
            contexts.append(c[:, 0])
            weights.append(a[:, 0])
            tildes.append(h_tilde)
        logits = self.out(torch.stack(tildes, 1))
        return Seq2SeqOutput(logits, torch.stack(weights, 1), torch.stack(states, 1),
                             torch.stack(contexts, 1))


def _check_alpha_fn(alpha_fn) -> None:
    if alpha_fn is not None and not callable(alpha_fn):
        raise TypeError(f"AttentionSeq2Seq: `alpha_fn` must be None or a callable "
                        f"(alpha (B, Tq, S), t) -> weights, got {alpha_fn!r}")


def _replace_weights(alpha_fn, weights: torch.Tensor, mask: torch.Tensor, t: int) -> torch.Tensor:
    """``alpha_fn(weights, t)``, checked: a distribution over the real keys of each row."""
    fn = "AttentionSeq2Seq.attend"
    _check_alpha_fn(alpha_fn)
    check_int("t", t, fn=fn, minimum=0)
    new = alpha_fn(weights, t)
    if not isinstance(new, torch.Tensor):
        raise TypeError(f"{fn}: `alpha_fn` must return a tensor of weights, got {type(new).__name__}")
    if new.shape != weights.shape or new.dtype != weights.dtype or new.device != weights.device:
        raise ValueError(f"{fn}: `alpha_fn` must return weights like alpha, {describe(weights)}, "
                         f"got {describe(new)}")
    if not bool(torch.isfinite(new).all()) or bool((new < 0).any()):
        raise ValueError(f"{fn}: `alpha_fn` must return finite weights >= 0 (step t={t})")
    if bool((new.masked_select(~mask[:, None, :].expand_as(new)) != 0).any()):
        raise ValueError(f"{fn}: `alpha_fn` must give PAD keys weight exactly 0 (step t={t})")
    sums = new.sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), rtol=0.0, atol=1e-4):
        raise ValueError(f"{fn}: every row that `alpha_fn` returns must sum to 1 (within 1e-4); "
                         f"step t={t} has sums from {sums.min().item():.6g} to {sums.max().item():.6g}")
    return new
