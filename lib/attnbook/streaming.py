"""Sliding windows and attention sinks: a rolling key/value cache (chapter 12).

A sliding window (Beltagy et al. 2020, Longformer; Jiang et al. 2023, Mistral 7B's rolling
buffer cache) keeps only the keys and values of the last ``window`` positions, so the cache
never grows past a fixed size however long the stream. Xiao et al. (ICLR 2024, "Efficient
Streaming Language Models with Attention Sinks", StreamingLLM) observed that trained models put
much attention on the first tokens, whatever they say, and that evicting them breaks a
window-only cache; they keep the first ``sinks`` positions as well (the attention sinks).

:class:`SinkCache` is that cache: the first ``sinks`` positions ever appended plus the last
``window``. Its keys are stored BEFORE RoPE; with ``rebase=True`` (StreamingLLM, section 3.2)
the i-th key kept in the cache is rotated to position i and the newest query to the last slot,
so the positions the model sees never exceed ``sinks + window - 1`` however long the stream;
with ``rebase=False`` every key keeps its position in the text. RoPE depends only on ``m - n``,
so the two differ only in the distances to the sink keys.

:func:`window_mask` is the same rule as a boolean mask over a whole sequence (True = may
attend): query i sees key j iff ``j <= i`` and (``j > i - window`` or ``j < sinks``).
:func:`streaming_attention_ref` evaluates it query by query from the cache's point of view
(re-based positions included), and :func:`streaming_logits` runs a RoPE :class:`~.gpt.GPT`
over a stream one token at a time with one :class:`SinkCache` per block.
"""
from __future__ import annotations

import torch

from ._checks import check_bool, check_int, check_tensor, describe
from .positional import apply_rope
from .reference import attention_ref

__all__ = ["SinkCache", "streaming_attention_ref", "streaming_logits", "window_mask"]


def _check_window(fn: str, window, sinks) -> tuple[int | None, int]:
    window = None if window is None else check_int("window", window, fn=fn, minimum=1)
    return window, check_int("sinks", sinks, fn=fn, minimum=0)


