"""A paged key/value cache: fixed-size blocks and a block table per sequence (chapter 12).

Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
PagedAttention" (SOSP). Keys and values live in a pool of ``n_blocks``
physical blocks of ``block_size`` positions each. A sequence's block table lists the blocks
that hold its positions in order (logical block i -> physical block ``table[i]``); a block is
taken from the free list only when the sequence's last block is full, and every block returns
to the free list when the sequence finishes. At most ``block_size - 1`` slots per sequence are
reserved but unused (internal fragmentation); nothing is reserved for a maximum length.

:meth:`PagedKVCache.fork` shares a prefix between sequences: the blocks are shared with a
reference count, and the first write into a shared block copies it (copy-on-write).
:func:`paged_attention` reads each sequence's keys and values through its block table.
"""
from __future__ import annotations

import torch

from ._checks import check_bool, check_int, check_tensor, describe
from .reference import attention_ref

__all__ = ["OutOfBlocksError", "PagedKVCache", "UnknownSequenceError", "paged_attention"]


class OutOfBlocksError(RuntimeError):
    """Raised when an append needs more free blocks than the pool has (nothing is changed)."""


class UnknownSequenceError(KeyError):
    """Raised for a sequence id the cache does not hold (its message reads as written)."""

    def __str__(self) -> str:
        return str(self.args[0])


class PagedKVCache:
    """A pool of key/value blocks and a block table per sequence (chapter 12).

    Args: ``n_blocks`` physical blocks of ``block_size`` positions, ``n_kv_heads`` heads of
    ``d_k`` (keys) and ``d_v`` (values, default d_k) features. Storage: ``k_blocks``
    ``(n_blocks, H_kv, block_size, d_k)``, ``v_blocks`` ``(n_blocks, H_kv, block_size, d_v)``.
    """

    def __init__(self, n_blocks, block_size, n_kv_heads, d_k, d_v=None, *, dtype=None, device=None):
        fn = "PagedKVCache"
        self.n_blocks = check_int("n_blocks", n_blocks, fn=fn)
        self.block_size = check_int("block_size", block_size, fn=fn)
        h, d_k = check_int("n_kv_heads", n_kv_heads, fn=fn), check_int("d_k", d_k, fn=fn)
        d_v = d_k if d_v is None else check_int("d_v", d_v, fn=fn)
        self.k_blocks = torch.zeros(n_blocks, h, block_size, d_k, dtype=dtype, device=device)
        self.v_blocks = torch.zeros(n_blocks, h, block_size, d_v, dtype=dtype, device=device)
        self.free_blocks = list(range(n_blocks - 1, -1, -1))   # a stack: last freed, first reused
        self.ref_count = [0] * n_blocks
        self.block_tables: dict = {}                            # seq_id -> [physical block, ...]
        self.lengths: dict = {}                                 # seq_id -> positions written

    def add_sequence(self, seq_id) -> None:
        """Start an empty sequence (no block is taken until its first append)."""
        if seq_id in self.block_tables:
            raise ValueError(f"PagedKVCache.add_sequence: sequence {seq_id!r} already exists")
        self.block_tables[seq_id], self.lengths[seq_id] = [], 0

    def append(self, seq_id, k, v) -> None:
        """Write the keys ``k`` ``(H_kv, t_new, d_k)`` and values ``v`` ``(H_kv, t_new, d_v)`` of
        the next positions of ``seq_id``, taking blocks from the free list as the last fills up."""
        self._check_append(seq_id, k, v)
        table, n, bs = self.block_tables[seq_id], self.lengths[seq_id], self.block_size
        t = k.shape[1]
        new_blocks = -(-(n + t) // bs) - len(table)             # ceil((n + t) / bs) - blocks held
        cow = n % bs != 0 and self.ref_count[table[-1]] > 1     # the last block is shared: copy it
        if new_blocks + cow > len(self.free_blocks):
            raise OutOfBlocksError(f"PagedKVCache.append: sequence {seq_id!r} needs "
                                   f"{new_blocks + cow} "
                                   f"more blocks, {len(self.free_blocks)} are free")
        if cow:
            table[-1] = self._copy_block(table[-1])
        for _ in range(new_blocks):
            table.append(self._take())
        for i in range(t):                                       # position p -> (p // bs, p % bs)
            p = n + i
            block, slot = table[p // bs], p % bs
            self.k_blocks[block, :, slot], self.v_blocks[block, :, slot] = k[:, i], v[:, i]
        self.lengths[seq_id] = n + t

    def fork(self, src, dst) -> None:
        """Start ``dst`` as a copy of ``src`` that shares its blocks (copy-on-write)."""
        self._known(src, "fork")
        self.add_sequence(dst)
        self.block_tables[dst], self.lengths[dst] = list(self.block_tables[src]), self.lengths[src]
        for b in self.block_tables[src]:
            self.ref_count[b] += 1

    def free(self, seq_id) -> None:
        """Finish ``seq_id``: its blocks go back to the free list (a shared block when its last
        sequence lets go)."""
        self._known(seq_id, "free")
        for b in reversed(self.block_tables.pop(seq_id)):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free_blocks.append(b)
        del self.lengths[seq_id]

    def gather(self, seq_id):
        """The keys and values of ``seq_id`` read through its block table: ``(H_kv, T, d_k)``,
        ``(H_kv, T, d_v)``."""
        self._known(seq_id, "gather")
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long,
                             device=self.k_blocks.device)
        t = self.lengths[seq_id]

        def read(blocks):                                        # (n, H, bs, d) -> (H, T, d)
            x = blocks.index_select(0, table).transpose(0, 1)
            return x.reshape(x.shape[0], -1, x.shape[-1])[:, :t]
        return read(self.k_blocks), read(self.v_blocks)

    def used_slots(self) -> tuple[int, int]:
        """``(slots of the blocks in use, slots holding a position)``; their difference is the
        internal fragmentation (a shared block counts once)."""
        filled = {}
        for sid, table in self.block_tables.items():
            for i, b in enumerate(table):
                here = min(self.block_size, self.lengths[sid] - i * self.block_size)
                filled[b] = max(filled.get(b, 0), here)
        return (self.n_blocks - len(self.free_blocks)) * self.block_size, sum(filled.values())

    # -- internals ---------------------------------------------------------------------------
    def _take(self) -> int:
        b = self.free_blocks.pop()
        self.ref_count[b] = 1
        return b

    def _copy_block(self, block) -> int:
        new = self._take()
        self.k_blocks[new], self.v_blocks[new] = self.k_blocks[block], self.v_blocks[block]
        self.ref_count[block] -= 1
        return new

    def _known(self, seq_id, method):
        if seq_id not in self.block_tables:
            raise UnknownSequenceError(f"PagedKVCache.{method}: unknown sequence {seq_id!r} "
                           f"(known: {sorted(map(repr, self.block_tables))})")

    def _check_append(self, seq_id, k, v):
        fn = "PagedKVCache.append"
        self._known(seq_id, "append")
        for name, t, store in (("k", k, self.k_blocks), ("v", v, self.v_blocks)):
            check_tensor(name, t, fn=fn, min_ndim=3)
            if t.ndim != 3 or t.shape[0] != store.shape[1] or t.shape[2] != store.shape[3]:
                raise ValueError(f"{fn}: `{name}` must be (H_kv = {store.shape[1]}, t_new, "
                                 f"{store.shape[3]}), got {describe(t)}")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"{fn}: `k` and `v` must hold the same positions, got {k.shape[1]} "
                             f"and {v.shape[1]}")


