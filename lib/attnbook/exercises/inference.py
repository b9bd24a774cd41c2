"""Chapter 12's exercises ``ch12.ring_worker`` (a build exercise) and ``ch12.mla_absorb``.

``ring_worker(q, q0, k_blocks, v_blocks, k_starts, causal=False)``: one worker of ring
attention. It keeps its query block ``q`` ``(B, H, Tq, D)`` (global positions
``q0 .. q0 + Tq - 1``) while key/value blocks arrive one at a time: ``k_blocks[b]``
``(B, H, Tb, D)``, ``v_blocks[b]`` ``(B, H, Tb, Dv)`` at global positions ``k_starts[b] ..``.
For each block it computes the block's attention ``(O_b, lse_b)`` (scale ``1/sqrt(D)``;
causal: key position <= query position, both global) and merges it into the running result with chapter 09's merge:
``lse = logaddexp(lse, lse_b)``, ``O = exp(lse_old - lse) O + exp(lse_b - lse) O_b``. Returns
``(out, lse)`` over the union of the blocks; a query row that sees no key has ``out = 0`` and
``lse = -inf``. The classic bugs average the block outputs, forget to rescale the old output,
use positions inside the block instead of global ones, give a fully masked block ``lse = 0``,
drop the scale, or get ``exp(-inf - (-inf)) = NaN`` for a row that has seen nothing yet.

``mla_absorb(w_uk, w_uv, w_o, n_heads)``: multi-head latent attention's absorbed matrices
(DeepSeek-V2, section 2.1). Row-vector convention: ``k^C = c W^UK``, ``v^C = c W^UV`` with
``W^UK, W^UV`` ``(d_c, H d_h)`` (head i: columns ``i d_h .. (i+1) d_h - 1``), ``W^O``
``(H d_h, d_model)`` (head i: those rows). Returns ``(W_q_lat (H, d_h, d_c), W_o_lat (H, d_c,
d_model))`` with ``W_q_lat[i] = W^UK_i^T`` (a head's content query times it is that query in the
latent space) and ``W_o_lat[i] = W^UV_i W^O_i``. The bugs split the heads the wrong way (in the
up-projections or in ``W^O``), fold every head into one matrix, forget the transpose, or use
``W^UK`` where ``W^UV`` belongs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import dispatch, flash, mla, reference, ring
from ._core import Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- ring_worker
def _block(q, k, v, q0, k0, causal, *, positions="global", masked_lse=NEG_INF, scale=True):
    """One block's ``(O_b, lse_b)``: attention of the query block over one key/value block."""
    tq, tk = q.shape[-2], k.shape[-2]
    i = torch.arange(tq)[:, None] + (q0 if positions == "global" else 0)
    j = torch.arange(tk)[None, :] + (k0 if positions == "global" else 0)
    if causal and positions == "global" and k0 > q0 + tq - 1:      # the whole block is later
        return (q.new_zeros(*q.shape[:-1], v.shape[-1]),
                q.new_full(q.shape[:-1], masked_lse))
    s = q @ k.transpose(-2, -1)                                    # (B, H, Tq, Tb)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~(j <= i), NEG_INF)
    lse = torch.logsumexp(s, -1)                                   # -inf where nothing is seen
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    return p @ v, lse


def _ring(q, q0, k_blocks, v_blocks, k_starts, causal=False, *, merge="exact", guard=True,
          **block_kw):
    """The worker's loop, with the choices a bug may get wrong."""
    dv = v_blocks[0].shape[-1]
    out = q.new_zeros(*q.shape[:-1], dv)                           # O = 0
    lse = q.new_full(q.shape[:-1], NEG_INF)                        # lse = -inf
    outs = []
    for k, v, k0 in zip(k_blocks, v_blocks, k_starts):
        o_b, lse_b = _block(q, k, v, q0, k0, causal, **block_kw)
        outs.append(o_b)
        new = torch.logaddexp(lse, lse_b)
        ref = new.masked_fill(torch.isneginf(new), 0.0) if guard else new
        w_old = torch.exp(lse - ref)[..., None] if merge != "no_rescale" else 1.0
        out = w_old * out + torch.exp(lse_b - ref)[..., None] * o_b
        lse = new
    if merge == "average":
        out = torch.stack(outs).mean(0)
    return out, lse