class SinkCache:
    """A rolling key/value cache: the first ``sinks`` positions and the last ``window``.

    Args: ``window`` (int >= 1, or None for a cache that never evicts: the full cache),
    ``sinks`` (int >= 0; 0 = window only). Holds ``k`` ``(B, H_kv, n, d_k)`` before RoPE and
    ``v`` ``(B, H_kv, n, d_v)``, ``n <= sinks + window``; ``positions`` ``(n,)``: where in the
    stream each kept key sits (0, 1, ..., increasing); ``seen``: how many positions were
    appended in all.
    """

    def __init__(self, window: int | None, *, sinks: int = 0):
        self.window, self.sinks = _check_window("SinkCache", window, sinks)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions = torch.zeros(0, dtype=torch.long)
        self.seen = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def __repr__(self) -> str:
        return (f"SinkCache(window={self.window}, sinks={self.sinks}, held={len(self)}, "
                f"seen={self.seen})")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new positions' keys (before RoPE) and values, evict, return what is kept.

        Args: k ``(B, H_kv, t_new, d_k)``, v ``(B, H_kv, t_new, d_v)``: one floating dtype, one
        device, and the batch and heads of the keys already held. Returns ``(k, v)`` of the
        positions kept after eviction: the first ``sinks`` of the stream, then the last
        ``window`` (which include the new ones when ``t_new <= window``). Decoding appends
        one position per step; a query earlier in a chunk of ``t_new > 1`` would need keys
        that a chunk update may already have evicted.
        """
        _check_update(self, k, v)
        new = torch.arange(self.seen, self.seen + k.shape[2])
        self.seen += k.shape[2]
        if self.k is not None:
            k, v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            new = torch.cat([self.positions, new])
        if self.window is not None:
            keep = (new < self.sinks) | (new > self.seen - 1 - self.window)
            if not bool(keep.all()):
                idx = keep.nonzero().squeeze(1).to(k.device)
                k, v, new = k.index_select(2, idx), v.index_select(2, idx), new[keep]
        self.k, self.v, self.positions = k, v, new
        return k, v

    def rope_positions(self, rebase: bool = True) -> torch.Tensor:
        """The position each held key is rotated to: ``0 .. n - 1`` (re-based inside the
        cache) or, with ``rebase=False``, its position in the stream."""
        rebase = check_bool("rebase", rebase, fn="SinkCache.rope_positions")
        return torch.arange(len(self)) if rebase else self.positions.clone()


def window_mask(tq: int, tk: int | None = None, *, window: int | None, sinks: int = 0,
                device=None) -> torch.Tensor:
    """``(tq, tk)`` bool mask, True = may attend: query i (at stream position
    ``tk - tq + i``, bottom-right aligned as in cached decoding) sees key j iff j is not after
    it and lies among the last ``window`` positions up to it or among the first ``sinks``.
    ``window`` None: the plain causal mask."""
    fn = "window_mask"
    tq = check_int("tq", tq, fn=fn, minimum=0)
    tk = tq if tk is None else check_int("tk", tk, fn=fn, minimum=0)
    if tk < tq:
        raise ValueError(f"{fn}: the queries are the last tq of the tk positions, so tk >= tq; "
                         f"got tq = {tq}, tk = {tk}")
    window, sinks = _check_window(fn, window, sinks)
    i = torch.arange(tk - tq, tk, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (j > i - window) | (j < sinks)
    return allowed


def streaming_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                            window: int | None, sinks: int = 0, rope: bool = False,
                            rebase: bool = True) -> torch.Tensor:
    """What each query of a stream sees through a :class:`SinkCache`, one query at a time.

    ``q`` ``(..., T, d)``, ``k`` ``(..., T, d)``, ``v`` ``(..., T, d_v)``, all BEFORE RoPE:
    query i attends to the keys the cache holds after position i was appended (the first
    ``sinks`` and the last ``window`` up to i). With ``rope`` the kept keys are rotated to
    ``0 .. n - 1`` and the query to ``n - 1`` (``rebase=True``), or all to their stream
    positions (``rebase=False``). Returns ``(..., T, d_v)``. A slow, literal definition to
    test the cache and the masks against.
    """
    fn = "streaming_attention_ref"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, fn=fn, min_ndim=2)
    if q.shape[:-1] != k.shape[:-1] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: q, k, v must share (..., T) and q, k their feature size; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    window, sinks = _check_window(fn, window, sinks)
    rope, rebase = check_bool("rope", rope, fn=fn), check_bool("rebase", rebase, fn=fn)
    outs = []
    for i in range(q.shape[-2]):
        kept = [j for j in range(i + 1) if window is None or j < sinks or j > i - window]
        idx = torch.tensor(kept, device=k.device)
        qi, ki, vi = q[..., i:i + 1, :], k.index_select(-2, idx), v.index_select(-2, idx)
        if rope:
            pos = torch.arange(len(kept), device=k.device) if rebase else idx
            ki, qi = apply_rope(ki, pos), apply_rope(qi, pos[-1:])
        outs.append(attention_ref(qi, ki, vi).out)
    return torch.cat(outs, -2)


@torch.no_grad()
def streaming_logits(model, ids: torch.Tensor, *, window: int | None, sinks: int = 0,
                     rebase: bool = True) -> torch.Tensor:
    """Next-token logits ``(B, T, V)`` of a :class:`~.gpt.GPT` reading ``ids`` ``(B, T)`` one
    token at a time through one :class:`SinkCache` per block (eval mode, no gradients).

    Each block projects the new token, appends its key (before RoPE) and value to its cache,
    rotates the kept keys to :meth:`SinkCache.rope_positions` and the query to the newest
    key's position, and attends over what is kept; deeper blocks read what the blocks below
    computed when each kept token arrived (its own window then), as a rolling cache does.
    ``window=None`` keeps everything: then the logits equal ``model(ids).logits`` (up to
    rounding). The model must use RoPE (``GPTConfig(positions="rope")``): learned positions
    have no table past ``n_positions`` and cannot be re-based.
    """
    window, sinks = _check_window("streaming_logits", window, sinks)
    rebase = check_bool("rebase", rebase, fn="streaming_logits")
    _check_stream_model(model, ids)
    from .multihead import split_heads
    was = model.training
    model.eval()
    caches = [SinkCache(window, sinks=sinks) for _ in model.blocks]
    out = []
    try:
        for t in range(ids.shape[1]):
            h = model.tok_emb(ids[:, t:t + 1])                           # (B, 1, d_model)
            for block, cache in zip(model.blocks, caches):
                attn, x = block.self_attn, block.norm1(h)
                q = split_heads(attn.q_proj(x), attn.n_heads)             # (B, H, 1, d_k)
                k = split_heads(attn.k_proj(x), attn.n_kv_heads)
                v = split_heads(attn.v_proj(x), attn.n_kv_heads)
                k, v = cache.update(k, v)                                 # kept, before RoPE
                pos = cache.rope_positions(rebase).to(ids.device)
                k, q = apply_rope(k, pos), apply_rope(q, pos[-1:])
                h = h + block.dropout(attn.attend(q, k, v, None, False, False, None).out)
                h = h + block.dropout(block.ffn(block.norm2(h)))
            out.append(model.lm_head(model.norm_f(h)))
    finally:
        model.train(was)
    return torch.cat(out, 1)


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_update(cache: SinkCache, k, v) -> None:
    fn = "SinkCache.update"
    check_tensor("k", k, fn=fn, min_ndim=4)
    check_tensor("v", v, fn=fn, min_ndim=4)
    if k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{fn}: k and v must be (B, H_kv, t_new, d), got k {describe(k)}, "
                         f"v {describe(v)}")
    if k.shape[:3] != v.shape[:3] or k.shape[2] == 0:
        raise ValueError(f"{fn}: k and v must share (B, H_kv, t_new) with t_new >= 1, got "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"{fn}: k and v must share dtype and device, got k {describe(k)}, "
                         f"v {describe(v)}")
    if cache.k is not None:
        held = (cache.k.shape[:2], cache.k.shape[3], cache.v.shape[3], cache.k.dtype,
                cache.k.device)
        if (k.shape[:2], k.shape[3], v.shape[3], k.dtype, k.device) != held:
            raise ValueError(f"{fn}: the new keys/values must match the held ones (batch, "
                             f"heads, feature sizes, dtype, device): held k "
                             f"{describe(cache.k)}, v {describe(cache.v)}; got k {describe(k)}, "
                             f"v {describe(v)}")


def _check_stream_model(model, ids) -> None:
    from .gpt import GPT
    fn = "streaming_logits"
    if not isinstance(model, GPT):
        raise TypeError(f"{fn}: `model` must be an attnbook.gpt.GPT, got {type(model).__name__}")
    if model.config.positions != "rope":
        raise ValueError(f"{fn}: the model must use RoPE positions (GPTConfig(positions='rope')); "
                         f"its positions are {model.config.positions!r}, which cannot be re-based")
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.long:
        got = describe(ids) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"{fn}: `ids` must be a (B, T) LongTensor, got {got}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{fn}: `ids` must hold at least one token, got {describe(ids)}")
    vocab = model.config.vocab_size
    if bool((ids < 0).any()) or bool((ids >= vocab).any()):
        raise ValueError(f"{fn}: `ids` must lie in [0, {vocab}), got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")
