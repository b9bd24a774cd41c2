"""The Triton kernels of FlashAttention-2, forward and backward (chapter 09): device code only.

The host side (argument checks, launch, autograd, the public ``attention_triton``) lives in
``attnbook.triton_flash``; this module needs triton and is imported only from there, lazily.

Forward (:func:`attn_fwd`): one program per (query tile Q_i, batch, head) walks the key tiles
K_j, V_j with an online softmax kept in fp32, as in Triton's tutorial 06:
    S_ij = scale * Q_i K_j^T                       (hidden keys -> -inf)
    m_i' = max(m_i, rowmax(S_ij)),  alpha = exp(m_i - m_i'),  P_ij = exp(S_ij - m_i')
    l_i' = alpha * l_i + rowsum(P_ij),  acc' = alpha * acc + P_ij V_j
    O_i = acc / l_i,  lse_i = m_i + log(l_i)       (O_i = 0, lse_i = -inf for an empty row)
Backward recomputes P from the saved row statistics instead of storing it (O(T) memory):
    P = exp((S - m) - log l),  Delta = rowsum(dO * O) - dlse          (:func:`attn_bwd_preprocess`)
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - Delta),  dK = scale dS^T Q   (:func:`attn_bwd_dkdv`)
    dQ = scale dS K                                                     (:func:`attn_bwd_dq`)
One program owns a key tile for dK, dV, another a query tile for dQ: no atomics anywhere.

Causal work is split as in the tutorial: each kernel calls its inner loop once per stage, over
the tiles its own tile sees in full, without the causal test, and over the tiles crossing the
diagonal, with it (forward and dQ: the full tiles first; dK, dV: the diagonal first); tiles
entirely above the diagonal are never loaded. Without causal there is one stage, every tile.
Exponentials are natural (``tl.exp``), not base 2 as in the tutorial, which folds log2(e) into
the scale: the code then reads like the equations above (Triton lowers an fp32 ``tl.exp`` to the
hardware's base-2 instruction after one multiplication anyway).

Every tl.dot passes ``input_precision="ieee"``: float32 inputs then get true fp32 products,
where Triton's default (TF32, 10 mantissa bits) visibly corrupts gradients; 16-bit inputs are
unaffected. Along the head dims tiles are zero-padded to BLOCK_D, BLOCK_DV: the next power of two
>= 16 (tl.dot's minimum) of D, Dv.
"""
import triton
import triton.language as tl

__all__ = ["INTERPRETED", "KERNELS", "TUNE_KEY", "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_preprocess", "attn_fwd"]

# The three autotuned kernels take TQ_BUCKET, TK_BUCKET (the lengths rounded up to a power of two,
# see ``triton_flash.length_bucket``) only as autotuning key: the body never reads them, so they
# are not specialised on (no extra compilation when a bucket is 1 or divisible by 16).
_TUNED_JIT = triton.jit(do_not_specialize=["TQ_BUCKET", "TK_BUCKET"])


@triton.jit
def load_tile(ptr, offs_r, offs_c, R, C, stride_r, stride_c):
    # A (len(offs_r), len(offs_c)) tile, zero outside rows < R and columns < C (the tail tile and
    # the head-dim padding). A transposed tile is the same load with rows and columns swapped.
    return tl.load(ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c,
                   mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)


@triton.jit
def visible(q_idx, k_idx, Tq, Tk, km_ptr, stride_mk, HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr):
    # May query q_idx attend key k_idx? Both come pre-shaped for broadcasting ([:, None], [None, :]).
    ok = (q_idx < Tq) & (k_idx < Tk)
    if HAS_MASK:  # key padding: one int8 per key, 0 = hidden
        ok = ok & (tl.load(km_ptr + k_idx * stride_mk, mask=k_idx < Tk, other=0) != 0)
    if MASK_CAUSAL:
        ok = ok & (k_idx <= q_idx)
    return ok


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

