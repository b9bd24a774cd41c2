"""Chapter 10's empirical claims: the Transformer's and the GRU's exact match on the date task,
and the reversal smoke test.

One *seed* s is the chapter's recipe with every seed moved together: the model initialised after
``torch.manual_seed(s)``, the training batches ``task.batches(64, seed=s + 1)``, ``fit(seed=s)``;
seed 0 is the chapter's own run. The test set is fixed (``task.batch(500, seed=3,
split="test")``), so the seeds differ in the model and the data order only. Both models train for
the same number of steps with label smoothing 0.1; the learning rates are the chapter's (neither
tuned): Transformer 3e-3 with 50 warm-up steps, GRU 1e-2 without.

``ch10.errors`` reads the same trained Transformers (kept per seed in this process, so the
runner trains each once): the chapter's 200 held-out dates (``task.pairs(200, seed=4,
split="test")``) in each of the 7 formats, decoded greedily; per format the share of wrong
outputs, and per wrong field (year, month, day) its kind (:func:`error_kinds`).

``ch10.reversal`` is the smoke test before the date task (:func:`run_reversal`): the full
Transformer at the seed's fallback size (:data:`REVERSAL_CONFIG`) trained on digit-string
reversal with the paper's Adam betas; one seed moves the initialisation
(``torch.manual_seed(s)``) and the batches (``seed=s + 1``) together. Its measures are those of
:func:`reversal_metrics`; the held-out and training check sets are fixed (the same for every
seed).
"""
from __future__ import annotations

import datetime as dt
import re

import torch

from .._checks import check_int
from ..data import BOS_ID, DATE_FORMATS, EOS_ID, date_task, format_date, make_batch, reversal_task
from ..decoding import beam_search, greedy_decode_batch, score_sequence
from ..seq2seq import AttentionSeq2Seq
from ..train import evaluate, fit, label_smoothed_cross_entropy, token_cross_entropy
from ..transformer import Transformer
from .registry import register
from .rules import All, Ge, Gt, Lt, Median, Rate

__all__ = ["CONFIG", "KINDS", "error_kinds", "error_metrics", "format_key", "keeping_weights",
           "run_errors", "run_training", "train_transformer", "train_gru", "test_set",
           "REVERSAL_CONFIG", "mirror_alignment", "reversal_data", "reversal_metrics",
           "run_reversal", "train_reversal"]

CONFIG = dict(d_model=64, n_heads=4, n_layers=2, d_ff=128)
BATCH = 64


def test_set(task):
    return task.batch(500, seed=3, split="test")


def train_transformer(task, seed: int, steps: int = 300, *, warmup: int = 50,
                      norm_first: bool = False, smoothing: float = 0.1) -> Transformer:
    """The chapter's Transformer (CONFIG, reference backend) trained for ``steps`` steps.

    The keywords are the recipe's ingredients an ablation changes (chapter 10's exercise):
    ``warmup`` (linear warm-up steps of ``fit``; 0 = none), ``norm_first`` (Pre-LN instead of
    Post-LN) and the label ``smoothing``; the defaults are the chapter's run.
    """
    def loss(m, b):
        logits = m(b.src, b.tgt_in, src_pad=b.src_mask, tgt_pad=b.tgt_mask)
        return label_smoothed_cross_entropy(logits, b.tgt_out, smoothing=smoothing)

    torch.manual_seed(seed)
    model = Transformer(len(task.src_vocab), len(task.tgt_vocab), **CONFIG, backend="ref",
                        norm_first=norm_first)
    fit(model, task.batches(BATCH, seed=seed + 1), loss_fn=loss, steps=steps, lr=3e-3,
        warmup=warmup, seed=seed, progress=False)
    return model.eval()


def keeping_weights(loss_fn, at, store: dict):
    """``loss_fn`` for :func:`~attnbook.train.fit` that also keeps the weights after some steps.

    ``fit`` calls the loss once per step, before that step's update, so at its call ``s + 1``
    the model holds exactly the weights after ``s`` steps: ``store[s]`` then gets a copy of
    the model's ``state_dict`` for every ``s`` in ``at`` (``s`` below ``fit``'s ``steps``).
    Nothing else changes (no random numbers drawn, no gradients), so the training is the
    same bit for bit. Chapter 10 keeps its run's weights after 150 steps: with the same seed,
    batches and warm-up (``fit``'s schedule does not depend on the total step count) they
    are those of :func:`train_transformer` with ``steps=150``, the ablation's recipe arm.
    """
    fn = "keeping_weights"
    if not callable(loss_fn):
        raise TypeError(f"{fn}: `loss_fn` must be callable as loss_fn(model, batch), "
                        f"got {type(loss_fn).__name__}")
    at = tuple(at)
    if not at or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                         for s in at):
        raise ValueError(f"{fn}: `at` must be a non-empty collection of step counts >= 1, "
                         f"got {at!r}")
    if not isinstance(store, dict):
        raise TypeError(f"{fn}: `store` must be a dict, got {type(store).__name__}")
    calls = [0]

    def loss_keeping_weights(model, batch):
        if calls[0] in at:
            store[calls[0]] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        calls[0] += 1
        return loss_fn(model, batch)

    return loss_keeping_weights


