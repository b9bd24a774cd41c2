"""Chapter 11's exercise ``ch11.sampling_probs``: the distribution top-k / top-p sampling draws
from.

The reader writes ``sampling_probs(logits, top_k=None, top_p=None)``: p = softmax(logits) per
row; top-k keeps the k most probable tokens; top-p sorts p in decreasing order and keeps the
shortest prefix whose mass reaches p (the token that crosses p is kept); with both, top-p runs
on the top-k survivors renormalised; the result is the kept probabilities divided by their sum
(0 elsewhere) -- ``softmax(attnbook.sampling.filter_logits(...))``. The hidden cases have no
ties. The classic bugs forget to renormalise, drop the token that crosses p, shift the
cumulative sum by one (one token too many), keep k - 1 tokens, run top-p on the unfiltered
probabilities, or accumulate the sum in vocabulary order instead of sorted order, or over the
sorted logits instead of the probabilities.
"""
from __future__ import annotations

import torch

from ..sampling import filter_logits
from ._core import Case, Exercise, register
from ._report import close


def sampling_probs(logits, top_k=None, top_p=None):
    """softmax of the top-k / top-p filtered logits, per row (chapter 11, eq-ch11-top-p)."""
    return torch.softmax(filter_logits(logits, top_k=top_k, top_p=top_p), dim=-1)


def _variant(logits, top_k=None, top_p=None, *, renorm=True, cross=True, shift=0, k_off=0,
             p_on="kept", sort=True, mass_of="probs"):
    p = torch.softmax(logits, -1)
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k is not None:
        k = min(top_k, p.shape[-1])
        kth = p.topk(k, -1).values[..., -1:]
        keep = p > kth if k_off else p >= kth
    if top_p is not None:
        q = torch.where(keep, p, 0.0)
        q = q / q.sum(-1, keepdim=True) if p_on == "kept" else p
        if mass_of == "logits":                  # the mass summed over the logits themselves
            q = torch.where(keep, logits, -torch.inf)
        sp, idx = q.sort(-1, descending=True) if sort else (q, None)
        before = sp.cumsum(-1) - sp if mass_of == "probs" else \
            torch.where(sp.isinf(), 0.0, sp).cumsum(-1) - torch.where(sp.isinf(), 0.0, sp)
        if cross:
            n_keep = (before < top_p).sum(-1, keepdim=True) + shift
        else:
            n_keep = (sp.cumsum(-1) <= top_p).sum(-1, keepdim=True)
        rank = torch.arange(p.shape[-1]).expand_as(p)
        kept_sorted = rank < n_keep
        kept = kept_sorted if not sort else torch.zeros_like(keep).scatter(-1, idx, kept_sorted)
        keep = keep & kept
    out = torch.where(keep, p, 0.0)
    return out / out.sum(-1, keepdim=True) if renorm else out


BUGS = {
    "not_renormalised": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p, renorm=False),
    "drops_token_crossing_p": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p,
                                                                         cross=False),
    "cumsum_off_by_one": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p, shift=1),
    "top_k_keeps_k_minus_1": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p,
                                                                        k_off=1),
    "top_p_on_unfiltered_probs": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p,
                                                                            p_on="all"),
    "cumsum_in_vocab_order": lambda x, top_k=None, top_p=None: _variant(x, top_k, top_p,
                                                                        sort=False),
    "mass_summed_over_logits": lambda x, top_k=None, top_p=None: _variant(
        x, top_k, top_p, mass_of="logits"),
}


def _logits(g, rows, v):
    return torch.randn(rows, v, generator=g, dtype=torch.float64) * 1.5


