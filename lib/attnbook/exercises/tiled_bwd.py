"""Chapter 09's exercise ``ch09.tiled_backward``: the FlashAttention backward, one key/value tile
at a time, with ``dK_j, dV_j`` per tile and ``dQ`` accumulated across tiles.

``tiled_backward(q, out, lse, dout, kv_tiles)`` -> ``(dq, dk, dv)``: the tiles come as in
``ch09.tiled_attention`` (a one-shot stream of ``(k_j, v_j, keep_j)``); ``dk`` and ``dv`` are the
tiles' gradients concatenated along the key axis. Per tile (eq. eq-ch09-bwd): ``S_j = Q K_jᵀ/√d``,
masked; ``P_j = exp(S_j - lse)`` rebuilt from the saved lse (a query with lse = -inf gets 0);
``dV_j = P_jᵀ dO``; ``dP_j = dO V_jᵀ``; ``dS_j = P_j ∘ (dP_j - D)`` with ``D = rowsum(dO ∘ O)``
(one number per query, from O: no full row of P needed); ``dQ += dS_j K_j/√d``;
``dK_j = dS_jᵀ Q/√d``. No intermediate may be as large as the full Tq x Tk scores (checked as in
``ch09.tiled_attention``), nor may a tile's ``k_j``/``v_j`` still be referenced when the tile
after next arrives (gathering the tiles into K and V, then one query row at a time, is refused as
``KeptTiles``; on a long key stream, so is a peak of live memory above the one-pass
backward's own plus all of K and V: private copies of the tiles gathered for a row-by-row
pass; Python numbers made of them, ``.tolist()`` and the like, are ruled out by name). The classic bugs drop D, take D
from the tile's own ``rowsum(dP_j)``,
forget 1/√d, normalise P by the tile's own max instead of lse, keep only the last tile's dQ,
or get NaN for a query with no key (``exp(-inf - (-inf))``).
"""
from __future__ import annotations

import math

import torch

from .. import flash
from ._core import Case, Exercise, register
from ._report import close
from .tiled import FullScores, KeptTiles, KVTiles, _kept, _OneShot, _sizes, _tiles, _Watch

NEG_INF = float("-inf")


def _run(fn, args, kwargs):
    q, out, lse, dout, tiles = args
    watch = _Watch(math.prod(q.shape[:-2]), q.shape[-2], tiles.tk())
    with watch:
        stream = _OneShot(tiles, q.dtype)
        ret = fn(q, out, lse, dout, stream, **kwargs)
    if watch.seen is not None:
        name, shape = watch.seen
        raise FullScores(f"{name} 得到了形状 {shape} 的张量：它和完整的 T_q × T_k = "
                         f"{q.shape[-2]} × {tiles.tk()} 分数矩阵一样大")
    _kept(stream)
    if tiles.long and fn is not tiled_backward:
        _memory_bound(watch.peak, args)
    if isinstance(ret, (tuple, list)) and len(ret) == 3:
        return ret, {"dq": ret[0], "dk": ret[1], "dv": ret[2]}
    return ret, {"dq": ret}


def _memory_bound(peak: int, args) -> None:
    """On a long key stream, refuse a peak of live memory above the one-pass backward's own
    plus all of K and V. Its own peak already holds dK and dV (they grow with T_k, ~2x K and V
    at the final concatenation), so the margin is K and V once more: copies of the tiles kept
    and gathered for a later pass (row by row) go past it, an answer that copies its result
    once more does not."""
    q, out, lse, dout, tiles = args
    ref = _Watch(1, 1, 1)  # sizes unused: only its memory is read
    with ref:
        tiled_backward(q, out, lse, dout, _OneShot(tiles, q.dtype))
    kv = sum((k.numel() + v.numel()) * q.element_size() for k, v, _ in tiles.tiles)
    if peak > ref.peak + kv:
        raise KeptTiles(f"你的函数同时占着 {peak} 字节的张量；一块一块地算（连同 dK、dV）只需要约 "
                        f"{ref.peak} 字节，而全部 T_k = {tiles.tk()} 个键和值是 {kv} 字节")