def train_gru(task, seed: int, steps: int = 300) -> AttentionSeq2Seq:
    """Chapter 03's GRU + additive attention (Bahdanau flow) with the chapter-10 budget."""
    def loss(m, b):
        logits = m(b.src, b.src_mask, b.tgt_in).logits
        return label_smoothed_cross_entropy(logits, b.tgt_out, smoothing=0.1)

    torch.manual_seed(seed)
    gru = AttentionSeq2Seq(len(task.src_vocab), len(task.tgt_vocab), d_emb=16, d_hidden=48,
                           score="additive", flow="bahdanau")
    fit(gru, task.batches(BATCH, seed=seed + 1), loss_fn=loss, steps=steps, lr=1e-2,
        seed=seed, progress=False)
    return gru.eval()


_TRAINED: dict = {}    # seed -> the trained Transformer (shared by run_training and run_errors)


def _transformer(task, seed: int) -> Transformer:
    if seed not in _TRAINED:
        _TRAINED[seed] = train_transformer(task, seed)
    return _TRAINED[seed]


def run_training(seed: int) -> dict:
    task = date_task()
    test = test_set(task)
    model = _transformer(task, seed)
    out = model.generate(test.src, src_pad=test.src_mask, bos=BOS_ID, eos=EOS_ID, max_len=12)
    acc = evaluate(out, test.tgt_out)
    gru = train_gru(task, seed)
    hyps = greedy_decode_batch(gru.batch_step_fn(test.src, test.src_mask), batch_size=len(test),
                               bos=BOS_ID, eos=EOS_ID, max_len=12)
    acc_gru = evaluate([list(h.tokens) for h in hyps], test.tgt_out)
    return {"transformer_exact": acc.exact_match, "transformer_token": acc.token_accuracy,
            "gru_exact": acc_gru.exact_match,
            "gru_minus_transformer": acc_gru.exact_match - acc.exact_match}


register("ch10.transformer_learns", chapter="10", run=run_training,
         rule=All(Gt("transformer_token", 0.9), Gt("transformer_exact", 0.5)),
         claim="300 步后 Transformer 学会了日期格式转换：逐词元正确率高于 0.9，整句正确率远高于未训练的模型（约 0），"
               "但整句正确率随种子变化很大",
         quoted=("transformer_exact", "transformer_token"), fmt=".3f")
register("ch10.gru_not_worse", chapter="10", run=run_training,
         rule=All(Gt("gru_exact", 0.9), Ge("gru_minus_transformer", -0.02)),
         claim="同样 300 步、同样的数据，第 3 章的 GRU + 注意力的整句正确率不低于 Transformer（学习率各用本章的，均未调）",
         quoted=("gru_exact", "gru_minus_transformer"), fmt=".3f")


FIELDS = {"year": slice(0, 4), "month": slice(5, 7), "day": slice(8, 10)}
KINDS = ("swapped", "0-padding", "other")


def error_kinds(out: str, iso: str) -> list[tuple[str, str]]:
    """One ``(field, kind)`` per wrong field of the output ``out`` against the ISO date ``iso``.

    ``"swapped"``: the field's last two digits in the wrong order (1997 -> 1979);
    ``"0-padding"``: a two-character field whose leading 0 is lost or gained while the last
    digit is right (01 -> 11, 24 -> 04); ``"other"``: anything else.
    """
    kinds = []
    for field, sl in FIELDS.items():
        a, b = out[sl], iso[sl]
        if a == b:
            continue
        if len(a) == len(b) and a[:-2] == b[:-2] and a[-2:] == b[-2:][::-1]:
            kinds.append((field, "swapped"))
        elif len(a) == 2 and (a[0] == "0") != (b[0] == "0") and a[1] == b[1]:
            kinds.append((field, "0-padding"))
        else:
            kinds.append((field, "other"))
    return kinds


def format_key(fmt: str) -> str:
    """A metric name for a date format: ``"MMMM D, YYYY"`` -> ``"err_MMMM_D_YYYY"``."""
    return "err_" + re.sub(r"\W+", "_", fmt).strip("_")


