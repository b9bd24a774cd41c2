"""Fused FlashAttention-2 forward and backward in Triton (chapter 09).

Forward: one program per (query tile Q_i, batch, head) walks the key tiles K_j, V_j with an
online softmax kept in fp32:
    S_ij = scale * Q_i K_j^T                       (hidden keys -> -inf)
    m_i' = max(m_i, rowmax(S_ij)),  alpha = exp(m_i - m_i'),  P_ij = exp(S_ij - m_i')
    l_i' = alpha * l_i + rowsum(P_ij),  acc' = alpha * acc + P_ij V_j
    O_i = acc / l_i,  lse_i = m_i + log(l_i)       (natural log; O_i = 0, lse_i = -inf for an empty row)
Backward recomputes P from the saved row statistics instead of storing it (O(T) memory):
    P = exp((S - m) - log l),  Delta = rowsum(dO * O) - dlse
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - Delta),  dQ = scale dS K,  dK = scale dS^T Q
One program owns a key tile for dK, dV, another a query tile for dQ: no atomics anywhere.

Conventions are those of `attnbook.attention.attention_ref`: causal is top-left aligned (query i
sees key j iff j <= i, also when Tq != Tk); a key-padding mask is True for a real key.
Supported: float16, bfloat16 (compute capability >= 8.0), float32; head dims D, Dv in 1..128,
zero-padded inside the kernel to BLOCK_D = next power of two >= 16. Every tl.dot passes
input_precision="ieee": float32 inputs then get true fp32 products, where Triton's default
(TF32, 10 mantissa bits) visibly corrupts gradients; 16-bit inputs are unaffected. On CPU the
kernels run under TRITON_INTERPRET=1 (set before this module is first imported), except
bfloat16: the interpreter's tl.dot multiplies raw bf16 bit patterns, so it is reported unsupported.
"""
import contextlib
import math
import numbers
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # optional dependency: pip install attnbook[gpu]
    triton = None

__all__ = ["attention_triton", "triton_support"]

_MAX_HEAD_DIM = 128
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INTERPRETER_BLOCKS = (16, 16)  # (BLOCK_Q, BLOCK_K) under TRITON_INTERPRET=1: small, quick to emulate

