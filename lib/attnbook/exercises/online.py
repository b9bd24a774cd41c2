"""Chapter 09's exercise ``ch09.online_softmax``: the softmax normaliser of a row in one pass
over blocks of its columns that stream by once.

``online_softmax(x_blocks)`` -> ``(m, l)``: ``x_blocks`` yields, once, the column blocks
``x_j`` of ``x`` (shape ``(..., B_j)``; the widths may differ, the last is often shorter).
The reader keeps, per row, the running max ``m`` and the running sum ``l`` of ``exp(x - m)``:
``m' = max(m, rowmax(x_j))``, ``l' = exp(m - m') * l + rowsum(exp(x_j - m'))`` (eq.
eq-ch09-online), and returns them, shape ``x.shape[:-1]``: ``m`` the row's max and ``l`` in
``[1, N]``, so ``softmax(x) = exp(x - m) / l`` in a second, elementwise pass that needs nothing
else. A row that is all ``-inf`` (fully masked) has ``m = -inf`` and ``l = 0`` (nothing NaN).
The pair is asked for, not ``lse = m + log l``: the rescaling of ``l`` by ``exp(m - m')`` is
the lesson, and an ``l`` kept relative to a wrong reference shows in it.

The method is checked with chapter 09's stream machinery (``tiled``): the blocks come through
a one-shot iterator (a second pass is refused); a block still referenced when the block after
next arrives is refused (``KeptTiles``); so is any intermediate as large as the whole of ``x``
(the blocks concatenated back into rows, ``WholeRow``), and, on a long stream, a peak of live
memory that grows with ``N`` (private copies of the blocks kept for a later pass); the
stream follows the blocks' storages too, so an alias made outside torch's dispatch
(``nn.Parameter``, ``Tensor._make_subclass``) counts as the block kept. Turning a block into
Python numbers (``.tolist()``, ``.item()``, ``float(...)``, ``.numpy()``) or reaching its raw
memory (``.untyped_storage()``, DLPack, pickle, ``copy.deepcopy``), which would escape that
tracking, is ruled out by name (``_offlimits``); so is any aten kernel of the softmax family
(softmax, log_softmax, logsumexp, logcumsumexp, logaddexp: ``Shortcut``), whatever Python
spelling reached it. The classic bugs start
the running max at 0, forget to rescale ``l`` when the max grows, rescale the wrong way, sum ``exp(x)``
without subtracting ``m``, keep the first block's max, replace the max by each block's own
max, drop the last block (a loop one block behind), or get NaN from ``exp(-inf - (-inf))``
on a block (or row) that is all ``-inf``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._core import Case, Exercise, register
from ._report import close
from .tiled import KeptTiles, _kept, _OneShot, _Watch

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- the block stream
@dataclass(frozen=True)
class _Meta:
    long: bool = False  # a long stream: the answer's live memory is bounded too


class XBlocks(tuple):
    """The hidden column blocks of one case: the tensors ``x_j`` (``(..., B_j)``), then a
    ``_Meta``. A tuple, so that ``check`` copies and casts the blocks like any argument and
    judges the answer's dtype by theirs; ``check`` hands the answer a one-shot iterator."""

    def __new__(cls, items=()):
        return super().__new__(cls, tuple(items))

    @property
    def blocks(self) -> tuple:
        return tuple(t for t in self if isinstance(t, torch.Tensor))

    @property
    def meta(self) -> _Meta:
        return next((t for t in self if isinstance(t, _Meta)), _Meta())

    @property
    def tiles(self) -> tuple:  # what _OneShot iterates
        return tuple((b,) for b in self.blocks)

    def n(self) -> int:
        return sum(b.shape[-1] for b in self.blocks)

    def full(self) -> torch.Tensor:
        """The blocks concatenated (for the references and the hints)."""
        return torch.cat(self.blocks, -1)

    def __repr__(self):
        bl = self.blocks
        widths = [b.shape[-1] for b in bl]
        lead = ", ".join(str(s) for s in bl[0].shape[:-1])
        if len(widths) > 6 and len(set(widths[:-1])) == 1:
            w = f"前 {len(widths) - 1} 块各 {widths[0]} 列，最后一块 {widths[-1]} 列"
        else:
            w = "各块的列数 " + "、".join(str(b) for b in widths)
        return (f"{len(bl)} 块（{w}；x_j 形状 ({lead}, B_j)，"
                f"{str(bl[0].dtype).replace('torch.', '')}）")