def error_metrics(model: Transformer, task, n_dates: int = 200) -> dict:
    """Per format the share of wrong greedy outputs on the held-out dates, and the kinds of
    the wrong fields: the numbers chapter 10's error analysis draws its conclusions from."""
    dates = [iso for _, iso in task.pairs(n_dates, seed=4, split="test")]
    m, kinds, n_wrong, day_dirs = {}, [], 0, {"to_one": 0, "zero_lost": 0}
    for fmt in DATE_FORMATS:
        pairs = [(format_date(dt.date.fromisoformat(iso), fmt), iso) for iso in dates]
        b = make_batch(pairs, task.src_vocab, task.tgt_vocab)
        outs = [task.tgt_vocab.decode(o) for o in model.generate(
            b.src, src_pad=b.src_mask, bos=BOS_ID, eos=EOS_ID, max_len=12)]
        wrong = [(o, iso) for o, (_, iso) in zip(outs, pairs) if o != iso]
        m[format_key(fmt)] = len(wrong) / len(pairs)
        n_wrong += len(wrong)
        for o, iso in wrong:
            k = error_kinds(o, iso)
            kinds += k
            if ("day", "0-padding") in k:
                day_dirs["to_one" if o[8] == "0" else "zero_lost"] += 1
    rates = [m[format_key(f)] for f in DATE_FORMATS]
    n_kinds = max(len(kinds), 1)
    n_swapped = sum(k == "swapped" for _, k in kinds)
    m.update(
        wrong_share=n_wrong / (len(dates) * len(DATE_FORMATS)),
        two_kinds_share=sum(k != "other" for _, k in kinds) / n_kinds,
        swapped_in_year=sum(kd == ("year", "swapped") for kd in kinds) / max(n_swapped, 1),
        mmmm_rank=sorted(rates, reverse=True).index(m[format_key("MMMM D, YYYY")]) + 1,
        max_over_min_err=max(rates) / max(min(rates), 1 / len(dates)),
        day_to_one=day_dirs["to_one"], day_zero_lost=day_dirs["zero_lost"])
    return m


def run_errors(seed: int) -> dict:
    task = date_task()
    return error_metrics(_transformer(task, seed), task)


register("ch10.errors", chapter="10", run=run_errors,
         rule=All(Gt("swapped_in_year", 0.5), Gt("day_zero_lost", 0.5)),
         overall=(Rate(Lt("mmmm_rank", 1.5), at_least=0.8), Median(Gt("max_over_min_err", 4)),
                  Rate(All(Gt("two_kinds_share", 0.5), Lt("wrong_share", 0.15)), at_least=0.8)),
         notes="Restated 2026-12-05 after seeds 0-9 x 3 environments: 'MMMM D, YYYY is the "
               "hardest format on every seed' holds on 22 of 25 runs and 'hardest/easiest > "
               "4x' was thin (seed 2: 4.3): now rates / a median. The other direction, a "
               "two-digit day written with a leading 0 (24 -> 04, `day_to_one`), is 0 on some "
               "seeds: not part of the claim.",
         claim="错误分析：7 种写法里 `MMMM D, YYYY` 在绝大多数运行上错误率最高"
               "；错误率最高与最低的写法之比的中位数超过 4；绝大多数运行上出错的字段过半属于两"
               "类位置错误（一个字段里相邻两位颠倒、一位数与两位数的日/月混淆）；每次运行上颠倒"
               "的过半出在年份，丢掉日的前导 0（01 → 11）都出现。各写法的具体错误率随种"
               "子变化",
         quoted=("err_MMMM_D_YYYY", "two_kinds_share", "swapped_in_year", "wrong_share"),
         fmt=".3f",
         )


# ---------------------------------------------------------------- the reversal smoke test

REVERSAL_CONFIG = dict(d_model=32, n_heads=4, n_layers=1, d_ff=128)   # the seed's fallback size
REVERSAL_STEPS, REVERSAL_BATCH, REVERSAL_LR, REVERSAL_WARMUP = 600, 128, 1e-3, 100
REVERSAL_BETAS = (0.9, 0.98)
N_HELD_OUT, N_BEAM, N_TRAIN_CHECK = 500, 100, 500


def reversal_data():
    """The smoke test's task: digit strings of lengths 3-8 and their mirror images
    (``attnbook.data.reversal_task``; one vocabulary of 10 digits + PAD, BOS, EOS, UNK)."""
    return reversal_task(min_len=3, max_len=8)


