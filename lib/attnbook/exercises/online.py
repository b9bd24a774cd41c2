"""Chapter 09's exercise ``ch09.online_softmax``: softmax in one pass over blocks of columns.

The reader keeps a running max ``m_i`` and sum ``l_i`` per row: ``m' = max(m, rowmax(x_b))``,
``l' = exp(m - m') * l + rowsum(exp(x_b - m'))``, then ``softmax(x) = exp(x - m) / l``. The
classic bugs forget to rescale the old sum when the max grows, rescale the wrong way, get NaN
when a whole block (or row) is -inf (``exp(-inf - (-inf))``), drop the last, partial block, or
write each block's ``exp(x_b - m)`` as they go and rescale the sum but not those outputs. The
hints name each; the dropped-last-block hint only where N is not a multiple of ``block``, a
rounding-sized error is left to the precision hint (a float32 running state), and an all
-inf row answered with 1/N is told that -inf was replaced by a large negative number.

A reduction over a whole row wider than ``block`` while the answer runs (``x.amax(-1)``,
``x.max()``, a sum, a sort, a matrix product with a ones vector) is refused as ``WholeRow``: the
two-pass softmax (the row's max first, then the sum) is not the lesson. A two-pass answer that
reduces only column slices no wider than ``block`` is not seen.
"""
from __future__ import annotations

import torch

from torch.utils._python_dispatch import TorchDispatchMode

from ..flash import online_softmax as _lib_online_softmax
from ._core import OUT, Case, Exercise, register
from ._report import close

NEG_INF = float("-inf")
_A = torch.ops.aten
# reductions (and contractions) that read a whole row at once: over the last axis, wider than block
_REDUCE = {_A.amax, _A.amin, _A.max, _A.min, _A.sum, _A.mean, _A.logsumexp, _A._softmax,
           _A._log_softmax, _A.prod, _A.linalg_vector_norm, _A.norm, _A.var, _A.std, _A.cumsum,
           _A.logcumsumexp, _A.sort, _A.topk, _A.argmax, _A.aminmax, _A.nansum,
           _A.special_logsumexp}
_CONTRACT = {_A.mm: 0, _A.bmm: 0, _A.mv: 0, _A.dot: 0, _A.addmm: 1, _A.baddbmm: 1, _A.addmv: 1,
             _A.vdot: 0}


class WholeRow(Exception):
    """The answer reduced a whole row (wider than ``block``) at once."""


class _RowWatch(TorchDispatchMode):
    """Records the first reduction over the last axis of a tensor wider than ``block``."""

    def __init__(self, block: int):
        super().__init__()
        self.block, self.seen = block, None

    def _wide(self, func, args, kwargs) -> bool:
        packet = getattr(func, "overloadpacket", None)
        if packet in _CONTRACT:
            t = args[_CONTRACT[packet]] if len(args) > _CONTRACT[packet] else None
            return isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[-1] > self.block
        if packet not in _REDUCE or not args or not isinstance(args[0], torch.Tensor):
            return False
        t = args[0]
        if t.dim() == 0 or t.shape[-1] <= self.block:
            return False
        if packet is _A.topk:  # topk(x, k, dim=-1)
            dims = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        else:
            dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if packet is _A.sort and dims is None:
                dims = -1
        if dims is None or isinstance(dims, (list, tuple)) and len(dims) == 0:
            return True  # a reduction over everything
        if not isinstance(dims, (list, tuple)):
            dims = [dims]
        return any(isinstance(d, int) and d % t.dim() == t.dim() - 1 for d in dims)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.seen is None and self._wide(func, args, kwargs):
            self.seen = (str(getattr(func, "overloadpacket", func)).replace("aten.", ""),
                         tuple(args[0].shape) if isinstance(args[0], torch.Tensor) else ())
        return func(*args, **kwargs)


def _run(fn, args, kwargs):
    x, block = args[0], args[1]
    watch = _RowWatch(int(block))
    with watch:
        ret = fn(*args, **kwargs)
    if watch.seen is not None:
        name, shape = watch.seen
        raise WholeRow(f"{name} 一次归约了形状 {shape} 的张量的整行（{shape[-1] if shape else '?'} "
                       f"列，而 block = {block}）")
    return ret, {OUT: ret}


