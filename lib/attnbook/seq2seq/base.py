"""What both GRU encoder-decoders share: teacher forcing, the decoding protocol, the checks."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_float, check_int, check_tensor, check_tokens, describe
from .encoder import EncoderOutput, GRUEncoder

__all__ = ["Seq2SeqOutput"]


class Seq2SeqOutput(NamedTuple):
    """Teacher-forced outputs for target inputs ``y_0 = BOS, y_1, ..., y_{T-1}``."""

    logits: torch.Tensor                 # (B, T, V): row t predicts y_{t+1}
    weights: torch.Tensor | None         # (B, T, S) attention weights, None without attention
    states: torch.Tensor                 # (B, T + 1, d_hidden): s_0, s_1, ..., s_T
    contexts: torch.Tensor               # (B, T, D_k): c_1..c_T (the fixed c repeated if no attention)


def _check_sizes(fn: str, *, src_vocab, tgt_vocab, d_emb, d_hidden, pad_id) -> None:
    for name, value in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("d_emb", d_emb),
                        ("d_hidden", d_hidden)):
        check_int(name, value, fn=fn)
    check_int("pad_id", pad_id, fn=fn, minimum=0)
    if pad_id >= min(src_vocab, tgt_vocab):
        raise ValueError(f"{fn}: `pad_id` must be a token id of both vocabularies (< "
                         f"{min(src_vocab, tgt_vocab)}), got {pad_id}")


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
