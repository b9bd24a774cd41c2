"""Chapter 10's exercises: the label-smoothed cross-entropy, the warm-up learning rate, the
decoder's mask.

``ch10.smoothed_cross_entropy(logits, target, smoothing, pad_id)``: logits ``(B, T, V)``,
targets ``(B, T)`` padded with ``pad_id``, smoothing eps; return the mean over the non-PAD
positions of ``sum_c q_c (-log p_c)`` with the smoothed target ``q = (1 - eps) onehot(y) +
eps / V`` (every one of the V classes, PAD's column included, gets eps / V: Szegedy et al.
2016, ``F.cross_entropy(label_smoothing=eps)``, the library's ``label_smoothed_cross_entropy``).
The classic bugs: eps / (V - 1) off the target (the other convention), the target's
1 - eps without its own eps / V (q no longer sums to 1), PAD's column kept out of the
smoothing, PAD positions counted or the sum divided by every position, PAD hard-coded as 0,
log(softmax) that gives -inf on large logits, the sum instead of the mean, KL(q || p) (the
KLDivLoss form, off by the constant H(q)), the mean of per-sentence means.

``ch10.noam_lr(steps, d_model, warmup)``: the learning rate of Vaswani et al. 2017 §5.3,
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``, for a float64 tensor of steps counted
from 1. The classic bugs: max instead of min, the d_model^-0.5 factor dropped, warmup^-1 or
warmup^-0.5 in the rising part, steps counted from 0 (lr = 0 at the first step) or shifted by
one to dodge 0^-0.5, sqrt(d_model) multiplied instead of divided.

``ch10.decoder_mask(tgt_pad)``: the target pad mask ``(B, T)`` (True = a real token); return
the decoder self-attention's bool mask ``(B, 1, T, T)``, True = may attend: query i sees key j
iff j <= i and j is a real token. The classic bugs: the causal part or the padding part
missing, padding applied to the queries (rows) instead of the keys, the diagonal hidden
(tril(-1)), the upper triangle, torch's polarity (True = hidden), no head axis, the two
conditions joined by OR.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..train import label_smoothed_cross_entropy
from ._core import OUT, Case, Exercise, register
from ._report import close


# ------------------------------------------------------------------ label-smoothed cross-entropy
def smoothed_cross_entropy(logits, target, smoothing, pad_id):
    """Mean over non-PAD positions of the cross-entropy against (1 - eps) onehot(y) + eps / V."""
    return label_smoothed_cross_entropy(logits, target, smoothing=smoothing, pad_id=pad_id)


def _q(logits, target, eps, *, off, on, pad_col=None):
    """A target distribution: ``on`` at y, ``off`` elsewhere (0 at ``pad_col`` if given)."""
    q = torch.full_like(logits, off)
    if pad_col is not None:
        q[..., pad_col] = 0.0
    y = target.clamp(0, logits.shape[-1] - 1)
    return q.scatter(-1, y[..., None], on)


def _ce(logits, q, keep, logp=None, reduce="mean"):
    logp = logits.log_softmax(-1) if logp is None else logp
    per = -(q * logp).sum(-1)                                       # (B, T)
    if reduce == "mean":
        return per[keep].sum() / keep.sum()
    if reduce == "all":
        return per.mean()
    if reduce == "all_positions":
        return per[keep].sum() / keep.numel()
    return per[keep].sum()


def _ls(logits, target, smoothing, pad_id, *, off=None, on=None, pad_col=False,
        keep_pad=False, reduce="mean", pad=None, log_of_softmax=False, kl=False):
    v = logits.shape[-1]
    pad = pad_id if pad is None else pad
    off = smoothing / v if off is None else off(smoothing, v)
    on = 1 - smoothing + smoothing / v if on is None else on(smoothing, v)
    q = _q(logits, target, smoothing, off=off, on=on, pad_col=pad if pad_col else None)
    keep = torch.ones_like(target, dtype=torch.bool) if keep_pad else target != pad
    logp = torch.log(torch.softmax(logits, -1)) if log_of_softmax else logits.log_softmax(-1)
    if kl:                                  # KL(q || p) = CE(q, p) - H(q): the KLDivLoss form
        logp = logp - torch.where(q > 0, q.log(), 0.0)
    if reduce == "sentences":               # the mean of each sentence's mean
        per = -(q * logp).sum(-1)
        return ((per * keep).sum(-1) / keep.sum(-1)).mean()
    return _ce(logits, q, keep, logp, "all" if keep_pad else reduce)


LS_BUGS = {
    "eps_over_V_minus_1": lambda lo, t, e, p: _ls(lo, t, e, p, off=lambda e, v: e / (v - 1),
                                                  on=lambda e, v: 1 - e),
    "target_misses_its_eps_over_V": lambda lo, t, e, p: _ls(lo, t, e, p, on=lambda e, v: 1 - e),
    "pad_column_not_smoothed": lambda lo, t, e, p: _ls(lo, t, e, p, off=lambda e, v: e / (v - 1),
                                                       on=lambda e, v: 1 - e + e / (v - 1),
                                                       pad_col=True),
    "pad_positions_counted": lambda lo, t, e, p: _ls(lo, t, e, p, keep_pad=True),
    "divided_by_all_positions": lambda lo, t, e, p: _ls(lo, t, e, p, reduce="all_positions"),
    "pad_id_hard_coded_0": lambda lo, t, e, p: _ls(lo, t, e, p, pad=0),
    "log_of_softmax": lambda lo, t, e, p: _ls(lo, t, e, p, log_of_softmax=True),
    "sum_not_mean": lambda lo, t, e, p: _ls(lo, t, e, p, reduce="sum"),
    "kl_not_cross_entropy": lambda lo, t, e, p: _ls(lo, t, e, p, kl=True),
    "mean_of_sentence_means": lambda lo, t, e, p: _ls(lo, t, e, p, reduce="sentences"),
}


def _ls_cases(g):
    f64 = torch.float64

    def draw(b, t, v, pad_id, lengths, scale=2.0):
        logits = scale * torch.randn(b, t, v, generator=g, dtype=f64)
        words = [c for c in range(v) if c != pad_id]
        target = torch.tensor(words)[torch.randint(len(words), (b, t), generator=g)]
        target[torch.arange(t) >= torch.tensor(lengths)[:, None]] = pad_id
        return logits, target

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    v = ri(12, 20)
    b, t, vr = ri(3, 6), ri(4, 10), ri(6, 40)
    pad_r = ri(1, vr - 1)                                  # PAD in the middle of the vocabulary
    lengths = [t, 1] + [ri(1, t + 1) for _ in range(b - 2)]
    mixed, target_r = draw(b, t, vr, pad_r, lengths)
    mixed = mixed * torch.logspace(-1, 2, b, dtype=f64)[:, None, None]  # 0.1x ... 100x
    eps_r = float(torch.empty(1, dtype=f64).uniform_(0.05, 0.4, generator=g))
    return [
        Case("2 句、每句 4 个位置、词表 6，第二句后两个是 PAD（= 0）",
             (*draw(2, 4, 6, 0, [4, 2]), 0.1, 0),
             note="ε = 0.1、V = 6：q 在正确类上是 1 − 0.1 + 0.1/6，其余每类 0.1/6（PAD 这一列也是）。"),
        Case(f"本章的尺寸：词表 V = {v}，3 句长短不一", (*draw(3, 9, v, 0, [9, 5, 3]), 0.2, 0),
             note=f"ε = 0.2，V = {v}。", tags=frozenset({"chapter"})),
        Case("PAD 的编号是 V − 1 = 7（不是 0）", (*draw(2, 5, 8, 7, [5, 3]), 0.1, 7),
             note="pad_id = 7：被忽略的是目标等于 7 的位置，类 0 是普通词元。",
             tags=frozenset({"pad7"})),
        Case("logit 很大（上千）", (*draw(2, 3, 5, 0, [3, 2], scale=3000.0), 0.1, 0),
             note="softmax 之后大多数类的概率下溢成 0：log 0 = −inf，而 ε/V · (−inf) 会让损失变成 inf。",
             tags=frozenset({"large"})),
        Case(f"{b} 句长短不一（第二句只有 1 个真实词元），各句 logit 的尺度从 0.1 倍到 100 倍，"
             f"PAD 的编号是 {pad_r}（V = {vr}）", (mixed, target_r, eps_r, pad_r),
             note=f"ε = {eps_r:.3f}；句长 {lengths}：平均是对全部真实词元取的，不是先对每句取平均。",
             tags=frozenset({"mixed"})),
    ]


LS_MESSAGES = {
    "pad_id_hard_coded_0": "PAD 的编号写死成了 0：用参数 pad_id 判断哪些位置要忽略。",
    "eps_over_V_minus_1": ("这是把 ε 平分给其余 V − 1 类的另一种约定：本章（Szegedy 等 2016、"
                           "F.cross_entropy 的 label_smoothing）把 ε 平分给全部 V 类，正确类也分到 ε/V，"
                           "q_y = 1 − ε + ε/V。"),
    "target_misses_its_eps_over_V": ("正确类少了它自己那一份 ε/V：q_y 应是 1 − ε + ε/V，"
                                     "否则 q 的和只有 1 − ε/V，不是一个分布。"),
    "pad_column_not_smoothed": ("PAD 这一列也要分到 ε/V：本章的定义（与 F.cross_entropy 相同）"
                                "对全部 V 类平分 ε，不把 PAD 列单独拿掉。"),
    "pad_positions_counted": ("PAD 位置也算进了平均：只对目标不等于 pad_id 的位置求平均，"
                              "PAD 位置不是要预测的词元。"),
    "divided_by_all_positions": ("分母是全部位置数：PAD 位置的损失去掉了，分母也要只数真实词元"
                                 "（target != pad_id 的个数）。"),
    "sum_not_mean": "这是总和；要的是每个真实词元的平均损失（除以真实词元的个数）。",
    "kl_not_cross_entropy": ("这是 KL(q‖p)（KLDivLoss 的写法），比交叉熵少了一个常数 H(q)："
                             "本章的损失是交叉熵 −Σ q_c log p_c，不减 Σ q_c log q_c。"),
    "mean_of_sentence_means": ("这是先对每句取平均、再对句子取平均：句子长短不一时，短句里的"
                               "词元权重更大。要的是全部真实词元放在一起的平均（总和除以真实词元的个数）。"),
}


def _ls_hint(f):
    if f.kind in ("inf", "nan") and "large" in f.case.tags:
        return ("softmax 下溢成 0，log 0 = −inf：用 logits.log_softmax(-1)"
                "（它先减去每行的最大值），不要 torch.log(torch.softmax(...))。")
    if f.kind != "value":
        return None
    args = [f.inputs[k] for k in ("logits", "target", "smoothing", "pad_id")]
    for name, message in LS_MESSAGES.items():
        if close(f.got, LS_BUGS[name](*args)):
            return message
    return None


register(Exercise("ch10.smoothed_cross_entropy", "标签平滑的交叉熵", smoothed_cross_entropy,
                  LS_BUGS, _ls_cases, (_ls_hint,)))


# ------------------------------------------------------------------ the warm-up learning rate
def noam_lr(steps, d_model, warmup):
    """Vaswani et al. 2017, §5.3: d_model^-0.5 min(step^-0.5, step warmup^-1.5), steps from 1."""
    return d_model ** -0.5 * torch.minimum(steps ** -0.5, steps * warmup ** -1.5)


def _lr(steps, d_model, warmup, *, pick=torch.minimum, d_factor=True, w_power=-1.5, shift=0):
    s = steps + shift
    rise = s * warmup ** w_power
    decay = s.clamp(min=1) ** -0.5
    return (d_model ** -0.5 if d_factor else 1.0) * pick(decay, rise)


LR_BUGS = {
    "max_not_min": lambda s, d, w: _lr(s, d, w, pick=torch.maximum),
    "no_d_model_factor": lambda s, d, w: _lr(s, d, w, d_factor=False),
    "warmup_to_the_minus_1": lambda s, d, w: _lr(s, d, w, w_power=-1.0),
    "warmup_to_the_minus_half": lambda s, d, w: _lr(s, d, w, w_power=-0.5),
    "steps_counted_from_0": lambda s, d, w: _lr(s, d, w, shift=-1),
    "steps_shifted_by_one": lambda s, d, w: _lr(s, d, w, shift=1),
    "times_sqrt_d_model": lambda s, d, w: _lr(s, d, w, d_factor=False) * d ** 0.5,
}


def _lr_cases(g):
    f64 = torch.float64
    d = int(2 ** torch.randint(4, 9, (1,), generator=g))
    w = int(torch.randint(20, 200, (1,), generator=g))
    rand = torch.randint(1, 20 * w, (6,), generator=g).to(f64)
    return [
        Case("论文的设定：d_model = 512，warmup = 4000",
             (torch.tensor([4000.0, 100, 1, 3999, 4001, 10_000, 100_000, 2], dtype=f64),
              512, 4000),
             note="预热结束时（4000，峰值）、之前、第 1 步、之后和很久以后的学习率。"),
        Case(f"d_model = {d}，warmup = {w}，随机的步数",
             (torch.cat([torch.tensor([w, 1.0, w - 1, w + 1], dtype=f64), rand]), d, w),
             note="步数从 1 开始数：第一次 optimizer.step() 用的是 step = 1。"),
        Case("warmup = 1：没有上升段", (torch.tensor([50.0, 1, 2, 3], dtype=f64), 64, 1),
             note="warmup = 1 时 min 总取 step^-0.5：从第 1 步起就按 1/√step 衰减。"),
    ]


LR_MESSAGES = {
    "max_not_min": ("用了 max：预热段应是两项里较小的那一项 step·warmup^-1.5（线性上升），"
                    "之后才是 step^-0.5；用 torch.minimum。"),
    "no_d_model_factor": "少了前面的因子 d_model^-0.5：峰值应是 (d_model·warmup)^-0.5。",
    "warmup_to_the_minus_1": ("上升段写成了 step/warmup：应是 step·warmup^-1.5，"
                              "这样两段在 step = warmup 处相接（都等于 warmup^-0.5）。"),
    "warmup_to_the_minus_half": ("上升段用了 warmup^-0.5：应是 step·warmup^-1.5，"
                                 "两段在 step = warmup 处相接。"),
    "steps_counted_from_0": ("步数从 0 数了：第 1 步的学习率变成了 0。steps 已经从 1 开始，"
                             "直接代入公式。"),
    "steps_shifted_by_one": ("步数多加了 1（为了避开 0^-0.5？）：steps 从 1 开始，"
                             "不会出现 0，直接代入公式。"),
    "times_sqrt_d_model": ("乘了 √d_model：因子是 d_model^-0.5，即除以 √d_model"
                           "（模型越宽，学习率越小）。"),
}


def _lr_hint(f):
    if f.kind != "value":
        return None
    args = [f.inputs[k] for k in ("steps", "d_model", "warmup")]
    for name, message in LR_MESSAGES.items():         # learning rates ~1e-4: relative
        if close(f.got, LR_BUGS[name](*args), rtol=1e-9, atol=0.0):
            return message
    return None


register(Exercise("ch10.noam_lr", "预热学习率", noam_lr, LR_BUGS, _lr_cases, (_lr_hint,)))


# --------------------------------------------------------------- the decoder's self-attention mask
def decoder_mask(tgt_pad):
    """(B, 1, T, T) bool, True = may attend: query i sees key j iff j <= i and j is no PAD."""
    t = tgt_pad.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=tgt_pad.device).tril()
    return causal & tgt_pad[:, None, None, :]


def _mask(tgt_pad, *, causal="tril", pad="keys", invert=False, keepdim=True, union=False):
    t = tgt_pad.shape[-1]
    ones = torch.ones(t, t, dtype=torch.bool)
    c = {"tril": ones.tril(), "none": ones, "strict": ones.tril(-1), "triu": ones.triu()}[causal]
    p = {"keys": tgt_pad[:, None, None, :], "queries": tgt_pad[:, None, :, None],
         "none": torch.ones_like(tgt_pad)[:, None, None, :]}[pad]
    m = (c | p) if union else c & p
    m = ~m if invert else m
    return m if keepdim else m[:, 0]


MASK_BUGS = {
    "causal_only": lambda p: _mask(p, pad="none"),
    "padding_only": lambda p: _mask(p, causal="none"),
    "pad_hides_queries_not_keys": lambda p: _mask(p, pad="queries"),
    "diagonal_hidden": lambda p: _mask(p, causal="strict"),
    "sees_the_future": lambda p: _mask(p, causal="triu"),
    "polarity_inverted": lambda p: _mask(p, invert=True),
    "no_head_axis": lambda p: _mask(p, keepdim=False),
    "causal_or_padding": lambda p: _mask(p, union=True),
}


def _mask_run(fn, args, kwargs):
    ret = fn(*args, **kwargs)  # check compares a bool result as 0/1 (bool_result=True)
    return ret, {OUT: ret}


def _mask_cases(g):
    def pads(lengths, t):
        return torch.arange(t) < torch.tensor(lengths)[:, None]

    t = int(torch.randint(6, 10, (1,), generator=g))
    b = int(torch.randint(3, 6, (1,), generator=g))
    lengths = [t, 1] + torch.randint(2, t, (b - 2,), generator=g).tolist()
    return [
        Case("2 个目标句，长 4 和 2（右边补 PAD）", (pads([4, 2], 4),),
             note="tgt_pad 形状 (2, 4)，True = 真实词元；第二句的位置 2、3 是 PAD。"),
        Case(f"{b} 个目标句，T = {t}，长度 {lengths}", (pads(lengths, t),),
             note="每句的 PAD 都在右边；第一句没有 PAD，第二句只有 1 个真实词元。"),
    ]


MASK_MESSAGES = {
    "causal_only": "少了键填充：PAD 位置作为键也要挡住（& tgt_pad[:, None, None, :]）。",
    "padding_only": "少了因果掩码：查询 i 只能看键 j ≤ i（下三角 tril），不能看后面的词元。",
    "pad_hides_queries_not_keys": ("填充掩码加在了查询（行）上：要挡住的是 PAD 作为键（列），"
                                   "即 tgt_pad[:, None, None, :]。"),
    "diagonal_hidden": "对角线也挡住了：查询 i 可以看它自己（j ≤ i，tril() 而不是 tril(-1)）。",
    "sees_the_future": "用了上三角：查询 i 看的是 j ≤ i，下三角 tril()，不是 triu()。",
    "polarity_inverted": ("掩码的含义反了：本书约定 True = 可以关注（nn.Transformer 的约定相反，"
                          "True = 挡住）。"),
    "causal_or_padding": ("两个条件用了“或”（|）：键 j 要同时满足 j ≤ i **和**不是 PAD 才能看，"
                          "用“与”（&）。"),
}


def _mask_hint(f):
    if f.kind == "shape":
        return ("形状应是 (B, 1, T, T)：中间的 1 是头的维度，这样掩码能广播到 (B, H, T, T) 的分数上。")
    if f.kind in ("dtype", "type", "bool_dtype"):
        return "返回一个 bool 张量（True = 可以关注），形状 (B, 1, T, T)。"
    if f.kind != "value":
        return None
    pad = f.inputs["tgt_pad"]
    for name, message in MASK_MESSAGES.items():
        alt = MASK_BUGS[name](pad)
        if f.got.shape == alt.shape and torch.equal(f.got.bool(), alt):
            return message
    return None


register(Exercise("ch10.decoder_mask", "解码器自注意力的掩码", decoder_mask, MASK_BUGS, _mask_cases,
                  (_mask_hint,), run=_mask_run, bool_result=True))
