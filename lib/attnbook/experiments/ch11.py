"""Chapter 11's empirical claims: the tiny GPT on Tang quatrains against a unigram and a bigram
model (held-out perplexity), and the form of the poems it samples against the untrained model
and the bigram model.

One seed: ``torch.manual_seed(seed)`` initialises a :class:`attnbook.gpt.GPT` with
:data:`CONFIG`, trained for :data:`STEPS` steps of :data:`BATCH` random training poems
(``attnbook.train.fit``, Adam, lr :data:`LR`, :data:`WARMUP` warm-up steps); then
:data:`N_SAMPLES` poems are sampled from BOS at temperature 1 (no top-k/top-p) from the trained
model, the same model before training, and the bigram model, with generators seeded by
``seed``. Sampled poems are decoded with UNK as one character (``poems.UNK_MARK``), so the
form checks count it as one character and never as a rhyme. The corpus, vocabulary (characters seen >= :data:`MIN_COUNT` times in the training
poems) and baselines do not depend on the seed.
"""
from __future__ import annotations

import functools

import torch

from ..data import BOS_ID, EOS_ID, PAD_ID, PoemCorpus, load_poems
from ..gpt import GPT, GPTConfig, generate, head_mask, lm_loss, perplexity, pruning_costs
from ..poems import (NgramLM, attention_to, copied_ngrams, ngram_set, poem_form, rhyme_groups,
                     rhymes, split_lines, unk_as_one)
from ..train import fit
from .registry import register
from .rules import All, Any, ArgmaxVaries, Ge, Gt, Le, Lt, Rate, Some

__all__ = ["BATCH", "CONFIG", "LR", "MIN_COUNT", "N_SAMPLES", "STEPS", "WARMUP", "baselines",
           "corpus", "form_metrics", "head_ratios", "HEAD_KINDS", "new_model", "PRUNE_POEMS",
           "prune_metrics", "rhyme_chance", "rhyme_queries", "run_poems", "run_poems_form",
           "sample_poems", "sweep_metrics", "sweep_summary", "SWEEP_N", "train_model"]

MIN_COUNT, STEPS, BATCH, LR, WARMUP, N_SAMPLES = 3, 400, 16, 5e-3, 20, 100
MAX_NEW = 33                     # BOS + 32 characters of a 七言 quatrain + EOS = 34 positions


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[PoemCorpus, torch.Tensor, torch.Tensor]:
    """The poem corpus and its encoded train / valid poems ``(N, T)`` (cached)."""
    c = load_poems(min_count=MIN_COUNT)
    return c, c.encode(c.train), c.encode(c.valid)


CONFIG = {"n_positions": 34, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 256}


def new_model(seed: int, **changes) -> GPT:
    """A freshly initialised chapter-11 GPT (``torch.manual_seed(seed)`` first)."""
    c, _, _ = corpus()
    torch.manual_seed(seed)
    return GPT(GPTConfig(len(c.vocab), **{**CONFIG, **changes}))


def train_model(model: GPT, seed: int, *, steps: int = STEPS, progress: bool = False,
                on_step=None):
    """Train ``model`` on random batches of training poems; returns ``fit``'s History.

    ``on_step``: None, or ``on_step(step, loss, model)``, passed to ``attnbook.train.fit``
    (called after every step, e.g. to record a validation loss; it must not change the model's
    weights or draw from the global RNG if the run is to stay the registered one)."""
    _, train, _ = corpus()
    g = torch.Generator().manual_seed(10_000 + seed)

    def batch():
        return train[torch.randint(len(train), (BATCH,), generator=g)]

    return fit(model, batch, loss_fn=lambda m, b: lm_loss(m(b).logits, b), steps=steps,
               lr=LR, seed=seed, warmup=WARMUP, progress=progress, on_step=on_step)


@functools.lru_cache(maxsize=1)
def baselines() -> dict:
    """The unigram and bigram models, their valid perplexities, the training 4-grams."""
    c, train, valid = corpus()
    v = len(c.vocab)
    uni, bi = NgramLM(train, v, order=1), NgramLM(train, v, order=2, lam=0.5)
    return {"unigram": uni, "bigram": bi, "ppl_unigram": uni.perplexity(valid),
            "ppl_bigram": bi.perplexity(valid),
            "ngrams": ngram_set(c.train, 4)}


