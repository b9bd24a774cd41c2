"""Tests for attnbook.ring: ring attention, simulated in-process and over torch.distributed (chapter 12)."""
from __future__ import annotations

import pytest
import torch

from attnbook.reference import attention_ref
import multiprocessing

from attnbook.ring import (merge_partials, ring_attention, ring_attention_simulated, run_local,
                           split_lengths)
from attnbook.testing import rand


def _qkv(t=11, seed=0):
    return rand(2, 3, t, 4, seed=seed), rand(2, 3, t, 4, seed=seed + 1), rand(2, 3, t, 5, seed=seed + 2)


def test_split_lengths_cover_t_and_differ_by_at_most_one():
    assert split_lengths(11, 4) == [3, 3, 3, 2] and split_lengths(6, 3) == [2, 2, 2]
    assert sum(split_lengths(13, 5)) == 13


def test_merge_partials_equals_attention_over_the_union_and_keeps_masked_rows_zero():
    q, k, v = _qkv()
    a, b = attention_ref(q, k[:, :, :4], v[:, :, :4]), attention_ref(q, k[:, :, 4:], v[:, :, 4:])
    out, lse = merge_partials(a.out, a.lse, b.out, b.lse)
    full = attention_ref(q, k, v)
    torch.testing.assert_close(out, full.out, rtol=0, atol=1e-14)
    torch.testing.assert_close(lse, full.lse, rtol=0, atol=1e-14)
    assert (a.out - full.out).abs().max() > 1e-3                    # control: one part alone is wrong
    z, ninf = torch.zeros(1, 2, 3), torch.full((1, 2), float("-inf"))
    out, lse = merge_partials(z, ninf, z, ninf)
    assert torch.equal(out, z) and torch.isneginf(lse).all()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_simulated_ring_equals_attention_ref_in_float64(world_size, causal):
    q, k, v = _qkv(t=11)                                          # 11 is not divisible by 2, 3, 4
    ref = attention_ref(q, k, v, causal=causal).out
    out = ring_attention_simulated(q, k, v, world_size=world_size, causal=causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    if causal and world_size > 1:                                 # control: the mask matters
        assert (ring_attention_simulated(q, k, v, world_size=world_size) - ref).abs().max() > 1e-3


def test_argument_errors_name_the_function_and_argument():
    q, k, v = _qkv(t=3)
    with pytest.raises(ValueError, match=r"ring_attention_simulated: `world_size` must be <= T = 3"):
        ring_attention_simulated(q, k, v, world_size=4)
    with pytest.raises(ValueError, match=r"ring_attention: `world_size` must be an int >= 1"):
        ring_attention(q, k, v, world_size=0)
    with pytest.raises(TypeError, match=r"ring_attention: `causal` must be a bool"):
        ring_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match=r"ring_attention: `q` must be \(B, H, T, D\)"):
        ring_attention(q[None], k, v)
    with pytest.raises(ValueError, match=r"ring_attention: q and k must cover the same positions"):
        ring_attention(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(ValueError, match=r"ring_attention: `q` must have at least 4 dims"):
        ring_attention(q[0], k[0], v[0])
    with pytest.raises(RuntimeError, match="ring_attention_local: needs an initialised"):
        from attnbook.ring import ring_attention_local
        ring_attention_local(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("world_size,causal", [(2, False), (3, True)])
def test_ring_over_torch_distributed_equals_attention_ref_in_float64(world_size, causal):
    q, k, v = _qkv(t=10, seed=world_size)                         # 10 is not divisible by 3
    out = ring_attention(q, k, v, world_size=world_size, causal=causal)
    torch.testing.assert_close(out, attention_ref(q, k, v, causal=causal).out, rtol=0, atol=1e-13)


def _both_masks_job(rank, world_size, q, k, v, outs):
    """Each rank runs ring_attention_local twice (non-causal, causal) in one process group."""
    from attnbook.ring import ring_attention_local
    lengths = split_lengths(q.shape[2], world_size)
    a = sum(lengths[:rank])
    sl = slice(a, a + lengths[rank])
    for out, causal in zip(outs, (False, True)):
        out[:, :, sl] = ring_attention_local(q[:, :, sl], k[:, :, sl], v[:, :, sl], causal=causal).out


@pytest.mark.slow
def test_ring_attention_local_with_four_ranks_causal_and_not():
    q, k, v = _qkv(t=10, seed=4)                                  # 10 = 3 + 3 + 2 + 2
    outs = [torch.zeros(2, 3, 10, 5, dtype=torch.float64).share_memory_() for _ in range(2)]
    run_local(_both_masks_job, 4, q, k, v, outs)
    for out, causal in zip(outs, (False, True)):
        torch.testing.assert_close(out, attention_ref(q, k, v, causal=causal).out, rtol=0, atol=1e-13)


def _fail_in_rank_1(rank, world_size):
    """A rank job for run_local: rank 1 raises, rank 0 waits for it (in the final barrier)."""
    if rank == 1:
        raise ValueError("boom from the test's rank 1")


@pytest.mark.slow
def test_an_error_in_a_rank_surfaces_with_its_message_and_no_process_is_left():
    with pytest.raises(RuntimeError, match=r"(?s)run_local: rank 1 failed:.*boom from the test's rank 1"):
        run_local(_fail_in_rank_1, 2, timeout=30)
    assert multiprocessing.active_children() == []


def test_run_local_argument_errors():
    with pytest.raises(ValueError, match=r"run_local: `world_size` must be an int >= 1"):
        run_local(_fail_in_rank_1, 0)
    with pytest.raises(ValueError, match=r"run_local: `timeout` must lie in"):
        run_local(_fail_in_rank_1, 2, timeout=0)
    with pytest.raises(TypeError, match=r"run_local: `fn` must be a callable"):
        run_local("not a function", 2)


def test_a_peer_lost_error_is_told_from_the_cause():
    """A rank whose barrier fails because another rank died waits before it exits, so run_local
    names the rank that failed first (a fresh-clone run saw 'rank 0 failed: ... Connection reset
    by peer' instead of rank 1's own error)."""
    from attnbook.ring import _peer_lost
    seen = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:10126: Connection reset by peer.")
    assert _peer_lost(RuntimeError(seen))
    assert not _peer_lost(ValueError("boom from the test's rank 1"))      # control: the cause
