"""A decoder-only language model built from the book's parts (chapter 11).

Chapter 10's decoder layer without its cross-attention is a Pre-LN block of masked
self-attention and FFN (:class:`DecoderBlock`); a stack of them between a token embedding (plus
learned positions, or RoPE inside the attention) and a final LayerNorm, read out through the
embedding matrix itself (weight tying), is :class:`GPT`. Trained with the causal language-model
loss (:func:`lm_loss`, chapter 02's factorisation p(x) = prod_t p(x_t | x_<t)), it generates
with a key/value cache (:func:`generate`, one :class:`cache.KVCache` per block).

Conventions: batch-first ids ``(B, T)``; the attention is chapter 05's through
``attnbook.attention`` (``cache.CachedAttention``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (check_bool, check_choice, check_float, check_int, check_tensor, check_tokens,
                      describe)
from .cache import CachedAttention, KVCache
from .layers import FeedForward, LayerNorm

__all__ = ["DecoderBlock", "GPT", "GPTConfig", "GPTOutput", "generate", "head_mask", "lm_loss",
           "mean_loss", "perplexity", "pruning_costs"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`GPT`; the defaults are chapter 11's tiny poem model.

    Checked on construction: every size is an int >= 1 (``n_layers`` >= 1 too), ``n_heads``
    divides ``d_model``, ``positions`` is ``"learned"`` or ``"rope"`` (RoPE needs an even
    ``d_model / n_heads``), ``tie_weights`` a bool, ``dropout`` in [0, 1] (as ``nn.Dropout``).
    """

    vocab_size: int
    n_positions: int = 64        # longest context (learned positions need a table this long)
    d_model: int = 64            # model width
    n_heads: int = 4             # attention heads, d_k = d_model / n_heads
    n_layers: int = 2            # decoder blocks
    d_ff: int = 256              # FFN hidden size (4 d_model, as in GPT-2)
    positions: str = "learned"   # "learned" (GPT-2) or "rope" (chapter 06)
    tie_weights: bool = True     # read out through the token embedding (Press & Wolf 2017)
    dropout: float = 0.0

    def __post_init__(self):
        _check_config(self)


class GPTOutput(NamedTuple):
    """What :meth:`GPT.forward` returns; ``weights`` only with ``need_weights=True``."""

    logits: torch.Tensor                      # (B, T, V)
    weights: list[torch.Tensor] | None        # per block (B, H, T, T_total)


class DecoderBlock(nn.Module):
    """Chapter 10's Pre-LN decoder layer without cross-attention (chapter 11, eq-ch11-gpt).

        x = x + SelfAttn(LN_1(x))   (causal);      x = x + FFN(LN_2(x))

    ``self_attn`` is a ``cache.CachedAttention`` (chapter 05's heads, RoPE optional), so
    :func:`generate` can hand it a ``KVCache``. Its causal mask is bottom-right aligned: with
    t positions cached, the T new queries are positions t .. t + T - 1 and query i sees keys
    j <= t + i (``reference.CAUSAL_ALIGNMENTS``; without a cache it is the ordinary j <= i).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, rope: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        self.norm1 = LayerNorm(d_model)
        self.self_attn = CachedAttention(d_model, n_heads, rope=rope)
        self.norm2 = LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, activation="gelu", dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *, cache: KVCache | None = None,
                need_weights: bool = False, head_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` ``(B, T, d_model)`` -> ``(out (B, T, d_model), weights or None)``.

        ``head_mask`` ``(H,)`` scales each head's output before ``W^O`` (0 = pruned).
        """
        # the new tokens are the last positions: bottom-right causal alignment
        res = self.self_attn(self.norm1(x), causal="bottom_right", cache=cache,
                             need_weights=need_weights, head_mask=head_mask)
        x = x + self.dropout(res.out)
        x = x + self.dropout(self.ffn(self.norm2(x)))
        return x, res.weights