def _stream(blocks, dtype=None) -> _OneShot:
    dtype = dtype if dtype is not None else blocks.blocks[0].dtype
    return _OneShot(blocks, dtype, name="x_blocks", noun="x 的列块", what="x_j", single=True)


class WholeRow(Exception):
    """The answer built a tensor as large as the whole of ``x`` (the blocks put back together)."""


class Shortcut(Exception):
    """The answer ran one of torch's softmax-family kernels (seen at the aten level, whatever
    the Python spelling: ``torch.special.logsumexp``, ``torch._C._special``, ``F.softmin``,
    ``logcumsumexp``, ``logaddexp``...): each computes the normaliser the exercise asks for."""


# aten operations (their overload packet's name, leading "_" and "special_" dropped) that
# compute a softmax normaliser or merge two of them: ruled out whatever Python spelling reached
# them (the off-limits recorder sees Python spellings; this sees the kernels they dispatch to)
_SHORTCUT_OPS = frozenset({"logsumexp", "logcumsumexp", "logaddexp", "logaddexp2"})


def _shortcut_op(func):
    name = str(getattr(getattr(func, "overloadpacket", func), "__name__", "")).split(".")[0]
    name = name.lstrip("_")
    name = name[len("special_"):] if name.startswith("special_") else name
    return name if ("softmax" in name or name in _SHORTCUT_OPS) else None


class _RowWatch(_Watch):
    """chapter 09's dispatch watch (memory, peak), its size rule replaced: any result with as
    many elements as all of ``x`` (only where there are several blocks)."""

    def __init__(self, rows: int, n: int, several: bool):
        super().__init__(1, rows, n)
        self.several = several

    def _big(self, t) -> bool:
        return (self.several and isinstance(t, torch.Tensor) and t.dim() > 0
                and t.numel() >= self.tq * self.tk)

    shortcut = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.shortcut is None:
            self.shortcut = _shortcut_op(func)
        return super().__torch_dispatch__(func, types, args, kwargs)


def _run(fn, args, kwargs):
    blocks = args[0]
    bl = blocks.blocks
    rows = bl[0][..., 0].numel()
    watch = _RowWatch(rows, blocks.n(), len(bl) > 1)
    with watch:
        stream = _stream(blocks)
        ret = fn(stream, *args[1:], **kwargs)
    if watch.shortcut is not None:
        raise Shortcut(f"你的函数调用了 torch 的 {watch.shortcut}（aten.{watch.shortcut}）："
                       "它替你算了这一题要一块一块求的归一化量")
    if watch.seen is not None:
        name, shape = watch.seen
        raise WholeRow(f"{name} 得到了形状 {shape} 的张量：它和整个 x（{rows} 行 × "
                       f"{blocks.n()} 列）一样多")
    _kept(stream)
    if blocks.meta.long and fn is not online_softmax:
        _memory_bound(watch.peak, blocks)
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return ret, {"m": ret[0], "l": ret[1]}
    return ret, {"m": ret}


def _memory_bound(peak: int, blocks) -> None:
    """On a long stream, refuse a peak of live memory above twice the one-pass algorithm's own
    plus a quarter of x: the blocks (or copies of them) kept for a later pass."""
    ref = _Watch(1, 1, 1)  # sizes unused: only its memory is read
    with ref:
        online_softmax(_stream(blocks))
    size = sum(b.numel() for b in blocks.blocks) * blocks.blocks[0].element_size()
    if peak > 2 * ref.peak + size // 4:
        raise KeptTiles(f"你的函数同时占着 {peak} 字节的张量；一块一块地算只需要约 {ref.peak} "
                        f"字节，而整个 x（N = {blocks.n()} 列）是 {size} 字节")