if triton is not None:

    @triton.jit
    def _load_tile(ptr, offs_r, offs_c, R, C, stride_r, stride_c):
        # A (len(offs_r), len(offs_c)) tile, zero outside rows < R and columns < C (the tail tile
        # and the head-dim padding). A transposed tile is the same load with rows and columns swapped.
        return tl.load(ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c,
                       mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)

    @triton.jit
    def _visible(q_idx, k_idx, Tq, Tk, km_ptr, stride_mk, HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr):
        # May query q_idx attend key k_idx? Both come pre-shaped for broadcasting ([:, None], [None, :]).
        ok = (q_idx < Tq) & (k_idx < Tk)
        if HAS_MASK:
            ok = ok & (tl.load(km_ptr + k_idx * stride_mk, mask=k_idx < Tk, other=0) != 0)
        if MASK_CAUSAL:
            ok = ok & (k_idx <= q_idx)
        return ok

    @triton.jit
    def _attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd, stride_vt, stride_vd,
                        stride_mk, Tq, Tk, D, Dv, scale, lo, hi, HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        # Online softmax over the key tiles in [lo, hi); MASK_CAUSAL only for tiles crossing the diagonal.
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        for start_k in range(lo, hi, BLOCK_K):
            offs_k = start_k + tl.arange(0, BLOCK_K)
            kt = _load_tile(k_ptr, offs_d, offs_k, D, Tk, stride_kd, stride_kt)  # (BLOCK_D, BLOCK_K)
            s = tl.dot(q, kt, input_precision="ieee") * scale  # S_ij = scale * Q_i K_j^T, fp32
            ok = _visible(offs_q[:, None], offs_k[None, :], Tq, Tk, km_ptr, stride_mk, HAS_MASK, MASK_CAUSAL)
            s = tl.where(ok, s, float("-inf"))  # masking stays in fp32
            m_new = tl.maximum(m_i, tl.max(s, 1))  # m_i' = max(m_i, rowmax(S_ij))
            # A row that has seen no visible key yet keeps m = -inf: shift it by 0 instead, so that
            # exp(-inf - (-inf)) = NaN never happens and alpha, P are exactly 0 there.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_shift)  # rescales what was summed so far
            p = tl.exp(s - m_shift[:, None])  # P_ij = exp(S_ij - m_i')
            l_i = alpha * l_i + tl.sum(p, 1)  # l_i' = alpha * l_i + rowsum(P_ij)
            v = _load_tile(v_ptr, offs_k, offs_dv, Tk, Dv, stride_vt, stride_vd)  # (BLOCK_K, BLOCK_DV)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")  # acc' = alpha*acc + P V
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _attn_fwd(Q, K, V, KM, O, LSE, M, LOGL, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh,
                  stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_ob, stride_oh, stride_ot,
                  stride_od, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale, HAS_MASK: tl.constexpr,
                  CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
        start_q = tl.program_id(0) * BLOCK_Q
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
        bh = b * H + h  # row of the (B * H, T) tables: lse, m, log l, Delta, gradients
        offs_q = start_q + tl.arange(0, BLOCK_Q)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = _load_tile(Q + b * stride_qb + h * stride_qh, offs_q, offs_d, Tq, D,
                       stride_qt, stride_qd)  # (BLOCK_Q, BLOCK_D)
        k_ptr = K + b * stride_kb + h * stride_kh
        v_ptr = V + b * stride_vb + h * stride_vh
        km_ptr = KM + b * stride_mb + h * stride_mh
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, BLOCK_DV], tl.float32)
        if CAUSAL:
            # Keys 0..start_q are visible to every row of the tile: whole tiles of them need no causal mask.
            free_end = tl.minimum((start_q + 1) // BLOCK_K * BLOCK_K, Tk)
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                            stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, free_end,
                                            HAS_MASK, False, BLOCK_K, BLOCK_D, BLOCK_DV)
            # Diagonal tiles; keys >= start_q + BLOCK_Q are hidden from the whole tile and never loaded.
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                            stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, free_end,
                                            tl.minimum(start_q + BLOCK_Q, Tk), HAS_MASK, True, BLOCK_K, BLOCK_D,
                                            BLOCK_DV)
        else:
            acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                            stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, Tk, HAS_MASK,
                                            False, BLOCK_K, BLOCK_D, BLOCK_DV)
        # Epilogue: O = acc / l, lse = m + log(l). A row with no visible key keeps m = -inf, l = 0 and
        # gets O = 0, lse = -inf. m and log(l) are also stored apart, for the backward pass: at large
        # logits lse (say 1e4) carries an fp32 rounding of ~1e-3, which exp(S - lse) would turn into a
        # 1e-3 relative error in P, while exp((S - m) - log l) is as exact as the forward pass.
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        log_l = tl.log(l_safe)
        tl.store(O + b * stride_ob + h * stride_oh + offs_q[:, None] * stride_ot + offs_dv[None, :] * stride_od,
                 (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=(offs_q[:, None] < Tq) & (offs_dv[None, :] < Dv))
        rows = bh * Tq + offs_q
        tl.store(LSE + rows, m_i + log_l, mask=offs_q < Tq)
        tl.store(M + rows, m_i, mask=offs_q < Tq)
        tl.store(LOGL + rows, log_l, mask=offs_q < Tq)

    @triton.jit
    def _attn_bwd_preprocess(O, DO, DLSE, DELTA, stride_ob, stride_oh, stride_ot, stride_od, stride_gb, stride_gh,
                             stride_gt, stride_gd, H, Tq, Dv, BLOCK_Q: tl.constexpr, BLOCK_DV: tl.constexpr):
        offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
        offs_dv = tl.arange(0, BLOCK_DV)
        o = _load_tile(O + b * stride_ob + h * stride_oh, offs_q, offs_dv, Tq, Dv, stride_ot, stride_od).to(tl.float32)
        do = _load_tile(DO + b * stride_gb + h * stride_gh, offs_q, offs_dv, Tq, Dv, stride_gt,
                        stride_gd).to(tl.float32)
        rows = (b * H + h) * Tq + offs_q
        dlse = tl.load(DLSE + rows, mask=offs_q < Tq, other=0.0)
        # Delta_i = rowsum(dO_i * O_i) - dlse_i: the gradient reaching lse directly enters here.
        tl.store(DELTA + rows, tl.sum(o * do, 1) - dlse, mask=offs_q < Tq)

    @triton.jit
    def _attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, m_ptr, logl_ptr, delta_ptr, km_ptr, stride_qt,
                             stride_qd, stride_gt, stride_gd, stride_mk, Tq, Tk, D, Dv, scale, lo, hi,
                             HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        # Accumulate dK_j, dV_j over the query tiles in [lo, hi); tiles are transposed (keys along rows).
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        for start_q in range(lo, hi, BLOCK_Q):
            offs_q = start_q + tl.arange(0, BLOCK_Q)
            qt = _load_tile(q_ptr, offs_d, offs_q, D, Tq, stride_qd, stride_qt)  # (BLOCK_D, BLOCK_Q)
            do = _load_tile(do_ptr, offs_q, offs_dv, Tq, Dv, stride_gt, stride_gd)  # (BLOCK_Q, BLOCK_DV)
            m = tl.load(m_ptr + offs_q, mask=offs_q < Tq, other=0.0)
            log_l = tl.load(logl_ptr + offs_q, mask=offs_q < Tq, other=0.0)
            delta = tl.load(delta_ptr + offs_q, mask=offs_q < Tq, other=0.0)
            ok = _visible(offs_q[None, :], offs_k[:, None], Tq, Tk, km_ptr, stride_mk, HAS_MASK, MASK_CAUSAL)
            st = tl.dot(k, qt, input_precision="ieee") * scale  # S^T, (BLOCK_K, BLOCK_Q)
            # P^T = exp((S^T - m) - log l); hidden pairs (all pairs of an empty row) are zeroed before exp.
            pt = tl.exp(tl.where(ok, (st - m[None, :]) - log_l[None, :], float("-inf")))
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision="ieee")  # dV_j += P^T dO
            dpt = tl.dot(v, tl.trans(do), input_precision="ieee")  # dP^T = V dO^T
            dst = pt * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - Delta)
            dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision="ieee")  # dK_j += dS^T Q
        return dk, dv

    @triton.jit
    def _attn_bwd_dkdv(Q, K, V, KM, DO, M, LOGL, DELTA, DK, DV, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb,
                       stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_gb,
                       stride_gh, stride_gt, stride_gd, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale,
                       HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        start_k = tl.program_id(0) * BLOCK_K
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
        bh = b * H + h
        offs_k = start_k + tl.arange(0, BLOCK_K)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        k_in = (offs_k[:, None] < Tk) & (offs_d[None, :] < D)
        v_in = (offs_k[:, None] < Tk) & (offs_dv[None, :] < Dv)
        k = _load_tile(K + b * stride_kb + h * stride_kh, offs_k, offs_d, Tk, D,
                       stride_kt, stride_kd)  # (BLOCK_K, BLOCK_D)
        v = _load_tile(V + b * stride_vb + h * stride_vh, offs_k, offs_dv, Tk, Dv,
                       stride_vt, stride_vd)  # (BLOCK_K, BLOCK_DV)
        q_ptr = Q + b * stride_qb + h * stride_qh
        do_ptr = DO + b * stride_gb + h * stride_gh
        km_ptr = KM + b * stride_mb + h * stride_mh
        dk = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_K, BLOCK_DV], tl.float32)
        if CAUSAL:
            # Queries i < start_k see none of these keys: start at the tile holding start_k. Query tiles
            # starting at or after start_k + BLOCK_K - 1 see every key of this tile and need no mask.
            lo = start_k // BLOCK_Q * BLOCK_Q
            free_start = tl.minimum((start_k + BLOCK_K - 1 + BLOCK_Q - 1) // BLOCK_Q * BLOCK_Q, Tq)
            dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, M + bh * Tq, LOGL + bh * Tq,
                                          DELTA + bh * Tq, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                                          stride_mk, Tq, Tk, D, Dv, scale, lo, free_start, HAS_MASK, True, BLOCK_Q,
                                          BLOCK_D, BLOCK_DV)
            dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, M + bh * Tq, LOGL + bh * Tq,
                                          DELTA + bh * Tq, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                                          stride_mk, Tq, Tk, D, Dv, scale, free_start, Tq, HAS_MASK, False, BLOCK_Q,
                                          BLOCK_D, BLOCK_DV)
        else:
            dk, dv = _attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, M + bh * Tq, LOGL + bh * Tq,
                                          DELTA + bh * Tq, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                                          stride_mk, Tq, Tk, D, Dv, scale, 0, Tq, HAS_MASK, False, BLOCK_Q, BLOCK_D,
                                          BLOCK_DV)
        # dK, dV are written into contiguous (B, H, Tk, D) and (B, H, Tk, Dv) tensors.
        tl.store(DK + (bh * Tk + offs_k[:, None]) * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
                 mask=k_in)  # dK = scale * dS^T Q
        tl.store(DV + (bh * Tk + offs_k[:, None]) * Dv + offs_dv[None, :], dv.to(DV.dtype.element_ty), mask=v_in)

    @triton.jit
    def _attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd, stride_vt,
                           stride_vd, stride_mk, Tq, Tk, D, Dv, scale, lo, hi, HAS_MASK: tl.constexpr,
                           MASK_CAUSAL: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_DV: tl.constexpr):
        # Accumulate dQ_i over the key tiles in [lo, hi).
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        for start_k in range(lo, hi, BLOCK_K):
            offs_k = start_k + tl.arange(0, BLOCK_K)
            kt = _load_tile(k_ptr, offs_d, offs_k, D, Tk, stride_kd, stride_kt)  # (BLOCK_D, BLOCK_K)
            vt = _load_tile(v_ptr, offs_dv, offs_k, Dv, Tk, stride_vd, stride_vt)  # (BLOCK_DV, BLOCK_K)
            ok = _visible(offs_q[:, None], offs_k[None, :], Tq, Tk, km_ptr, stride_mk, HAS_MASK, MASK_CAUSAL)
            s = tl.dot(q, kt, input_precision="ieee") * scale  # S, (BLOCK_Q, BLOCK_K)
            p = tl.exp(tl.where(ok, (s - m[:, None]) - log_l[:, None], float("-inf")))  # P = exp((S - m) - log l)
            dp = tl.dot(do, vt, input_precision="ieee")  # dP = dO V^T
            ds = p * (dp - delta[:, None])  # dS = P * (dP - Delta)
            dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision="ieee")  # dQ_i += dS K
        return dq

    @triton.jit
    def _attn_bwd_dq(Q, K, V, KM, DO, M, LOGL, DELTA, DQ, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb,
                     stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_gb, stride_gh,
                     stride_gt, stride_gd, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        start_q = tl.program_id(0) * BLOCK_Q
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
        bh = b * H + h
        offs_q = start_q + tl.arange(0, BLOCK_Q)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q_in = (offs_q[:, None] < Tq) & (offs_d[None, :] < D)
        q = _load_tile(Q + b * stride_qb + h * stride_qh, offs_q, offs_d, Tq, D,
                       stride_qt, stride_qd)  # (BLOCK_Q, BLOCK_D)
        do = _load_tile(DO + b * stride_gb + h * stride_gh, offs_q, offs_dv, Tq, Dv,
                        stride_gt, stride_gd)  # (BLOCK_Q, BLOCK_DV)
        rows = bh * Tq + offs_q
        m = tl.load(M + rows, mask=offs_q < Tq, other=0.0)
        log_l = tl.load(LOGL + rows, mask=offs_q < Tq, other=0.0)
        delta = tl.load(DELTA + rows, mask=offs_q < Tq, other=0.0)
        k_ptr = K + b * stride_kb + h * stride_kh
        v_ptr = V + b * stride_vb + h * stride_vh
        km_ptr = KM + b * stride_mb + h * stride_mh
        dq = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        if CAUSAL:  # the same split as the forward pass
            free_end = tl.minimum((start_q + 1) // BLOCK_K * BLOCK_K, Tk)
            dq = _attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                    stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, free_end, HAS_MASK,
                                    False, BLOCK_K, BLOCK_D, BLOCK_DV)
            dq = _attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                    stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, free_end,
                                    tl.minimum(start_q + BLOCK_Q, Tk), HAS_MASK, True, BLOCK_K, BLOCK_D, BLOCK_DV)
        else:
            dq = _attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                    stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, Tk, HAS_MASK, False,
                                    BLOCK_K, BLOCK_D, BLOCK_DV)
        # dQ is written into a contiguous (B, H, Tq, D) tensor.
        tl.store(DQ + (bh * Tq + offs_q[:, None]) * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=q_in)  # dQ = scale * dS K

    # On a GPU the tiles of 16-bit inputs are autotuned per (Tq, Tk, head dims, mask, causal) from a small
    # list of (BLOCK_Q, BLOCK_K, num_warps, num_stages); float32 (IEEE products on CUDA cores: slow to
    # compile, never fast) uses one small fixed tile. The last entry of each list and the float32 tiles
    # fit the 64 KiB of shared memory of a T4 (sm_75) at D = 128; configs that do not fit are skipped.
    def _tuned(kernel, shapes):
        configs = [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bq, bk, w, s in shapes]
        return triton.autotune(configs=configs, key=["Tq", "Tk", "BLOCK_D", "BLOCK_DV", "HAS_MASK", "CAUSAL"])(kernel)

    _KERNELS = {  # name: (kernel, autotuned kernel, float32 tile)
        "fwd": (_attn_fwd, _tuned(_attn_fwd, [(128, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                                              (64, 32, 4, 2)]), (64, 32, 4, 2)),
        "dkdv": (_attn_bwd_dkdv, _tuned(_attn_bwd_dkdv, [(32, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2),
                                                         (16, 64, 4, 2), (32, 32, 4, 1)]), (16, 32, 4, 1)),
        "dq": (_attn_bwd_dq, _tuned(_attn_bwd_dq, [(128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2), (64, 16, 4, 2),
                                                   (32, 32, 4, 1)]), (32, 16, 4, 1)),
    }
    # The decorators read TRITON_INTERPRET when they run: remember which kind of kernel was built.
    _INTERPRETED = type(_attn_fwd).__name__ == "InterpretedFunction"
else:
    _INTERPRETED = False


def _problem(q, k, v, mask):
    """(exception type, reason) when the kernel cannot serve these arguments here, else None."""
    if triton is None:
        return RuntimeError, "triton is not installed (pip install attnbook[gpu])"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return TypeError, f"`{name}` must be a torch.Tensor, got {type(t).__name__}"
        if t.ndim != 4:
            return ValueError, f"`{name}` must be 4-D (B, H, T, D), got shape {tuple(t.shape)}"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return TypeError, (f"q, k, v must share one dtype among float16, bfloat16, float32; "
                           f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        return ValueError, f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}"
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        return ValueError, f"q, k, v must share (B, H), got {shapes}"
    if k.shape[3] != q.shape[3] or v.shape[2] != k.shape[2]:
        return ValueError, f"need q, k with the same D and k, v with the same Tk, got {shapes}"
    for name, d in (("D", q.shape[3]), ("Dv", v.shape[3])):
        if not 1 <= d <= _MAX_HEAD_DIM:
            return ValueError, f"head dim {name}={d} is outside 1..{_MAX_HEAD_DIM}, the range of the Triton kernel"
    for name, t in (("q", q), ("k", k), ("v", v)):  # offsets inside one (b, h) slice are 32-bit in the kernel
        if (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3)) >= 2**31:
            return ValueError, f"`{name}` is too long for 32-bit offsets: shape {tuple(t.shape)}, strides {t.stride()}"
    if q.device.type != "cuda" and not _INTERPRETED:
        return RuntimeError, (f"tensors are on {q.device}: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 "
                              "set before attnbook.triton_flash is first imported, to use the CPU interpreter)")
    if _INTERPRETED and os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "yes", "on"):
        return RuntimeError, ("attnbook.triton_flash was imported under TRITON_INTERPRET=1 (CPU interpreter), "
                              "which must stay set while the kernel runs")
    if q.dtype == torch.bfloat16:
        if _INTERPRETED:
            return RuntimeError, ("bfloat16 is not supported under TRITON_INTERPRET=1 "
                                  "(the interpreter's tl.dot multiplies raw bf16 bit patterns)")
        capability = torch.cuda.get_device_capability(q.device)
        if capability < (8, 0):
            return RuntimeError, f"bfloat16 needs compute capability >= 8.0, {q.device} has {capability}"
    return _mask_problem(mask, q, k)