@triton.jit
def attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr,
                   stride_kt, stride_kd, stride_vt, stride_vd, stride_mk,
                   Tq, Tk, D, Dv, scale, lo, hi,
                   HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr):
    # Online softmax over the key tiles in [lo, hi); MASK_CAUSAL only for tiles crossing
    # the diagonal.
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_k in range(lo, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        # (BLOCK_D, BLOCK_K)
        kt = load_tile(k_ptr, offs_d, offs_k, D, Tk, stride_kd, stride_kt)
        # S_ij = scale * Q_i K_j^T, fp32
        s = tl.dot(q, kt, input_precision="ieee") * scale
        ok = visible(offs_q[:, None], offs_k[None, :], Tq, Tk, km_ptr, stride_mk,
                     HAS_MASK, MASK_CAUSAL)
        # A select, not "+ (-inf)": a hidden key whose k holds NaN / inf still
        # scores -inf.
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # m_i' = max(m_i, rowmax(S_ij))
        # A row that has seen no visible key yet keeps m = -inf: shift it by 0
        # instead, so that exp(-inf - (-inf)) = NaN never happens and alpha, P are
        # exactly 0 there.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_shift)  # rescales what was summed so far
        p = tl.exp(s - m_shift[:, None])  # P_ij = exp(S_ij - m_i')
        l_i = alpha * l_i + tl.sum(p, 1)  # l_i' = alpha * l_i + rowsum(P_ij)
        # (BLOCK_K, BLOCK_DV)
        v = load_tile(v_ptr, offs_k, offs_dv, Tk, Dv, stride_vt, stride_vd)
        # acc' = alpha*acc + P V
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@_TUNED_JIT
def attn_fwd(Q, K, V, KM, O, LSE, M, LOGL, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh,
             stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_ob, stride_oh, stride_ot,
             stride_od, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale, TQ_BUCKET, TK_BUCKET,
             HAS_MASK: tl.constexpr,
             CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
             BLOCK_DV: tl.constexpr):
    start_q = tl.program_id(0) * BLOCK_Q
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    offs_q = start_q + tl.arange(0, BLOCK_Q)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_q, tl.arange(0, BLOCK_D), Tq, D,
                  stride_qt, stride_qd)  # (BLOCK_Q, BLOCK_D)
    k_ptr = K + b * stride_kb + h * stride_kh
    v_ptr = V + b * stride_vb + h * stride_vh
    km_ptr = KM + b * stride_mb + h * stride_mh
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_DV], tl.float32)
    if CAUSAL:  # keys 0..start_q are visible to every row of the tile: whole tiles of them need no test
        free_end = tl.minimum((start_q + 1) // BLOCK_K * BLOCK_K, Tk)
    else:
        free_end = Tk
    # Stage 1: the key tiles every row of this query tile sees (all of them when not causal).
    acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                   stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, free_end,
                                   HAS_MASK, False, BLOCK_K, BLOCK_D, BLOCK_DV)
    if CAUSAL:  # stage 2: the diagonal tiles; keys >= start_q + BLOCK_Q are hidden from the whole tile
        acc, l_i, m_i = attn_fwd_inner(acc, l_i, m_i, q, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                                       stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, free_end,
                                       tl.minimum(start_q + BLOCK_Q, Tk), HAS_MASK, True, BLOCK_K, BLOCK_D,
                                       BLOCK_DV)
    # Epilogue: O = acc / l, lse = m + log(l). A row with no visible key keeps m = -inf, l = 0 and
    # gets O = 0, lse = -inf. m and log(l) are also stored apart, for the backward pass: at large
    # logits lse (say 1e4) carries an fp32 rounding of ~1e-3, which exp(S - lse) would turn into a
    # 1e-3 relative error in P, while exp((S - m) - log l) is as exact as the forward pass.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    log_l = tl.log(l_safe)
    tl.store(O + b * stride_ob + h * stride_oh + offs_q[:, None] * stride_ot + offs_dv[None, :] * stride_od,
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=(offs_q[:, None] < Tq) & (offs_dv[None, :] < Dv))
    rows = (b * H + h) * Tq + offs_q  # rows of the (B * H, Tq) tables: lse, m, log l
    tl.store(LSE + rows, m_i + log_l, mask=offs_q < Tq)
    tl.store(M + rows, m_i, mask=offs_q < Tq)
    tl.store(LOGL + rows, log_l, mask=offs_q < Tq)


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------