# --------------------------------------------------------------------------- reference and bugs
def _stats(x_blocks, *, m0=NEG_INF, rescale="right", guard=True, centred=True, carry=True,
           first_only=False, drop_last=False):
    """The one-pass loop, with the choices a bug may get wrong."""
    def step(m, l_i, x_j, first):
        bmax = x_j.amax(-1)
        if first_only and not first:
            m_new = m                       # the max stays the first block's
        elif carry:
            m_new = torch.maximum(m, bmax)  # m' = max(m, rowmax(x_j))
        else:
            m_new = bmax                    # this block's own max only
        safe = m_new.masked_fill(torch.isneginf(m_new), 0.0) if guard else m_new
        if rescale == "right":
            alpha = torch.exp(m - safe)     # <= 1: what was summed so far, rescaled
        elif rescale == "none":
            alpha = torch.ones_like(m)
        else:                               # exp(m' - m), the old m guarded like the new one
            alpha = torch.exp(safe - m.masked_fill(torch.isneginf(m), 0.0))
        if centred:
            l_i = alpha * l_i + torch.exp(x_j - safe[..., None]).sum(-1)
        else:                               # exp(x) summed as it is
            l_i = l_i + torch.exp(x_j).sum(-1)
        return m_new, l_i, False

    m = l_i = held = None
    first = True
    for x_j in x_blocks:
        if m is None:
            m = torch.full(x_j.shape[:-1], m0, dtype=x_j.dtype)
            l_i = torch.zeros_like(m)
        if drop_last:  # one block behind; the block held at the end is never used
            if held is not None:
                m, l_i, first = step(m, l_i, held, first)
            held = x_j
            continue
        m, l_i, first = step(m, l_i, x_j, first)
    return m, l_i


def online_softmax(x_blocks):
    """The softmax normaliser ``(m, l)`` of each row of x, from its column blocks streamed
    once (chapter 09): ``m`` the row's max, ``l = sum(exp(x - m))``; an all -inf row: -inf, 0."""
    return _stats(x_blocks)


def _bug(**kw):
    def bug(x_blocks):
        return _stats(x_blocks, **kw)
    bug.__name__ = "_" + "_".join(f"{k}_{v}" for k, v in kw.items())
    return bug


BUGS = {
    "running_max_starts_at_zero": _bug(m0=0.0),
    "sum_not_rescaled": _bug(rescale="none"),
    "rescaled_the_wrong_way": _bug(rescale="inverted"),
    "sum_of_exp_x_without_m": _bug(centred=False),
    "max_of_the_first_block_only": _bug(first_only=True),
    "max_not_carried_over": _bug(carry=False),
    "last_block_dropped": _bug(drop_last=True),
    "nan_when_a_block_is_all_minus_inf": _bug(guard=False),
}


# --------------------------------------------------------------------------- hidden cases
def _split(x, widths, long=False) -> XBlocks:
    out, j = [], 0
    for w in widths:
        out.append(x[..., j:j + w].clone())  # each block its own storage
        j += w
    assert j == x.shape[-1]
    return XBlocks([*out, _Meta(long)])


def _uniform(n, block):
    return [min(block, n - j) for j in range(0, n, block)]


