"""Chapter 01's empirical claims: a plain RNN against a GRU on first-token recall, and an exploding
RNN trained with and without gradient clipping.

The comparison is parameter-matched: a tanh ``nn.RNN`` with ``d_hidden = 64`` (5,248 recurrent
parameters) against an ``nn.GRU`` with ``d_hidden = 32`` (4,800); both read a 16-dim embedding of
8 tokens and end in a linear readout. Same data stream, same 300 Adam steps of 64 sequences, two
learning rates (0.01, 0.03), T = 20 and 50; accuracy on 1,000 fresh sequences (chance 1/8).
The remaining differences are named in the chapter: the gate structure and the total parameter
count (embedding and readout included: 5,896 against 5,192).

Each ``run_*(seed)`` seeds the model with ``torch.manual_seed(seed)`` and draws its data from
``torch.Generator().manual_seed(100 + seed)`` (training) and ``12345 + seed`` (test), so a seed
reproduces one run exactly.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_choice, check_float, check_int
from ..data import first_token_recall
from ..train import fit
from .registry import register
from .rules import All, Gt, Lt, Median, Rate

__all__ = ["Recall", "recall_loss", "recurrent_params", "train_recall", "recall_accuracy",
           "unrolled_states", "gradient_ratio", "update_gate", "run_sweep", "run_clipping",
           "clipping_runs", "clipping_metrics", "CLIP",
           "MODELS", "LRS", "LENGTHS", "V_REC", "D_EMB"]

V_REC, D_EMB, STEPS, BATCH, N_TEST = 8, 16, 300, 64, 1000
MODELS = {"rnn": 64, "gru": 32}          # kind -> d_hidden (parameter-matched recurrent layers)
LRS = (0.01, 0.03)
LENGTHS = (20, 50)
CLIP = dict(d_hidden=32, scale=1.5, lr=0.3, length=20, steps=150, max_norm=1.0)


class Recall(nn.Module):
    """Embedding (``D_EMB``) -> ``nn.RNN`` (tanh) or ``nn.GRU`` -> a linear readout of the last state."""

    def __init__(self, kind: str, d_hidden: int, vocab: int = V_REC, d_emb: int = D_EMB):
        super().__init__()
        check_choice("kind", kind, ("rnn", "gru"), fn="Recall")
        d_hidden = check_int("d_hidden", d_hidden, fn="Recall", minimum=1)
        self.kind, self.d_hidden = kind, d_hidden
        self.emb = nn.Embedding(vocab, d_emb)
        self.rnn = (nn.RNN if kind == "rnn" else nn.GRU)(d_emb, d_hidden, batch_first=True)
        self.out = nn.Linear(d_hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.emb(tokens))              # (B, T, d_hidden)
        return self.out(states[:, -1])                      # (B, vocab)


def recall_loss(model: nn.Module, batch) -> torch.Tensor:
    """Cross-entropy of the readout against the first token (the chapter's loss l)."""
    tokens, labels = batch
    return F.cross_entropy(model(tokens), labels)


def recurrent_params(model: Recall) -> int:
    """Number of parameters of the recurrent layer alone (weights and both biases)."""
    return sum(p.numel() for p in model.rnn.parameters())


def train_recall(kind: str, d_hidden: int, length: int, lr: float, seed: int, *,
                 steps: int = STEPS, optimizer: str = "adam", clip: float | None = None,
                 w_hh_scale: float | None = None, progress: bool = False):
    """Train a :class:`Recall` model on first-token recall; return ``(model, History)``.

    ``w_hh_scale`` sets ``weight_hh_l0 = scale * Q`` (Q a random orthogonal matrix, so
    ``s_max = rho = scale``): an RNN whose gradient products grow at initialisation.
    """
    fn = "train_recall"
    length = check_int("length", length, fn=fn, minimum=2)
    lr = check_float("lr", lr, fn=fn, minimum=0, inclusive=False)
    torch.manual_seed(seed)
    model = Recall(kind, d_hidden)
    if w_hh_scale is not None:
        q, r = torch.linalg.qr(torch.randn(d_hidden, d_hidden))
        with torch.no_grad():
            model.rnn.weight_hh_l0.copy_(w_hh_scale * q * torch.sign(torch.diagonal(r)))
    gen = torch.Generator().manual_seed(100 + seed)
    hist = fit(model, lambda: first_token_recall(BATCH, length, vocab_size=V_REC, seed=gen),
               loss_fn=recall_loss, steps=steps, lr=lr, seed=seed, optimizer=optimizer,
               clip=clip, progress=progress)
    return model, hist


@torch.no_grad()
def recall_accuracy(model: Recall, length: int, seed: int, n: int = N_TEST) -> float:
    """Accuracy on ``n`` fresh sequences of the given length (test seed ``12345 + seed``)."""
    tokens, labels = first_token_recall(n, length, vocab_size=V_REC, seed=12345 + seed)
    return (model(tokens).argmax(-1) == labels).double().mean().item()


def unrolled_states(model: Recall, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Every ``h_t`` (t = 1..T) as its own tensor: the same weights run as a cell, step by step."""
    d = model.d_hidden
    cell = (nn.RNNCell if model.kind == "rnn" else nn.GRUCell)(model.emb.embedding_dim, d)
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in model.rnn.state_dict().items()})
    x_emb = model.emb(tokens).detach()
    h_t, states = torch.zeros(len(tokens), d), []
    for step in range(tokens.shape[1]):
        h_t = cell(x_emb[:, step], h_t)
        states.append(h_t)
    return states


def gradient_ratio(model: Recall, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """``||dl/dh_1|| / ||dl/dh_T||`` over the batch (l: mean cross-entropy of the readout)."""
    states = unrolled_states(model, tokens)
    loss = F.cross_entropy(model.out(states[-1]), labels)
    g_first, g_last = torch.autograd.grad(loss, [states[0], states[-1]])
    return (g_first.norm() / g_last.norm()).item()


@torch.no_grad()
def update_gate(model: Recall, tokens: torch.Tensor) -> torch.Tensor:
    """The GRU's update gate u_t at every step, ``(B, T, d)``; ``nn.GRU`` stacks gates as [r, u, n]."""
    if model.kind != "gru":
        raise ValueError(f"update_gate: `model` must be a GRU Recall model, got kind={model.kind!r}")
    gru, d = model.rnn, model.d_hidden
    x_emb = model.emb(tokens)
    states, _ = gru(x_emb)
    h_prev = torch.cat([torch.zeros(len(tokens), 1, d), states[:, :-1]], 1)   # h_{t-1}
    rows = slice(d, 2 * d)
    return torch.sigmoid(x_emb @ gru.weight_ih_l0[rows].T + gru.bias_ih_l0[rows]
                         + h_prev @ gru.weight_hh_l0[rows].T + gru.bias_hh_l0[rows])


def _key(kind, length, lr):
    return f"{kind}_T{length}_lr{lr:g}"


def run_sweep(seed: int, lengths=LENGTHS) -> dict:
    """Accuracy of both models for every (T, lr); each model's best lr; the trained GRU's
    gradient ratio and median update gate (T = 20, lr 0.03, on 256 test sequences).
    ``lengths=(20,)`` is the chapter's live run (one seed, T = 20 only)."""
    m = {}
    for length in lengths:
        for kind, d in MODELS.items():
            for lr in LRS:
                model, _ = train_recall(kind, d, length, lr, seed)
                m[_key(kind, length, lr)] = recall_accuracy(model, length, seed)
                if kind == "gru" and length == 20 and lr == 0.03:
                    tokens, labels = first_token_recall(256, 20, vocab_size=V_REC, seed=999 + seed)
                    m["gru_ratio_T20"] = gradient_ratio(model, tokens, labels)
                    m["gru_u_median_T20"] = update_gate(model, tokens)[:, 1:].median().item()
            m[f"best_{kind}_T{length}"] = max(m[_key(kind, length, lr)] for lr in LRS)
        m[f"best_gap_T{length}"] = m[f"best_gru_T{length}"] - m[f"best_rnn_T{length}"]
    if 20 in lengths:
        m["gap_T20_lr0.01"] = m[_key("gru", 20, 0.01)] - m[_key("rnn", 20, 0.01)]
    return m


def clipping_runs(seed: int) -> dict:
    """An RNN with ``W_hh = 1.5 Q`` trained by plain SGD (lr 0.3, 150 steps, T = 20) without and
    with ``clip_grad_norm_(max_norm=1)``: ``{"noclip": (model, History), "clip": (...)}``. The
    unclipped run records its norms by clipping at 1e30 (a factor of exactly 1 for finite N)."""
    c, runs = CLIP, {}
    for name, clip in (("noclip", 1e30), ("clip", c["max_norm"])):
        runs[name] = train_recall("rnn", c["d_hidden"], c["length"], c["lr"], seed, steps=c["steps"],
                                  optimizer="sgd", clip=clip, w_hh_scale=c["scale"])
    return runs


def clipping_metrics(runs: dict, seed: int) -> dict:
    """Final loss (mean of the last 20 steps), test accuracy and largest pre-clip norm per run."""
    m = {}
    for name, (model, hist) in runs.items():
        m[f"{name}_loss"] = sum(hist.losses[-20:]) / 20
        m[f"{name}_acc"] = recall_accuracy(model, CLIP["length"], seed)
        m[f"{name}_max_grad"] = max(hist.grad_norms)
    return m


def run_clipping(seed: int) -> dict:
    """``clipping_metrics(clipping_runs(seed), seed)``."""
    return clipping_metrics(clipping_runs(seed), seed)


_FAIR = ("parameter-matched (RNN d_h = 64: 5,248 recurrent parameters; GRU d_h = 32: 4,800), "
         "same data stream, 300 Adam steps of 64 sequences, lr in {0.01, 0.03}")

register("ch01.gru_T20", chapter="01", run=run_sweep,
         rule=Gt("best_gru_T20", 0.95),
         overall=(Rate(Lt("best_rnn_T20", 0.95), at_least=0.6), Median(Gt("best_gap_T20", 0))),
         notes="Restated 2026-12-05: 'the parameter-matched RNN stays below 0.95 on every "
               "seed' fails on another CPU (seed 0: 0.89 on the Xeon, 1.00 on EPYC AVX2); it "
               "is a rate: the RNN stays below 0.95 on at least 60 % of the runs, the GRU "
               "reaches 0.95 on every run, and the median gap is positive.",
         claim="T = 20、各取两个学习率中较好的一个：GRU 在每次运行上都学会了回忆第一个"
               "词元；参数匹配的普通 RNN 在多数运行上没有学会（达到 0.95 的是少数），"
               "两者之差的中位数为正",
         quoted=("best_gru_T20", "best_rnn_T20", "best_gap_T20"))
register("ch01.lr_reverses_T20", chapter="01", run=run_sweep,
         overall=(Rate(Gt("rnn_T20_lr0.01", 0.2), at_least=0.8),
                  Rate(Lt("gap_T20_lr0.01", 0), at_least=0.6)),
         notes=_FAIR + " Restated 2026-12-06: 'rnn_T20_lr0.01 > 0.2 on every seed' held on the 25 "
               "committed runs but failed on seed 2 of a check on an Intel Xeon under "
               "ATEN_CPU_CAPABILITY=default; it is now a rate (at least 80 % of the runs).",
         claim="T = 20、学习率 0.01：参数匹配的 RNN 在绝大多数运行上高于随机猜测，"
               "并在多数种子上超过 GRU（结论随学习率反转）",
         quoted=("rnn_T20_lr0.01", "gru_T20_lr0.01", "gap_T20_lr0.01"))
register("ch01.T50_unsolved", chapter="01", run=run_sweep,
         rule=Lt("best_rnn_T50", 0.9),
         overall=(Rate(Gt("best_rnn_T50", 0.15), at_least=0.8),
                  Rate(Lt("best_gru_T50", 0.2), at_least=0.6)),
         notes="Restated 2026-12-05 after the 10-seed x 3-environment sweep: 'best_rnn_T50 > "
               "0.15 on every seed' fails on 2 of 25 runs (0.128); it is now a rate (at least "
               "80 % of the runs).",
         claim="T = 50、300 步：两个模型都没有稳定地学会；参数匹配的 RNN 从未达到"
               " 0.9，在绝大多数运行上高于随机猜测；GRU 在多数运行上停在随机猜测附近",
         quoted=("best_rnn_T50", "best_gru_T50"))
register("ch01.gru_keeps", chapter="01", run=run_sweep,
         rule=All(Gt("gru_u_median_T20", 0.75), Gt("gru_ratio_T20", 0.1)), notes=_FAIR,
         claim="训练后（T = 20、学习率 0.03）GRU 的更新门学会了保持：u_t 的中位数超过 0.75，"
               "从第 T 步传回第 1 步的梯度比大于 0.1",
         quoted=("gru_u_median_T20", "gru_ratio_T20"))
register("ch01.clipping_rescues", chapter="01", run=run_clipping,
         rule=All(Lt("clip_loss", "noclip_loss", offset=-0.3), Gt("clip_acc", "noclip_acc",
                  offset=0.2),
                  Gt("noclip_max_grad", 1)),
         overall=(Rate(Lt("noclip_acc", 0.3), at_least=0.6),),
         notes="RNN d_h = 32, W_hh = 1.5 Q, plain SGD lr 0.3, 150 steps, T = 20; the same run with "
               "clip_grad_norm_(max_norm=1); final loss = mean of the last 20 steps",
         claim="W_hh = 1.5 Q 的 RNN 用 SGD（学习率 0.3）训练：按范数裁剪到 1 之后，最终损失低得多、"
               "准确率高得多；不裁剪的那次在多数种子上没有学会",
         quoted=("noclip_loss", "clip_loss", "noclip_acc", "clip_acc", "noclip_max_grad"))