@triton.jit
def attn_bwd_preprocess(O, DO, DLSE, DELTA, stride_ob, stride_oh, stride_ot, stride_od, stride_gb, stride_gh,
                        stride_gt, stride_gd, H, Tq, Dv, BLOCK_Q: tl.constexpr, BLOCK_DV: tl.constexpr):
    offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    o = load_tile(O + b * stride_ob + h * stride_oh, offs_q, offs_dv, Tq, Dv, stride_ot, stride_od).to(tl.float32)
    do = load_tile(DO + b * stride_gb + h * stride_gh, offs_q, offs_dv, Tq, Dv, stride_gt,
                   stride_gd).to(tl.float32)
    rows = (b * H + h) * Tq + offs_q
    dlse = tl.load(DLSE + rows, mask=offs_q < Tq, other=0.0)
    # Delta_i = rowsum(dO_i * O_i) - dlse_i: the gradient reaching lse directly enters here.
    tl.store(DELTA + rows, tl.sum(o * do, 1) - dlse, mask=offs_q < Tq)


@triton.jit
def attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, m_ptr, logl_ptr,
                        delta_ptr, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                        stride_mk, Tq, Tk, D, Dv, scale, lo, hi,
                        HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                        BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr):
    # Accumulate dK_j, dV_j over the query tiles in [lo, hi); tiles are transposed
    # (keys along rows).
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_q in range(lo, hi, BLOCK_Q):
        offs_q = start_q + tl.arange(0, BLOCK_Q)
        # (BLOCK_D, BLOCK_Q)
        qt = load_tile(q_ptr, offs_d, offs_q, D, Tq, stride_qd, stride_qt)
        # (BLOCK_Q, BLOCK_DV)
        do = load_tile(do_ptr, offs_q, offs_dv, Tq, Dv, stride_gt, stride_gd)
        m = tl.load(m_ptr + offs_q, mask=offs_q < Tq, other=0.0)
        log_l = tl.load(logl_ptr + offs_q, mask=offs_q < Tq, other=0.0)
        delta = tl.load(delta_ptr + offs_q, mask=offs_q < Tq, other=0.0)
        ok = visible(offs_q[None, :], offs_k[:, None], Tq, Tk, km_ptr, stride_mk,
                     HAS_MASK, MASK_CAUSAL)
        st = tl.dot(k, qt, input_precision="ieee") * scale  # S^T, (BLOCK_K, BLOCK_Q)
        # P^T = exp((S^T - m) - log l); hidden pairs (all pairs of an empty row) are
        # zeroed before exp.
        pt = tl.exp(tl.where(ok, (st - m[None, :]) - log_l[None, :], float("-inf")))
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision="ieee")  # dV_j += P^T dO
        dpt = tl.dot(v, tl.trans(do), input_precision="ieee")  # dP^T = V dO^T
        dst = pt * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - Delta)
        # dK_j += dS^T Q
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision="ieee")
    return dk, dv


