"""Chapter 02's build exercise ``ch02.beam_search``: beam search over a bigram table.

The model is a table ``logp`` ``(V, V)``: ``logp[a, b] = log P(next token = b | last token = a)``
(each row a log-distribution), the first step conditioned on ``bos``. The search follows
chapter 02 (and ``attnbook.decoding.beam_search`` with alpha = 0): at step t every live prefix
is extended by every token (by EOS only at t = max_len); of all these candidates the ``k``
with the highest log P stay; a kept candidate that ends in EOS is finished and leaves the
beam, the others are the next step's live prefixes; the search ends when none is live. The
answer is the finished output with the highest log P: ``(tokens, logprob)``, tokens without
BOS and ending with EOS (a LongTensor or a list of ints), logprob a 0-dim tensor or a number.

The hidden cases include a model on which beam k = 2 returns a less probable output than
greedy decoding (k = 1), k = 1 itself, an output that finishes first but is not the best,
one whose per-token average would pick a longer output, and outputs cut at max_len.
The classic bugs: EOS treated as an ordinary token, probabilities added instead of
log-probabilities, k kept per parent instead of k overall, finished outputs ranked by the
length-normalised score, the sort the wrong way round, candidates ranked by their last step
only, and the first finished output returned.
"""
from __future__ import annotations

import math

import torch

from .. import decoding
from ._core import Case, Exercise, register
from ._report import close

TOKENS = "输出的词元"
LOGP = "对数概率"


def _search(logp, bos, eos, k, max_len, *, eos_ends=True, score="logp", per_parent=False,
            descending=True, rank="logp", first=False, stop_at_k=False):
    V = logp.shape[-1]
    lp = logp.double()
    live = [((), 0.0, 0.0)]                    # (tokens without BOS, log P, ranking score)
    finished = []
    for t in range(1, max_len + 1):
        allowed = list(range(V)) if t < max_len else [eos]
        groups = []
        for toks, total, s in live:
            row = lp[toks[-1] if toks else bos]
            kids = []
            for tok in allowed:
                step = float(row[tok])
                new = {"logp": total + step, "prob": s + math.exp(step), "last": step}[score]
                kids.append((toks + (tok,), total + step, new))
            groups.append(kids)
        if per_parent:
            kept = [c for kids in groups
                    for c in sorted(kids, key=lambda c: c[2], reverse=descending)[:k]]
        else:
            cands = [c for kids in groups for c in kids]
            kept = sorted(cands, key=lambda c: c[2], reverse=descending)[:k]
        live = []
        for c in kept:
            if eos_ends and c[0][-1] == eos:
                finished.append(c)
                if first:
                    return c
            else:
                live.append(c)
        if not live or stop_at_k and len(finished) >= k:
            break
    if not eos_ends:
        finished = live
    if rank == "length":
        return max(finished, key=lambda c: c[1] / len(c[0]))
    return max(finished, key=lambda c: c[2] if score == "prob" else c[1])


def _answer(c, logp, value=None):
    return (torch.tensor(c[0], dtype=torch.long),
            torch.tensor(c[1] if value is None else value, dtype=logp.dtype))


def beam_search(logp, bos, eos, k, max_len):
    """Beam search of width ``k`` over the bigram table ``logp`` (chapter 02, build exercise).

    Returns ``(tokens, logprob)``: the best finished output (no BOS, EOS last) and its log P.
    """
    return _answer(_search(logp, bos, eos, k, max_len), logp)


def _no_eos(logp, bos, eos, k, max_len):
    return _answer(_search(logp, bos, eos, k, max_len, eos_ends=False), logp)


def _summed_probs(logp, bos, eos, k, max_len):
    c = _search(logp, bos, eos, k, max_len, score="prob")
    return _answer(c, logp, value=c[2])       # the summed probabilities, reported as the score


BUGS = {
    "eos_not_handled": _no_eos,
    "probabilities_summed": _summed_probs,
    "k_kept_per_parent": lambda *a: _answer(_search(*a, per_parent=True), a[0]),
    "length_normalised": lambda *a: _answer(_search(*a, rank="length"), a[0]),
    "sorted_ascending": lambda *a: _answer(_search(*a, descending=False), a[0]),
    "last_step_only": lambda *a: _answer(_search(*a, score="last"), a[0]),
    "first_finished_returned": lambda *a: _answer(_search(*a, first=True), a[0]),
    "stopped_at_k_finished": lambda *a: _answer(_search(*a, stop_at_k=True), a[0]),
}


