"""Chapter 02's exercises: a sequence's log-probability by the chain rule, and the
teacher-forced token-mean cross-entropy.

``ch02.sequence_logprob(logits, tokens)``: the decoder's logits at every position of one output
``(T, V)`` (position t conditioned on ``y_<t`` and x) and the output's tokens ``(T,)``, EOS
last; return ``log P(y|x) = sum_t log softmax(logits_t)[y_t]`` (eq. eq-ch02-chain-eos) as a
0-dim tensor. The classic bugs: raw logits instead of log-probabilities, a product of
probabilities that underflows to 0 (log 0 = -inf) on a long output, exp without the max
subtracted (inf/inf = NaN on large logits), the logits shifted by one position against the
tokens, the EOS term dropped, the mean instead of the sum, the softmax over the wrong axis.

``ch02.token_cross_entropy(logits, target, pad_id)``: logits ``(B, T, V)``, targets ``(B, T)``
padded with ``pad_id``; return the token-mean cross-entropy of eq. eq-ch02-token-ce (the
negative log-likelihood summed over the real tokens, divided by their number). The classic
bugs: PAD counted as a target, the mean of the sentence means, the sum, the sum divided by the
batch size, the PAD id hard-coded as 0. F.cross_entropy / F.nll_loss with ``ignore_index`` are
off limits (they drop the PAD targets for the reader); the PAD id sits mid-vocabulary in one
case (an answer that takes PAD for the largest id selects the wrong tokens).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._core import Case, Exercise, register
from ._report import close


def sequence_logprob(logits, tokens):
    """log P(y|x) of one output by the chain rule (chapter 02, eq-ch02-chain-eos)."""
    logp = logits.log_softmax(-1)                                # (T, V)
    return logp.gather(-1, tokens[:, None])[:, 0].sum()


def _picked(logits, tokens):
    return logits.gather(-1, tokens[:, None])[:, 0]


def _raw_logits(logits, tokens):
    return _picked(logits, tokens).sum()


def _product(logits, tokens):
    return torch.log(_picked(logits.softmax(-1), tokens).prod())


def _no_max(logits, tokens):
    e = logits.exp()
    return torch.log(_picked(e / e.sum(-1, keepdim=True), tokens)).sum()


def _shifted(logits, tokens):
    return _picked(logits.log_softmax(-1)[:-1], tokens[1:]).sum()


def _eos_dropped(logits, tokens):
    return _picked(logits.log_softmax(-1), tokens)[:-1].sum()


def _mean(logits, tokens):
    return _picked(logits.log_softmax(-1), tokens).mean()


def _wrong_axis(logits, tokens):
    return _picked(logits.log_softmax(0), tokens).sum()


LOGPROB_BUGS = {
    "raw_logits_summed": _raw_logits,
    "product_underflows": _product,
    "exp_without_max": _no_max,
    "logits_shifted_by_one": _shifted,
    "eos_term_dropped": _eos_dropped,
    "mean_not_sum": _mean,
    "softmax_over_wrong_axis": _wrong_axis,
}


def _logprob_cases(g):
    f64 = torch.float64

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    def draw(t, v, scale=1.0, shift=0.0):
        logits = scale * torch.randn(t, v, generator=g, dtype=f64) + shift
        tokens = torch.randint(1, v, (t,), generator=g)
        return logits, tokens.index_fill_(0, torch.tensor([t - 1]), 0)

    t1, v1 = pick(4, 7), pick(5, 9)
    t2, v2 = pick(350, 450), pick(40, 60)
    t3, v3 = pick(5, 8), pick(4, 6)
    big = 250.0 + 100.0 * float(torch.rand(1, generator=g))
    return [
        Case(f"一个 {t1} 个词元的输出（最后一个是 EOS = 0）", draw(t1, v1),
             note=f"logits 形状 ({t1}, {v1})：第 t 行是模型在看过 y_<t 之后给第 t 个词元的 logit。"),
        Case(f"一个 {t2} 个词元的长输出", draw(t2, v2),
             note=f"每个词元的概率约 1/{v2}，整句的概率小于 e^-1000：直接连乘会下溢成 0。",
             tags=frozenset({"long"})),
        Case("logit 很大（上千）的输出", draw(t3, v3, scale=big, shift=1000.0),
             note="logit 的量级上千：exp(logit) 会上溢成 inf（float64 到 e^709 为止）。",
             tags=frozenset({"large"})),
        Case("选中的词元比最大的 logit 低 900，词表里最大的编号没有出现", _far_below(g),
             note="每一步被选中的词元的 logit 比这一行最大的低 900：它的概率 e^-900 在 float64 里"
                  "下溢成 0；词元编号里没有 V − 1。", tags=frozenset({"far"})),
    ]


def _far_below(g):
    """Picked logits 900 below their row's max (log(softmax) underflows to -inf on every seed),
    and token ids that never reach V - 1 (F.one_hot without num_classes gives too few columns)."""
    t = 4 + int(torch.randint(0, 3, (1,), generator=g))
    v = 6 + int(torch.randint(0, 3, (1,), generator=g))
    logits = 200.0 * torch.randn(t, v, generator=g, dtype=torch.float64) + 1000.0
    tokens = torch.randint(1, v - 1, (t,), generator=g)
    tokens[-1] = 0
    rows = torch.arange(t)
    others = logits.clone()
    others[rows, tokens] = float("-inf")
    logits[rows, tokens] = others.amax(-1) - 900.0
    return logits, tokens


def _logprob_hint(f):
    if "far" in f.case.tags and f.kind == "exception" and "size" in str(f.exc):
        return ("F.one_hot(tokens) 不传 num_classes 时，列数是 tokens.max() + 1，不一定是词表大小 "
                "V：写 F.one_hot(tokens, num_classes=logits.shape[-1])，或直接用 gather。")
    if "far" in f.case.tags and f.kind == "inf":
        return ("选中词元的概率 e^-900 在 float64 里下溢成 0，log 0 = −inf：先 softmax 再取 log "
                "不行，要用 log_softmax（它算的是 x − logsumexp(x)，不经过概率本身）。")
    if f.kind == "inf" and "long" in f.case.tags:
        return ("概率连乘下溢成了 0，log 0 = −inf：在对数空间里把每一步的 log P 相加，"
                "logits.log_softmax(-1) 再 gather，而不是先连乘概率再取对数。")
    if f.kind in ("nan", "inf") and "large" in f.case.tags:
        return ("exp(logit) 上溢成 inf（inf/inf = NaN，有限数/inf = 0，log 0 = −inf）："
                "用 log_softmax（它先减去每行的最大值），"
                "不要自己写 exp(x) / exp(x).sum()。")
    if f.kind != "value":
        return None
    logits, tokens, got = f.inputs["logits"], f.inputs["tokens"], f.got
    picked = _picked(logits.log_softmax(-1), tokens)
    texts = (
        (_raw_logits(logits, tokens),
         "像是直接把 logit 加起来了：logit 不是对数概率，先做 log_softmax(-1)"
         "（每一行减去自己的 logsumexp）再取 y_t 那一项。"),
        (-picked.sum(),
         "符号反了：要的是 log P(y|x)（一个负数），不是负对数似然 −log P(y|x)。"),
        (_shifted(logits, tokens),
         "logits 与词元错开了一位：第 t 行已经是 P(y_t | y_<t, x) 的 logit，"
         "直接与 tokens[t] 配对，不要再移位。"),
        (_picked(logits.log_softmax(-1)[1:], tokens[:-1]).sum(),
         "logits 与词元错开了一位（logits[1:] 配 tokens[:-1]）：第 t 行就是第 t 个词元的 logit，"
         "直接与 tokens[t] 配对。"),
        (picked[1:].sum(),
         "少了第一项：第 0 行已经是 P(y_1 | x) 的 logit，logits 里没有要跳过的 BOS 行；"
         "每一行都与同一位置的词元配对，一项也不丢。"),
        (_eos_dropped(logits, tokens),
         "少了最后一项：EOS 的对数概率也属于 log P(y|x)，“什么时候停”也是模型的输出。"),
        (_mean(logits, tokens),
         "这是每个词元的平均对数概率；整句的 log P(y|x) 是各项之和（链式法则是连乘）。"),
        (_wrong_axis(logits, tokens),
         "softmax 沿错了维度：每个位置在词表上归一，用 log_softmax(dim=-1)。"),
    )
    for alt, text in texts:  # float64 throughout: a recomputed bug matches to ~1e-12
        if close(got, alt, rtol=1e-8, atol=1e-8):
            return text
    return None


register(Exercise("ch02.sequence_logprob", "一个输出的对数概率", sequence_logprob,
                  LOGPROB_BUGS, _logprob_cases, (_logprob_hint,)))


def token_cross_entropy(logits, target, pad_id):
    """Token-mean cross-entropy over the non-PAD targets (chapter 02, eq-ch02-token-ce)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad_id)