def online_softmax(x, block):
    """Softmax over the last dim, statistics gathered ``block`` columns at a time (chapter 09)."""
    return _lib_online_softmax(x, block=block)


def _variant(x, block, *, rescale="right", guard=True, tail=True):
    """The reader's loop, with the choices a bug may get wrong."""
    m = torch.full(x.shape[:-1] + (1,), NEG_INF, dtype=x.dtype)
    l_i = torch.zeros_like(m)
    n = x.shape[-1] if tail else x.shape[-1] - x.shape[-1] % block
    for j in range(0, n, block):
        xb = x[..., j:j + block]
        m_new = torch.maximum(m, xb.amax(-1, keepdim=True))
        m_use = m_new.masked_fill(m_new == NEG_INF, 0.0) if guard else m_new
        alpha = {"right": torch.exp(m - m_use), "none": torch.ones_like(m),
                 "inverted": torch.exp(m_use - m)}[rescale]
        l_i = alpha * l_i + torch.exp(xb - m_use).sum(-1, keepdim=True)
        m = m_new
    m_use = m.masked_fill(m == NEG_INF, 0.0) if guard else m
    out = torch.exp(x - m_use) / (l_i.masked_fill(l_i == 0, 1.0) if guard else l_i)
    return out


def _stale_outputs(x, block):
    """Each block's exp(x_b - m) is written with the max known at that block; only l is rescaled."""
    m = torch.full(x.shape[:-1] + (1,), NEG_INF, dtype=x.dtype)
    l_i = torch.zeros_like(m)
    out = torch.zeros_like(x)
    for j in range(0, x.shape[-1], block):
        xb = x[..., j:j + block]
        m_new = torch.maximum(m, xb.amax(-1, keepdim=True))
        m_use = m_new.masked_fill(m_new == NEG_INF, 0.0)
        l_i = torch.exp(m.masked_fill(m == NEG_INF, 0.0) - m_use) * l_i \
            + torch.exp(xb - m_use).sum(-1, keepdim=True)
        out[..., j:j + block] = torch.exp(xb - m_use)  # never rescaled later
        m = m_new
    return out / l_i.masked_fill(l_i == 0, 1.0)


def _no_rescale(x, block):
    return _variant(x, block, rescale="none")


def _inverted(x, block):
    return _variant(x, block, rescale="inverted")


def _no_guard(x, block):
    return _variant(x, block, guard=False)


def _tail(x, block):
    return _variant(x, block, tail=False)


BUGS = {
    "sum_not_rescaled": _no_rescale,
    "rescaled_the_wrong_way": _inverted,
    "nan_when_a_block_is_all_minus_inf": _no_guard,
    "last_partial_block_dropped": _tail,
    "outputs_not_rescaled": _stale_outputs,
}