def sample_poems(model, n: int, seed: int, **sampling) -> list[str]:
    """``n`` poems sampled from BOS by a GPT (``generate``) or an ``NgramLM`` (``sample``),
    decoded with UNK as the one character ``poems.UNK_MARK`` (□)."""
    c, _, _ = corpus()
    g = torch.Generator().manual_seed(20_000 + seed)
    if isinstance(model, NgramLM):
        ids = model.sample(n, max_len=MAX_NEW, generator=g)
    else:
        prompt = torch.full((n, 1), BOS_ID, dtype=torch.long)
        ids = generate(model, prompt, max_new_tokens=MAX_NEW, generator=g, eos_id=EOS_ID,
                       **sampling)
    return [unk_as_one(c.vocab.decode(row)) for row in ids]


def form_metrics(poems: list[str]) -> dict:
    """Shares of ``poems``: right line lengths, well formed (lengths + punctuation), rhyming
    lines 2 and 4 (of all, and of those with the right lengths), the chance level of that
    rhyme for these poems (``rhyme_chance``: line 2's end of one poem with the right lengths
    against line 4's end of another, over all ordered pairs; 0.0 with fewer than two such
    poems), and the mean share of 4-grams copied from the training poems. UNK counts as one
    character and never rhymes (:func:`attnbook.poems.poem_form`)."""
    b = baselines()
    forms = [poem_form(p) for p in poems]
    n = len(poems)
    shaped = sum(f.lengths_ok for f in forms)
    return {"lengths": shaped / n,
            "well_formed": sum(f.well_formed for f in forms) / n,
            "rhyme": sum(f.rhyme_ok for f in forms) / n,
            "rhyme_of_shaped": sum(f.rhyme_ok for f in forms) / max(shaped, 1),
            "rhyme_chance": rhyme_chance([p for p, f in zip(poems, forms) if f.lengths_ok]),
            "copied4": sum(copied_ngrams(p, b["ngrams"]) for p in poems) / n}


def rhyme_chance(poems: list[str]) -> float:
    """Share of ordered pairs (i, j), i != j, of ``poems`` (each four lines) whose line 2 of
    poem i ends in the rhyme group of line 4 of poem j: how often lines 2 and 4 would rhyme
    if the endings were paired at random (0.0 for fewer than two poems).

    Raises ``TypeError`` unless ``poems`` is a list of str, ``ValueError`` naming the first poem
    that lacks four non-empty lines (:func:`attnbook.poems.split_lines`)."""
    fn = "rhyme_chance"
    if isinstance(poems, str) or not isinstance(poems, (list, tuple)) \
            or not all(isinstance(p, str) for p in poems):
        raise TypeError(f"{fn}: `poems` must be a list of str (four-line poems), got {poems!r:.60}")
    lines = [split_lines(unk_as_one(p)) for p in poems]
    for i, ls in enumerate(lines):
        if len(ls) < 4 or not ls[1] or not ls[3]:
            raise ValueError(f"{fn}: `poems`[{i}] must have four lines with lines 2 and 4 "
                             f"non-empty, got {len(ls)} line(s): {poems[i]!r:.40}")
    if len(poems) < 2:
        return 0.0
    g = rhyme_groups()
    ends = [(ls[1][-1], ls[3][-1]) for ls in lines]
    hits = sum(rhymes(a, d, g) for i, (a, _) in enumerate(ends)
               for j, (_, d) in enumerate(ends) if i != j)
    return hits / (len(ends) * (len(ends) - 1))


HEAD_KINDS = ("previous", "line_start", "prev_line_same", "rhyme_slot", "bos")


def head_ratios(model: GPT, ids: torch.Tensor) -> dict:
    """Per kind of key (:func:`attnbook.poems.attention_to`): the largest mean attention of any
    head of any block on ``ids``, divided by what uniform causal attention gives (chapter 11)."""
    with torch.no_grad():
        weights = model(ids, need_weights=True).weights
    t = ids.shape[1]
    uniform = (torch.ones(t, t).tril() / torch.arange(1, t + 1)[:, None])[None, None]
    out = {}
    for kind in HEAD_KINDS:
        chance = float(attention_to(uniform.expand(len(ids), 1, t, t), ids, kind)[0])
        best = max(float(attention_to(w, ids, kind).max()) for w in weights)
        out[f"head_{kind}"] = best / chance
    return out


PRUNE_POEMS = 100                # held-out poems the pruning costs are measured on