def _backward(q, out, lse, dout, kv_tiles, *, use_d="right", scale=True, p_ref="lse",
              accumulate=True, guard=True):
    c = 1.0 / math.sqrt(q.shape[-1])
    f = c if scale else 1.0
    ref = lse[..., None]
    if guard:
        ref = ref.masked_fill(torch.isneginf(ref), 0.0)
    d_rows = (dout * out).sum(-1, keepdim=True)              # D_i = dO_i . O_i
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for k_j, v_j, keep_j in kv_tiles:
        s = q @ k_j.transpose(-2, -1) * c
        if keep_j is not None:
            s = s.masked_fill(~keep_j, NEG_INF)
        if p_ref == "lse":
            p = torch.exp(s - ref)
        else:  # the tile's own max: P_j not normalised by the whole row
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m.masked_fill(torch.isneginf(m), 0.0))
        dvs.append(p.transpose(-2, -1) @ dout)
        dp = dout @ v_j.transpose(-2, -1)
        dd = {"right": d_rows, "none": 0.0, "tile_rowsum": dp.sum(-1, keepdim=True)}[use_d]
        ds = p * (dp - dd)
        dq = dq + ds @ k_j * f if accumulate else ds @ k_j * f
        dks.append(ds.transpose(-2, -1) @ q * f)
    return dq, torch.cat(dks, -2), torch.cat(dvs, -2)


def tiled_backward(q, out, lse, dout, kv_tiles):
    """FlashAttention's backward over key/value tiles streamed once (chapter 09) -> (dq, dk, dv)."""
    return _backward(q, out, lse, dout, kv_tiles)


def _bug(**kw):
    def bug(q, out, lse, dout, kv_tiles):
        return _backward(q, out, lse, dout, kv_tiles, **kw)
    bug.__name__ = "_" + "_".join(f"{k}_{v}" for k, v in kw.items())
    return bug


BUGS = {
    "D_dropped": _bug(use_d="none"),
    "D_from_the_tile_only": _bug(use_d="tile_rowsum"),
    "scale_forgotten": _bug(scale=False),
    "P_from_the_tile_max": _bug(p_ref="tile_max"),
    "dq_not_accumulated": _bug(accumulate=False),
    "nan_for_a_query_with_no_key": _bug(guard=False),
}