def ring_worker(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """One ring-attention worker: its query block over key/value blocks arriving one by one
    (chapter 12, exercise).

    Args: q ``(B, H, Tq, D)`` at global positions ``q0 ..``; k_blocks, v_blocks: lists of
    ``(B, H, Tb, D)``, ``(B, H, Tb, Dv)`` in the order they arrive, block b at global positions
    ``k_starts[b] ..``; causal: key position <= query position (global). Returns
    ``(out (B, H, Tq, Dv), lse (B, H, Tq))``; a row that sees no key: ``out = 0``, ``lse = -inf``.
    """
    return _ring(q, q0, k_blocks, v_blocks, k_starts, causal)


def _ring_bug(**kw):
    def bug(q, q0, k_blocks, v_blocks, k_starts, causal=False):
        return _ring(q, q0, k_blocks, v_blocks, k_starts, causal, **kw)
    return bug


RING_BUGS = {
    "outputs_averaged": _ring_bug(merge="average"),
    "old_output_not_rescaled": _ring_bug(merge="no_rescale"),
    "local_positions": _ring_bug(positions="local"),
    "masked_block_lse_zero": _ring_bug(masked_lse=0.0),
    "scale_forgotten": _ring_bug(scale=False),
    "nan_when_a_row_has_seen_nothing": _ring_bug(guard=False),
}


def _ring_case(g, b, h, lengths, rank, *, order="ring", d=None, dv=None, scale=1.0,
               row_scales=False, dtype=torch.float64, drop=()):
    """A worker's query block and the blocks it receives, cut from one sequence of the given
    block ``lengths``; ``rank``'s block holds the queries. ``order="ring"``: its own block
    first, then ranks r-1, r-2, ... (as they travel round the ring); ``drop``: ranks whose block
    has not arrived."""
    d = d or 4 + 2 * int(torch.randint(0, 3, (1,), generator=g))
    dv = dv or d
    t = sum(lengths)
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, t, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, t, dv, generator=g, dtype=torch.float64)
    if row_scales:                                     # rows of very different scale
        f = torch.logspace(-1, 1.3, t, dtype=torch.float64)
        q = q * f[torch.randperm(t, generator=g)][:, None]
    starts = [sum(lengths[:r]) for r in range(len(lengths))]
    p = len(lengths)
    ranks = [(rank - s) % p for s in range(p)] if order == "ring" else list(order)
    ranks = [r for r in ranks if r not in drop]
    sl = lambda r: slice(starts[r], starts[r] + lengths[r])           # noqa: E731
    return (q[:, :, sl(rank)].to(dtype), starts[rank], [k[:, :, sl(r)].to(dtype) for r in ranks],
            [v[:, :, sl(r)].to(dtype) for r in ranks], [starts[r] for r in ranks])


def _partial_case(g, tq, d=6):
    """Queries at q0 .. q0 + tq - 1; a later block, then one that starts at the third query."""
    q0 = 2 + int(torch.randint(0, 5, (1,), generator=g))
    q = torch.randn(1, 2, tq, d, generator=g, dtype=torch.float64)

    def kv(t):
        return (torch.randn(1, 2, t, d, generator=g, dtype=torch.float64),
                torch.randn(1, 2, t, d, generator=g, dtype=torch.float64))
    (k1, v1), (k2, v2) = kv(3), kv(tq)
    return q, q0, [k1, k2], [v1, v2], [q0 + tq, q0 + 2]


