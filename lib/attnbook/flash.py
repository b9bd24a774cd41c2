"""Online softmax and exact tiled attention in plain PyTorch: FlashAttention-2 on any device (chapter 09).

``attention_tiled`` never materialises the ``(Tq, Tk)`` score matrix. The outer loop owns a
query tile (``m_i = -inf``, ``l_i = 0``, ``acc = 0``), the inner loop visits key tiles and keeps
a running row max ``m_i`` and row sum ``l_i``, and the epilogue divides by ``l_i``
and returns the log-sum-exp ``lse = m_i + log l_i``. The backward pass recomputes each tile's
``P = exp(S - m_i) / l_i`` from the saved row statistics (FlashAttention-2, Dao 2023, Alg. 2,
which saves their sum ``lse``; keeping ``m_i`` and ``l_i`` apart keeps the recomputed ``P`` as
exact as the forward's at large logits), so training keeps O(T) extra memory instead of O(T^2).

Two implementation choices, both exact: ``q`` (and an additive mask) is pre-multiplied by
``scale * log2(e)`` so the kernel works in base 2 (``exp2`` instead of ``exp``; it saves the
multiplication inside every exponential); ``lse`` is converted back to natural log before it
is returned. The Triton kernel (``triton_flash``) works in natural units with ``exp``.

Masks reach the kernel in two parts: ``blocked`` (bool, True = may NOT attend: a False in a
bool mask or a ``-inf`` in an additive one), applied with ``masked_fill`` so that a hidden key
whose k holds NaN still scores ``-inf``; and ``bias`` (the finite additive mask in base-2 units,
clamped to the dtype's range so that ``finfo.min`` does not overflow to ``-inf``).
"""
from __future__ import annotations

import math

import torch

from ._checks import attention_kernel, check_bool, check_int, check_tensor
from ._policy import DOUBLE_BACKWARD_ERROR, at_least_2d, propagate_nonfinite_tiled
from .reference import AttentionResult, has_nonfinite

__all__ = ["attention_tiled", "default_blocks", "online_softmax", "tiled_backward", "tile_schedule",
           "tiled_forward"]

LOG2E = 1.0 / math.log(2.0)  # exp(x) = 2 ** (x * LOG2E)
LN2 = math.log(2.0)
NEG_INF = float("-inf")


def online_softmax(x: torch.Tensor, *, block: int = 64) -> torch.Tensor:
    """Softmax over the last dim with statistics gathered block by block (chapter 09).

    One pass over the blocks keeps the running max and sum:
    ``m' = max(m, rowmax(x_b))``, ``l' = exp(m - m') * l + rowsum(exp(x_b - m'))``;
    then ``softmax(x) = exp(x - m) / l``. Rows that are all ``-inf`` give zeros.

    Args:
        x: floating tensor ``(..., N)``; float16/bfloat16 are computed in float32.
        block: how many columns each step reads (int >= 1).
    Returns:
        ``(..., N)`` in the dtype of ``x``.
    """
    check_tensor("x", x, fn="online_softmax", min_ndim=1)
    block = check_int("block", block, fn="online_softmax")
    xc = x if x.dtype in (torch.float32, torch.float64) else x.float()
    # running max (..., 1)
    m_i = torch.full(xc.shape[:-1] + (1,), NEG_INF, dtype=xc.dtype, device=xc.device)
    l_i = torch.zeros_like(m_i)  # running sum (..., 1)
    for j0 in range(0, xc.shape[-1], block):
        xb = xc[..., j0:j0 + block]  # (..., b)
        # m_i' = max(m_i, rowmax(x_b))
        m_new = torch.maximum(m_i, xb.amax(-1, keepdim=True))
        # no finite entry yet: exp(-inf - 0) = 0, not NaN
        m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
        alpha = torch.exp(m_i - m_safe)  # rescales what was summed so far
        # l_i' = alpha * l_i + rowsum(exp(x_b - m_i'))
        l_i = alpha * l_i + torch.exp(xb - m_safe).sum(-1, keepdim=True)
        m_i = m_new
    m_safe = m_i.masked_fill(m_i == NEG_INF, 0.0)
    # all -inf row: 0 / 1 = 0
    out = torch.exp(xc - m_safe) / l_i.masked_fill(l_i == 0, 1.0)
    return out.to(x.dtype)