@_TUNED_JIT
def attn_bwd_dkdv(Q, K, V, KM, DO, M, LOGL, DELTA, DK, DV, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb,
                  stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_gb,
                  stride_gh, stride_gt, stride_gd, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale,
                  TQ_BUCKET, TK_BUCKET, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr,
                  BLOCK_K: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_k = tl.program_id(0) * BLOCK_K
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    bh = b * H + h  # row of the (B * H, T) tables: m, log l, Delta, dK, dV
    offs_k = start_k + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_tile(K + b * stride_kb + h * stride_kh, offs_k, offs_d, Tk, D, stride_kt, stride_kd)  # (BLOCK_K, BLOCK_D)
    v = load_tile(V + b * stride_vb + h * stride_vh, offs_k, offs_dv, Tk, Dv,
                  stride_vt, stride_vd)  # (BLOCK_K, BLOCK_DV)
    q_ptr = Q + b * stride_qb + h * stride_qh
    do_ptr = DO + b * stride_gb + h * stride_gh
    km_ptr = KM + b * stride_mb + h * stride_mh
    dk = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_K, BLOCK_DV], tl.float32)
    if CAUSAL:
        # Queries i < start_k see none of these keys: stage 1 starts at the tile holding start_k and
        # ends where query tiles begin that see every key of this tile (i >= start_k + BLOCK_K - 1).
        free_start = tl.minimum((start_k + BLOCK_K - 1 + BLOCK_Q - 1) // BLOCK_Q * BLOCK_Q, Tq)
        dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, M + bh * Tq, LOGL + bh * Tq,
                                     DELTA + bh * Tq, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                                     stride_mk, Tq, Tk, D, Dv, scale, start_k // BLOCK_Q * BLOCK_Q, free_start,
                                     HAS_MASK, True, BLOCK_Q, BLOCK_D, BLOCK_DV)
    else:
        free_start = 0
    # Stage 2 (the only one when not causal): the query tiles that see every key of this tile.
    dk, dv = attn_bwd_dkdv_inner(dk, dv, k, v, offs_k, q_ptr, do_ptr, M + bh * Tq, LOGL + bh * Tq,
                                 DELTA + bh * Tq, km_ptr, stride_qt, stride_qd, stride_gt, stride_gd,
                                 stride_mk, Tq, Tk, D, Dv, scale, free_start, Tq, HAS_MASK, False, BLOCK_Q,
                                 BLOCK_D, BLOCK_DV)
    # dK, dV are written into contiguous (B, H, Tk, D) and (B, H, Tk, Dv) tensors.
    tl.store(DK + (bh * Tk + offs_k[:, None]) * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=(offs_k[:, None] < Tk) & (offs_d[None, :] < D))  # dK = scale * dS^T Q
    tl.store(DV + (bh * Tk + offs_k[:, None]) * Dv + offs_dv[None, :], dv.to(DV.dtype.element_ty),
             mask=(offs_k[:, None] < Tk) & (offs_dv[None, :] < Dv))


@triton.jit
def attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr,
                      stride_kt, stride_kd, stride_vt, stride_vd, stride_mk,
                      Tq, Tk, D, Dv, scale, lo, hi,
                      HAS_MASK: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                      K_NONFINITE: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # Accumulate dQ_i over the key tiles in [lo, hi).
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_k in range(lo, hi, BLOCK_K):
        offs_k = start_k + tl.arange(0, BLOCK_K)
        # (BLOCK_D, BLOCK_K)
        kt = load_tile(k_ptr, offs_d, offs_k, D, Tk, stride_kd, stride_kt)
        # (BLOCK_DV, BLOCK_K)
        vt = load_tile(v_ptr, offs_dv, offs_k, Dv, Tk, stride_vd, stride_vt)
        ok = visible(offs_q[:, None], offs_k[None, :], Tq, Tk, km_ptr, stride_mk,
                     HAS_MASK, MASK_CAUSAL)
        s = tl.dot(q, kt, input_precision="ieee") * scale  # S, (BLOCK_Q, BLOCK_K)
        # P = exp((S - m) - log l)
        p = tl.exp(tl.where(ok, (s - m[:, None]) - log_l[:, None], float("-inf")))
        dp = tl.dot(do, vt, input_precision="ieee")  # dP = dO V^T
        ds = p * (dp - delta[:, None])  # dS = P * (dP - Delta)
        # a hidden key has dS = 0, but 0 * NaN = NaN: its NaN / inf must not enter dQ
        if K_NONFINITE:
            finite = (kt == kt) & (tl.abs(kt) != float("inf"))
            kt = tl.where(finite, kt, 0.0).to(q.dtype)
        # dQ_i += dS K
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision="ieee")
    return dq