def _as_tokens(toks, dtype):
    """The reader's tokens as a float tensor (compared like any output); other types as given."""
    def integer(t):
        return isinstance(t, int) and not isinstance(t, bool) or isinstance(
            t, torch.Tensor) and t.ndim == 0 and t.dtype in (torch.int64, torch.int32)

    if isinstance(toks, (list, tuple)) and all(integer(t) for t in toks):
        return torch.tensor([float(int(t)) for t in toks], dtype=dtype)
    if isinstance(toks, torch.Tensor) and not toks.is_floating_point() \
            and not toks.is_complex() and toks.dtype != torch.bool:
        return toks.to(dtype)
    return toks


def _run(fn, args, kwargs):
    ret = fn(*args, **kwargs)
    dtype = args[0].dtype
    if isinstance(ret, (tuple, list)) and len(ret) == 2:
        toks, value = ret
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = torch.tensor(float(value), dtype=dtype)
        return ret, {TOKENS: _as_tokens(toks, dtype), LOGP: value}
    return ret, {TOKENS: _as_tokens(ret, dtype)}


# --------------------------------------------------------------------------- the cases
def _table(g, spec, names, extra):
    """A (V, V) log-prob table from ``spec`` (state name -> {token name: probability}), the
    tokens relabelled at random (``names`` plus ``extra`` filler tokens); unnamed transitions
    get a tiny probability (about e^-14, all different: no ties)."""
    n = len(names) + extra
    perm = torch.randperm(n, generator=g).tolist()
    ids = {name: perm[i] for i, name in enumerate(names)}
    scores = -14.0 + 0.5 * torch.rand(n, n, generator=g, dtype=torch.float64)
    for state, dist in spec.items():
        for tok, p in dist.items():
            scores[ids[state], ids[tok]] = math.log(p)
    return scores.log_softmax(-1), ids


def _beam_loses(g):
    """Greedy (k = 1) finds A x EOS (P about .12); k = 2 keeps A and B, then the two B y
    prefixes push every A x out: it ends with B y z EOS (P about .06); the MAP is C EOS."""
    jitter = 0.01 * torch.rand(6, generator=g, dtype=torch.float64)
    xs = {f"x{i}": 0.25 + 0.03 * (1.5 - i) for i in range(4)}
    zs = {f"z{i}": 0.25 + 0.04 * (1.5 - i) + float(jitter[i]) / 10 for i in range(4)}
    spec = {"BOS": {"A": 0.40, "B": 0.35, "C": 0.25},
            "A": xs, "B": {"y0": 0.52 + float(jitter[4]), "y1": 0.48 - float(jitter[4])},
            "y0": zs, "y1": zs, "C": {"EOS": 1.0}}
    spec.update({x: {"EOS": 1.0} for x in xs})
    spec.update({z: {"EOS": 1.0} for z in zs})
    names = ["BOS", "EOS", "A", "B", "C", *xs, "y0", "y1", *zs]
    return _table(g, spec, names, int(torch.randint(0, 4, (1,), generator=g)))


def _first_not_best(g):
    """EOS at step 1 (P about .34) finishes first; A EOS (P about .66) is better (rows are
    renormalised: the spec's numbers are not the final P)."""
    p = 0.28 + 0.04 * float(torch.rand(1, generator=g))
    spec = {"BOS": {"EOS": p, "A": 0.6}, "A": {"EOS": 0.9}}
    return _table(g, spec, ["BOS", "EOS", "A"], int(torch.randint(2, 5, (1,), generator=g)))


def _k_finished_early(g):
    """EOS (P about .36) finishes at step 1, A EOS (P about .2) at step 2: k = 2 outputs are
    finished, but the live A X still ends as A X EOS (P about .45), the best (each row is
    renormalised with the filler tokens: the spec's numbers are not the final P)."""
    p = 0.28 + 0.04 * float(torch.rand(1, generator=g))
    spec = {"BOS": {"A": 0.55, "EOS": p}, "A": {"X": 0.68, "EOS": 0.3}, "X": {"EOS": 0.95}}
    return _table(g, spec, ["BOS", "EOS", "A", "X"], int(torch.randint(2, 5, (1,), generator=g)))


def _length_matters(g):
    """[EOS] has P about .53; [A B EOS] has P about .47 but a better per-token average."""
    spec = {"BOS": {"EOS": 0.5, "A": 0.45}, "A": {"B": 0.9}, "B": {"EOS": 0.9}}
    return _table(g, spec, ["BOS", "EOS", "A", "B"], int(torch.randint(2, 5, (1,), generator=g)))


def _whole_prefix(g):
    """A's children (P .8 x about .25) beat B's (P .2 x about .5) only when ranked by the whole
    prefix; ranked by the last step alone, B y0 and B y1 push every A x out of the beam."""
    d = 0.02 * float(torch.rand(1, generator=g))
    xs = {f"x{i}": 0.25 + 0.02 * (1.5 - i) for i in range(4)}
    spec = {"BOS": {"A": 0.8, "B": 0.2}, "A": xs, "B": {"y0": 0.52 + d, "y1": 0.48 - d},
            "y0": {"EOS": 1.0}, "y1": {"EOS": 1.0}}
    spec.update({x: {"EOS": 1.0} for x in xs})
    names = ["BOS", "EOS", "A", "B", *xs, "y0", "y1"]
    return _table(g, spec, names, int(torch.randint(0, 3, (1,), generator=g)))


