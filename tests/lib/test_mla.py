"""Tests for attnbook.mla: multi-head latent attention, absorbed vs expanded, its latent cache (chapter 12)."""
from __future__ import annotations

import pytest
import torch

from attnbook.cache import CachedAttention, KVCache
from attnbook.mla import LatentCache, MultiHeadLatentAttention
from attnbook.testing import rand, randomize

f64 = torch.float64


def _mla(**kw):
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(16, 4, 6, 4, dtype=f64, **kw)
    return randomize(m, seed=1)


@pytest.mark.parametrize("d_q_latent", [None, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_absorbed_equals_expanded_in_float64(d_q_latent, causal):
    m, x = _mla(d_q_latent=d_q_latent), rand(2, 7, 16)
    expanded, absorbed = m(x, causal=causal), m(x, causal=causal, absorb=True)
    torch.testing.assert_close(absorbed, expanded, rtol=0, atol=1e-13)
    # control: the tolerance tells different outputs apart (the other causal setting)
    assert (m(x, causal=not causal) - expanded).abs().max() > 1e-3


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_step_by_step_equals_the_full_causal_forward(absorb):
    m, x = _mla(absorb=absorb), rand(2, 9, 16, seed=3)
    full = m(x, causal=True)
    cache = LatentCache()
    prefix = m(x[:, :4], causal=True, cache=cache)                  # a prompt of 4, then 1 by 1
    steps = [m(x[:, t:t + 1], causal=True, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat([prefix, *steps], 1), full, rtol=0, atol=1e-13)
    assert len(cache) == 9
    # control: without the cache each step sees only itself
    alone = torch.cat([m(x[:, t:t + 1], causal=True) for t in range(4, 9)], 1)
    assert (alone - full[:, 4:]).abs().max() > 1e-3


def test_cache_per_token_is_d_latent_plus_d_rope_values_measured_from_the_tensors():
    b, t = 3, 10
    m, x = _mla(), rand(b, t, 16)
    cache = LatentCache()
    m(x, causal=True, cache=cache)
    per_token = sum(c.numel() for c in (cache.c_kv, cache.k_rope)) / (b * t)
    assert per_token == m.d_latent + m.d_rope == 10
    mha, kv = CachedAttention(16, 4, dtype=f64), KVCache()          # MHA with the same d_model, heads
    mha(x, causal=True, cache=kv)
    mha_per_token = sum(c.numel() for c in (kv.k, kv.v)) / (b * t)
    assert mha_per_token == 2 * 4 * 4 and per_token < mha_per_token


def test_argument_errors_name_the_function_and_argument():
    with pytest.raises(ValueError, match=r"MultiHeadLatentAttention: `d_rope` must be even"):
        MultiHeadLatentAttention(16, 4, 6, 3)
    with pytest.raises(ValueError, match=r"MultiHeadLatentAttention: `d_latent` must be an int >= 1"):
        MultiHeadLatentAttention(16, 4, 0, 4)
    with pytest.raises(ValueError, match="not divisible by `n_heads`"):
        MultiHeadLatentAttention(15, 4, 6, 4)
    m = _mla()
    with pytest.raises(ValueError, match=r"forward: `x` must be \(B, T, d_model = 16\)"):
        m(rand(2, 7, 15))
    with pytest.raises(TypeError, match=r"forward: `x` must have the weights' dtype"):
        m(rand(2, 7, 16, dtype=torch.float32))
    with pytest.raises(TypeError, match=r"forward: `cache` must be a LatentCache"):
        m(rand(2, 7, 16), cache=KVCache())
    with pytest.raises(TypeError, match=r"forward: `absorb` must be a bool"):
        m(rand(2, 7, 16), absorb=1)
    cache = LatentCache()
    m(rand(2, 3, 16), cache=cache)
    with pytest.raises(ValueError, match="LatentCache.update: new latents"):
        m(rand(3, 1, 16), cache=cache)