@_TUNED_JIT
def attn_bwd_dq(Q, K, V, KM, DO, M, LOGL, DELTA, DQ, stride_qb, stride_qh, stride_qt, stride_qd, stride_kb,
                stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd, stride_gb, stride_gh,
                stride_gt, stride_gd, stride_mb, stride_mh, stride_mk, H, Tq, Tk, D, Dv, scale, TQ_BUCKET, TK_BUCKET,
                HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, K_NONFINITE: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    start_q = tl.program_id(0) * BLOCK_Q
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    bh = b * H + h
    offs_q = start_q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_q, offs_d, Tq, D, stride_qt, stride_qd)  # (BLOCK_Q, BLOCK_D)
    do = load_tile(DO + b * stride_gb + h * stride_gh, offs_q, tl.arange(0, BLOCK_DV), Tq, Dv,
                   stride_gt, stride_gd)  # (BLOCK_Q, BLOCK_DV)
    rows = bh * Tq + offs_q
    m = tl.load(M + rows, mask=offs_q < Tq, other=0.0)
    log_l = tl.load(LOGL + rows, mask=offs_q < Tq, other=0.0)
    delta = tl.load(DELTA + rows, mask=offs_q < Tq, other=0.0)
    k_ptr = K + b * stride_kb + h * stride_kh
    v_ptr = V + b * stride_vb + h * stride_vh
    km_ptr = KM + b * stride_mb + h * stride_mh
    dq = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    if CAUSAL:  # the same two stages as the forward pass
        free_end = tl.minimum((start_q + 1) // BLOCK_K * BLOCK_K, Tk)
    else:
        free_end = Tk
    dq = attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                           stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, 0, free_end, HAS_MASK, False,
                           K_NONFINITE, BLOCK_K, BLOCK_D, BLOCK_DV)
    if CAUSAL:
        dq = attn_bwd_dq_inner(dq, q, do, m, log_l, delta, offs_q, k_ptr, v_ptr, km_ptr, stride_kt, stride_kd,
                               stride_vt, stride_vd, stride_mk, Tq, Tk, D, Dv, scale, free_end,
                               tl.minimum(start_q + BLOCK_Q, Tk), HAS_MASK, True, K_NONFINITE, BLOCK_K, BLOCK_D,
                               BLOCK_DV)
    # dQ is written into a contiguous (B, H, Tq, D) tensor.
    tl.store(DQ + (bh * Tq + offs_q[:, None]) * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=(offs_q[:, None] < Tq) & (offs_d[None, :] < D))  # dQ = scale * dS K


# ---------------------------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------------------------

# On a GPU the tiles of 16-bit inputs are autotuned from a small list of (BLOCK_Q, BLOCK_K,
# num_warps, num_stages) per TUNE_KEY: the lengths' power-of-two buckets (not Tq, Tk themselves,
# so that KV-cache decoding, Tk + 1 at every step, re-tunes only when Tk crosses a power of two),
# the padded head dims, mask and causal. float32 (IEEE products on CUDA cores: slow to compile,
# never fast) uses one small fixed tile. The last entry of each list and the float32 tiles fit
# the 64 KiB of shared memory of a T4 (sm_75) at D = 128; configs that do not fit are skipped by
# the autotuner.
TUNE_KEY = ["TQ_BUCKET", "TK_BUCKET", "BLOCK_D", "BLOCK_DV", "HAS_MASK", "CAUSAL"]


def _tuned(kernel, shapes):
    configs = [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bq, bk, w, s in shapes]
    return triton.autotune(configs=configs, key=TUNE_KEY)(kernel)


KERNELS = {  # name: (kernel, autotuned kernel, float32 tile (BLOCK_Q, BLOCK_K, num_warps, num_stages))
    "fwd": (attn_fwd, _tuned(attn_fwd, [(128, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                                        (64, 32, 4, 2)]), (64, 32, 4, 2)),
    "dkdv": (attn_bwd_dkdv, _tuned(attn_bwd_dkdv, [(32, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2),
                                                   (16, 64, 4, 2), (32, 32, 4, 1)]), (16, 32, 4, 1)),
    "dq": (attn_bwd_dq, _tuned(attn_bwd_dq, [(128, 32, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2), (64, 16, 4, 2),
                                             (32, 32, 4, 1)]), (32, 16, 4, 1)),
}

# @triton.jit reads TRITON_INTERPRET when this module is imported: remember which kind was built.
INTERPRETED = type(attn_fwd).__name__ == "InterpretedFunction"
