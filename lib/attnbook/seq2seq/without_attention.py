"""The GRU encoder-decoder with one fixed context vector (chapter 02): ``Seq2Seq``."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice
from .base import Seq2SeqOutput, _check_sizes, _Seq2SeqBase
from .encoder import EncoderOutput, GRUEncoder

__all__ = ["CONTEXTS", "Seq2Seq"]

CONTEXTS = ("every_step", "init")


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