def mirror_alignment(weights: torch.Tensor, src_len) -> float:
    """The share of target tokens whose attention peaks on the mirrored source position.

    ``weights``: ``(B, T, S)`` attention of target query t over source key s (e.g. the last
    layer's cross-attention averaged over heads, teacher forced); ``src_len``: ``(B,)`` the
    number of source tokens of each row. For reversal, query t (which predicts the target's
    token t) should read source position ``src_len - 1 - t``; the queries counted are
    t = 0 .. src_len - 1 of every row (the one that predicts EOS and the padded ones are not).
    Returns the share of those queries whose argmax over the keys is the mirrored position
    (ties go to the lowest index, as ``torch.argmax``).
    """
    fn = "mirror_alignment"
    if not isinstance(weights, torch.Tensor) or weights.ndim != 3 \
            or not weights.dtype.is_floating_point:
        raise TypeError(f"{fn}: `weights` must be a float tensor (B, T, S), got "
                        f"{getattr(weights, 'shape', type(weights).__name__)}")
    b, t, s = weights.shape
    src_len = torch.as_tensor(src_len)
    if src_len.shape != (b,) or src_len.dtype.is_floating_point or src_len.dtype == torch.bool:
        raise TypeError(f"{fn}: `src_len` must hold {b} integer lengths (one per row of "
                        f"`weights`), got {src_len!r}")
    if b == 0 or int(src_len.min()) < 1 or int(src_len.max()) > min(s, t):
        raise ValueError(f"{fn}: `src_len` must lie in 1..{min(s, t)} (the keys S={s} and the "
                         f"queries T={t} of `weights`), got {src_len.tolist()}")
    if not bool(torch.isfinite(weights).all()):
        raise ValueError(f"{fn}: `weights` must be finite")
    pos = torch.arange(t)
    counted = pos[None] < src_len[:, None]                              # (B, T)
    mirrored = src_len[:, None] - 1 - pos[None]                         # (B, T)
    hit = (weights.argmax(-1) == mirrored) & counted
    return float(hit.sum()) / float(counted.sum())