def _case(g, title, lead, tq, tk, block, *, d=4, dv=3, keep=None, dtype=torch.float64, note="",
          tags=frozenset(), long=False):
    def r(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    q, k, v, dout = r(*lead, tq, d), r(*lead, tk, d), r(*lead, tk, dv), r(*lead, tq, dv)
    from ..reference import attention_ref  # noqa: PLC0415
    fwd = attention_ref(q, k, v, mask=keep)
    tiles = _tiles(k.to(dtype), v.to(dtype), keep, _sizes(tk, block), long=long)
    args = (q.to(dtype), fwd.out.to(dtype), fwd.lse.to(dtype), dout.to(dtype), tiles)
    return Case(title, args, note=note, tags=tags)


def _cases(g):
    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    tq, tk = pick(6, 8), pick(11, 14)
    block = pick(3, 5)
    while tk % block == 0:
        tk += 1
    cases = [_case(g, "一个头，没有掩码，最后一块不满", (), tq, tk, block,
                   note=f"T_q = {tq}，T_k = {tk}，每块 {block} 个键。")]
    cases.append(_case(g, "多头，T_q > T_k", (2, pick(2, 3)), pick(9, 11), pick(6, 8), 3, dv=5))
    tq, tk = pick(6, 8), pick(10, 12)
    keep = torch.ones(1, 1, tq, tk, dtype=torch.bool)
    keep[..., tk - 2:] = False
    keep[..., 1, :4] = False
    keep[..., 3, :] = False
    cases.append(_case(g, "掩码：有一个查询整行被屏蔽", (1, 2), tq, tk, 4, keep=keep,
                       note="后两个键被屏蔽；查询 1 的第一块全被屏蔽；查询 3 没有任何键"
                            "（lse = −inf，它对梯度没有贡献）。", tags=frozenset({"masked"})))
    cases.append(_case(g, "float32", (2,), pick(8, 10), pick(9, 12), 4, dtype=torch.float32))
    # a long key stream, few queries: copies of the tiles kept for later show in the memory
    # (T_q > d, d_v: dK, dV, (T_k, d) and (T_k, d_v), are not mistaken for T_k x T_q scores)
    tq, tk, block = pick(6, 8), pick(160, 240), pick(3, 5)
    cases.append(_case(g, "很长的键流，查询很少", (), tq, tk, block, long=True,
                       note=f"T_q = {tq}，T_k = {tk}，每块 {block} 个键：除了 dK、dV 本身，"
                            "同时占用的内存和 T_k 无关。", tags=frozenset({"long"})))
    return cases


_TEXT = {
    "D_dropped": "dS_j = P_j ∘ (dP_j − D)，D_i = rowsum(dO ∘ O)：你的 dS 像是少了 D。",
    "D_from_the_tile_only": ("D_i = Σ_j P_ij dP_ij 是对整行所有的键求和，等于 dO_i · O_i："
                             "只用这一块的 rowsum(dP_j) 不对；用 O 和 dO 在循环外一次算出 D。"),
    "scale_forgotten": "S = QKᵀ/√d，所以 dQ = dS K/√d、dK = dSᵀ Q/√d：别忘了 1/√d。",
    "P_from_the_tile_max": ("P_j = exp(S_j − lse)：要用前向存下的整行的 lse 重算，"
                            "不是这一块自己的最大值（那样每块都没有除以整行的和）。"),
    "dq_not_accumulated": "dQ 要跨所有键块累加：dQ += dS_j K_j/√d；你的 dQ 像是只剩最后一块的贡献。",
}


def _hint(f):
    if f.kind == "exception" and isinstance(f.exc, FullScores):
        return ("这一题要一块一块地算：任何时候都不要造出和完整的 T_q × T_k 分数矩阵一样大的张量"
                "（例如把所有的 k_j 拼起来）。每来一块，只算这一块的 S_j、P_j，得到 dK_j、dV_j，"
                "把 dS_j K_j 累加进 dQ。")
    if f.kind == "exception" and isinstance(f.exc, KeptTiles):
        return ("每块只看一遍、用完就不再需要它：不要把 k_j、v_j 存进列表或拼成整个 K、V，"
                "再按查询逐行去算。每来一块，就地算出这一块的 dK_j、dV_j，把 dS_j K_j 累加进 dQ。")
    if f.kind == "exception" and "只能遍历一次" in str(f.exc):
        return "键/值块只流过一遍：D 从 O 和 dO 算，不需要先扫一遍键。"
    if f.kind == "exception" and isinstance(f.exc, RuntimeError) and "must match" in str(f.exc):
        return ("形状 (…, T_q) 的 lse 和形状 (…, T_q, B_j) 的 S_j 相减之前要先加一维："
                "lse[..., None]；否则它沿键的那一维广播。")
    if f.kind == "nan" and "masked" in f.case.tags:
        return ("整行被屏蔽的查询 lse = −inf，S_j 的这一行也是 −inf：exp(S_j − lse) = "
                "exp(−inf − (−inf)) = NaN。重算 P_j 之前把 −inf 的 lse 换成 0，这一行的 P_j 就是 0。")
    if f.kind != "value":
        return None
    q, out, lse, dout, tiles = (f.inputs[n] for n in ("q", "out", "lse", "dout", "kv_tiles"))
    i = {"dq": 0, "dk": 1, "dv": 2}.get(f.label, 0)
    for bug, text in _TEXT.items():
        try:
            alt = BUGS[bug](q, out, lse, dout, _OneShot(tiles, q.dtype))[i]
        except Exception:  # noqa: BLE001  (a hint never hides the report)
            continue
        if close(f.got, alt):
            return text
    return None


register(Exercise("ch09.tiled_backward", "分块的 FlashAttention 反向", tiled_backward, BUGS, _cases,
                  (_hint,), run=_run, autograd=False,
                  forbidden=((flash.tiled_backward, "attnbook.flash.tiled_backward"),)))
