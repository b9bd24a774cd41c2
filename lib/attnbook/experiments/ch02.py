"""Chapter 02's empirical claims: the no-attention seq2seq's decline with the source length
(with a longer-training and a wider control), and how the toy's search-error and empty-MAP
rates depend on the toy's temperature.

``accuracy_by_length(model)`` is the chapter's evaluation: per source length m = 3..12, 200
test sentences; greedy exact match and token accuracy, and the teacher-forced token accuracy
computed per position (argmax of the logits == the gold token, over the real target tokens,
EOS included; no cut at a predicted EOS). ``run_bottleneck(seed)`` trains the chapter's model
(d_hidden 64, 300 steps), goes on training the same model to 600 steps (twice the budget;
300 more batches of the same task), and trains a model with d_hidden 128 for 300 steps on the
same batches as the first: same learning rate, same batch size. The continued run starts a
fresh Adam (``fit`` builds its own optimizer), a difference the chapter names.
"""
from __future__ import annotations

import torch

from ..data import BOS_ID, EOS_ID, reversal_task
from ..decoding import enumerate_sequences, greedy_decode, random_tree_lm
from ..seq2seq import Seq2Seq
from ..train import evaluate, fit, token_cross_entropy
from .registry import register
from .rules import All, Decreasing, Gt, Lt

__all__ = ["LENGTHS", "TEMPERATURES", "test_sets", "accuracy_by_length", "seq2seq_loss",
           "new_model", "train_bottleneck", "bottleneck_metrics", "run_bottleneck",
           "search_rates", "run_search_rates"]

LENGTHS = list(range(3, 13))
TEMPERATURES = (2.0, 1.0, 0.5, 0.25)
STEPS, LONG_STEPS, LR, BATCH = 300, 600, 3e-3, 64
_TASK = reversal_task(min_len=3, max_len=12)


def test_sets(n: int = 200) -> dict:
    """``{m: Batch}``: ``n`` test-split reversal pairs of source length m, m = 3..12."""
    return {m: reversal_task(min_len=m, max_len=m).batch(n, seed=m, split="test")
            for m in LENGTHS}


def accuracy_by_length(model: Seq2Seq, sets: dict | None = None) -> dict:
    """``{m: (exact match, greedy token acc., teacher-forced token acc.)}`` (see module doc)."""
    from ..decoding import greedy_decode_batch
    sets = test_sets() if sets is None else sets
    rows, was_training = {}, model.training
    model.eval()
    with torch.no_grad():
        for m, tb in sets.items():
            step = model.batch_step_fn(tb.src, tb.src_mask)   # row i continues source i
            hyps = greedy_decode_batch(step, batch_size=len(tb), bos=BOS_ID, eos=EOS_ID,
                                       max_len=m + 3)
            free = evaluate([list(h.tokens) for h in hyps], tb.tgt_out)
            pred = model(tb.src, tb.src_mask, tb.tgt_in).logits.argmax(-1)
            hit = (pred == tb.tgt_out) & tb.tgt_mask
            rows[m] = (free.exact_match, free.token_accuracy,
                       (hit.sum() / tb.tgt_mask.sum()).item())
    model.train(was_training)
    return rows


def seq2seq_loss(model, batch):
    """Teacher forcing: the token-mean cross-entropy of eq. eq-ch02-token-ce."""
    return token_cross_entropy(model(batch.src, batch.src_mask, batch.tgt_in).logits,
                               batch.tgt_out)


def new_model(seed: int, d_hidden: int = 64) -> Seq2Seq:
    """The chapter's Cho-style GRU seq2seq (d_emb 32), initialised after manual_seed(seed)."""
    torch.manual_seed(seed)
    sizes = (len(_TASK.src_vocab), len(_TASK.tgt_vocab))
    return Seq2Seq(*sizes, d_emb=32, d_hidden=d_hidden, context="every_step")


def train_bottleneck(model: Seq2Seq, seed: int, steps: int = STEPS, *,
                     progress: bool = False, data_seed: int | None = None):
    """Train ``model`` for ``steps`` steps of batch 64, Adam 3e-3 (a step budget, no time cap)."""
    data_seed = seed + 1 if data_seed is None else data_seed
    return fit(model, _TASK.batches(BATCH, seed=data_seed), loss_fn=seq2seq_loss,
               steps=steps, lr=LR, seed=seed, progress=progress)


def bottleneck_metrics(rows: dict, prefix: str = "") -> dict:
    """EM at m = 3, 7, 8, 12; teacher-forced acc. at 3 and 12 and the drop between them."""
    m = {f"{prefix}em_{n}": rows[n][0] for n in (3, 7, 8, 12)}
    m[f"{prefix}tf_3"], m[f"{prefix}tf_12"] = rows[3][2], rows[12][2]
    m[f"{prefix}tf_drop"] = rows[3][2] - rows[12][2]
    m[f"{prefix}greedy_12"] = rows[12][1]
    return m