class GPT(nn.Module):
    """A decoder-only Transformer language model (chapter 11, eq-ch11-gpt).

        h_0 = E[x] (+ P[positions]);   h_l = Block_l(h_{l-1});   logits = LN_f(h_L) E^T

    With ``tie_weights`` the read-out matrix is the embedding ``E`` itself (Press & Wolf 2017;
    GPT-2 does the same). With ``positions="rope"`` there is no position table: every block's
    attention rotates queries and keys (chapter 06).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT: `config` must be a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.n_positions, c.d_model) if c.positions == "learned" else None
        self.blocks = nn.ModuleList(
            DecoderBlock(c.d_model, c.n_heads, c.d_ff, rope=c.positions == "rope",
                         dropout=c.dropout) for _ in range(c.n_layers))
        self.norm_f = LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(_init)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight      # one matrix, two uses

    def new_cache(self) -> list[KVCache]:
        """One empty self-attention ``KVCache`` per block."""
        return [KVCache() for _ in self.blocks]

    def forward(self, ids: torch.Tensor, *, cache: list[KVCache] | None = None,
                need_weights: bool = False,
                head_mask: torch.Tensor | None = None) -> GPTOutput:
        """Logits for the next token at every position of ``ids`` ``(B, T)``.

        With ``cache`` (from :meth:`new_cache`: one distinct self-attention ``KVCache`` per
        block, all holding the same number t of positions), ``ids`` are the NEW tokens:
        they sit at positions ``t, t + 1, ...`` and their keys and values are appended.
        A list that repeats one cache object, or caches of different lengths, raises
        ``ValueError``.
        ``head_mask`` ``(n_layers, n_heads)`` (e.g. from :func:`head_mask`) multiplies
        each head's output before its block's ``W^O``: 0 prunes that head.
        """
        past = _check_forward(self, ids, cache)
        _check_head_mask(self, head_mask)
        t = ids.shape[1]
        h = self.tok_emb(ids)                                         # (B, T, d_model)
        if self.pos_emb is not None:
            h = h + self.pos_emb(torch.arange(past, past + t, device=ids.device))
        weights = []
        for i, block in enumerate(self.blocks):
            h, w = block(h, cache=None if cache is None else cache[i],
                         need_weights=need_weights,
                         head_mask=None if head_mask is None else head_mask[i])
            weights.append(w)
        logits = self.lm_head(self.norm_f(h))                         # (B, T, V)
        return GPTOutput(logits, weights if need_weights else None)


def _init(m: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) for linear and embedding weights, zero biases."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, *,
            pad_id: int = 0) -> torch.Tensor:
    """The causal language-model loss (chapter 11, eq-ch11-lm-loss).

        L = -1/N sum_t log p(x_{t+1} | x_<=t),   N = positions whose target is not PAD

    Chapter 02's factorisation, one term per position. ``logits`` ``(B, T, V)`` from
    ``GPT(ids)``, ``ids`` ``(B, T)`` (``torch.long``, each in ``[0, V)`` or equal to
    ``pad_id``): the logits at position t are scored against the token at t + 1 (the
    shift happens here). With every target PAD the mean is over nothing: NaN
    (``perplexity`` and ``mean_loss`` raise instead).
    """
    _check_lm_loss(logits, ids, pad_id)
    pred, target = logits[:, :-1], ids[:, 1:]               # position t predicts t + 1
    return F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id)


def _check_lm_loss(logits, ids, pad_id) -> None:
    fn = "lm_loss"
    check_tensor("logits", logits, fn=fn)
    check_tensor("ids", ids, fn=fn, floating=False)
    if ids.dtype != torch.long:
        raise TypeError(f"{fn}: `ids` must be a torch.long tensor of token ids, "
                        f"got {describe(ids)}")
    if logits.ndim != 3 or ids.shape != logits.shape[:2] or ids.shape[1] < 2:
        raise ValueError(f"{fn}: `logits` must be (B, T, V) and `ids` (B, T) with T >= 2, "
                         f"got {tuple(logits.shape)} and {tuple(ids.shape)}")
    pad_id = check_int("pad_id", pad_id, fn=fn, minimum=-(2 ** 63))
    v = logits.shape[-1]
    bad = ((ids < 0) | (ids >= v)) & (ids != pad_id)
    if bool(bad.any()):
        raise ValueError(f"{fn}: `ids` must lie in [0, V = {v}) (or equal pad_id = {pad_id}), "
                         f"got {int(ids[bad][0])}")


@torch.no_grad()
def perplexity(model: GPT, ids: torch.Tensor, *, pad_id: int = 0, batch_size: int = 256) -> float:
    """exp of the mean next-token loss over every non-PAD target of ``ids`` ``(N, T)``."""
    return math.exp(_mean_loss("perplexity", model, ids, None, pad_id, batch_size))


def head_mask(model: GPT, prune=()) -> torch.Tensor:
    """A ``(n_layers, n_heads)`` mask for :meth:`GPT.forward`: ones, zeros at ``prune``.

    ``prune``: an iterable of ``(layer, head)`` pairs, both counted from 0 (block 1 is
    layer 0); empty (the default) prunes nothing.
    """
    _check_head_mask_args(model, prune)
    c = model.config
    mask = torch.ones(c.n_layers, c.n_heads, dtype=model.tok_emb.weight.dtype,
                      device=model.tok_emb.weight.device)
    for pair in prune:
        if (not isinstance(pair, tuple) or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
                or not (0 <= pair[0] < c.n_layers and 0 <= pair[1] < c.n_heads)):
            raise ValueError(f"head_mask: `prune` must hold (layer, head) pairs of ints with "
                             f"0 <= layer < {c.n_layers} and 0 <= head < {c.n_heads}, "
                             f"got {pair!r}")
        mask[pair] = 0
    return mask


def _check_head_mask_args(model, prune) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"head_mask: `model` must be an attnbook.gpt.GPT, "
                        f"got {type(model).__name__}")
    if isinstance(prune, (str, bytes, torch.Tensor)) or not hasattr(prune, "__iter__"):
        raise TypeError(f"head_mask: `prune` must be an iterable of (layer, head) pairs "
                        f"(e.g. [(0, 1)] or ()), got {prune!r:.80}")


@torch.no_grad()
def mean_loss(model: GPT, ids: torch.Tensor, *, head_mask: torch.Tensor | None = None,
              pad_id: int = 0, batch_size: int = 256) -> float:
    """The mean next-token loss (nats per non-PAD target) of ``model`` on ``ids`` ``(N, T)``;
    ``head_mask`` as in :meth:`GPT.forward`. :func:`perplexity` is its exp without a mask."""
    return _mean_loss("mean_loss", model, ids, head_mask, pad_id, batch_size)


def _mean_loss(fn, model, ids, head_mask, pad_id, batch_size):
    _check_mean_loss(fn, model, ids, pad_id, batch_size)
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in ids.split(batch_size):
        n = int((chunk[:, 1:] != pad_id).sum())
        if n:                                      # a chunk of PAD targets only: lm_loss is NaN
            logits = model(chunk, head_mask=head_mask).logits
            total += float(lm_loss(logits, chunk, pad_id=pad_id)) * n
            count += n
    model.train(was)
    if not count:
        raise ValueError(f"{fn}: `ids` must hold at least one non-PAD target (ids[:, 1:] "
                         f"!= {pad_id}), got shape {tuple(ids.shape)} with none")
    return total / count


def _check_mean_loss(fn, model, ids, pad_id, batch_size) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"{fn}: `model` must be an attnbook.gpt.GPT, got {type(model).__name__}")
    check_tokens("ids", ids, model.config.vocab_size, fn=fn)       # (N, T) long, in [0, V)
    if ids.shape[1] < 2:
        raise ValueError(f"{fn}: `ids` must be (N, T) with T >= 2 (a target after a context), "
                         f"got shape {tuple(ids.shape)}")
    check_int("pad_id", pad_id, fn=fn, minimum=-(2 ** 63))
    check_int("batch_size", batch_size, fn=fn, minimum=1)


def pruning_costs(model: GPT, ids: torch.Tensor, *, pad_id: int = 0) -> dict:
    """What pruning costs on ``ids``: the rise of :func:`mean_loss` (nats per token) when
    one head's output is zeroed before ``W^O`` (head ablation, Michel et al. 2019).

    Returns ``{"loss": the unpruned loss, "heads": (n_layers, n_heads) rises with head
    (l, h) pruned alone, "layers": (n_layers,) rises with every head of layer l pruned}``.
    """
    c = model.config
    base = mean_loss(model, ids, pad_id=pad_id)
    heads = torch.zeros(c.n_layers, c.n_heads, dtype=torch.float64)
    for layer in range(c.n_layers):
        for h in range(c.n_heads):
            mask = head_mask(model, [(layer, h)])
            heads[layer, h] = mean_loss(model, ids, head_mask=mask, pad_id=pad_id) - base
    layers = torch.tensor([mean_loss(model, ids, pad_id=pad_id,
                                     head_mask=head_mask(model, [(layer, h) for h in
                                                                 range(c.n_heads)])) - base
                           for layer in range(c.n_layers)], dtype=torch.float64)
    return {"loss": base, "heads": heads, "layers": layers}


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, *, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, eos_id: int | None = None) -> torch.Tensor:
    """Continue ``prompt`` ``(B, T0)`` by sampling one token at a time (chapter 11).

    Each step feeds only the newest token when ``use_cache`` (the blocks' ``KVCache``
    hold the rest), or the whole sequence again when not; both give the same logits
    (asserted in the chapter and the tests). Tokens are drawn by ``sample_next``
    (temperature, top-k, top-p; ``temperature=0`` is greedy). Rows that produced
    ``eos_id`` keep producing it. ``use_cache`` is a bool; ``eos_id`` None or an int in
    ``[0, vocab_size)``.

    Returns: ``(B, T0 + max_new_tokens)`` ids (fewer steps if every row has ended).
    """
    from .sampling import sample_next
    max_new_tokens = _check_generate(model, prompt, max_new_tokens, use_cache, eos_id)
    was = model.training
    model.eval()
    ids, cache = prompt, (model.new_cache() if use_cache else None)
    done = torch.zeros(len(prompt), dtype=torch.bool, device=prompt.device)
    step_in = ids
    for _ in range(max_new_tokens):
        logits = model(step_in, cache=cache).logits[:, -1]            # (B, V)
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                          generator=generator)                        # (B,)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt == eos_id)
        ids = torch.cat([ids, nxt[:, None]], 1)                       # (B, T + 1)
        step_in = nxt[:, None] if use_cache else ids
        if eos_id is not None and bool(done.all()):
            break
    model.train(was)
    return ids


def _check_generate(model, prompt, max_new_tokens, use_cache, eos_id) -> int:
    if not isinstance(model, GPT):
        raise TypeError(f"generate: `model` must be an attnbook.gpt.GPT, "
                        f"got {type(model).__name__}")
    check_bool("use_cache", use_cache, fn="generate")
    if eos_id is not None:
        check_int("eos_id", eos_id, fn="generate", minimum=0)
        if eos_id >= model.config.vocab_size:
            raise ValueError(f"generate: `eos_id` must lie in [0, vocab_size = "
                             f"{model.config.vocab_size}), got {eos_id}")
    check_tensor("prompt", prompt, fn="generate", floating=False)
    if prompt.ndim != 2 or prompt.shape[1] < 1 or prompt.dtype != torch.long:
        raise ValueError(f"generate: `prompt` must be a (B, T0) LongTensor with T0 >= 1, got "
                         f"{tuple(prompt.shape)} {prompt.dtype}")
    n = check_int("max_new_tokens", max_new_tokens, fn="generate", minimum=0)
    if prompt.shape[1] + n > model.config.n_positions and model.pos_emb is not None:
        raise ValueError(f"generate: prompt length + `max_new_tokens` must be <= n_positions = "
                         f"{model.config.n_positions}, got {prompt.shape[1] + n}")
    return n


def _check_head_mask(model: GPT, mask) -> None:
    if mask is None:
        return
    c = model.config
    check_tensor("head_mask", mask, fn="GPT.forward")
    if mask.shape != (c.n_layers, c.n_heads):
        raise ValueError(f"GPT.forward: `head_mask` must have shape (n_layers, n_heads) = "
                         f"({c.n_layers}, {c.n_heads}), got {tuple(mask.shape)}")


def _check_forward(model: GPT, ids, cache) -> int:
    fn = "GPT.forward"
    check_tensor("ids", ids, fn=fn, floating=False)
    if ids.ndim != 2 or ids.dtype != torch.long:
        raise ValueError(f"{fn}: `ids` must be a (B, T) LongTensor, got {tuple(ids.shape)} {ids.dtype}")
    if cache is not None and (not isinstance(cache, list) or len(cache) != len(model.blocks)
                              or not all(isinstance(c, KVCache) for c in cache)):
        raise TypeError(f"{fn}: `cache` must be a list of {len(model.blocks)} KVCache "
                        f"(model.new_cache()), got {cache!r:.80}")
    if cache is not None:
        _check_block_caches(cache, fn)
    past = 0 if cache is None else len(cache[0])
    if model.pos_emb is not None and past + ids.shape[1] > model.config.n_positions:
        raise ValueError(f"{fn}: positions up to {past + ids.shape[1]} exceed n_positions = "
                         f"{model.config.n_positions}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= model.config.vocab_size):
        raise ValueError(f"{fn}: `ids` must lie in [0, {model.config.vocab_size}), got "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    return past


def _check_block_caches(cache: list[KVCache], fn: str) -> None:
    """One distinct, self-attention cache per block, all holding the same number of positions."""
    if len({id(c) for c in cache}) != len(cache):
        raise ValueError(f"{fn}: `cache` must hold one distinct KVCache per block "
                         f"(model.new_cache()); the list repeats one object, so two blocks would append to it")
    if any(c.static for c in cache):
        raise ValueError(f"{fn}: `cache` must hold self-attention caches (static=False), "
                         f"got {cache!r:.100}")
    lengths = [len(c) for c in cache]
    if len(set(lengths)) > 1:
        raise ValueError(f"{fn}: every block's cache must hold the same number of positions (the "
                         f"new tokens' positions start there), got lengths {lengths}")


def _check_config(c: GPTConfig) -> None:
    fn = "GPTConfig"
    for name in ("vocab_size", "n_positions", "d_model", "n_heads", "n_layers", "d_ff"):
        check_int(name, getattr(c, name), fn=fn, minimum=1)
    if c.d_model % c.n_heads:
        raise ValueError(f"{fn}: `n_heads` must divide `d_model`, got d_model={c.d_model}, "
                         f"n_heads={c.n_heads}")
    check_choice("positions", c.positions, ("learned", "rope"), fn=fn)
    if c.positions == "rope" and (c.d_model // c.n_heads) % 2:
        raise ValueError(f"{fn}: positions='rope' rotates pairs of features, so d_model / n_heads "
                         f"must be even, got {c.d_model // c.n_heads}")
    check_bool("tie_weights", c.tie_weights, fn=fn)
    check_float("dropout", c.dropout, fn=fn, minimum=0.0, maximum=1.0)