def _random_table(g, v, scale, eos_bias):
    scores = scale * torch.randn(v, v, generator=g, dtype=torch.float64)
    scores[:, 1] += eos_bias                                 # EOS = 1, BOS = 0
    return scores.log_softmax(-1)


def _cases(g):
    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    loses, ids = _beam_loses(g)
    first, fid = _first_not_best(g)
    early, eid = _k_finished_early(g)
    length, lid = _length_matters(g)
    whole, wid = _whole_prefix(g)
    scale = 1.0 + 2.0 * float(torch.rand(1, generator=g))
    v1, v2, v3 = pick(5, 8), pick(6, 9), pick(4, 6)
    return [
        Case("束搜索输给贪心：k = 2", (loses, ids["BOS"], ids["EOS"], 2, 5),
             note="贪心（k = 1）得到 A x EOS，P 约 0.12；k = 2 时两个 B y 前缀把所有 A x 挤出了束，"
                  "最后得到 B y z EOS，P 约 0.06：束宽更大，结果反而更差。",
             tags=frozenset({"loses"})),
        Case("同一个模型，k = 1 就是贪心", (loses, ids["BOS"], ids["EOS"], 1, 5),
             note="k = 1 时每一步只留概率最大的一个前缀：A、x、EOS。", tags=frozenset({"greedy"})),
        Case("排序看整个前缀", (whole, wid["BOS"], wid["EOS"], 2, 4),
             note="A 的 P = 0.8，它的四个后继各约 0.25；B 的 P = 0.2，它的两个后继各约 0.5："
                  "按整个前缀的对数概率，A x 留在束里。", tags=frozenset({"whole"})),
        Case("最先完成的不是最好的", (first, fid["BOS"], fid["EOS"], 2, 3),
             note="第 1 步就生成 EOS 的输出 P 约 0.34，最先完成；A EOS 的 P 约 0.66，更大。",
             tags=frozenset({"first"})),
        Case("已有 k 个输出完成，搜索还没结束", (early, eid["BOS"], eid["EOS"], 2, 4),
             note="EOS（P 约 0.36）和 A EOS（P 约 0.2）先后完成，凑够了 k = 2 个；但 A X 还活着，"
                  "它走到 A X EOS，P 约 0.45，最好。", tags=frozenset({"kdone"})),
        Case("按对数概率而不是按每个词元的平均", (length, lid["BOS"], lid["EOS"], 2, 4),
             note="[EOS] 的 P 约 0.53；[A B EOS] 的 P 约 0.47，但每个词元的平均对数概率更高。",
             tags=frozenset({"length"})),
        Case(f"随机的模型：V = {v1}，k = 1", (_random_table(g, v1, scale, 1.0), 0, 1, 1, pick(4, 6)),
             note="BOS = 0，EOS = 1；k = 1 的束搜索与贪心解码相同。", tags=frozenset({"greedy"})),
        Case(f"随机的模型：V = {v2}，k = 3", (_random_table(g, v2, scale, 0.5), 0, 1, 3, 5),
             note="BOS = 0，EOS = 1。"),
        Case(f"EOS 很少出现：到 max_len 强制结束，V = {v3}",
             (_random_table(g, v3, scale, -6.0), 0, 1, 2, pick(3, 5)),
             note="几乎没有前缀自己生成 EOS：第 max_len 步只能选 EOS（它的对数概率照样计入）。",
             tags=frozenset({"maxlen"})),
    ]


# --------------------------------------------------------------------------- the hints
_TOKEN_TEXTS = (
    ("stopped_at_k_finished",
     "像是凑够 k 个完成的输出就停了：束里还有活前缀时搜索不能结束，它们之后可能完成一个"
     "对数概率更高的输出；要一直走到没有活前缀（或到 max_len）。"),
    ("first_finished_returned",
     "返回的是最先完成的输出：它不一定最好。完成的输出先收起来，搜索结束后在它们中间取"
     "对数概率最大的那个。"),
    ("length_normalised",
     "像是按每个词元的平均对数概率挑了最后的输出（长度归一化）：这道题按 log P(y|x) 本身比较，"
     "不除以长度。"),
    ("k_kept_per_parent",
     "像是每个前缀各留了 k 个扩展（束会越变越大）：应把所有前缀的全部扩展放在一起，"
     "只留对数概率最高的 k 个。"),
    ("last_step_only",
     "候选像是只按最后一步的 log P(y_t | y_{t-1}) 排序：排序要用整个前缀的对数概率，"
     "父前缀的 log P 加上这一步的。"),
    ("sorted_ascending",
     "排序方向反了：留下的是对数概率最低的 k 个。要降序排（sorted(..., reverse=True)，"
     "或 torch.topk）。"),
    ("probabilities_summed",
     "像是把每一步的概率加了起来：链式法则是概率相乘，在对数空间里是对数概率相加，"
     "score = 父前缀的 log P + logp[上一个词元, 这个词元]。"),
    ("eos_not_handled",
     "生成 EOS 的前缀应当结束：把它移出束、放进完成的列表，不再扩展；"
     "EOS 不能出现在输出的中间。"),
)