def _cases(g):
    def r(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    b1 = pick(2, 3)
    n1 = b1 * pick(3, 4)                                  # a multiple of the block
    ramp = r(2, n1) + torch.linspace(0, 6, n1, dtype=torch.float64)  # the max grows block by block
    b2 = pick(3, 4)
    n2 = b2 * pick(2, 3) + pick(1, b2 - 1)                # not a multiple: a partial last block
    first_masked = r(3, 6)
    first_masked[:, :2] = NEG_INF
    first_masked[2] = NEG_INF
    n5 = pick(4, 7)
    big = float(torch.empty(1).uniform_(60.0, 150.0, generator=g))
    return [
        Case("N 是 block 的整数倍，最大值逐块变大", (ramp, b1),
             note=f"N = {n1}，block = {b1}：{n1 // b1} 块。"),
        Case("N 不是 block 的整数倍", (r(3, n2), b2),
             note=f"N = {n2}，block = {b2}：最后一块只有 {n2 % b2} 列。"),
        Case("第一块全是 −inf，最后一行整行是 −inf", (first_masked, 2),
             note="x[:, :2] 是 −inf（例如被屏蔽的键）；x[2] 整行是 −inf，应输出 0。",
             tags=frozenset({"masked"})),
        Case("block = 1", (r(2, n5), 1)),
        Case("block 比 N 大", (r(2, n5), n5 + pick(1, 4)), note="只有一块。"),
        Case("分数很大（float32），行的尺度各不相同",
             (r(3, 9, scale=big).float() * torch.tensor([[1.0], [0.01], [3.0]]), 4),
             note=f"第 0 行的分数可达 ±{2 * big:.0f} 左右，第 1 行只有它的百分之一。"),
        Case("整行都是很大的负数（float32）", (_negative_rows(g), 3),
             note="每一行的分数都在 −200 附近（没有一个是正的）：运行中的最大值要从 −inf 开始。",
             tags=frozenset({"negative"})),
    ]


def _negative_rows(g):
    """float32 rows entirely below -100 (a running max started at 0 underflows every exp)."""
    n = 7 + int(torch.randint(0, 4, (1,), generator=g))
    x = torch.randn(3, n, generator=g, dtype=torch.float64) * 5 - 200.0
    x[1] -= 600.0
    return x.float()


def _hint(f):
    x, block = f.inputs["x"], f.inputs["block"]
    if f.kind == "exception" and isinstance(f.exc, WholeRow):
        return (f"每次只看 block = {block} 列：行的最大值和指数和要一块一块地攒（运行中的 m 和 l），"
                "不能先对整行求最大值（x.max(-1)、amax）再求和——那是两遍扫描。"
                "只有最后输出 exp(x − m) / l 这一步可以整行逐元素地算。")
    if f.kind == "nan" and "masked" in f.case.tags:
        if bool(torch.isneginf(x[f.index[:-1]]).all()):
            return "整行都是 −inf 时应该输出 0，而不是 NaN：这时 l = 0，别让 0/0 出现（分母为 0 时换成 1）。"
        return ("一整块都是 −inf 时，m_i 和这块的最大值都是 −inf，exp(m_i − m_new) = exp(−inf − (−inf)) = NaN："
                "m_new 仍是 −inf 时先把它换成 0 再做减法。")
    if f.kind not in ("value", "nan"):
        return None
    if "negative" in f.case.tags:
        return ("整行都是很大的负数时你的结果不对：运行中的最大值 m 要从 −inf 开始"
                "（torch.full(..., float('-inf'))），不是 0；从 0 开始时 exp(x − 0) 全部下溢成 0。")
    if close(f.got, _no_rescale(x, block)):
        return ("最大值变大时，之前累加的和 l_i 是按旧的最大值算的，要先乘以 α = exp(m_i − m_new) 再加上新块："
                "l_i' = α·l_i + rowsum(exp(x_b − m_new))。")
    if close(f.got, _inverted(x, block)):
        return "α = exp(m_i − m_new) ≤ 1（旧的最大值减新的），你的像是 exp(m_new − m_i)：方向反了。"
    if close(f.got, _stale_outputs(x, block)):
        return ("l_i 修正了，但前面的块写下的 exp(x_b − m) 用的还是当时的最大值：最大值变大以后，"
                "它们也要乘以 α = exp(m_i − m_new)（或者最后用最终的 m_i 统一算 exp(x − m_i) / l_i）。")
    if x.shape[-1] % block != 0 and close(f.got, _tail(x, block)):
        return (f"N = {x.shape[-1]} 不是 block = {block} 的整数倍时，最后一块不满 block 列，也要算进去："
                "range(0, N, block)，切片 x[..., j:j + block] 会自动截短。")
    if "masked" in f.case.tags and f.index is not None:
        row = f.index[:-1]
        got = f.got[row].double()
        if bool(torch.isneginf(x[row]).all()) and bool((got - got.mean()).abs().max() < 1e-9) \
                and float(got.mean()) > 0:
            return ("整行都是 −inf 时应输出 0，你的像是均匀分布 1/N：是不是用 −1e9 之类的大负数代替了 "
                    "−inf？那样整行被屏蔽时 exp(x − m) 全是 1。保留 −inf，只在做减法前把 m 换成 0。")
    err = float((f.got.double() - f.expected).abs().nan_to_num(0.0).max())
    if f.kind == "value" and err < 1e-5:
        return None  # a rounding-sized error: the precision hint (float32 state?) speaks
    return "对照这一行：每块更新 m_i 和 l_i，最后输出 exp(x − m_i) / l_i。"


register(Exercise("ch09.online_softmax", "分块的在线 softmax", online_softmax, BUGS, _cases,
                  (_hint,), run=_run))