def _mask_problem(mask, q, k):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        return TypeError, f"`mask` must be None or a tensor, got {type(mask).__name__}"
    B, H, Tk, shape = q.shape[0], q.shape[1], k.shape[2], tuple(mask.shape)
    only = ("only key-padding masks are supported by the Triton backend: bool (B, H, 1, Tk), (B, Tk) or (Tk,) "
            "(size-1 dims broadcast) with True = real key, or integer lengths (B,); "
            f"got {mask.dtype} mask {shape} for B={B}, H={H}, Tk={Tk}")
    if mask.dtype == torch.bool:
        if mask.ndim == 4:
            ok = shape[0] in (1, B) and shape[1] in (1, H) and shape[2] == 1
        else:
            ok = mask.ndim == 1 or (mask.ndim == 2 and shape[0] in (1, B))
        if not (ok and shape[-1] in (1, Tk)):
            return ValueError, only
    elif mask.dtype.is_floating_point or mask.dtype.is_complex or shape != (B,):
        return ValueError, only
    if mask.device != q.device:
        return ValueError, f"`mask` is on {mask.device} but q is on {q.device}"
    return None


def _key_mask(mask, B, H, Tk, device):
    """The key-padding mask as a (B, H, Tk) int8 view (broadcast dims have stride 0), and whether it exists."""
    if mask is None:
        return torch.ones((1, 1, 1), dtype=torch.int8, device=device).expand(B, H, Tk), False
    if mask.dtype != torch.bool:  # integer lengths (B,)
        if bool((mask < 0).any()) or bool((mask > Tk).any()):
            raise ValueError(f"attention_triton: `mask` lengths must lie in 0..Tk={Tk}, got {mask.tolist()}")
        mask = torch.arange(Tk, device=device) < mask[:, None]  # (B, Tk)
    if mask.ndim == 4:
        mask = mask[:, :, 0, :]  # (B, H, Tk) up to broadcasting
    elif mask.ndim == 2:
        mask = mask[:, None, :]  # (B, 1, Tk)
    else:
        mask = mask[None, None, :]  # (1, 1, Tk)
    return mask.to(torch.int8).expand(B, H, Tk), True


