"""The GRU encoder of chapters 02-03 over padded sources, and what it hands the decoder."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .._checks import check_bool, check_int, check_src_mask, check_tokens

__all__ = ["EncoderOutput", "GRUEncoder"]


class EncoderOutput(NamedTuple):
    """What the decoder reads from the encoder."""

    memory: torch.Tensor   # (B, S, D_k) encoder states h_1..h_S (zeros at PAD)
    mask: torch.Tensor     # (B, S) bool, True = real token
    summary: torch.Tensor  # (B, d_enc) fwd h_m (unidirectional) or bwd h_1 (bidirectional)


def _check_pad_id(fn: str, pad_id, vocab_size: int) -> int:
    pad_id = check_int("pad_id", pad_id, fn=fn, minimum=0)
    if pad_id >= vocab_size:
        raise ValueError(f"{fn}: `pad_id` must be a token id of the vocabulary (< {vocab_size}), got {pad_id}")
    return pad_id


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