def paged_attention(q, cache: PagedKVCache, seq_ids, *, causal=False, scale=None):
    """Attention of each sequence's queries over its keys and values read
    through the block table (chapter 12).

    Args: q ``(B, H, Tq, d_k)``, row b for sequence ``seq_ids[b]``; H a multiple of
    H_kv (grouped-query heads share a key/value head). ``causal``: the Tq queries are
    the last Tq positions of their sequence (bottom-right aligned).
    Returns ``(B, H, Tq, d_v)``.
    """
    fn = "paged_attention"
    check_tensor("q", q, fn=fn, min_ndim=4)
    causal = check_bool("causal", causal, fn=fn)
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"{fn}: `cache` must be a PagedKVCache, "
                        f"got {type(cache).__name__}")
    seq_ids = list(seq_ids)
    h_kv = cache.k_blocks.shape[1]
    if q.ndim != 4 or len(seq_ids) != q.shape[0] or q.shape[1] % h_kv:
        raise ValueError(f"{fn}: `q` must be (B = len(seq_ids) = {len(seq_ids)}, "
                         f"H (a multiple of "
                         f"H_kv = {h_kv}), Tq, d_k), got {describe(q)}")
    outs = []
    for b, sid in enumerate(seq_ids):
        k, v = cache.gather(sid)                                 # (H_kv, T, d)
        rep = q.shape[1] // h_kv
        k = k.repeat_interleave(rep, 0)[None]                    # (1, H, T, d_k)
        v = v.repeat_interleave(rep, 0)[None]                    # (1, H, T, d_v)
        tq, tk = q.shape[2], k.shape[2]
        mask = None                                    # bottom-right: j <= Tk - Tq + i
        if causal:
            mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        outs.append(attention_ref(q[b:b + 1], k, v, mask=mask, scale=scale).out)
    return torch.cat(outs, 0)
