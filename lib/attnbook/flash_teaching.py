"""Chapter 09's teaching loops: FlashAttention-2 and FlashAttention-1 in a few lines each.

``tiled_loop`` is eq. eq-ch09-fa2 for one head, written as plainly as possible (the library's
``attention_tiled`` is the same loop, batched and with a custom backward). ``fa1_loop`` is the
loop order of FlashAttention-1 (Dao et al. 2022, Alg. 1; eq. eq-ch09-fa1). Both can count, in
an element model of the GPU's memory (:class:`Traffic`), every element they read from or write
to "HBM": each load of a tile goes through ``traffic.read`` and each store through
``traffic.write``, so the counts come from the loops themselves. This is model bookkeeping on a
CPU, not a measurement of a GPU. ``fa1_tile_sizes`` is Alg. 1's tile sizing and
``count_matmul_flops`` counts matrix-multiplication FLOPs with ``FlopCounterMode``.
"""
from __future__ import annotations

import math

import torch

from ._checks import check_int

__all__ = ["Traffic", "count_matmul_flops", "fa1_loop", "fa1_tile_sizes", "tiled_loop"]

# FlopCounterMode (torch 2.13) has no formula for the in-place baddbmm_ that attention_tiled
# uses: count it like baddbmm, 2 b n k m.
_INPLACE = {torch.ops.aten.baddbmm_: lambda c, a, b, out_shape=None, **kw:
            2 * a[0] * a[1] * a[2] * b[2]}


class Traffic:
    """Counts of elements read from and written to HBM in the chapter's element model."""

    def __init__(self):
        self.reads = 0
        self.writes = 0

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """Count ``t.numel()`` elements read; return ``t``."""
        self.reads += t.numel()
        return t

    def write(self, t: torch.Tensor) -> torch.Tensor:
        """Count ``t.numel()`` elements written; return ``t``."""
        self.writes += t.numel()
        return t

    @property
    def total(self) -> int:
        """Reads plus writes."""
        return self.reads + self.writes


def _none(t):
    return t


def tiled_loop(q, k, v, block_q, block_k, causal=False, trace=None, rescale=True,
               traffic=None):
    """Eq. eq-ch09-fa2 for one head: q (T, d), k (Tk, d), v (Tk, dv) -> (O, lse).

    Args:
        block_q, block_k: tile sizes B_r, B_c.
        causal: top-left aligned (key j <= query i).
        trace: a list that receives ``(i, j, m_i, l_i, acc)`` after every tile.
        rescale: False forgets alpha (a control: that is what the rescaling is for).
        traffic: a :class:`Traffic` that counts the HBM reads and writes, or None.
    Returns: ``(O, lse)``, shapes ``(T, dv)`` and ``(T,)``.
    """
    rd, wr = (traffic.read, traffic.write) if traffic is not None else (_none, _none)
    T, Tk = q.shape[0], k.shape[0]
    out, lse = q.new_empty(T, v.shape[1]), q.new_empty(T)
    for i0 in range(0, T, block_q):  # outer loop: one query tile, its state on chip
        q_i = rd(q[i0:i0 + block_q]) / math.sqrt(q.shape[1])  # (n, d)
        n = q_i.shape[0]
        m_i = q.new_full((n, 1), -math.inf)
        l_i = q.new_zeros(n, 1)
        acc = q.new_zeros(n, v.shape[1])
        # causal: the key tiles entirely after the last query of this tile are skipped
        for j0 in range(0, min(Tk, i0 + n) if causal else Tk, block_k):
            s = q_i @ rd(k[j0:j0 + block_k]).T  # S_ij (n, m)
            if causal:  # key j > query i is hidden (only tiles on the diagonal need it)
                rows = torch.arange(i0, i0 + n)[:, None]
                s = s.masked_fill(torch.arange(j0, j0 + s.shape[1]) > rows, -math.inf)
            m_new = torch.maximum(m_i, s.amax(1, keepdim=True))
            alpha = torch.exp(m_i - m_new) if rescale else 1.0  # rescales the sums
            p = torch.exp(s - m_new)  # P~_ij
            l_i = alpha * l_i + p.sum(1, keepdim=True)
            acc = alpha * acc + p @ rd(v[j0:j0 + block_k])
            m_i = m_new
            if trace is not None:
                trace.append((i0 // block_q, j0 // block_k, m_i.clone(), l_i.clone(),
                              acc.clone()))
        out[i0:i0 + n] = wr(acc / l_i)
        lse[i0:i0 + n] = wr((m_i + torch.log(l_i)).squeeze(1))
    return out, lse


def fa1_loop(q, k, v, block_q, block_k, traffic=None):
    """FlashAttention-1's loop order (Alg. 1, eq. eq-ch09-fa1), one head -> O (T, dv).

    Key tiles outside, query tiles inside; the normalised ``O_i`` and ``l_i, m_i`` live
    in HBM and are read and written at every (key tile, query tile) pair. ``traffic``
    counts them.
    """
    rd, wr = (traffic.read, traffic.write) if traffic is not None else (_none, _none)
    T, dv = q.shape[0], v.shape[1]
    O, l, m = q.new_zeros(T, dv), q.new_zeros(T, 1), q.new_full((T, 1), -math.inf)
    for j0 in range(0, k.shape[0], block_k):  # outer loop: one key tile
        k_j, v_j = rd(k[j0:j0 + block_k]), rd(v[j0:j0 + block_k])
        for i0 in range(0, T, block_q):
            rows = slice(i0, i0 + block_q)
            q_i, O_i = rd(q[rows]), rd(O[rows])
            l_i, m_i = rd(l[rows]), rd(m[rows])
            s = q_i @ k_j.T / math.sqrt(q.shape[1])
            m_ij = s.amax(1, keepdim=True)
            p = torch.exp(s - m_ij)
            m_new = torch.maximum(m_i, m_ij)
            l_new = (torch.exp(m_i - m_new) * l_i
                     + torch.exp(m_ij - m_new) * p.sum(1, keepdim=True))
            O[rows] = wr((l_i * torch.exp(m_i - m_new) * O_i
                          + torch.exp(m_ij - m_new) * (p @ v_j)) / l_new)  # eq. fa1
            l[rows], m[rows] = wr(l_new), wr(m_new)
    return O


def fa1_tile_sizes(sram: int, d: int) -> tuple[int, int]:
    """FlashAttention-1's tiles (Alg. 1 line 1): ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``.

    Args: sram: M, the numbers that fit on chip. d: head dim.  Returns: ``(B_r, B_c)``.
    The ``B_r x B_c`` score tile then holds at most ``d * M / 4d = M / 4`` numbers: it fits.
    """
    sram = check_int("sram", sram, fn="fa1_tile_sizes")
    d = check_int("d", d, fn="fa1_tile_sizes")
    b_c = -(-sram // (4 * d))
    return min(b_c, d), b_c


def count_matmul_flops(fn) -> int:
    """Matrix-multiplication FLOPs of ``fn()`` counted by ``torch.utils.flop_counter``
    (``baddbmm_`` counted like ``baddbmm``)."""
    if not callable(fn):
        raise TypeError(f"count_matmul_flops: `fn` must be callable, got {type(fn).__name__}")
    # imported here: torch.utils.flop_counter imports triton, and triton imported before
    # TRITON_INTERPRET=1 breaks the interpreted kernels of a test session (triton_flash docs)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_INPLACE) as counter:
        fn()
    return counter.get_total_flops()
