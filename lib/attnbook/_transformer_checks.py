"""Argument checks of ``transformer.Transformer`` (kept out of the methods the book shows).

Each ``_check_<method>`` validates one method's arguments and raises ``TypeError``/``ValueError``
in the format of ``_checks`` (``"fn: `arg` must be ..., got ..."``); ``m`` is the model.
"""
from __future__ import annotations

import torch
from torch import nn

from ._checks import check_bool, check_float, check_int, check_tensor, check_tokens, describe
from .cache import DecoderCache

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
    if len(model.encoder.layers) != len(model.decoder.layers):
        raise ValueError(f"{fn}: encoder and decoder must have as many layers, got "
                         f"{len(model.encoder.layers)} and {len(model.decoder.layers)}")
