"""Tests for attnbook.cache: KVCache.update/select, DecoderCache, CachedAttention (chapter 10)."""
from __future__ import annotations

import pytest
import torch

from attnbook.cache import CachedAttention, DecoderCache, KVCache
from attnbook.multihead import MultiHeadAttention
from attnbook.positional import apply_rope
from attnbook.testing import F64_TOL, rand

f64 = torch.float64




def test_kv_cache_select_and_static():
    c = KVCache()
    c.k = c.v = torch.arange(6.0).reshape(3, 1, 2, 1)
    sel = c.select(torch.tensor([2, 2, 0]))
    assert torch.equal(sel.k[:, 0, 0, 0], torch.tensor([4.0, 4.0, 0.0])) and len(sel) == 2
    s = KVCache(static=True)
    s.k = s.v = torch.zeros(1, 1, 4, 1)
    assert s.select(torch.tensor([0, 0, 0])).k.shape[0] == 1          # a shared memory stays shared


def test_kv_cache_update_appends_and_returns_everything():
    c = KVCache()
    k1, v1, k2, v2 = rand(2, 1, 3, 4), rand(2, 1, 3, 4, seed=1), rand(2, 1, 1, 4, seed=2), rand(2, 1, 1, 4, seed=3)
    k, v = c.update(k1, v1)
    assert k is k1 and len(c) == 3
    k, v = c.update(k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert c.k is k and len(c) == 4
    with pytest.raises(ValueError, match="do not continue"):
        c.update(rand(3, 1, 1, 4), rand(3, 1, 1, 4))                         # another batch size
    static = KVCache(static=True)
    static.update(k1, v1)
    with pytest.raises(ValueError, match="filled once"):
        static.update(k2, v2)
    with pytest.raises(TypeError, match=r"`k` must be a \(B, H_kv, T, d_k\)"):
        KVCache().update(rand(2, 3, 4), rand(2, 3, 4))
    with pytest.raises(TypeError, match="`rows`"):
        c.select([0, 1])


def test_decoder_cache_select_keeps_length_and_pairs():
    dc = DecoderCache(2)
    for s, x in dc.layers:
        s.update(rand(3, 2, 4, 2), rand(3, 2, 4, 2, seed=1))
        x.update(rand(1, 2, 5, 2, seed=2), rand(1, 2, 5, 2, seed=3))
    dc.length = 4
    new = dc.select(torch.tensor([1, 1, 0]))
    assert new.length == 4 and len(new.layers) == 2
    assert torch.equal(new.layers[0][0].k, dc.layers[0][0].k[[1, 1, 0]])
    assert new.layers[0][1].k is dc.layers[0][1].k                            # a shared memory: not copied


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_cached_attention_step_by_step_equals_one_pass(rope, n_kv):
    torch.manual_seed(0)
    m = CachedAttention(16, 4, rope=rope, n_kv_heads=n_kv, dtype=f64)
    x = rand(2, 6, 16)
    full = m(x, causal=True).out
    cache = KVCache()
    parts = [m(x[:, :2], causal=True, cache=cache).out]
    for t in range(2, 6):
        parts.append(m(x[:, t:t + 1], causal=True, cache=cache).out)
    torch.testing.assert_close(torch.cat(parts, 1), full, **F64_TOL)
    assert cache.k.shape == (2, n_kv, 6, 4)                                  # H_kv heads: GQA saves memory


def test_cached_attention_without_rope_and_cache_is_multihead_attention():
    torch.manual_seed(1)
    mine = CachedAttention(16, 4, dtype=f64)
    plain = MultiHeadAttention(16, 4, dtype=f64)
    plain.load_state_dict(mine.state_dict())
    x, mem = rand(2, 5, 16), rand(2, 7, 16, seed=1)
    for kw in (dict(), dict(causal=True), dict(need_weights=True)):
        a, b = mine(x, **kw), plain(x, **kw)
        torch.testing.assert_close(a.out, b.out, rtol=0, atol=0)
    torch.testing.assert_close(mine(x, mem).out, plain(x, mem).out, rtol=0, atol=0)
    with_rope = CachedAttention(16, 4, rope=True, dtype=f64)
    with_rope.load_state_dict(mine.state_dict())
    assert (with_rope(x).out - mine(x).out).abs().max() > 1e-3               # control: RoPE matters


def test_cached_attention_rope_rotates_q_and_k_at_their_positions():
    torch.manual_seed(2)
    m = CachedAttention(8, 2, rope=True, dtype=f64, backend="ref")
    x = rand(1, 4, 8)
    q = apply_rope(m.q_proj(x).view(1, 4, 2, 4).transpose(1, 2))
    k = apply_rope(m.k_proj(x).view(1, 4, 2, 4).transpose(1, 2))
    w = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1)
    torch.testing.assert_close(m(x, need_weights=True).weights, w, **F64_TOL)


def test_cross_attention_cache_projects_the_memory_once_and_shares_batch_one():
    torch.manual_seed(3)
    m = CachedAttention(8, 2, dtype=f64)
    mem = rand(1, 5, 8)
    q = rand(3, 1, 8, seed=1)
    c = KVCache(static=True)
    first = m(q, mem, cache=c).out
    assert c.k.shape[0] == 1
    again = m(q, mem * 100, cache=c).out                                     # the cached memory is used
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.testing.assert_close(first, m(q, mem.expand(3, -1, -1)).out, **F64_TOL)


def test_cached_attention_validation():
    m = CachedAttention(8, 2, dtype=f64)
    x = rand(2, 3, 8)
    with pytest.raises(TypeError, match="`cache` must be a KVCache"):
        m(x, cache=(KVCache(), KVCache()))
    c = KVCache()
    m(x, cache=c)
    with pytest.raises(ValueError, match="Tk counts the cached keys"):
        m(x[:, :1], cache=c, mask=torch.ones(2, 1, 1, 1 + 1, dtype=torch.bool))   # Tk is 3 + 1, not 2
    with pytest.raises(ValueError, match="d_k"):
        CachedAttention(6, 2, rope=True)
    with pytest.raises(TypeError, match="`rope`"):
        CachedAttention(8, 2, rope="yes")