def _block(d):
    return max(16, triton.next_power_of_2(d))  # tl.dot needs every dimension >= 16


def _launch(name, n, by, B, H, blocks, fp32, *args, **consts):
    """Run kernel `name` on a (tiles of n, B, H) grid; `by` names the tile size that splits n."""
    kernel, tuned, fp32_tile = _KERNELS[name]
    if blocks is None and not _INTERPRETED and not fp32:
        tuned[lambda meta: (triton.cdiv(n, meta[by]), B, H)](*args, **consts)
        return
    if blocks is None and not _INTERPRETED:  # float32 on a GPU
        block_q, block_k, warps, stages = fp32_tile
        consts.update(num_warps=warps, num_stages=stages)
    else:
        block_q, block_k = blocks or _INTERPRETER_BLOCKS
    tiles = triton.cdiv(n, block_q if by == "BLOCK_Q" else block_k)
    kernel[(tiles, B, H)](*args, BLOCK_Q=block_q, BLOCK_K=block_k, **consts)


def _forward(q, k, v, km, has_mask, causal, scale, blocks):
    """out (B, H, Tq, Dv), and the float32 row statistics lse, m, log l, each (B, H, Tq)."""
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if B * H * Tq == 0 or Tk == 0:  # no key at all: every row is empty
        out = torch.zeros((B, H, Tq, Dv), dtype=q.dtype, device=q.device)  # (B, H, Tq, Dv)
        lse = torch.full((B, H, Tq), float("-inf"), device=q.device)  # (B, H, Tq)
        return out, lse, lse, torch.zeros_like(lse)
    out = torch.empty((B, H, Tq, Dv), dtype=q.dtype, device=q.device)  # (B, H, Tq, Dv)
    lse, m, log_l = (torch.empty((B, H, Tq), dtype=torch.float32, device=q.device) for _ in range(3))  # (B, H, Tq)
    _launch("fwd", Tq, "BLOCK_Q", B, H, blocks, q.dtype == torch.float32, q, k, v, km, out, lse, m, log_l,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *km.stride(), H, Tq, Tk, D, Dv, scale,
            HAS_MASK=has_mask, CAUSAL=causal, BLOCK_D=_block(D), BLOCK_DV=_block(Dv))
    return out, lse, m, log_l