def _cases(g):
    def r(*shape, scale=1.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    cases = []
    # 1: N a multiple of the width; the max grows block by block, row 0's max in the last block
    b1 = pick(2, 3)
    n1 = b1 * pick(3, 4)
    ramp = r(2, n1) + torch.linspace(0, 6, n1, dtype=torch.float64)
    ramp[0, -1] = ramp[0].max() + 1.0
    cases.append(Case("N 是块宽的整数倍，最大值逐块变大", (_split(ramp, _uniform(n1, b1)),),
                      note=f"N = {n1}，每块 {b1} 列：第 0 行的最大值在最后一块。"))
    # 2: a ragged last block that holds row 1's max
    b2 = pick(3, 4)
    n2 = b2 * pick(2, 3) + pick(1, b2 - 1)
    x2 = r(3, n2)
    x2[1, -1] = x2[1].max() + 2.0
    cases.append(Case("N 不是块宽的整数倍", (_split(x2, _uniform(n2, b2)),),
                      note=f"N = {n2}，每块 {b2} 列：最后一块只有 {n2 % b2} 列，"
                           "第 1 行的最大值就在这一块里。"))
    # 3: the first block below everything that follows (its max is not the row's)
    b3 = pick(2, 4)
    n3 = b3 * pick(2, 3) + pick(0, 1)
    x3 = r(2, n3)
    x3[:, :b3] = x3[:, b3:].amin(-1, keepdim=True) - 1.0 - r(2, b3).abs()
    cases.append(Case("第一块比后面的数都小", (_split(x3, _uniform(n3, b3)),),
                      note=f"N = {n3}，每块 {b3} 列：第一块的每个数都小于后面的任何一个数。"))
    # 4: masked: a fully masked first block, rows that are entirely -inf
    x4 = r(4, 7)
    x4[0, :2] = NEG_INF
    x4[1] = NEG_INF
    x4[2, :6] = NEG_INF   # only the last column is left
    x4[3] = NEG_INF
    cases.append(Case("−inf：第一块全被屏蔽，有的行整行被屏蔽", (_split(x4, _uniform(7, 2)),),
                      note="N = 7，每块 2 列；第 0 行的第一块全是 −inf，第 2 行只剩最后一列，"
                           "第 1、3 行整行都是 −inf（约定 m = −inf、l = 0）。",
                      tags=frozenset({"masked"})))
    # 5: block = 1
    n5 = pick(4, 7)
    cases.append(Case("每块 1 列", (_split(r(2, n5), [1] * n5),), note=f"N = {n5}。"))
    # 6: one block wider than... the whole row: a single block
    n6 = pick(4, 7)
    cases.append(Case("只有一块（块比行还宽）", (_split(r(2, n6), [n6]),),
                      note=f"N = {n6}：整行在唯一的一块里。"))
    # 7: widths that differ from block to block
    widths = [pick(1, 4) for _ in range(pick(3, 5))]
    x7 = r(3, sum(widths), scale=2.0)
    # row 2: each block's max only 1e-4 above the max so far (a rescaling skipped when the max
    # grows "a little" shows); its other entries stay below
    # (no draw from g: the cases after this one keep their data)
    j = 0
    for i, w in enumerate(widths):
        x7[2, j:j + w] = 1.0 + 1e-4 * i - torch.linspace(0.0, 1.5, w, dtype=torch.float64).roll(i)
        j += w
    cases.append(Case("各块的列数不同", (_split(x7, widths),),
                      note="块的宽度各不相同：不要假定每块一样宽；第 2 行每一块的最大值只比之前的大 1e-4。"))
    # 8: float32, rows at very different scales
    big = float(torch.empty(1).uniform_(60.0, 150.0, generator=g))
    x8 = (r(3, 9, scale=big) * torch.tensor([[1.0], [0.01], [3.0]], dtype=torch.float64)).float()
    cases.append(Case("分数很大（float32），行的尺度各不相同", (_split(x8, _uniform(9, 4)),),
                      note=f"第 0 行的分数可达 ±{2 * big:.0f} 左右，第 1 行只有它的百分之一，"
                           "第 2 行是它的 3 倍。"))
    # 9: float32, every score far below 0 (a running max started at 0 underflows every exp)
    n9 = 7 + pick(0, 3)
    x9 = r(3, n9, scale=5.0) - 200.0
    x9[1] -= 600.0
    cases.append(Case("整行都是很大的负数（float32）", (_split(x9.float(), _uniform(n9, 3)),),
                      note="每一行的分数都在 −200 附近或更小（没有一个是正的）。",
                      tags=frozenset({"negative"})))
    # 10: a long stream: memory that grows with N (blocks kept for later) shows
    b10, n10 = pick(3, 5), pick(300, 400)
    cases.append(Case("很长的一行", (_split(r(3, n10, scale=3.0), _uniform(n10, b10), long=True),),
                      note=f"N = {n10}，每块 {b10} 列：一块一块地算时，同时占用的内存和 N 无关。",
                      tags=frozenset({"long"})))
    return cases


def _low_atol(case, dtype) -> float:
    """float32: l sums N terms each within a few roundings of exact, rescaled once per block
    (l <= N); m is exact (a max). An answer that keeps lse = m + log l and returns
    exp(lse - m) loses eps * |m| of lse's rounding in l (rows near -800: ~1e-4): allowed."""
    blocks = case.args[0]
    n, nb = blocks.n(), len(blocks.blocks)
    x = blocks.full()
    mx = float(x[torch.isfinite(x)].abs().max()) if bool(torch.isfinite(x).any()) else 0.0
    eps = torch.finfo(dtype).eps
    return 2 * eps * (n + 2 * nb + 4) * max(n, 1) + 2 * eps * mx * max(n, 1)


# --------------------------------------------------------------------------- hints
_TEXT = {
    "running_max_starts_at_zero": (
        "运行中的最大值 m 要从 −inf 开始，不是 0：整行都远小于 0 时，从 0 开始的 m 不是这一行的"
        "最大值，exp(x − 0) 还会全部下溢成 0；整行都是 −inf 时 m 就应是 −inf（换成 0 的 m "
        "只在做减法时用，不要把它返回）。"),
    "sum_not_rescaled": (
        "最大值变大时，之前累加的 l 是相对旧的最大值算的，要先乘以 α = exp(m − m_new) 再加上"
        "新块：l ← α·l + rowsum(exp(x_j − m_new))。"),
    "rescaled_the_wrong_way": (
        "α = exp(m − m_new) ≤ 1（旧的最大值减新的）：你的像是 exp(m_new − m)，方向反了。"),
    "sum_of_exp_x_without_m": (
        "l 是相对最大值的和：l = Σ exp(x − m)，每块加的是 rowsum(exp(x_j − m_new))；你的 l 像是 "
        "Σ exp(x)，没有减去 m（分数一大就溢出成 inf）。"),
    "max_of_the_first_block_only": (
        "你的 m 像是只取了第一块的最大值：后面的块可能有更大的数，每来一块都要更新 "
        "m_new = max(m, rowmax(x_j))，并把 l 乘以 exp(m − m_new)。"),
    "max_not_carried_over": (
        "你的 m 像是最后一块自己的最大值：更新要和之前的最大值比较，m_new = max(m, rowmax(x_j))，"
        "不能只取这一块的 rowmax(x_j)。"),
    "last_block_dropped": (
        "最后一块没有算进去：你的 m、l 和只看前面几块的结果一样。每一块（包括最后一块，"
        "它可能不满）都要更新 m 和 l；如果循环落后一块处理，循环结束后还要处理手里那一块。"),
}

_NAN_BLOCK = ("一整块都是 −inf 时，m 和这块的最大值都是 −inf，exp(m − m_new) 和 exp(x_j − m_new) 都是 "
              "exp(−inf − (−inf)) = NaN：m_new 仍是 −inf 时先把它换成 0 再做减法（m 和 l 本身不换）。")
_NAN_ROW = ("整行都是 −inf 时约定 m = −inf、l = 0，不是 NaN：这一行的每一块都全是 −inf，"
            "exp(−inf − (−inf)) = NaN；m_new 仍是 −inf 时先把它换成 0 再做减法（m 和 l 本身不换）。")


def _alt(bug, f):
    """A bug's (m, l) on the failing case, in the case's dtype; None if it raised."""
    blocks = f.case.args[0]
    try:
        return bug(_stream(blocks))
    except Exception:  # noqa: BLE001  (a hint never hides the report)
        return None


def _matches(f, alt) -> bool:
    """Whether the answer's (m, l) is the bug's: both outputs where it returned both."""
    if alt is None:
        return False
    ret = f.ret
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        return all(isinstance(g, torch.Tensor) and close(g.detach().double(), a.double())
                   for g, a in zip(ret, alt))
    return close(f.got, alt[0 if f.label == "m" else 1])


def _hint(f):
    if f.kind == "exception":
        exc = f.exc
        if isinstance(exc, Shortcut):
            return ("softmax、log_softmax、logsumexp、logcumsumexp、logaddexp 这一族函数（任何写法："
                    "torch.、F.、torch.special.、nn 模块、张量方法、torch.ops.aten）在这一题里都不能用，"
                    "只对一块调用也不行：每块的最大值和 Σ exp(x_j − m_new) 用 amax、exp、sum 自己算，"
                    "再按 l ← exp(m − m_new)·l + … 合并。")
        if isinstance(exc, WholeRow):
            return ("不要把各块拼回整行（torch.cat、把块存起来再拼）：这一题的行是一块一块流过来的。"
                    "每来一块，只用这一块更新每行的 m 和 l。")
        if isinstance(exc, KeptTiles):
            return ("每块只看一遍、看完就不再需要它：不要把 x_j（或它的副本）存进列表留到后面"
                    "（先求最大值、再回头求和是两遍扫描）。每来一块就更新 m 和 l，"
                    "同时占用的内存和 N 无关。")
        if isinstance(exc, RuntimeError) and "只能遍历一次" in str(exc):
            return ("在线算法只看一遍：不要先遍历一次求最大值、再遍历一次求和（两遍扫描）。"
                    "每来一块就更新 m 和 l：最大值变大时把 l 乘以 exp(m − m_new)。")
        if isinstance(exc, TypeError) and any(w in str(exc) for w in (
                "subscriptable", "has no len", "_OneShot")):
            return ("x_blocks 不是张量也不是列表，而是只能遍历一次的迭代器：用 for x_j in x_blocks: "
                    "一块一块地读，不能取下标、求长度，也不知道一共有几块。")
        return None
    if f.kind == "shape" and isinstance(f.got, torch.Tensor) \
            and tuple(f.got.shape) == tuple(f.expected.shape) + (1,):
        return (f"m 和 l 每行一个数，形状是 x.shape[:-1]，这里是 {tuple(f.expected.shape)}："
                "用 amax(-1)、sum(-1)（不带 keepdim），或者返回前 .squeeze(-1)。")
    if f.kind not in ("value", "nan", "inf"):
        return None
    blocks = f.case.args[0]
    x = blocks.full()
    if f.kind == "nan" and "masked" in f.case.tags and f.index is not None:
        row = f.index
        return _NAN_ROW if bool(torch.isneginf(x[row]).all()) else _NAN_BLOCK
    for name, text in _TEXT.items():
        if _matches(f, _alt(BUGS[name], f)):
            return text
    if f.kind == "value" and f.index is not None and "masked" in f.case.tags \
            and bool(torch.isneginf(x[f.index]).all()):
        return ("整行都是 −inf 时约定 m = −inf、l = 0：是不是用 −1e9 之类的大负数代替了 −inf，"
                "或者把换成 0 的 m 当成了结果？保留 −inf，只在做减法前把 m_new 换成 0。")
    err = float((f.got.double() - f.expected).abs().nan_to_num(0.0, 0.0, 0.0).max())
    if f.kind == "value" and err < 1e-5 * max(1.0, float(f.expected.abs().nan_to_num(
            0.0, 0.0, 0.0).max())):
        return None  # a rounding-sized error: the precision hint (float32 state?) speaks
    return ("对照这一行：每来一块 x_j，m_new = max(m, rowmax(x_j))，"
            "l ← exp(m − m_new)·l + rowsum(exp(x_j − m_new))，m ← m_new；"
            "最后 m 是整行的最大值，l = Σ exp(x − m)。")


# Off limits (_offlimits.OFF_LIMITS): the library's online_softmax and masked_softmax, torch's
# softmax / log_softmax / logsumexp in every spelling (aten forms included), and the ways out of
# torch into Python numbers (.tolist(), .item(), float(...), .numpy()).

# The gallery's loop itself (``_stats`` with its defaults is the solution) and its factory are
# ruled out too (their calls from this package, the solution's and the gallery's, never count;
# the gallery's functions themselves stay callable: each is a wrong answer).
_OFF = ((_stats, "exercises.online._stats（本题参考答案的循环）"),
        (_bug, "exercises.online._bug"))

register(Exercise("ch09.online_softmax", "在线 softmax 的归一化量", online_softmax, BUGS, _cases,
                  (_hint,), run=_run, low_atol=_low_atol, forbidden=_OFF))