# the bug each hand-built case is made to expose (others may give the same output there)
_MEANT = {"length_normalised": "length", "first_finished_returned": "first",
         "stopped_at_k_finished": "kdone",
          "last_step_only": "whole"}


def _token_list(t):
    if not isinstance(t, torch.Tensor) or t.ndim != 1 or not t.is_floating_point():
        return None
    if not bool((t == t.round()).all()):
        return None
    return [int(v) for v in t.tolist()]


def _exact_map(logp, bos, eos, max_len):
    """The most probable output of at most ``max_len`` tokens (dynamic programming over the
    last token): (tokens, log P)."""
    lp = logp.double()
    best, live = None, {bos: (0.0, [])}
    for t in range(1, max_len + 1):
        for last, (s, toks) in live.items():
            c = (s + float(lp[last, eos]), toks + [eos])
            best = c if best is None or c[0] > best[0] else best
        nxt = {}
        for last, (s, toks) in live.items():
            for w in range(lp.shape[0]):
                if w != eos and (w not in nxt or s + float(lp[last, w]) > nxt[w][0]):
                    nxt[w] = (s + float(lp[last, w]), toks + [w])
        live = nxt
    return best[1], best[0]


def _hint(f):
    if f.kind not in ("value", "shape"):
        return None
    args = [f.inputs[n] for n in ("logp", "bos", "eos", "k", "max_len")]
    logp, bos, eos = args[0], args[1], args[2]
    right = _search(*args)
    if f.label == TOKENS:
        got = _token_list(f.got)
        if got is None:
            return None
        if got and got[0] == bos and got[1:] == list(right[0]):
            return "输出里不要放 BOS：tokens 从第一个生成的词元开始，以 EOS 结尾。"
        if eos in got[:-1]:
            return dict(_TOKEN_TEXTS)["eos_not_handled"]
        if got == _exact_map(logp, bos, eos, args[4])[0] and got != list(right[0]):
            return ("你返回的是全局最优的输出（穷举或动态规划得到的精确 MAP）：本题要的是束宽 k 的"
                    "束搜索本身的结果，它可能比 MAP 差。按题目的规则一步一步留下 k 个候选。")
        if not got or got[-1] != eos:
            return ("输出要以 EOS 结尾：EOS 也是输出的一部分；到第 max_len 步时只能选 EOS"
                    "（它的对数概率也要加上）。")
        found = [bug for bug, _ in _TOKEN_TEXTS
                 if BUGS[bug](*args)[0].tolist() != list(right[0])
                 and BUGS[bug](*args)[0].tolist() == got]
        meant = [bug for bug in found if _MEANT.get(bug) in f.case.tags]
        if len(found) == 1 or meant:            # two bugs alike: the one the case is built for
            return dict(_TOKEN_TEXTS)[(meant or found)[0]]
        return None
    if f.label == LOGP and f.kind == "value":
        got, n = float(f.got), len(right[0])
        if abs(got - right[1] / n) < 1e-9 * max(1.0, abs(got)):
            return f"返回的像是除以长度（{n}）之后的平均值：要的是 log P(y|x) 本身。"
        if abs(got - math.exp(right[1])) < 1e-9:
            return "返回的是概率 P(y|x)：要的是它的对数 log P(y|x)。"
        last = float(logp.double()[right[0][-2] if n > 1 else bos, eos])
        if abs(got - (right[1] - last)) < 1e-9 * max(1.0, abs(got)):
            return "少了 EOS 那一项：生成 EOS 的对数概率也属于 log P(y|x)。"
        if close(f.got, _summed_probs(*args)[1]):
            return dict(_TOKEN_TEXTS)["probabilities_summed"]
    return None


register(Exercise("ch02.beam_search", "束搜索", beam_search, BUGS, _cases, (_hint,), run=_run,
                  build=True, f64_tol=dict(rtol=1e-9, atol=1e-9),
                  forbidden=((decoding.beam_search, "attnbook.decoding.beam_search"),
                             (decoding.exact_map, "attnbook.decoding.exact_map"),
                             (_search, "exercises.beam._search"))))