def _ring_cases(g):
    def n(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))
    a, c = n(3, 6), n(2, 5)
    return [
        Case("不带因果掩码，两块", _ring_case(g, 1, 1, [a, a], 0),
             note=f"两个 worker，每块 {a} 个位置；这是 worker 0：先算自己的块，再算 worker 1 的。"),
        Case("因果，三块长度不等，worker 1", (*_ring_case(g, 1, 2, [a + 1, a, c], 1), True),
             note="块的顺序是 worker 1、0、2（沿环传来的顺序）；worker 2 的块整块在这些查询之后。",
             tags=frozenset({"causal"})),
        Case("因果，worker 0 收到的都在它之后", (*_ring_case(g, 2, 1, [c, a, a + 1], 0), True),
             note="worker 0 的查询只能看自己的块：后面两块整块被屏蔽。", tags=frozenset({"causal"})),
        Case("因果，还没收到自己的块", (*_ring_case(g, 1, 2, [a, c + 2, a], 1, order=(2, 0),
                                                   dv=3), True),
             note="先到的是 worker 2 的块（整块在后面），再是 worker 0 的；查询还没看过自己的块。",
             tags=frozenset({"causal", "unseen"})),
        Case("查询的一部分行什么都看不到", (*_partial_case(g, a + 3), True),
             note="后面的块先到（整块被屏蔽）；再到的块从第 3 个查询的位置开始：前两行一个键也看不到，"
                  "应输出 0、lse = −inf。", tags=frozenset({"causal", "unseen"})),
        Case("参数 causal 取默认值，四块", _ring_case(g, 2, 2, [a, a, a - 1, a - 1], 2, dv=5),
             note="不传 causal（默认 False）；B = 2，H = 2，d_v = 5。"),
        Case("分数很大（float32）", (*_ring_case(g, 1, 2, [a + 2, a + 1, a], 2, scale=6.0,
                                                dtype=torch.float32), True),
             note="q、k 的元素放大 6 倍：分数可达上百，不能直接 exp。", tags=frozenset({"causal"})),
        Case("各行尺度相差很大（float32）", (*_ring_case(g, 1, 1, [5, 4, 4], 1, row_scales=True,
                                                      dtype=torch.float32), True),
             note="查询各行乘以 0.1 到 20 之间的不同倍数。", tags=frozenset({"causal"})),
    ]


def _ring_run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return ret, {"out": ret[0], "lse": ret[1]}
    return ret, {"out": ret}


def _ring_hint(f):
    args = [f.inputs[n] for n in ("q", "q0", "k_blocks", "v_blocks", "k_starts")]
    causal = f.inputs.get("causal", False)
    if f.kind == "nan" and "unseen" in f.case.tags:
        return ("第一块整块被屏蔽时，这些行的 lse 和 lse_b 都是 −inf，exp(lse − lse_new) = "
                "exp(−inf − (−inf)) = NaN：合并前把仍是 −inf 的 lse_new 换成 0 再做减法"
                "（这时两个权重都是 0，输出保持 0）。")
    if f.kind != "value":
        return None

    def bug(name):
        return RING_BUGS[name](*args, causal)[0 if f.label == "out" else 1]
    if close(f.got, bug("outputs_averaged")):
        return ("各块的输出不能平均：每块的权重是它的指数和占总和的比例 exp(lse_b − lse)，"
                "不是 1/块数。")
    if close(f.got, bug("old_output_not_rescaled")):
        return ("新块合并进来时，之前累积的输出也要乘以 exp(lse_old − lse_new)：它是按旧的 lse "
                "归一化的，总 lse 变大以后它所占的比例变小了。")
    if causal and close(f.got, bug("local_positions")):
        return ("因果掩码要用全局位置：查询 i 在 q0 + i，块里的键 j 在 k0 + j，可见当且仅当 "
                "k0 + j ≤ q0 + i；块内的下标 j ≤ i 只在 q0 = k0 时才对。")
    if causal and close(f.got, bug("masked_block_lse_zero")):
        return ("整块都在查询之后（被屏蔽）的块，lse_b 应是 −inf（没有任何键：log 0），不是 0："
                "lse_b = 0 等于凭空多出一个分数为 0、输出为 0 的键，把结果拉向 0。")
    if close(f.got, bug("scale_forgotten")):
        return "分数要乘以 1/√d（d 是 q 的最后一维），每一块都一样。"
    return ("对照：每块 O_b = softmax(q k_bᵀ/√d) v_b、lse_b = logsumexp(q k_bᵀ/√d)，"
            "再合并 lse = logaddexp(lse, lse_b)，O = exp(lse_old − lse)·O + exp(lse_b − lse)·O_b。")


