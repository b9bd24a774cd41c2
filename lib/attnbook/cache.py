"""Incremental decoding: key/value caches and the attention that reads them (chapter 10).

A decoder that has already read t target positions need not recompute their keys and values
at step t + 1: :class:`KVCache` keeps them (after the projection and RoPE) and
:meth:`KVCache.update` appends the new position's (torchtune's ``KVCache.update`` is the model).
A cross-attention cache (``static=True``) is filled once from the encoder's memory and then only
read. :class:`DecoderCache` holds one pair per decoder layer; beam search reorders its rows with
``select``.

:class:`CachedAttention` is ``multihead.MultiHeadAttention`` with RoPE on queries and keys and
such a cache. It overrides the projection step only (``project``); the attention step
(``attend``: heads through ``attnbook.attention``, ``Concat(...) W^O``) is chapter 05's.
"""
from __future__ import annotations

import torch

from ._checks import check_bool, check_int, check_tensor, describe
from .multihead import MultiHeadAttention, MultiHeadOutput, split_heads
from .positional import apply_rope
from .reference import causal_alignment, fold_causal

__all__ = ["CachedAttention", "DecoderCache", "KVCache"]


class KVCache:
    """The keys and values one attention module has already computed (chapter 10).

    ``k``, ``v``: ``(B, H_kv, t, d_k)`` after the projection (and RoPE), or None while empty.
    A self-attention cache grows by the new positions at every :meth:`update`; a cross-attention
    cache (``static=True``) is filled by its first ``update`` and then only read.
    """

    def __init__(self, *, static: bool = False):
        self.static = check_bool("static", static, fn="KVCache")
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        return f"KVCache(static={self.static}, k={shape})"

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the keys and values of the new positions; return all of them.

        Args: k, v ``(B, H_kv, t_new, d_k)``, one floating dtype and one device (those of the
        cached ones). Returns ``(k, v)`` ``(B, H_kv, t + t_new, d_k)``.
        """
        _check_update(self, k, v)
        if self.k is not None:
            k, v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)   # (B, H_kv, t + t_new, d_k)
        self.k, self.v = k, v
        return k, v

    def select(self, rows: torch.Tensor) -> KVCache:
        """A cache whose batch row n is row ``rows[n]`` of this one (beam search reorders rows).

        A static cache with batch size 1 (one source shared by every hypothesis) is kept as is,
        and so is any non-empty cache when ``rows`` is ``0, 1, ..., B - 1`` (then the result is
        ``self``); an empty cache gives a new empty one. Every row must lie in ``[0, B)``
        (B: the cached batch; no negative indices).
        """
        _check_select(self, rows)
        if self.k is not None and len(rows) == self.k.shape[0] and torch.equal(
                rows, torch.arange(len(rows), device=rows.device)):
            return self                                       # nothing moves: no copy
        new = KVCache(static=self.static)
        if self.k is not None:
            keep = self.static and self.k.shape[0] == 1
            new.k = self.k if keep else self.k.index_select(0, rows.to(self.k.device))
            new.v = self.v if keep else self.v.index_select(0, rows.to(self.v.device))
        return new


class DecoderCache:
    """Everything incremental decoding keeps between steps: one self- and one cross-attention
    :class:`KVCache` per decoder layer (``layers[i] = (self_cache, cross_cache)``), and how many
    target positions are already inside (``length``)."""

    def __init__(self, n_layers: int):
        n_layers = check_int("n_layers", n_layers, fn="DecoderCache", minimum=0)
        self.layers = [(KVCache(), KVCache(static=True)) for _ in range(n_layers)]
        self.length = 0

    def select(self, rows: torch.Tensor) -> DecoderCache:
        """The cache for hypotheses whose row n continues row ``rows[n]`` of this one."""
        _check_rows(rows, "DecoderCache.select")
        new = DecoderCache(0)
        new.layers = [(s.select(rows), c.select(rows)) for s, c in self.layers]
        new.length = self.length
        return new


class CachedAttention(MultiHeadAttention):
    """Multi-head attention (chapter 05) with RoPE and a key/value cache (chapters 06, 10).

    With ``rope=True`` queries and keys are rotated per head after the projection
    (``apply_rope``, chapter 06): key j sits at position j, and the Tq queries are the LAST Tq
    positions (Tk - Tq + i), which is where the new tokens are when a cache holds the earlier
    ones. With a ``cache``:

    - self-attention (``cache.static`` False): the keys and values of the new positions are
      appended to the cache (:meth:`KVCache.update`) and the queries attend to all of them;
    - cross-attention (``cache.static`` True): ``key``/``value`` are projected once, on the
      first call, and reused afterwards; a cache of batch 1 is shared by every query row.

    Causal alignment (``reference.CAUSAL_ALIGNMENTS``): here ``causal=True`` means
    ``"bottom_right"``, query i (at position Tk - Tq + i) sees keys j <= Tk - Tq + i, which is
    what incremental decoding needs; ``MultiHeadAttention``'s ``True`` is ``"top_left"``
    (j <= i). The two agree when Tq = Tk, and either name may be passed explicitly. Without
    RoPE and without a cache, ``forward`` with ``causal`` False, ``"top_left"`` or
    ``"bottom_right"`` computes exactly ``MultiHeadAttention.forward`` with the same argument.

    Args: as ``MultiHeadAttention``, plus ``rope`` (rotate queries and keys; d_k must be even).
    """

    causal_default = "bottom_right"   # what causal=True means in forward

    def __init__(self, d_model: int, n_heads: int, *, rope: bool = False, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.rope = check_bool("rope", rope, fn="CachedAttention")
        if self.rope and self.d_k % 2:
            raise ValueError(f"CachedAttention: RoPE rotates pairs of features, so d_k = d_model / "
                             f"n_heads must be even, got d_k = {self.d_k}")

    def extra_repr(self) -> str:
        return super().extra_repr() + (", rope=True" if self.rope else "")

    def forward(self, query, key=None, value=None, *, mask=None, causal=False, need_weights=False,
                head_mask=None, cache: KVCache | None = None) -> MultiHeadOutput:
        """Attention of ``query`` ``(B, Tq, d_model)`` over ``key``/``value`` (default: query).

        ``mask`` broadcasts to ``(B, H, Tq, Tk)`` where Tk counts the cached keys too.
        ``causal``: ``False``; ``True`` or ``"bottom_right"`` (query i sees keys
        j <= i + Tk - Tq); ``"top_left"`` (j <= i). Returns ``MultiHeadOutput(out, weights)``
        like ``MultiHeadAttention``. A cache is bound to one batch size (a static cache of
        batch 1 is shared by any batch) and to this module's heads, dtype and device.
        """
        key = query if key is None else key
        value = key if value is None else value
        align = _check_cached_forward(self, query, key, value, mask, causal, need_weights,
                                      head_mask, cache)
        q, k, v = self.project(query, key, value, cache)
        mask, causal = fold_causal(mask, align, q.shape[2], k.shape[2], device=q.device)
        return self.attend(q, k, v, mask, causal, need_weights, head_mask)

    def project(self, query, key, value, cache=None):
        """Step 1 with RoPE and the cache: q ``(B, H, Tq, d_k)``, k, v ``(B, H_kv, Tk, d_k)``."""
        q = split_heads(self.q_proj(query), self.n_heads)              # (B, H, Tq, d_k)
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v                                     # the memory: projected once
        else:
            past = 0 if cache is None or cache.static else len(cache)
            k = split_heads(self.k_proj(key), self.n_kv_heads)          # (B, H_kv, Tk_new, d_k)
            v = split_heads(self.v_proj(value), self.n_kv_heads)
            if self.rope:                                               # key j at position j
                k = apply_rope(k, past + torch.arange(k.shape[2], device=k.device))
            if cache is not None:
                k, v = cache.update(k, v)                               # (B, H_kv, Tk, d_k)
        tq, tk = q.shape[2], k.shape[2]
        if self.rope:                                                   # the last Tq positions
            q = apply_rope(q, tk - tq + torch.arange(tq, device=q.device))
        b = q.shape[0]                                                  # a memory of batch 1 is shared
        return q, k.expand(b, *k.shape[1:]), v.expand(b, *v.shape[1:])


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_rows(rows, fn) -> None:
    if not isinstance(rows, torch.Tensor) or rows.ndim != 1 or rows.dtype not in (torch.long, torch.int):
        got = describe(rows) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise TypeError(f"{fn}: `rows` must be a 1-D integer tensor of batch rows, got {got}")


def _check_select(cache: KVCache, rows) -> None:
    fn = "KVCache.select"
    _check_rows(rows, fn)
    if cache.k is None or not len(rows) or (cache.static and cache.k.shape[0] == 1):
        return                                    # nothing is indexed
    b = cache.k.shape[0]
    if int(rows.min()) < 0 or int(rows.max()) >= b:
        raise ValueError(f"{fn}: every entry of `rows` must lie in [0, {b}) (the cached batch), "
                         f"got min {int(rows.min())}, max {int(rows.max())}")


def _check_update(cache: KVCache, k, v) -> None:
    fn = "KVCache.update"
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            got = describe(t) if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{fn}: `{name}` must be a (B, H_kv, T, d_k) tensor, got {got}")
        check_tensor(name, t, fn=fn, min_ndim=4)                      # floating
    if k.dtype != v.dtype or k.device != v.device:
        raise TypeError(f"{fn}: `k` and `v` must share one dtype and device, got {describe(k)} "
                        f"and {describe(v)}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{fn}: `k` and `v` must share (B, H_kv, T), got {tuple(k.shape)} and {tuple(v.shape)}")
    if cache.static and cache.k is not None:
        raise ValueError(f"{fn}: a static (cross-attention) cache is filled once; it already holds "
                         f"{len(cache)} positions")
    if cache.k is not None and (k.shape[:2] != cache.k.shape[:2] or k.shape[3] != cache.k.shape[3]
                                or v.shape[3] != cache.v.shape[3]):
        raise ValueError(f"{fn}: new keys {tuple(k.shape)} do not continue the cached "
                         f"{tuple(cache.k.shape)} (same B, H_kv, d_k)")
    if cache.k is not None and (k.dtype, k.device) != (cache.k.dtype, cache.k.device):
        raise TypeError(f"{fn}: new keys and values must have the cached dtype and device "
                        f"({cache.k.dtype}, {cache.k.device}), got {describe(k)}")


def _check_inputs(m: CachedAttention, query, key, value, head_mask, fn) -> None:
    """query ``(B, Tq, d_model)``, key ``(B, Tk, kdim)``, value ``(B, Tk, vdim)`` in the module's
    dtype and device; ``head_mask`` None or ``(H,)``, bool or floating."""
    weight = m.q_proj.weight
    for name, t, width in (("query", query, m.d_model), ("key", key, m.kdim),
                           ("value", value, m.vdim)):
        check_tensor(name, t, fn=fn)
        if t.ndim != 3 or t.shape[-1] != width:
            raise ValueError(f"{fn}: `{name}` must be (B, T, {width}) (batch first), "
                             f"got {describe(t)}")
        if t.dtype != weight.dtype or t.device != weight.device:
            raise TypeError(f"{fn}: `{name}` must have the module's dtype and device "
                            f"({weight.dtype}, {weight.device}), got {describe(t)}")
    if not (query.shape[0] == key.shape[0] == value.shape[0]) or key.shape[1] != value.shape[1]:
        raise ValueError(f"{fn}: `query`, `key`, `value` must share B, and `key`, `value` must "
                         f"share Tk; got query {tuple(query.shape)}, key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}")
    if head_mask is not None:
        _check_bool_or_float("head_mask", head_mask, fn)
        if head_mask.shape != (m.n_heads,):
            raise ValueError(f"{fn}: `head_mask` must have shape (n_heads,) = ({m.n_heads},), "
                             f"got {describe(head_mask)}")
        if head_mask.device != weight.device:
            raise ValueError(f"{fn}: `head_mask` is on {head_mask.device} but the module is on "
                             f"{weight.device}")


def _check_bool_or_float(name, t, fn, min_ndim=1) -> None:
    check_tensor(name, t, fn=fn, min_ndim=min_ndim, floating=False)
    if t.dtype != torch.bool and not t.dtype.is_floating_point:
        raise TypeError(f"{fn}: `{name}` must be bool or floating, got {describe(t)}")


def _check_mask(mask, target, fn) -> None:
    """``mask``: None, or bool / additive float broadcastable to ``target`` = (B, H, Tq, Tk)."""
    if mask is None:
        return
    _check_bool_or_float("mask", mask, fn, min_ndim=0)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{fn}: `mask` of shape {tuple(mask.shape)} does not broadcast to "
                         f"(B, H, Tq, Tk) = {target}; Tk counts the cached keys")


def _check_cache(m: CachedAttention, cache, batch, fn) -> None:
    """A KVCache that this module can continue: its heads, d_k, dtype, device and batch."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"{fn}: `cache` must be a KVCache or None, got {type(cache).__name__}")
    if cache.k is None:
        return
    weight = m.q_proj.weight
    if cache.k.shape[1] != m.n_kv_heads or cache.k.shape[3] != m.d_k:
        raise ValueError(f"{fn}: `cache` holds keys {tuple(cache.k.shape)}, not this module's "
                         f"(B, H_kv = {m.n_kv_heads}, t, d_k = {m.d_k})")
    if (cache.k.dtype, cache.k.device) != (weight.dtype, weight.device):
        raise TypeError(f"{fn}: `cache` holds {cache.k.dtype} on {cache.k.device}, the module is "
                        f"{weight.dtype} on {weight.device}")
    shared = cache.static and cache.k.shape[0] == 1                    # one memory for every row
    if cache.k.shape[0] != batch and not shared:
        raise ValueError(f"{fn}: `cache` was filled at batch size {cache.k.shape[0]}, the query "
                         f"has batch size {batch} (a cache serves one batch; a static cache of "
                         f"batch 1 serves any)")


def _check_cached_forward(m, query, key, value, mask, causal, need_weights, head_mask,
                          cache) -> str | None:
    """Validate :meth:`CachedAttention.forward`'s arguments; return the causal alignment or None."""
    fn = "CachedAttention.forward"
    shared = all(isinstance(t, torch.Tensor) and t.ndim == 3 for t in (query, key, value)) \
        and key.shape[0] == value.shape[0] == 1 != query.shape[0]   # one memory for every row
    if shared:
        key, value = (t.expand(query.shape[0], -1, -1) for t in (key, value))
    _check_inputs(m, query, key, value, head_mask, fn)
    if cache is not None:
        _check_cache(m, cache, query.shape[0], fn)
    align = causal_alignment(causal, default=m.causal_default, fn=fn)
    check_bool("need_weights", need_weights, fn=fn)
    if cache is None:
        tk = key.shape[1]
    elif cache.static:
        tk = key.shape[1] if cache.k is None else len(cache)
    else:
        tk = len(cache) + key.shape[1]
    _check_mask(mask, (query.shape[0], m.n_heads, query.shape[1], tk), fn)
    return align