def prune_metrics(model: GPT, ids: torch.Tensor) -> dict:
    """:func:`attnbook.gpt.pruning_costs` on ``ids`` as flat metrics (nats per token):
    ``prune_b<block>h<head>`` per head (blocks from 1), their max / median / min, the block
    of the costliest head, the costliest head of each block (``prune_block<l>_max``),
    ``prune_block<l>`` for all heads of block l at once, and the
    cost of the head that puts the most attention on the previous key / on the rhyme slot
    (:func:`attnbook.poems.attention_to`); for the rhyme-slot head also the rise of the loss
    on line 4's last character alone (``prune_rhyme_slot_head_at_end``; the unpruned loss
    there is ``prune_rhyme_end_loss``), where the mean over all tokens would dilute it."""
    r = pruning_costs(model, ids)
    heads = r["heads"]
    flat = heads.flatten()
    v, n = flat.sort().values, len(flat)
    out = {"prune_loss": r["loss"], "prune_max": float(flat.max()),
           "prune_median": float(v[(n - 1) // 2] + v[n // 2]) / 2,   # of all the heads
           "prune_min": float(flat.min()),
           "prune_max_block": int(flat.argmax()) // heads.shape[1] + 1}
    out.update({f"prune_b{l + 1}h{h}": float(heads[l, h]) for l in range(heads.shape[0])
                for h in range(heads.shape[1])})
    out.update({f"prune_block{l + 1}": float(x) for l, x in enumerate(r["layers"])})
    out.update({f"prune_block{l + 1}_max": float(x) for l, x in enumerate(heads.amax(1))})
    with torch.no_grad():
        weights = model(ids, need_weights=True).weights
    best = {}
    for kind in ("previous", "rhyme_slot"):      # the head most on that kind: its cost
        on = torch.stack([attention_to(w, ids, kind) for w in weights])   # (L, H)
        best[kind] = int(on.flatten().argmax())
        out[f"prune_{kind}_head"] = float(flat[best[kind]])
    # the rhyme head's cost where it looks: the loss on line 4's last character only
    rows, q = rhyme_queries(ids)
    end = _loss_at(model, ids, rows, q)
    mask = head_mask(model, [divmod(best["rhyme_slot"], heads.shape[1])])
    out["prune_rhyme_end_loss"] = end
    out["prune_rhyme_slot_head_at_end"] = _loss_at(model, ids, rows, q, mask) - end
    return out


def rhyme_queries(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``ids`` that are quatrains (BOS + 24 or 32 tokens) and, per row, the query
    that predicts line 4's last character (the rhyme_slot query of ``attention_to``)."""
    rows, qs = [], []
    for r, row in enumerate(ids.tolist()):
        n = next((i for i, tok in enumerate(row[1:], 1) if tok in (EOS_ID, PAD_ID)), len(row))
        period = {25: 6, 33: 8}.get(n)
        if period is not None:
            rows.append(r)
            qs.append(4 * period - 2)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(qs, dtype=torch.long)


@torch.no_grad()
def _loss_at(model: GPT, ids, rows, q, mask=None) -> float:
    """Mean next-token loss (nats) of the queries ``q`` of ``rows`` (eval mode)."""
    was = model.training
    model.eval()
    logits = model(ids[rows], head_mask=mask).logits[torch.arange(len(rows)), q]   # (R, V)
    model.train(was)
    return float(torch.nn.functional.cross_entropy(logits.double(), ids[rows, q + 1]))


def run_poems(seed: int) -> dict:
    """One seed: perplexities (model before/after training, bigram, unigram), form shares,
    sampling sweep, heads and pruning costs: the metrics of ``ch11.perplexity``, ``ch11.heads``
    and ``ch11.prune``, whose committed rows predate ``rhyme_chance`` (left out here)."""
    return {k: v for k, v in _run_poems(seed).items() if not k.startswith("rhyme_chance")}


def run_poems_form(seed: int) -> dict:
    """:func:`run_poems` with the ``rhyme_chance_*`` shares: the run of ``ch11.form`` and
    ``ch11.sampling`` (one computation per seed and process, shared with :func:`run_poems`)."""
    return dict(_run_poems(seed))


@functools.lru_cache(maxsize=None)
def _run_poems(seed: int) -> dict:
    _, _, valid = corpus()
    b = baselines()
    model = new_model(seed)
    untrained = form_metrics(sample_poems(model, N_SAMPLES, seed))
    ppl_init = perplexity(model, valid)
    train_model(model, seed)
    trained = form_metrics(sample_poems(model, N_SAMPLES, seed))
    bigram = form_metrics(sample_poems(b["bigram"], N_SAMPLES, seed))
    out = {"ppl_model": perplexity(model, valid), "ppl_init": ppl_init,
           "ppl_bigram": b["ppl_bigram"], "ppl_unigram": b["ppl_unigram"]}
    for name, m in (("gpt", trained), ("init", untrained), ("bigram", bigram)):
        out.update({f"{k}_{name}": v for k, v in m.items()})
    out.update(sweep_summary(sweep_metrics(model, seed)))
    out.update(head_ratios(model.eval(), valid[:100]))
    out.update(prune_metrics(model, valid[:PRUNE_POEMS]))
    return out


register("ch11.perplexity", chapter="11", run=run_poems,
         rule=All(Lt("ppl_model", "ppl_bigram"), Lt("ppl_bigram", "ppl_unigram", scale=0.6),
                  Gt("ppl_init", "ppl_unigram")),
         claim="训练 400 步的小 GPT 在留出的诗上困惑度低于二元模型（bigram），二元模型又低于一元模型的 0.6 倍；"
               "训练前的模型比一元模型还差",
         notes="A first version asked ppl_model < 0.9 ppl_bigram; seed 2 gave 244 against 256.5 "
               "(on the split before issue 33's deduplication). Re-swept 2026-12-06 on the "
               "deduplicated split (every earlier row deleted): bigram 264.5, worst run 0.935x.",
         quoted=("ppl_model", "ppl_init"), fmt=".0f")
register("ch11.form", chapter="11", run=run_poems_form,
         rule=All(Gt("well_formed_gpt", 0.5), Lt("rhyme_of_shaped_gpt", 0.3),
                  Lt("well_formed_init", 0.05),
                  Lt("well_formed_bigram", 0.05)),
         claim="训练后的 GPT 从 BOS 采样（温度 1）的诗，过半行数、字数和标点全对（UNK 算一个字）；未训练的模型和二元模型几乎没有一首格式对；"
               "但字数对的诗里第 2、4 句末字同韵的比例仍低（不到 0.3），与把这些诗的末字随机配对相近，远低于真实绝句（约 0.85）",
         notes="A first version asked rhyme_of_shaped_gpt > 0.5; the five seeds give 0.03-0.17. "
               "Re-registered 2026-12-06: UNK counts as one character (it had counted as the five "
               "characters of '<unk>', so a poem with an UNK failed the lengths); the rows made "
               "before (EPYC AVX2/DEFAULT, Xeon native) were deleted. rhyme_chance_gpt: line-2 "
               "and line-4 endings of different GPT poems paired, quoted, not in the rule.",
         quoted=("well_formed_gpt", "lengths_gpt", "rhyme_of_shaped_gpt", "rhyme_chance_gpt",
                 "well_formed_bigram", "copied4_gpt"), fmt=".3f")

SWEEP = (("greedy", dict(temperature=0.0)), ("T=0.7", dict(temperature=0.7)),
         ("T=1", dict(temperature=1.0)), ("T=1.3", dict(temperature=1.3)),
         ("top-k 10", dict(top_k=10)), ("top-p 0.8", dict(top_p=0.8)))


SWEEP_N = {"T=1": 200, "T=1.3": 200}   # poems per setting where two are compared; else 50


def sweep_metrics(model: GPT, seed: int, n: int | None = None, settings=SWEEP) -> dict:
    """Per sampling setting: the form shares of ``n`` poems from BOS (``None``: 200 for
    T = 1 and T = 1.3, whose well-formed shares the claim compares, 50 for the others), the
    share of distinct poems, and the mean share of distinct characters inside a poem
    (repetition lowers it)."""
    out = {}
    for name, kw in settings:
        k = SWEEP_N.get(name, 50) if n is None else n
        poems = sample_poems(model, k, seed, **kw)
        chars = [p.replace("，", "").replace("。", "") for p in poems]
        out[name] = {**form_metrics(poems), "distinct": len(set(poems)) / k,
                     "char_types": sum(len(set(c)) / max(len(c), 1) for c in chars) / k}
    return out


def sweep_summary(sweep: dict) -> dict:
    """The figures of :func:`sweep_metrics` that the ``ch11.sampling`` claim quotes."""
    return {"greedy_distinct": sweep["greedy"]["distinct"],
            "greedy_char_types": sweep["greedy"]["char_types"],
            "t1_char_types": sweep["T=1"]["char_types"],
            "wf_t07": sweep["T=0.7"]["well_formed"], "wf_t1": sweep["T=1"]["well_formed"],
            "wf_t13": sweep["T=1.3"]["well_formed"],
            "wf_top_p": sweep["top-p 0.8"]["well_formed"],
            "distinct_t07": sweep["T=0.7"]["distinct"]}


register("ch11.sampling", chapter="11", run=run_poems_form,
         rule=All(Lt("greedy_distinct", 1.5 / 50), Lt("greedy_char_types", "t1_char_types")),
         overall=(Rate(Lt("wf_t13", "wf_t1"), at_least=0.8),),
         notes="Restated 2026-12-05: 'T = 1.3 gives fewer well-formed poems than T = 1' fails "
               "on 1 of 25 runs (seed 1, EPYC default); it is a rate now. Re-registered "
               "2026-12-06: UNK counts as one character, and T = 1 and T = 1.3 draw 200 poems "
               "each (50 before; the other settings 50); the rows made before (EPYC AVX2/DEFAULT, "
               "Xeon native) were deleted.",
         claim="贪心解码从 BOS 只写出一首诗，且诗内重复的字比温度 1 采样多；温度升到 1"
               ".3，格式对的比例（每种温度 200 首）在至少八成的运行上低于温度 1",
         quoted=("greedy_char_types", "t1_char_types", "wf_t07", "wf_t1", "wf_t13", "wf_top_p"))


register("ch11.heads", chapter="11", run=run_poems,
         overall=(Rate(Any(*(Ge(f"head_{k}", 2) for k in HEAD_KINDS)), at_least=0.8),
                  ArgmaxVaries(*(f"head_{k}" for k in HEAD_KINDS)), Some(Gt("head_rhyme_slot", 2))),
         notes="Restated 2026-12-06 after the re-sweep on the deduplicated split (issue 33): "
               "'some head at least 2x uniform on every run' held on 20 of 20, but the weakest "
               "run (seed 8, EPYC DEFAULT: rhyme slot 2.05x) is 2.5 % from the bound, so another "
               "CPU's rounding could flip it: it is now a rate (at least 80 % of runs).",
         claim="在 100 首留出的诗上，绝大多数运行（至少八成）的模型都有一个头专门看某一类位置（不少于均匀注意力的 2 倍），"
               "但看的是哪一类因种子而异；有的种子上有头把注意力集中到押韵那一格，押韵率却仍在随机水平",
         quoted=("head_previous", "head_line_start", "head_prev_line_same", "head_rhyme_slot",
                 "head_bos"))


register("ch11.prune", chapter="11", run=run_poems,
         rule=All(Lt("prune_max_block", 1.5), Lt("prune_block2_max", 0.01), Lt("prune_block2",
                  0.02),
                  Any(Le("head_rhyme_slot", 5), Lt("prune_rhyme_slot_head", 0.01))),
         overall=(Some(Gt("head_rhyme_slot", 5)), Rate(Ge("prune_max", 0.1), at_least=0.7),
                  Rate(Ge("prune_block1", 0.3), at_least=0.8),
                  Rate(Any(Le("head_rhyme_slot", 5), Lt("prune_rhyme_slot_head_at_end", 0.05)),
                       at_least=0.8)),
         notes="Restated 2026-12-05: prune_max >= 0.1 holds on 20 of 25 runs and prune_block1 "
               ">= 0.3 on 22 of 25; both are rates now. The rhyme clauses bind where "
               "head_rhyme_slot > 5. Re-swept 2026-12-06 on the deduplicated split (issue 33; "
               "every earlier row deleted): 'prune_rhyme_slot_head_at_end < 0.05 on every run' "
               "failed on seed 1 (EPYC AVX2, 0.0503); it is now a rate (at least 80 %).",
         claim="在 100 首留出的诗上逐个剪掉一个头（它的输出在 W^O 之前置零，不重新训练）：每次运行最贵的头都在第 1 块，"
               "第 2 块的每个头都不到 0.01 nats/词元，4 个一起剪也不到 0.02；最贵的头让留出损失升高不少于 0.1"
               "（至少七成的运行），整个第 1 块一起剪升高不少于 0.3（至少八成的运行）；在有头以均匀 5 倍以上的注意力看押韵那一格的种子上，剪掉那个头，"
               "平均损失升高不到 0.01；只在它看押韵那一格的那个位置（预测第 4 句末字）上量，"
               "至少八成的运行或者没有这样的头、或者剪掉它升高不到 0.05",
         quoted=("prune_max", "prune_median", "prune_block2_max", "prune_block1", "prune_block2"),
         fmt=".3f")