_RING_OFF = ((ring.merge_partials, "attnbook.ring.merge_partials"),
             (ring.ring_attention, "attnbook.ring.ring_attention"),
             (ring.ring_attention_simulated, "attnbook.ring.ring_attention_simulated"),
             (ring._ring_loop, "attnbook.ring._ring_loop"),
             (ring._block, "attnbook.ring._block"),
             (reference.attention_ref, "attnbook.attention_ref"),
             (dispatch.attention, "attnbook.attention"),
             (flash.attention_tiled, "attnbook.flash.attention_tiled"),
             (F.scaled_dot_product_attention, "F.scaled_dot_product_attention"))

register(Exercise("ch12.ring_worker", "环形注意力的一个 worker", ring_worker, RING_BUGS,
                  _ring_cases, (_ring_hint,), run=_ring_run, forbidden=_RING_OFF, build=True))


# --------------------------------------------------------------------------- mla_absorb
def _absorb(w_uk, w_uv, w_o, n_heads, *, split="head_major", o_split="head_major",
            transpose=True, per_head=True, uv="uv"):
    dc, hd = w_uk.shape
    h = n_heads
    dh = hd // h

    def heads(w):                                                  # (d_c, H d_h) -> (H, d_c, d_h)
        if split == "head_major":
            return w.reshape(dc, h, dh).permute(1, 0, 2)
        return w.reshape(dc, dh, h).permute(2, 0, 1)               # columns i, i + H, ...
    uk = heads(w_uk)
    uvh = heads(w_uk if uv == "uk" else w_uv)                      # (H, d_c, d_h)
    if o_split == "head_major":
        oh = w_o.reshape(h, dh, -1)                                # (H, d_h, d_model)
    else:
        oh = w_o.reshape(dh, h, -1).transpose(0, 1)
    q_lat = uk.transpose(1, 2) if transpose else uk                # W^UK_i^T (H, d_h, d_c)
    o_lat = uvh @ oh                                               # W^UV_i W^O_i
    if not per_head:
        o_lat = o_lat.sum(0)                                       # (d_c, d_model)
    return q_lat, o_lat


def mla_absorb(w_uk, w_uv, w_o, n_heads):
    """MLA's absorbed matrices (chapter 12, exercise): ``(W_q_lat (H, d_h, d_c),
    W_o_lat (H, d_c, d_model))``, ``W_q_lat[i] = W^UK_i^T``, ``W_o_lat[i] = W^UV_i W^O_i``.

    Args: w_uk, w_uv ``(d_c, H d_h)`` (head i: columns ``i d_h ..``), w_o ``(H d_h, d_model)``
    (head i: those rows), n_heads H. Row-vector convention (``k^C = c W^UK``).
    """
    return _absorb(w_uk, w_uv, w_o, n_heads)


MLA_BUGS = {
    "heads_interleaved": lambda w_uk, w_uv, w_o, n_heads: _absorb(w_uk, w_uv, w_o, n_heads,
                                                                  split="interleaved"),
    "output_rows_interleaved": lambda w_uk, w_uv, w_o, n_heads: _absorb(
        w_uk, w_uv, w_o, n_heads, o_split="interleaved"),
    "one_matrix_for_all_heads": lambda w_uk, w_uv, w_o, n_heads: _absorb(
        w_uk, w_uv, w_o, n_heads, per_head=False),
    "uk_not_transposed": lambda w_uk, w_uv, w_o, n_heads: _absorb(w_uk, w_uv, w_o, n_heads,
                                                                  transpose=False),
    "uk_used_for_values": lambda w_uk, w_uv, w_o, n_heads: _absorb(w_uk, w_uv, w_o, n_heads,
                                                                   uv="uk"),
}


def _mla_case(g, h, dh, dc, dm, *, head_scales=False, dtype=torch.float64):
    def w(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[0])
    w_uk, w_uv, w_o = w(dc, h * dh), w(dc, h * dh), w(h * dh, dm)
    if head_scales:                                                # heads of very different scale
        f = torch.logspace(-1, 1, h, dtype=torch.float64).repeat_interleave(dh)
        w_uk, w_o = w_uk * f, w_o * f[:, None]
    return tuple(x.to(dtype) for x in (w_uk, w_uv, w_o)) + (h,)