def default_blocks(tq: int, tk: int) -> tuple[int, int]:
    """Tile sizes used when ``block_q`` / ``block_k`` are None (rule of PyTorch's CPU flash kernel).

    ``block_q = 256`` if ``Tq >= 768``, ``64`` if ``Tq >= 192``, else ``32``; ``block_k = 512``
    (the last tile of each axis is simply shorter, so ``Tk`` does not change the rule).
    Large tiles matter more here than in C++: each tile costs a dozen PyTorch calls, so with
    64 x 64 tiles the Python overhead dominates; a 256 x 512 float32 tile is 512 KiB per
    (batch, head) and its matrix products run near the CPU's peak.
    """
    tq, tk = check_int("tq", tq, fn="default_blocks", minimum=0), check_int("tk", tk, fn="default_blocks", minimum=0)
    block_q = 256 if tq >= 768 else 64 if tq >= 192 else 32
    return block_q, 512


def _key_starts(i0: int, i1: int, tk: int, block_k: int, causal: bool) -> range:
    """First key of every key tile that query rows ``i0 .. i1-1`` visit (causal: keys ``j < i1``)."""
    return range(0, min(tk, i1) if causal else tk, block_k)


def tile_schedule(tq: int, tk: int, block_q: int, block_k: int, *, causal: bool = False) -> list[tuple[int, int]]:
    """The ``(query tile, key tile)`` index pairs ``attention_tiled`` computes, in loop order.

    Without ``causal`` that is all ``ceil(Tq/block_q) * ceil(Tk/block_k)`` pairs; with it the
    tiles entirely above the diagonal (every key after every query) are skipped, so for
    ``Tq = Tk = n * b`` and square ``b x b`` tiles only ``n (n + 1) / 2`` remain.
    """
    tq = check_int("tq", tq, fn="tile_schedule", minimum=0)
    tk = check_int("tk", tk, fn="tile_schedule", minimum=0)
    causal = check_bool("causal", causal, fn="tile_schedule")
    check_int("block_q", block_q, fn="tile_schedule")
    check_int("block_k", block_k, fn="tile_schedule")
    return [
        (i0 // block_q, j0 // block_k)
        for i0 in range(0, tq, block_q)
        for j0 in _key_starts(i0, min(i0 + block_q, tq), tk, block_k, causal)
    ]


def _mask_tile(s, masks, lead, i0, j0, causal):
    """Mask one score tile ``s`` (G, n, m) in place: add the bias, then hide blocked keys."""
    n, m = s.shape[-2:]
    blocked, bias = masks
    s4 = s.view(*lead, n, m)  # (..., n, m)
    if bias is not None:
        s4.add_(bias[..., i0:i0 + n, j0:j0 + m])  # additive mask, in base-2 units
    if blocked is not None:
        s4.masked_fill_(blocked[..., i0:i0 + n, j0:j0 + m], NEG_INF)
    if causal and j0 + m - 1 > i0:  # only tiles that straddle the diagonal need the mask
        above = torch.ones(n, m, dtype=torch.bool, device=s.device).triu_(i0 - j0 + 1)  # key j > query i
        s.masked_fill_(above, NEG_INF)


def tiled_forward(q, k, v, masks, lead, causal, block_q, block_k):
    """FlashAttention-2 forward over tiles (chapter 09; inside :func:`attention_tiled`).

    q (G, Tq, D) pre-scaled by scale*log2(e), k (G, Tk, D), v (G, Tk, Dv).

    Returns ``out`` (G, Tq, Dv) and the row statistics ``row_max`` (G, Tq), the row max
    of the base-2 scores, and ``row_sum`` (G, Tq), the row sum of ``2^(S - row_max)``:
    the base-2 log-sum-exp is ``row_max + log2(row_sum)`` (``-inf`` for a row with no
    allowed key, where ``row_max = -inf`` and ``row_sum = 0``).
    """
    g, tq, tk, dv = q.shape[0], q.shape[1], k.shape[1], v.shape[-1]
    kt = k.transpose(1, 2)  # (G, D, Tk)
    out = q.new_zeros((g, tq, dv))
    row_max, row_sum = q.new_full((g, tq), NEG_INF), q.new_zeros((g, tq))
    # no query, no key or no (batch, head): empty rows (out = 0, lse = -inf)
    if g * tq * tk == 0:
        return out, row_max, row_sum
    # one score tile, reused
    s_buf = q.new_empty(g * min(block_q, tq) * min(block_k, tk))
    for i0 in range(0, tq, block_q):
        q_i = q[:, i0:i0 + block_q]  # (G, n, D)
        n = q_i.shape[1]
        m_i = q.new_full((g, n, 1), NEG_INF)  # running row max
        l_i = q.new_zeros((g, n, 1))  # running row sum
        acc = q.new_zeros((g, n, dv))  # unnormalised output (G, n, Dv)
        for j0 in _key_starts(i0, i0 + n, tk, block_k, causal):
            # (G, D, m), (G, m, Dv)
            kt_j, v_j = kt[:, :, j0:j0 + block_k], v[:, j0:j0 + block_k]
            # S_ij (G, n, m)
            s = torch.bmm(q_i, kt_j, out=s_buf[: g * n * kt_j.shape[-1]].view(g, n, -1))
            _mask_tile(s, masks, lead, i0, j0, causal)
            # m_i' = max(m_i, rowmax(S_ij))
            m_new = torch.maximum(m_i, s.amax(-1, keepdim=True))
            # no key yet: 2^(-inf - 0) = 0, not NaN
            m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
            alpha = torch.exp2(m_i - m_safe)  # rescales what was summed so far
            p = s.sub_(m_safe).exp2_()  # P_ij = 2^(S_ij - m_i')
            # l_i' = alpha * l_i + rowsum(P_ij)
            l_i.mul_(alpha).add_(p.sum(-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(p, v_j)  # acc' = alpha * acc + P_ij V_j
            m_i = m_new
        # O_i = acc / l_i; empty row: 0
        out[:, i0:i0 + n] = acc.div_(l_i.masked_fill(l_i == 0, 1.0))
        row_max[:, i0:i0 + n], row_sum[:, i0:i0 + n] = m_i.squeeze(-1), l_i.squeeze(-1)
    return out, row_max, row_sum  # (G, Tq, Dv), (G, Tq), (G, Tq)


def tiled_backward(q, k, v, out, row_max, row_sum, dout, masks, lead, causal, scale,
                   block_q, block_k, dmask=None, dlse=None):
    """FlashAttention-2 backward (chapter 09): recompute P_ij = 2^(S_ij - m_i) / l_i.

    Tile by tile. Shapes as ``tiled_forward``; ``dlse`` (G, Tq) or None is the gradient
    reaching the log-sum-exp: since d lse_i / d S_ij = P_ij, it enters as D_i - dlse_i
    (as in the Triton kernel).

    q here is the unscaled query; returns dq, dk, dv in the compute dtype. If ``dmask``
    (G, Tq, Tk) is given, the score gradients dS_ij (the gradient of an additive mask)
    are written into it. Each tile's scores are recomputed exactly as the forward
    computed them (S = Q K^T, then the mask, then minus the row max): folding the row
    max into the product first would turn a row soft-masked with -1e9 into large
    positive exponents. The row max and row sum are used apart, never as one
    ``lse = m + log2(l)``: at logits of 1e3 to 1e4 a float32 ``lse`` is rounded by ~1e-4
    to 1e-3, which ``2^(S - lse)`` would turn into a relative error of that size in
    every recomputed P_ij, while ``S - m`` is as exact as in the forward pass. The 1/l_i
    factor is folded into dO_i and D_i once per row instead of into every tile.
    """
    g, tq, tk = q.shape[0], q.shape[1], k.shape[1]
    qs = q * (scale * LOG2E)  # (G, Tq, D)
    # dQ_i = sum_j dS_ij K_j: a hidden key has dS_ij = 0, but 0 * NaN = NaN if its k
    # holds NaN.
    k_for_dq = k.masked_fill(~torch.isfinite(k), 0.0) if has_nonfinite(k) else k
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # (G, D, Tk), (G, Dv, Tk)
    empty_row = row_max == NEG_INF
    # empty row: every 2^(-inf - 0) = 0  (G, Tq, 1)
    row_max = row_max.masked_fill(empty_row, 0.0).unsqueeze(-1)
    # 1 / l_i
    inv_l = torch.where(row_sum > 0, 1.0 / row_sum.masked_fill(row_sum == 0, 1.0), 0.0)
    inv_l = inv_l.unsqueeze(-1)
    dout = dout * inv_l  # dO_i / l_i  (G, Tq, Dv)
    # -D_i / l_i, D_i = rowsum(dO_i * O_i)  (G, Tq, 1)
    neg_delta = -(dout * out).sum(-1, keepdim=True)
    if dlse is not None:  # lse_i depends on S_ij through P_ij: -(D_i - dlse_i) / l_i
        neg_delta = neg_delta + torch.where(inv_l > 0, dlse.unsqueeze(-1) * inv_l, 0.0)
    dq = [q.new_zeros((g, min(block_q, tq - i0), q.shape[-1]))
          for i0 in range(0, tq, block_q)]
    dks, dvs = [], []
    for j0 in range(0, tk, block_k):  # FA2 backward: the outer loop owns a key tile
        kt_j, vt_j = kt[:, :, j0:j0 + block_k], vt[:, :, j0:j0 + block_k]
        m = kt_j.shape[-1]
        dk_j = k.new_zeros((g, m, k.shape[-1]))  # (G, m, D)
        dv_j = v.new_zeros((g, m, v.shape[-1]))  # (G, m, Dv)
        # causal: queries i < j0 see no key here
        first_q = (j0 // block_q) * block_q if causal else 0
        for i0 in range(first_q, tq, block_q):
            sl = slice(i0, i0 + block_q)
            n = dq[i0 // block_q].shape[1]
            s = torch.bmm(qs[:, sl], kt_j)  # S_ij (G, n, m), as in the forward
            _mask_tile(s, masks, lead, i0, j0, causal)
            p = s.sub_(row_max[:, sl]).exp2_()  # l_i P_ij = 2^(S_ij - m_i), recomputed
            # dV_j += (l_i P_ij)^T (dO_i / l_i) = P_ij^T dO_i
            dv_j.baddbmm_(p.transpose(1, 2), dout[:, sl])
            # (dP_ij - D_i) / l_i
            dp = torch.baddbmm(neg_delta[:, sl].expand(g, n, m), dout[:, sl], vt_j)
            # (dP_ij = dO_i V_j^T; the 1/l_i comes with dout, it turns 2^(S_ij - m_i)
            # into P_ij below)
            ds = dp.mul_(p)  # dS_ij = P_ij * (dP_ij - D_i)
            if dmask is not None:
                # d mask_ij = dS_ij: the mask is added to S
                dmask[:, sl, j0:j0 + m] = ds
            # dQ_i += dS_ij K_j (times scale below)
            dq[i0 // block_q].baddbmm_(ds, k_for_dq[:, j0:j0 + m])
            # dK_j += dS_ij^T Q_i   (times scale below)
            dk_j.baddbmm_(ds.transpose(1, 2), q[:, sl])
        dks.append(dk_j.mul_(scale))
        dvs.append(dv_j)
    dq = torch.cat(dq, 1).mul_(scale) if dq else q.new_zeros(q.shape)
    dk = torch.cat(dks, 1) if dks else k.new_zeros(k.shape)
    dv = torch.cat(dvs, 1) if dvs else v.new_zeros(v.shape)
    return dq, dk, dv


_forward, _backward = tiled_forward, tiled_backward  # the names chapter 09 showed before issue 30


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _flatten(t, dtype):
    return t.to(dtype).reshape(math.prod(t.shape[:-2]), t.shape[-2], t.shape[-1])  # (G, T, D)


def _split_mask(mask, tq, tk, dtype):
    """The user's mask as the kernel's ``(blocked, bias)``, each None or viewed as (..., Tq, Tk).

    ``blocked``: True = may NOT attend (a bool mask inverted, or where an additive mask is -inf);
    ``bias``: an additive mask in base-2 units (times log2 e), -inf entries set to 0 (they are
    blocked), clamped to the dtype's finite range: ``finfo.min * log2(e)`` would overflow to -inf
    and turn the Hugging Face convention (a finite ``finfo.min`` mask) into a hard mask.
    """
    if mask is None:
        return None, None
    mask = at_least_2d(mask)
    if mask.dtype == torch.bool:
        blocked, bias = ~mask, None
    else:
        mask = mask.detach().to(dtype)
        hidden = torch.isneginf(mask)
        blocked = hidden if bool(hidden.any()) else None
        big = torch.finfo(dtype).max
        bias = (mask.masked_fill(hidden, 0.0) * LOG2E).clamp_(-big, big)
    view = lambda t: None if t is None else t.expand(*t.shape[:-2], tq, tk)  # noqa: E731 (stride-0 views)
    return view(blocked), view(bias)


class _TiledAttention(torch.autograd.Function):
    """Custom autograd: forward saves q, k, v, out, the row max and row sum (and the user's mask);
    backward recomputes the tiles."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, block_q, block_k):
        cdt = _compute_dtype(q.dtype)
        lead, tq, tk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
        q3, k3, v3 = _flatten(q, cdt), _flatten(k, cdt), _flatten(v, cdt)  # (G, T, D)
        masks = _split_mask(mask, tq, tk, cdt)
        out, row_max, row_sum = tiled_forward(q3 * (scale * LOG2E), k3, v3, masks, lead, causal, block_q, block_k)
        out = out.reshape(*lead, tq, v.shape[-1])  # (..., Tq, Dv)
        lse = ((row_max + torch.log2(row_sum)) * LN2).reshape(*lead, tq)  # natural log (..., Tq); empty row: -inf
        ctx.save_for_backward(q, k, v, out, row_max, row_sum, mask)
        ctx.config = (causal, scale, block_q, block_k)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if torch.is_grad_enabled():  # create_graph=True: a second derivative is being asked for
            raise RuntimeError(DOUBLE_BACKWARD_ERROR.format(fn="attention_tiled"))
        q, k, v, out, row_max, row_sum, mask = ctx.saved_tensors
        causal, scale, block_q, block_k = ctx.config
        cdt = out.dtype
        lead, tq, tk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
        # A float mask that requires grad (a learned bias): its gradient is dS, a (..., Tq, Tk) tensor.
        dmask = out.new_zeros((math.prod(lead), tq, tk)) if ctx.needs_input_grad[3] else None
        if math.prod(lead) * tq * tk == 0:  # nothing was attended: every gradient is 0
            dq, dk, dv = q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
        else:
            dlse = None if dlse is None else dlse.reshape(-1, tq).to(cdt)  # (G, Tq)
            dq, dk, dv = tiled_backward(
                _flatten(q, cdt), _flatten(k, cdt), _flatten(v, cdt), _flatten(out, cdt), row_max, row_sum,
                _flatten(dout, cdt), _split_mask(mask, tq, tk, cdt), lead, causal, scale, block_q, block_k, dmask,
                dlse,
            )
        if dmask is not None:  # summed over the dims the mask was broadcast along
            dmask = dmask.reshape(*lead, tq, tk).sum_to_size(mask.shape).to(mask.dtype)
        return (dq.reshape(q.shape).to(q.dtype), dk.reshape(k.shape).to(k.dtype),
                dv.reshape(v.shape).to(v.dtype), dmask, None, None, None, None)


@attention_kernel
def attention_tiled(q, k, v, *, mask=None, causal=False, scale=None, block_q=None,
                    block_k=None):
    """Exact attention computed tile by tile with an online softmax (chapter 09).

    Introduced in chapter 04.

    For each query tile Q_i and key tile (K_j, V_j):
    ``S_ij = scale * Q_i K_j^T (+ mask)``, ``m_i' = max(m_i, rowmax S_ij)``,
    ``P_ij = exp(S_ij - m_i')``, ``l_i' = exp(m_i - m_i') l_i + rowsum P_ij``,
    ``acc' = exp(m_i - m_i') acc + P_ij V_j``; finally ``O_i = acc / l_i`` and
    ``lse_i = m_i + log l_i``. Equal to ``softmax(Q K^T * scale + mask) V`` up to
    rounding. Gradients come from a custom backward that recomputes
    ``P_ij = exp(S_ij - m_i) / l_i``.

    Float16/bfloat16 inputs are computed in float32 (``out`` is returned in the input
    dtype); float32/float64 are computed in their own dtype. Runs on the device of its
    inputs.

    Args:
        q: ``(..., Tq, D)``; k: ``(..., Tk, D)``; v: ``(..., Tk, Dv)`` (same leading
            dims).
        mask: bool (True = may attend) or additive float, broadcastable to
            ``(..., Tq, Tk)``. A float mask that requires grad (a learned bias) gets its
            gradient dS; that one gradient is a ``(..., Tq, Tk)`` tensor, so only then
            is O(Tq Tk) memory used.
        causal: forbid key j > query i (top-left aligned when Tq != Tk); tiles entirely
            above the diagonal are skipped, see :func:`tile_schedule`.
        scale: softmax scale, default ``1/sqrt(D)``.
        block_q, block_k: tile sizes (ints >= 1); None picks :func:`default_blocks`
            (256 x 512 for long sequences: 64 x 64 tiles spend most of the time in
            Python overhead).
    Returns:
        :class:`~attnbook.reference.AttentionResult` ``(out, lse, weights=None)``:
        ``out`` ``(..., Tq, Dv)`` in the input dtype and the natural-log log-sum-exp
        ``lse (..., Tq)`` in the compute dtype (differentiable, the rule of every
        kernel: see ``attnbook.attention``). A query row with no allowed key gets
        ``out = 0``, ``lse = -inf`` and zero gradients; a key the mask hides never
        reaches the output, even if its k or v holds NaN / inf. First
        derivatives only: a double backward (``create_graph=True``) raises a
        RuntimeError.
        Arguments are validated by ``@attention_kernel``, which also resolves ``scale``.
    """
    tq, tk = q.shape[-2], k.shape[-2]
    auto_q, auto_k = default_blocks(tq, tk)
    fn = "attention_tiled"
    block_q = auto_q if block_q is None else check_int("block_q", block_q, fn=fn)
    block_k = auto_k if block_k is None else check_int("block_k", block_k, fn=fn)
    # hidden keys: weight 0 times 0, not 0 * NaN (the visible ones are put back below)
    clean_v = v.masked_fill(~torch.isfinite(v.detach()), 0.0) if has_nonfinite(v) else v
    out, lse = _TiledAttention.apply(q, k, clean_v, mask, causal, scale, block_q,
                                     block_k)
    if clean_v is not v:
        out = propagate_nonfinite_tiled(out, v, mask, causal, block_q)
    return AttentionResult(out, lse, None)
