"""Tests for attnbook.paged: the paged KV cache and attention through its block tables (chapter 12)."""
from __future__ import annotations

import pytest
import torch

from attnbook.cache import KVCache
from attnbook.paged import OutOfBlocksError, PagedKVCache, paged_attention
from attnbook.reference import attention_ref
from attnbook.testing import rand

f64 = torch.float64
H_KV, D_K, D_V = 2, 4, 3


def _kv(t, seed):
    return rand(H_KV, t, D_K, seed=seed), rand(H_KV, t, D_V, seed=seed + 1000)


def test_attention_through_the_block_table_equals_the_contiguous_cache_exactly():
    paged = PagedKVCache(12, 3, H_KV, D_K, D_V, dtype=f64)
    contiguous = {}
    # interleaved appends of different lengths, a sequence finishing, a new one reusing its blocks
    plan = [("a", 4), ("b", 1), ("a", 2), ("c", 5), ("b", 3), ("free", "a"), ("d", 7), ("c", 1),
            ("b", 2), ("d", 1)]
    for step, (sid, t) in enumerate(plan):
        if sid == "free":
            paged.free(t)
            del contiguous[t]
            continue
        if sid not in contiguous:
            paged.add_sequence(sid)
            contiguous[sid] = KVCache()
        k, v = _kv(t, seed=step)
        paged.append(sid, k, v)
        contiguous[sid].update(k[None], v[None])
        ids = sorted(contiguous)
        for causal, tq in ((False, 2), (True, 1)):
            q = rand(len(ids), 2 * H_KV, tq, D_K, seed=100 + step)     # GQA: 2 query heads per KV head
            out = paged_attention(q, paged, ids, causal=causal)
            for b, s in enumerate(ids):
                c = contiguous[s]
                k_c, v_c = c.k.repeat_interleave(2, 1), c.v.repeat_interleave(2, 1)
                mask = torch.ones(tq, len(c), dtype=torch.bool).tril(len(c) - tq) if causal else None
                assert torch.equal(out[b:b + 1], attention_ref(q[b:b + 1], k_c, v_c, mask=mask).out)
    # control: another sequence's keys give another answer
    q = rand(1, 2 * H_KV, 1, D_K)
    assert not torch.equal(paged_attention(q, paged, ["b"]), paged_attention(q, paged, ["c"]))


def test_blocks_are_taken_as_needed_and_reused_after_free():
    c = PagedKVCache(4, 2, H_KV, D_K, dtype=f64)
    c.add_sequence(0)
    k = rand(H_KV, 3, D_K)
    c.append(0, k, k)
    assert len(c.block_tables[0]) == 2 and len(c.free_blocks) == 2 and c.used_slots() == (4, 3)
    held = set(c.block_tables[0])
    c.free(0)
    assert len(c.free_blocks) == 4
    c.add_sequence(1)
    k = rand(H_KV, 4, D_K)
    c.append(1, k, k)
    assert set(c.block_tables[1]) == held                          # the freed blocks come back first
    torch.testing.assert_close(c.gather(1)[0], k, rtol=0, atol=0)


def test_fork_shares_blocks_and_copies_on_write():
    c = PagedKVCache(6, 2, H_KV, D_K, dtype=f64)
    c.add_sequence("p")
    k = rand(H_KV, 3, D_K)
    c.append("p", k, k)
    c.fork("p", "q")
    assert c.block_tables["q"] == c.block_tables["p"] and c.used_slots() == (4, 3)
    k_new = rand(H_KV, 1, D_K, seed=5)
    c.append("q", k_new, k_new)                                  # writes into the shared last block
    assert c.block_tables["q"][0] == c.block_tables["p"][0]      # the full block stays shared
    assert c.block_tables["q"][1] != c.block_tables["p"][1]      # the partial one was copied
    torch.testing.assert_close(c.gather("p")[0], k, rtol=0, atol=0)   # p is untouched
    torch.testing.assert_close(c.gather("q")[0], torch.cat([k, k_new], 1), rtol=0, atol=0)
    c.free("p")
    assert len(c.free_blocks) == 6 - 2                            # the shared block is still q's
    c.free("q")
    assert len(c.free_blocks) == 6


def test_errors():
    with pytest.raises(ValueError, match=r"PagedKVCache: `block_size` must be an int >= 1"):
        PagedKVCache(4, 0, H_KV, D_K)
    with pytest.raises(TypeError, match=r"PagedKVCache: `block_size` must be an int"):
        PagedKVCache(4, 2.5, H_KV, D_K)
    c = PagedKVCache(2, 2, H_KV, D_K, dtype=f64)
    with pytest.raises(KeyError, match=r"PagedKVCache.append: unknown sequence 'x'"):
        c.append("x", rand(H_KV, 1, D_K), rand(H_KV, 1, D_K))
    c.add_sequence("x")
    with pytest.raises(ValueError, match="already exists"):
        c.add_sequence("x")
    k = rand(H_KV, 5, D_K)
    with pytest.raises(OutOfBlocksError, match=r"PagedKVCache.append: sequence 'x' needs 3 more blocks, 2 are free"):
        c.append("x", k, k)
    assert c.lengths["x"] == 0 and len(c.free_blocks) == 2        # nothing changed
    with pytest.raises(ValueError, match=r"PagedKVCache.append: `k` must be \(H_kv = 2"):
        c.append("x", rand(3, 1, D_K), rand(3, 1, D_K))
    with pytest.raises(KeyError, match=r"PagedKVCache.free: unknown sequence 'y'"):
        c.free("y")
    with pytest.raises(ValueError, match=r"paged_attention: `q` must be \(B = len\(seq_ids\) = 2"):
        paged_attention(rand(1, 2, 1, D_K), c, ["x", "x"])
    with pytest.raises(TypeError, match=r"paged_attention: `cache` must be a PagedKVCache"):
        paged_attention(rand(1, 2, 1, D_K), KVCache(), ["x"])