def _cases(g):
    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    rows, v = ri(3, 7), ri(12, 60)
    k = ri(3, 8)
    p_r = float(torch.empty(1, dtype=torch.float64).uniform_(0.3, 0.9, generator=g))
    mixed = _logits(g, rows, v) * torch.logspace(-1, 0.7, rows, dtype=torch.float64)[:, None]
    return [
        Case("只用 top-p", (_logits(g, 4, 10),), dict(top_p=0.7),
             note="4 行、10 个词元的 logits，top_p = 0.7：越过 0.7 的那个词元要保留。",
             tags=frozenset({"p"})),
        Case("只用 top-k", (_logits(g, 3, 9),), dict(top_k=3),
             note="top_k = 3：每行恰好留下 3 个词元。", tags=frozenset({"k"})),
        Case("top-k 之后再 top-p", (_logits(g, 4, 12),), dict(top_k=6, top_p=0.5),
             note="top_k = 6，top_p = 0.5：top-p 作用在 top-k 剩下、重新归一化后的分布上。",
             tags=frozenset({"kp"})),
        Case("第一个词元就超过 p", (torch.tensor([[4.0, 0.5, 0.0, -1.0, 0.2]],
                                          dtype=torch.float64),), dict(top_p=0.3),
             note="最大的概率约 0.9，已经超过 top_p = 0.3：只留下它，概率变成 1。",
             tags=frozenset({"p"})),
        Case("不过滤", (_logits(g, 2, 6),), {}, note="不给 top_k 和 top_p：结果就是 softmax。"),
        Case(f"{rows} 行、{v} 个词元，各行 logit 的尺度从 0.1 倍到 5 倍，top_k = {k}、"
             f"top_p = {p_r:.2f}", (mixed,), dict(top_k=k, top_p=p_r),
             note="平的行留下的词元多，尖的行可能只留一个。", tags=frozenset({"kp"})),
    ]


def _hint(f):
    if f.kind == "nan":
        return ("出现了 NaN：某一行一个词元都没留下。越过 p 的那个词元必须保留——"
                "保留条件是“排在它前面的概率之和 < p”，而不是“包括它在内的和 ≤ p”。")
    if f.kind != "value":
        return None
    args = {k: f.inputs[k] for k in ("logits", "top_k", "top_p") if k in f.inputs}
    alt = BUGS["mass_summed_over_logits"](args["logits"], args.get("top_k"), args.get("top_p"))
    if args.get("top_p") is not None and close(f.got, alt, 1e-9, 1e-12):
        return ("top-p 累加的要是排好序的概率（softmax 之后），不是 logits：“质量达到 p”说的是"
                "概率之和。")
    row = f.index[0] if f.index else 0
    got, want = f.got[row].double(), f.expected[row]
    n_got, n_want = int((got > 0).sum()), int((want > 0).sum())
    if abs(float(got.sum()) - 1) > 1e-6 and n_got == n_want:
        return "留下的词元对了，但概率之和不是 1：除以留下的概率之和，重新归一化。"
    if n_got == n_want - 1 and "k" in f.case.tags:
        return "每行少留了一个：top-k 要保留概率 ≥ 第 k 大概率的词元（用 >=，不是 >）。"
    if "kp" in f.case.tags and n_got != n_want:
        return "同时给 top_k 和 top_p 时，top-p 要在 top-k 留下并重新归一化的分布上计算。"
    if n_got == n_want - 1:
        return "少留了一个词元：越过 p 的那个词元也要保留（前面的和 < p 就保留）。"
    if n_got == n_want + 1:
        return "多留了一个词元：累积和错了一位。第 i 个词元保留的条件是排在它前面的和 < p。"
    if "kp" in f.case.tags:
        return "同时给 top_k 和 top_p 时，top-p 要在 top-k 留下并重新归一化的分布上计算。"
    vocab_order = BUGS["cumsum_in_vocab_order"](args["logits"], args.get("top_k"),
                                                args.get("top_p"))
    if args.get("top_p") is not None and close(f.got, vocab_order, 1e-9, 1e-12):
        return "top-p 要先把概率从大到小排序，再沿排好的顺序累加；不是按词表顺序累加。"
    return None                          # e.g. float32 rounding: the generic hints say so


register(Exercise("ch11.sampling_probs", "top-k / top-p 采样分布", sampling_probs, BUGS,
                  _cases, (_hint,)))