def _backward(q, k, v, km, out, m, log_l, dout, dlse, has_mask, causal, scale, blocks):
    """dq, dk, dv (contiguous, input dtype) for upstream gradients dout (B, H, Tq, Dv), dlse (B, H, Tq)."""
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if B * H * Tq == 0 or Tk == 0:
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dout = dout.to(q.dtype)
    dlse = torch.zeros_like(m) if dlse is None else dlse.to(torch.float32).contiguous()  # (B, H, Tq)
    delta = torch.empty_like(m)  # (B, H, Tq)
    pre_block = _INTERPRETER_BLOCKS[0] if _INTERPRETED else 64
    _attn_bwd_preprocess[(triton.cdiv(Tq, pre_block), B, H)](out, dout, dlse, delta, *out.stride(), *dout.stride(),
                                                            H, Tq, Dv, BLOCK_Q=pre_block, BLOCK_DV=_block(Dv))
    args = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *km.stride(), H, Tq, Tk, D, Dv, scale)
    consts = dict(HAS_MASK=has_mask, CAUSAL=causal, BLOCK_D=_block(D), BLOCK_DV=_block(Dv))
    fp32 = q.dtype == torch.float32
    _launch("dkdv", Tk, "BLOCK_K", B, H, blocks, fp32, q, k, v, km, dout, m, log_l, delta, dk, dv, *args, **consts)
    _launch("dq", Tq, "BLOCK_Q", B, H, blocks, fp32, q, k, v, km, dout, m, log_l, delta, dq, *args, **consts)
    return dq, dk, dv