def _nll(logits, target):
    return -logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]     # (B, T)


def _pad_counted(logits, target, pad_id):
    return _nll(logits, target).mean()


def _sentence_means(logits, target, pad_id):
    keep = target != pad_id
    return ((_nll(logits, target) * keep).sum(1) / keep.sum(1)).mean()


def _summed(logits, target, pad_id):
    return (_nll(logits, target) * (target != pad_id)).sum()


def _per_batch(logits, target, pad_id):
    return _summed(logits, target, pad_id) / target.shape[0]


def _pad_zero(logits, target, pad_id):
    return token_cross_entropy(logits, target, 0)


CE_BUGS = {
    "pad_counted": _pad_counted,
    "mean_of_sentence_means": _sentence_means,
    "summed_not_averaged": _summed,
    "divided_by_batch_size": _per_batch,
    "pad_id_hardcoded_zero": _pad_zero,
}


def _ce_cases(g):
    f64 = torch.float64

    def draw(lengths, v, pad_id, lo):
        b, t = len(lengths), max(lengths)
        logits = torch.randn(b, t, v, generator=g, dtype=f64)
        target = torch.randint(lo, v, (b, t), generator=g)
        for i, n in enumerate(lengths):
            target[i, n:] = pad_id
        return logits, target, pad_id

    n = 2 + int(torch.randint(0, 3, (1,), generator=g))
    lengths = torch.randint(1, 7, (n,), generator=g).tolist()
    lengths[int(torch.randint(0, n, (1,), generator=g))] = 7       # one target fills T
    v3 = 6 + int(torch.randint(0, 4, (1,), generator=g))
    return [
        Case("三个长短不一的目标（PAD = 0）", draw([2, 5, 3], 7, 0, 1),
             note="目标长度 2、5、3，补齐到 5：10 个真实词元，5 个 PAD。",
             tags=frozenset({"pad"})),
        Case("PAD 的编号不是 0", _zero_occurs(draw([4, 1, 6, 2], 8, 7, 0)),
             note="pad_id = 7；编号 0 在这里是一个普通词元，也出现在目标里。",
             tags=frozenset({"pad7"})),
        Case(f"{n} 个目标，PAD 的编号在词表中间", _pad_in_the_middle(draw(lengths, v3, v3 // 2, 0),
                                                             lengths),
             note=f"目标长度 {lengths}；pad_id = {v3 // 2}，比它大和比它小的编号都是普通词元。",
             tags=frozenset({"padmid"})),
        Case("logit 很大（上千）", _large(draw([3, 6], 6, 5, 0), g),
             note="logit 约 1000 ± 几百：exp(logit) 会上溢成 inf；被选中的词元的概率常常小于 "
                  "e^-745，在 float64 里下溢成 0。", tags=frozenset({"large"})),
    ]


def _large(drawn, g):
    """Logits around 1000 +- a few hundred (exp overflows; softmax then log gives -inf)."""
    logits, target, pad_id = drawn
    scale = 300.0 + 100.0 * float(torch.rand(1, generator=g))
    return 1000.0 + scale * logits, target, pad_id


def _zero_occurs(drawn):
    """Token 0 is an ordinary target here (an answer that hard-codes PAD = 0 drops it)."""
    logits, target, pad_id = drawn
    target[0, 0] = 0
    return logits, target, pad_id


def _pad_in_the_middle(drawn, lengths):
    """The real targets never hold pad_id (ids above and below it do occur)."""
    logits, target, pad_id = drawn
    v = logits.shape[-1]
    for i, n in enumerate(lengths):
        row = target[i, :n]
        row[row == pad_id] = (pad_id + 1) % v
        row[0], row[-1] = pad_id - 1, pad_id + 1       # both sides of pad_id
    return logits, target, pad_id


def _ce_hint(f):
    logits, target, pad_id, got = f.inputs["logits"], f.inputs["target"], f.inputs["pad_id"], f.got
    if f.kind == "exception" and "Expected target size" in str(f.exc):
        return ("F.cross_entropy 要的类别在第 1 维：输入是 (N, V) 或 (B, V, T)。把 (B, T, V) 的 logits "
                "先 flatten(0, 1)（目标也 flatten()），或者 transpose(1, 2)。")
    if f.kind in ("nan", "inf") and "large" in f.case.tags:
        return ("exp(logit) 上溢成 inf，或概率下溢成 0 再取 log 得到 −inf：用 log_softmax"
                "（它先减去每行的最大值，不经过概率本身），不要自己写 exp(x) / exp(x).sum()，"
                "也不要先 softmax 再 log。")
    if f.kind == "nan":
        return ("结果是 0/0 = NaN：有的句子（或整个批）一个真实词元也没选上。判断真实词元要用 "
                "target != pad_id，不能假定 PAD 是最大（或最小）的编号。")
    if f.kind != "value":
        return None
    n_tok = int((target != pad_id).sum())
    keep = target != pad_id
    nll = _nll(logits, target)
    for wrong in (target < pad_id, target > pad_id):
        if wrong.any() and close(got, (nll * wrong).sum() / wrong.sum()):
            return ("真实词元选错了：不能假定 PAD 是最大（或最小）的编号，"
                    "真实词元是 target != pad_id 的位置。")
    if close(got, (nll[:, :-1] * keep[:, 1:]).sum() / keep[:, 1:].sum()) or close(
            got, (_nll(logits[:, :-1], target[:, 1:]) * keep[:, 1:]).sum() / keep[:, 1:].sum()):
        return ("logits 与目标错开了一位：这里的 logits[:, t] 已经是目标 target[:, t] 的预测"
                "（强制教学的输入已经右移过），直接配对，不要再像语言模型那样移位。")
    if close(got, nll.sum() / n_tok):
        return (f"分母是真实词元数 {n_tok}，分子却把 PAD 位置的负对数似然也加进去了："
                "求和之前先乘以 target != pad_id。")
    if close(got, _pad_counted(logits, target, pad_id)):
        return ("PAD 也被当成了要预测的目标：只对 target != pad_id 的位置求和，"
                "除以真实词元数（F.cross_entropy 的 ignore_index=pad_id）。")
    if close(got, _sentence_means(logits, target, pad_id)):
        return ("这是先在每个句子内平均、再对句子平均：短句的每个词元权重更大。"
                f"应把所有真实词元的负对数似然加起来，除以词元总数（这里是 {n_tok}）。")
    if close(got, _summed(logits, target, pad_id)):
        return f"这是总和；还要除以真实词元的个数 N_tok（这里是 {n_tok}），不是按句子数。"
    if close(got, _per_batch(logits, target, pad_id)):
        return f"除以的是句子数；按词元平均要除以真实词元的个数 N_tok（这里是 {n_tok}）。"
    if close(got, _pad_zero(logits, target, pad_id)):
        return "PAD 的编号写死成了 0：用传入的 pad_id（ignore_index=pad_id）。"
    return None


def _ignore_index(args, kwargs) -> bool:
    """F.cross_entropy / F.nll_loss asked to drop the PAD targets itself (ignore_index), or to
    weigh them out (a class ``weight`` with 0 at pad_id gives the same mean)."""
    value = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
    weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
    return value is not None and int(value) != -100 or weight is not None


register(Exercise("ch02.token_cross_entropy", "按词元平均的交叉熵", token_cross_entropy,
                  CE_BUGS, _ce_cases, (_ce_hint,),
                  forbidden=((F.cross_entropy, "F.cross_entropy(ignore_index=… 或 weight=…)",
                              _ignore_index),
                             (F.nll_loss, "F.nll_loss(ignore_index=… 或 weight=…)",
                              _ignore_index))))