def run_bottleneck(seed: int) -> dict:
    """The chapter's run (300 steps), the same model at 600 steps, and d_hidden 128 at 300."""
    sets = {n: b for n, b in test_sets().items() if n in (3, 7, 8, 12)}   # the metrics' lengths
    model = new_model(seed)
    h1 = train_bottleneck(model, seed)
    m = bottleneck_metrics(accuracy_by_length(model, sets))
    m["loss"] = sum(h1.losses[-20:]) / 20
    # the same model trained on: 300 more steps (a fresh slice of the same data stream;
    # fit builds a new Adam, so its moment estimates start again from zero)
    h2 = train_bottleneck(model, seed, LONG_STEPS - STEPS, data_seed=seed + 1001)
    m.update(bottleneck_metrics(accuracy_by_length(model, sets), "long_"))
    m["long_loss"] = sum(h2.losses[-20:]) / 20
    wide = new_model(seed, d_hidden=128)
    h3 = train_bottleneck(wide, seed)
    m.update(bottleneck_metrics(accuracy_by_length(wide, sets), "wide_"))
    m["wide_loss"] = sum(h3.losses[-20:]) / 20
    return m


def search_rates(group: int, temperature: float, n_models: int = 200, *, vocab_size: int = 4,
                 max_len: int = 5) -> dict:
    """Greedy's search-error rate and the empty-MAP rate over ``n_models`` toy LMs.

    The models are ``random_tree_lm(4, eos=0, seed=s, temperature=temperature, max_len=5)``
    for s in ``range(group * n_models, (group + 1) * n_models)`` (group 0: the chapter's 200).
    Also the mean probability the models give the empty output (from the enumeration).
    """
    kw = dict(bos=vocab_size, eos=0, max_len=max_len)
    err = empty = 0
    p_empty = 0.0
    for s in range(group * n_models, (group + 1) * n_models):
        lm = random_tree_lm(vocab_size, eos=0, seed=s, temperature=temperature, max_len=max_len)
        # one enumeration serves both: exact_map (alpha 0) is this argmax, ties to the first
        seqs, logp = enumerate_sequences(lm, vocab_size=vocab_size, **kw)
        best = seqs[int(logp.argmax())]
        err += greedy_decode(lm, **kw).tokens != best
        empty += best == (0,)
        p_empty += logp[seqs.index((0,))].exp().item()
    return dict(greedy_error=err / n_models, empty_map=empty / n_models,
                p_empty=p_empty / n_models)


def _tag(t: float) -> str:
    return f"{t:g}".replace(".", "")


def run_search_rates(seed: int) -> dict:
    """``search_rates`` for every temperature in TEMPERATURES, seed = the group of 200 models."""
    m = {}
    for t in TEMPERATURES:
        for k, v in search_rates(seed, t).items():
            m[f"{k}_T{_tag(t)}"] = v
    return m


register("ch02.bottleneck", chapter="02", run=run_bottleneck,
         rule=All(Gt("em_3", 0.9), Lt("em_12", 0.1), Gt("tf_drop", 0.2), Gt("tf_12", "greedy_12",
                  offset=0.05)),
         claim="不带注意力的 GRU seq2seq（反转任务，源长 3–12，300 步）：短句几乎全对、长句整句几乎全错，"
               "强制教学下的词元准确率也随长度下降，且高于贪心解码（喂自己的输出）",
         quoted=("em_8", "em_12", "tf_12", "greedy_12", "loss"), fmt=".2f")
register("ch02.bottleneck_controls", chapter="02", run=run_bottleneck,
         rule=All(*(r for p in ("long_", "wide_") for r in (
             Gt(f"{p}em_3", 0.9), Gt(f"{p}tf_drop", 0.1), Lt(f"{p}em_12", f"{p}em_3", offset=-0.5))),
                  Gt("long_em_8", "em_8"), Gt("wide_em_8", "em_8"), Gt("long_tf_12", "tf_12")),
         claim="同一模型训练加倍到 600 步、或隐状态加到 128 维（300 步）：中等长度明显变好，"
               "但随长度的下降仍在（短句全对，长度 12 整句仍几乎全错，强制教学下仍下降）",
         quoted=("long_em_8", "long_em_12", "long_tf_12", "wide_em_8", "wide_em_12",
                 "wide_tf_12", "long_loss", "wide_loss"), fmt=".2f")
register("ch02.search_rates", chapter="02", run=run_search_rates,
         rule=All(Decreasing(*(f"greedy_error_T{_tag(t)}" for t in TEMPERATURES)),
                  Decreasing("empty_map_T2", "empty_map_T1"), Gt("empty_map_T1", 0.5),
                  Lt("empty_map_T05", 0.5), Decreasing("empty_map_T05", "empty_map_T025"),
                  Gt("empty_map_T1", "p_empty_T1", scale=2)),
         claim="玩具模型的搜索误差率和空 MAP 的比例是玩具的性质：logit 的温度越低（分布越尖），"
               "贪心越少出错、精确 MAP 越少是空输出；空 MAP 在温度 1 时过半，温度 0.5 时已不到一半",
         quoted=tuple(f"{k}_T{_tag(t)}" for k in ("greedy_error", "empty_map")
                      for t in TEMPERATURES),
         fmt=".3f", unit="group of 200 toy models")
