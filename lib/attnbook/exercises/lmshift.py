"""Chapter 11's build exercise ``ch11.lm_loss``: the language-model loss, targets shifted by one.

The reader writes ``lm_loss(logits, ids, pad_id=0)``: ``logits`` ``(B, T, V)`` is what the
model gives for ``ids`` ``(B, T)`` (right-padded with ``pad_id``); the logits at position t
predict the token at t + 1, so the predictions are ``logits[:, :-1]`` and the targets
``ids[:, 1:]``. Return the mean of ``-log p(target)`` over every target that is not PAD
(eq-ch11-lm-loss), as ``attnbook.gpt.lm_loss`` -- computed here without ``F.cross_entropy``:
log-softmax, the shift, picking each target's log-probability, the PAD mask and the mean over
tokens are the steps.

The classic bugs: no shift (position t scored against its own token), the shift the wrong
way (logits[:, 1:] against ids[:, :-1]), PAD targets counted, the PAD mask read from the
inputs ids[:, :-1] instead of the targets, the mean of per-sequence means, PAD hard-coded
as 0, log(softmax) that gives -inf on large logits, the sum instead of the mean.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gpt import lm_loss as _lib_lm_loss
from ..train import label_smoothed_cross_entropy, token_cross_entropy
from ._core import Case, Exercise, register
from ._report import close


def lm_loss(logits, ids, pad_id=0):
    """Mean -log p(ids[:, t+1] | logits[:, t]) over the non-PAD targets (chapter 11)."""
    return _lib_lm_loss(logits, ids, pad_id=pad_id)


def _variant(logits, ids, pad_id=0, *, shift="right", keep="targets", reduce="tokens",
             pad=None, log_of_softmax=False):
    pad = pad_id if pad is None else pad
    logp = torch.log(torch.softmax(logits, -1)) if log_of_softmax else logits.log_softmax(-1)
    if shift == "right":
        pred, target, inputs = logp[:, :-1], ids[:, 1:], ids[:, :-1]
    elif shift == "none":
        pred, target, inputs = logp, ids, ids
    else:                                                      # the wrong way
        pred, target, inputs = logp[:, 1:], ids[:, :-1], ids[:, 1:]
    y = target.clamp(0, logits.shape[-1] - 1)
    nll = -pred.gather(-1, y[..., None])[..., 0]                # (B, T - 1)
    real = {"targets": target != pad, "inputs": inputs != pad,
            "all": torch.ones_like(target, dtype=torch.bool)}[keep]
    nll = torch.where(real, nll, 0.0)
    if reduce == "sequences":
        return (nll.sum(-1) / real.sum(-1)).mean()
    if reduce == "sum":
        return nll.sum()
    return nll.sum() / real.sum()


def _bug(**kw):
    return lambda logits, ids, pad_id=0: _variant(logits, ids, pad_id, **kw)


BUGS = {
    "no_shift": _bug(shift="none"),
    "shifted_the_wrong_way": _bug(shift="left"),
    "pad_targets_counted": _bug(keep="all"),
    "pad_mask_from_the_inputs": _bug(keep="inputs"),
    "mean_of_sequence_means": _bug(reduce="sequences"),
    "pad_id_hard_coded_0": _bug(pad=0),
    "log_of_softmax": _bug(log_of_softmax=True),
    "sum_not_mean": _bug(reduce="sum"),
}


def _cases(g):
    f64 = torch.float64

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    def draw(b, t, v, pad_id, lengths, scale=2.0):
        logits = scale * torch.randn(b, t, v, generator=g, dtype=f64)
        words = torch.tensor([c for c in range(v) if c != pad_id])
        ids = words[torch.randint(len(words), (b, t), generator=g)]
        ids[torch.arange(t) >= torch.tensor(lengths)[:, None]] = pad_id
        return logits, ids

    b, t, v = ri(3, 6), ri(5, 12), ri(8, 40)
    pad_r = ri(1, v - 1)                                   # PAD in the middle of the vocabulary
    lengths = [t, 2] + [ri(2, t + 1) for _ in range(b - 2)]
    mixed, ids_r = draw(b, t, v, pad_r, lengths)
    mixed = mixed * torch.logspace(-1, 2, b, dtype=f64)[:, None, None]   # 0.1x ... 100x
    return [
        Case("1 首、T = 5、词表 6，没有 PAD，pad_id 用默认值 0", draw(1, 5, 6, 0, [5]),
             note="5 个位置给出 4 个预测：位置 t 的 logits 预测位置 t + 1 的词元。"),
        Case("2 首，T = 6、词表 7，第二首只有 4 个真实词元（后面是 PAD = 0）",
             draw(2, 6, 7, 0, [6, 4]),
             note="第二首的目标 ids[1, 1:] 里最后两个是 PAD，不算；算的是 3 + 5 = 8 个目标。"),
        Case("PAD 的编号是 V − 1 = 7（不是 0）", (*draw(2, 5, 8, 7, [5, 3]),), dict(pad_id=7),
             note="pad_id = 7：类 0 是普通词元。", tags=frozenset({"pad7"})),
        Case(f"{b} 首长短不一（第二首只有 2 个真实词元），各首 logit 的尺度从 0.1 倍到 100 倍，"
             f"PAD = {pad_r}（V = {v}）", (mixed, ids_r), dict(pad_id=pad_r),
             note=f"长度 {lengths}：平均是对全部非 PAD 目标取的，不是先对每首取平均。",
             tags=frozenset({"mixed"})),
        Case("logit 很大（上千）", draw(2, 4, 5, 0, [4, 3], scale=3000.0),
             note="softmax 之后大多数类的概率下溢成 0：log 0 = −inf。", tags=frozenset({"large"})),
    ]


MESSAGES = {
    "no_shift": ("没有错开一位：位置 t 的 logits 要预测下一个词元 ids[:, t + 1]，"
                 "不是它自己 ids[:, t]。预测取 logits[:, :-1]，目标取 ids[:, 1:]。"),
    "shifted_the_wrong_way": ("错开的方向反了：预测取 logits[:, :-1]（最后一个位置后面没有词元），"
                              "目标取 ids[:, 1:]（第一个词元 BOS 不是谁的目标）。"),
    "pad_targets_counted": ("PAD 目标也算进了平均：只对目标 ids[:, 1:] 不等于 pad_id 的位置"
                            "求平均。"),
    "pad_mask_from_the_inputs": ("PAD 掩码看的是输入 ids[:, :-1]：要看的是目标 ids[:, 1:]"
                                 "（一首诗最后一个真实词元的下一个目标已经是 PAD）。"),
    "mean_of_sequence_means": ("这是先对每首取平均、再对各首取平均：长短不一时短的权重更大。"
                               "要的是全部非 PAD 目标放在一起的平均（总和除以目标个数）。"),
    "pad_id_hard_coded_0": "PAD 的编号写死成了 0：用参数 pad_id 判断哪些目标要忽略。",
    "sum_not_mean": "这是总和；要的是每个目标词元的平均损失（除以非 PAD 目标的个数）。",
}


def _hint(f):
    if f.kind in ("inf", "nan") and "large" in f.case.tags:
        return ("softmax 下溢成 0，log 0 = −inf：用 logits.log_softmax(-1)"
                "（它先减去每行的最大值），不要 torch.log(torch.softmax(...))。")
    if f.kind != "value":
        return None
    args = [f.inputs[k] for k in ("logits", "ids", "pad_id") if k in f.inputs]
    for name, message in MESSAGES.items():
        if close(f.got, BUGS[name](*args), rtol=1e-9, atol=1e-9):
            return message
    return None


FORBIDDEN = ((_lib_lm_loss, "attnbook.gpt.lm_loss"),
             (token_cross_entropy, "attnbook.train.token_cross_entropy"),
             (label_smoothed_cross_entropy, "attnbook.train.label_smoothed_cross_entropy"),
             (F.cross_entropy, "F.cross_entropy"),
             (F.nll_loss, "F.nll_loss"))

register(Exercise("ch11.lm_loss", "语言模型的损失：目标错开一位", lm_loss, BUGS, _cases,
                  (_hint,), forbidden=FORBIDDEN, build=True))