def _on_device(t):
    """Launch on t's GPU even when another one is current (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


class _FlashAttention(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, out and two (B, H, Tq) row statistics, never the weights."""

    @staticmethod
    def forward(ctx, q, k, v, km, has_mask, causal, scale, blocks):
        with _on_device(q):
            out, lse, m, log_l = _forward(q, k, v, km, has_mask, causal, scale, blocks)
        ctx.save_for_backward(q, k, v, km, out, m, log_l)
        ctx.options = (has_mask, causal, scale, blocks)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, km, out, m, log_l = ctx.saved_tensors
        with _on_device(q):
            grads = _backward(q, k, v, km, out, m, log_l, dout, dlse, *ctx.options)
        return (*grads, None, None, None, None, None)


def triton_support(q, k, v, mask=None):
    """Whether `attention_triton` can serve these arguments on this machine.

    Returns:
        (True, "") or (False, reason), e.g. triton missing, CPU tensors without TRITON_INTERPRET=1,
        bfloat16 below compute capability 8.0, a head dim outside 1..128, a mask that is not key padding.
    """
    problem = _problem(q, k, v, mask)
    return (True, "") if problem is None else (False, problem[1])


def attention_triton(q, k, v, *, mask=None, causal=False, scale=None):
    """Fused FlashAttention-2 (chapter 09): softmax(scale * q k^T + mask) v and its log-sum-exp.

    out_i = sum_j P_ij v_j,  P_ij = exp(scale * q_i . k_j - lse_i) over the visible keys j,
    lse_i = log sum_j exp(scale * q_i . k_j). Differentiable in q, k, v (through out and lse).

    Args:
        q: (B, H, Tq, D); k: (B, H, Tk, D); v: (B, H, Tk, Dv); float16, bfloat16 or float32, CUDA
            tensors (CPU tensors under TRITON_INTERPRET=1). D, Dv in 1..128.
        mask: None, a bool key-padding mask (True = real key) of shape (B, H, 1, Tk), (B, Tk) or
            (Tk,), any of whose B, H, Tk dims may be 1 (broadcast), or integer lengths (B,) (keys
            j < lengths[b] are real). A 2-D mask is (B, Tk) here, not (Tq, Tk) as in
            ``attnbook.attention``, which hands this kernel only 4-D key-padding masks.
        causal: query i sees key j only if j <= i (top-left aligned when Tq != Tk).
        scale: logit scale, default 1 / sqrt(D).
    Returns:
        out (B, H, Tq, Dv) in the input dtype; lse (B, H, Tq) float32, natural log.
        A row with no visible key gives out = 0, lse = -inf and zero gradients.
    Raises:
        RuntimeError (no triton, no CUDA, unsupported GPU), TypeError / ValueError (bad arguments),
        with the reason `triton_support` reports.
    """
    return _attention(q, k, v, mask=mask, causal=causal, scale=scale, blocks=None)


def _attention(q, k, v, *, mask, causal, scale, blocks):
    """attention_triton with fixed (BLOCK_Q, BLOCK_K) tiles instead of autotuned ones (tests)."""
    problem = _problem(q, k, v, mask)
    if problem is not None:
        raise problem[0](f"attention_triton: {problem[1]}")
    if not isinstance(causal, bool):
        raise TypeError(f"attention_triton: `causal` must be a bool, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"attention_triton: `scale` must be a positive number or None, got {scale!r}")
    elif not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"attention_triton: `scale` must be finite and positive, got {scale!r}")
    km, has_mask = _key_mask(mask, q.shape[0], q.shape[1], k.shape[2], q.device)
    return _FlashAttention.apply(q, k, v, km, has_mask, causal, float(scale), blocks)