def _mla_cases(g):
    def n(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))
    dh = n(2, 5)
    return [
        Case("两个头", _mla_case(g, 2, dh, dh + 3, 2 * dh + 5),
             note=f"H = 2，d_h = {dh}，d_c = {dh + 3}。"),
        Case("d_c = d_h", _mla_case(g, 3, dh + 1, dh + 1, 5),
             note="潜在维度和每头的维度相等：转置错了形状也对。"),
        Case("各头尺度相差很大", _mla_case(g, 4, dh, 2 * dh + 1, 7, head_scales=True),
             note="第 i 个头的 W^UK 列和 W^O 行乘以 0.1 到 10 之间的不同倍数。"),
        Case("一个头", _mla_case(g, 1, dh + 2, 3, 4), note="H = 1：分头的方式不影响结果。"),
        Case("float32，头多", _mla_case(g, n(5, 8), 2, 6, 9, dtype=torch.float32)),
    ]


def _mla_run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return ret, {"W_q_lat": ret[0], "W_o_lat": ret[1]}
    return ret, {"W_q_lat": ret}


def _mla_hint(f):
    w_uk, w_uv, w_o, h = (f.inputs[n] for n in ("w_uk", "w_uv", "w_o", "n_heads"))
    dc, hd = w_uk.shape
    dh = hd // h
    i = 0 if f.label == "W_q_lat" else 1
    if f.kind == "shape":
        got = tuple(f.got.shape)
        if i == 0 and got == (h, dc, dh):
            return ("W_q_lat[i] 是 W^UK_i 的转置 (d_h, d_c)：头 i 的内容查询 (…, d_h) 乘以它，"
                    "就到了潜在空间 (…, d_c)。")
        if i == 1 and got == (dc, w_o.shape[1]):
            return ("每个头要有自己的 W^UV_i W^O_i，形状 (H, d_c, d_model)：各头的注意力权重不同，"
                    "P_i C 不能先把各头加起来再乘。")
        return None
    if f.kind != "value":
        return None

    def bug(name):
        return MLA_BUGS[name](w_uk, w_uv, w_o, h)[i]
    if close(f.got, bug("uk_not_transposed")):
        return ("W_q_lat[i] 是 W^UK_i 的转置：q^C_i · (c W^UK_i) = (q^C_i W^UK_iᵀ) · c，"
                "你的像是 W^UK_i 本身（d_c = d_h 时形状碰巧也对）。")
    if close(f.got, bug("heads_interleaved")):
        return ("头 i 是 W^UK、W^UV 的第 i·d_h 到 (i+1)·d_h − 1 列（连续的一段），不是每隔 H 列取一列："
                "reshape 成 (d_c, H, d_h)，不是 (d_c, d_h, H)。")
    if close(f.got, bug("output_rows_interleaved")):
        return ("W^O 的头 i 是第 i·d_h 到 (i+1)·d_h − 1 行（连续的一段）：reshape 成 (H, d_h, d_model)，"
                "不是 (d_h, H, d_model)。")
    if close(f.got, bug("uk_used_for_values")):
        return "W_o_lat[i] = W^UV_i W^O_i：值的上投影是 W^UV，不是 W^UK。"
    return ("对照：W_q_lat[i] = W^UK_iᵀ (d_h, d_c)，W_o_lat[i] = W^UV_i W^O_i (d_c, d_model)，"
            "头 i 取连续的 d_h 列（W^O 取连续的 d_h 行）。")


_MLA_OFF = ((mla.MultiHeadLatentAttention.absorbed_weights,
             "attnbook.mla.MultiHeadLatentAttention.absorbed_weights"),)

register(Exercise("ch12.mla_absorb", "MLA：吸收上投影", mla_absorb, MLA_BUGS, _mla_cases,
                  (_mla_hint,), run=_mla_run, forbidden=_MLA_OFF))