def train_reversal(task, seed: int, steps: int = REVERSAL_STEPS, *,
                   config: dict | None = None) -> tuple[Transformer, list[float]]:
    """The full Transformer trained on reversal with the paper's Adam (betas 0.9, 0.98).

    ``torch.manual_seed(seed)`` initialises the model (``config``, default
    :data:`REVERSAL_CONFIG`, Post-LN, dropout 0, reference backend); batches of
    :data:`REVERSAL_BATCH` come from ``task.batches(seed=seed + 1)``; the loss is the plain
    teacher-forced cross-entropy (no label smoothing: its floor would keep the loss far above
    0); the learning rate rises linearly over :data:`REVERSAL_WARMUP` steps to
    :data:`REVERSAL_LR`. Returns the model (in eval mode) and every step's loss.
    """
    fn = "train_reversal"
    seed = check_int("seed", seed, fn=fn, minimum=0)
    steps = check_int("steps", steps, fn=fn, minimum=1)
    config = dict(REVERSAL_CONFIG if config is None else config)
    torch.manual_seed(seed)
    model = Transformer(len(task.src_vocab), len(task.tgt_vocab), **config, backend="ref")
    opt = torch.optim.Adam(model.parameters(), lr=REVERSAL_LR, betas=REVERSAL_BETAS)
    batches = task.batches(REVERSAL_BATCH, seed=seed + 1)
    losses = []
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = REVERSAL_LR * min(1.0, (step + 1) / REVERSAL_WARMUP)
        b = next(batches)
        logits = model(b.src, b.tgt_in, src_pad=b.src_mask, tgt_pad=b.tgt_mask)
        loss = token_cross_entropy(logits, b.tgt_out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.eval(), losses


def reversal_metrics(model: Transformer, task, losses, *, label: str = "") -> dict:
    """The smoke test's measurements of a trained model (what ``ch10.reversal`` registers).

    On :data:`N_HELD_OUT` held-out strings (``task.batch(seed=3, split="test")``): greedy exact
    match and token accuracy, and :func:`mirror_alignment` of the last layer's head-averaged
    cross-attention (teacher forced); on the first :data:`N_BEAM` of them, the share where beam
    search (k = 4) returns greedy's output, and the number where beam's sequence is less
    probable than greedy's (printed, each with both log-probabilities); on
    :data:`N_TRAIN_CHECK` training strings (``seed=5``), the share where greedy decoding equals
    the argmax of the teacher-forced pass at every target position. ``loss_ratio``: the mean of
    the last 10 training losses over the mean of the first 10.
    """
    if len(losses) < 20:
        raise ValueError(f"reversal_metrics: `losses` must hold >= 20 steps, got {len(losses)}")
    test = task.batch(N_HELD_OUT, seed=3, split="test")
    greedy = model.generate(test.src, src_pad=test.src_mask, bos=BOS_ID, eos=EOS_ID, max_len=10)
    acc = evaluate(greedy, test.tgt_out)
    maps = model.attention_maps(test.src, test.tgt_in, src_pad=test.src_mask,
                                tgt_pad=test.tgt_mask)
    align = mirror_alignment(maps.cross[-1].mean(1), test.src_len)
    agree, worse = 0, 0
    for i in range(N_BEAM):
        step = model.step_fn(test.src[i, :int(test.src_len[i])])
        beam = beam_search(step, bos=BOS_ID, eos=EOS_ID, beam_size=4, max_len=10)[0]
        agree += list(beam.tokens) == greedy[i]
        g_lp = score_sequence(step, greedy[i], bos=BOS_ID)
        if beam.logprob < g_lp - 1e-4:                     # beyond float32 rounding
            worse += 1
            print(f"ch10.reversal{label}: beam less probable than greedy on "
                  f"{test.pairs[i][0]!r}: beam {beam.logprob:.4f} < greedy {g_lp:.4f}")
    train = task.batch(N_TRAIN_CHECK, seed=5, split="train")
    out = model.generate(train.src, src_pad=train.src_mask, bos=BOS_ID, eos=EOS_ID, max_len=10)
    with torch.no_grad():
        tf = model(train.src, train.tgt_in, src_pad=train.src_mask,
                   tgt_pad=train.tgt_mask).argmax(-1)
    same = [o == tf[i, :int(train.tgt_len[i])].tolist() for i, o in enumerate(out)]
    return {"exact_match": acc.exact_match, "token_accuracy": acc.token_accuracy,
            "loss_ratio": (sum(losses[-10:]) / 10) / (sum(losses[:10]) / 10),
            "mirror_alignment": align, "beam_greedy_agree": agree / N_BEAM,
            "beam_less_probable": float(worse), "greedy_teacher_agree": sum(same) / len(same)}


def run_reversal(seed: int) -> dict:
    task = reversal_data()
    model, losses = train_reversal(task, seed)
    return reversal_metrics(model, task, losses, label=f" seed {seed}")


register("ch10.reversal", chapter="10", run=run_reversal,
         rule=All(Lt("loss_ratio", 0.1), Ge("beam_greedy_agree", 0.95)),
         overall=(Rate(Ge("exact_match", 0.9), at_least=0.8),
                  Rate(Ge("token_accuracy", 0.97), at_least=0.7),
                  Rate(Ge("greedy_teacher_agree", 0.95), at_least=0.4),
                  Median(Gt("mirror_alignment", 0.5)),
                  Rate(Ge("mirror_alignment", 0.8), at_most=0.2)),
         notes="The seed's fallback size (d_model 32, 1 encoder + 1 decoder layer, 4 heads, "
               "d_ff 128): the seed's size (d_model 64, 2 + 2 layers) costs about 50 "
               "CPU-seconds a seed for 600 steps, over the 30 s budget. Restated 2026-12-06 "
               "after seeds 0-9 x 2 kernel paths: the seed review's thresholds were the per-run "
               "rule (exact >= 0.9, token >= 0.97, loss ratio < 0.1, mirror alignment >= 0.8, "
               "beam = greedy >= 0.95, greedy = teacher-forced argmax >= 0.95); loss and beam "
               "held on every run, exact on 18/20, token on 16/20, greedy = teacher-forced on "
               "10/20, mirror alignment >= 0.8 on 2/20 (median 0.65): those are now rates over "
               "the runs and a median. `beam_less_probable` (held-out inputs where beam's "
               "sequence is less probable than greedy's, possible since greedy's prefix can be "
               "pruned) is recorded, not ruled.",
         claim="反转任务上的自检（d_model 32，1 + 1 层，600 步）：每次运行最后 10 步的训练损失都不到最初 10 步的"
               "十分之一，束宽 4 的束搜索与贪心的输出在至少 95% 的留出输入上相同；留出串上整句正确率不低于 0.9、"
               "逐词元正确率不低于 0.97 在大多数运行上成立；训练分布上贪心解码与强制教学的逐位 argmax 在至少 95% "
               "的样本上相同，只在约一半的运行上成立；最后一层各头平均的交叉注意力，最大权重落在镜像源位置上的"
               "目标词元过半（中位数），达到 80% 的运行很少",
         quoted=("exact_match", "token_accuracy", "loss_ratio", "mirror_alignment",
                 "beam_greedy_agree", "greedy_teacher_agree"),
         fmt=".3f")
