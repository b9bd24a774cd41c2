"""Chapter 07's empirical claims: what attention without an FFN can and cannot do, and ReLU /
GELU / SwiGLU at equal parameters.

- XOR of two bits (:class:`TwoBitModel`): on one position an attention-only stack is affine
  and stays at ln 2, one FFN per layer fits all four patterns; with the bits on two positions
  attention alone fits them too (its softmax weights depend on the contents).
- Rank collapse (Dong et al. 2021): :func:`collapse_profile` pushes random tokens through a
  stack of random attention layers, with or without FFNs and skip connections, and records
  :func:`rank1_residual` after every layer.
- Modular addition (:class:`ModSum`): ``(a + b) mod P`` from two positions, one Pre-LN layer,
  trained on all ``P**2`` pairs; the FFN is ReLU, GELU or SwiGLU with equal parameter counts
  (:func:`ffn_width`), or absent (the attention-only control, which has fewer parameters).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_choice, check_int
from ..layers import FeedForward, LayerNorm
from ..multihead import MultiHeadAttention
from .registry import register
from .rules import All, Any, Gt, Lt, Near, Rate

__all__ = ["BITS", "XOR", "TwoBitModel", "train_xor", "xor_runs", "xor_metrics", "run_xor",
           "rank1_residual", "collapse_profile", "run_collapse", "ffn_width", "ModSum",
           "mod_sum_data", "train_mod_sum", "run_activations", "other_lr_ratios",
           "RATIO_WIDTHS", "layer_params", "run_ratios", "P_MOD", "D_MOD", "MOD_STEPS",
           "OTHER_LRS", "COLLAPSE_MODES"]

BITS = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])
XOR = (BITS[:, 0] ^ BITS[:, 1]).to(torch.float64)
P_MOD, D_MOD, MOD_STEPS = 17, 24, 100
OTHER_LRS = {"lo": 1e-3, "hi": 1e-2}          # besides the default 3e-3
COLLAPSE_MODES = ("attn", "attn_ffn", "skip", "skip_ffn")


class TwoBitModel(nn.Module):
    """Chapter 07's XOR probe: two bits -> ``n_layers`` x (attention + residual [+ FFN +
    residual]) -> a linear logit; no LayerNorm, float64.

    ``positions=1``: one token x = e1[c1] + e2[c2] (the affine case); ``positions=2``: bit 1
    on position 0 and bit 2 on position 1, each with a learned position vector, the logit
    read at position 1.
    """

    def __init__(self, with_ffn: bool, positions: int = 1, d: int = 8, n_layers: int = 2):
        super().__init__()
        self.positions = check_choice("positions", positions, (1, 2), fn="TwoBitModel")
        f64 = torch.float64
        self.e1, self.e2 = nn.Embedding(2, d, dtype=f64), nn.Embedding(2, d, dtype=f64)
        self.pos = nn.Parameter(torch.randn(2, d, dtype=f64)) if positions == 2 else None
        self.attn = nn.ModuleList(MultiHeadAttention(d, 2, dtype=f64) for _ in range(n_layers))
        self.ffn = nn.ModuleList(FeedForward(d, 4 * d, dtype=f64) for _ in range(n_layers)) \
            if with_ffn else None
        self.readout = nn.Linear(d, 1, dtype=f64)

    def forward(self, bits: torch.Tensor) -> torch.Tensor:
        e1, e2 = self.e1(bits[:, 0]), self.e2(bits[:, 1])          # (B, d) each
        if self.positions == 1:
            x = (e1 + e2)[:, None]                                 # (B, 1, d)
        else:
            x = torch.stack([e1, e2], 1) + self.pos                # (B, 2, d)
        for i, attn in enumerate(self.attn):
            x = x + attn(x).out                                    # residual, no LN
            if self.ffn is not None:
                x = x + self.ffn[i](x)
        return self.readout(x[:, -1])[:, 0]                        # one logit per example


def train_xor(with_ffn: bool, positions: int, seed: int, steps: int = 200, lr: float = 1e-2):
    """Train a :class:`TwoBitModel` on the four patterns (full batch, Adam); ``(logits, loss)``."""
    steps = check_int("steps", steps, fn="train_xor")
    torch.manual_seed(seed)
    model = TwoBitModel(with_ffn, positions)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(model(BITS), XOR)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z = model(BITS)
    return z, F.binary_cross_entropy_with_logits(z, XOR).item()


def _correct(z):
    return float(((z > 0).to(torch.float64) == XOR).sum())


XOR_RUNS = {"one_att": (False, 1, 200), "one_ffn": (True, 1, 200), "two_att": (False, 2, 300)}


def xor_runs(seed: int) -> dict:
    """``{tag: (logits, loss)}``: attention only / with FFN on one position (200 steps), and
    attention only with the bits on two positions (300 steps)."""
    return {tag: train_xor(with_ffn, positions, seed, steps)
            for tag, (with_ffn, positions, steps) in XOR_RUNS.items()}


def xor_metrics(runs: dict) -> dict:
    """Loss, number right and |z00 + z11 - z01 - z10| of every run of :func:`xor_runs`."""
    m = {}
    for tag, (z, loss) in runs.items():
        m[f"{tag}_loss"], m[f"{tag}_correct"] = loss, _correct(z)
        m[f"{tag}_identity"] = abs((z[0] + z[3] - z[1] - z[2]).item())
    return m


def run_xor(seed: int) -> dict:
    return xor_metrics(xor_runs(seed))


def rank1_residual(x: torch.Tensor) -> float:
    """r(X) = ||X - 1 mean(X)|| / ||X|| (chapter 07, eq-ch07-rank1-residual).

    Frobenius norms, averaged over the batch: how far the ``n`` token vectors of each
    sequence are from all being equal. Dong et al. 2021 measure res(X) = X - 1 x^T in a
    mixed l1/l-inf norm; in the Frobenius norm the row mean is the nearest x.
    Args: x ``(B, n, d)``. Returns a float in [0, 1].
    """
    if x.ndim != 3:
        raise ValueError(f"rank1_residual: `x` must be (B, n, d), got {tuple(x.shape)}")
    r = x - x.mean(-2, keepdim=True)                       # X - 1 mean(X), (B, n, d)
    return (r.norm(dim=(-2, -1)) / x.norm(dim=(-2, -1))).mean().item()


def collapse_profile(mode: str, seed: int, n_layers: int = 12, n: int = 16, d: int = 32,
                     batch: int = 8) -> list:
    """``rank1_residual`` of random tokens after each of ``n_layers`` random layers (PyTorch's
    default init, 4 heads, float64). ``mode``: ``"attn"`` X <- Attn(X); ``"attn_ffn"`` X <-
    FFN(Attn(X)); ``"skip"`` X <- X + Attn(X); ``"skip_ffn"`` X <- X + Attn(X), X <- X + FFN(X).
    Returns ``n_layers + 1`` values (the input first)."""
    mode = check_choice("mode", mode, COLLAPSE_MODES, fn="collapse_profile")
    n_layers = check_int("n_layers", n_layers, fn="collapse_profile")
    torch.manual_seed(seed)
    x = torch.randn(batch, n, d, dtype=torch.float64)
    out = [rank1_residual(x)]
    with torch.no_grad():
        for _ in range(n_layers):
            attn = MultiHeadAttention(d, 4, dtype=torch.float64)
            ffn = FeedForward(d, 4 * d, dtype=torch.float64)
            a = attn(x).out
            x = x + a if mode.startswith("skip") else a
            if mode.endswith("ffn"):
                x = x + ffn(x) if mode == "skip_ffn" else ffn(x)
            out.append(rank1_residual(x))
    return out


def run_collapse(seed: int) -> dict:
    """The residual after 1, 4 and 12 layers for every mode, and ``attn_loglog`` =
    ln r_3 / ln r_2 of the attention-only stack: about 1 to 1.5 for an exponential decay
    (ln r falls by a constant per layer), well above for a doubly exponential one."""
    m = {}
    for mode in COLLAPSE_MODES:
        prof = collapse_profile(mode, seed)
        for depth in (1, 4, 12):
            m[f"{mode}_{depth}"] = prof[depth]
        if mode == "attn":
            m["attn_2"], m["attn_3"] = prof[2], prof[3]
            m["attn_loglog"] = math.log(prof[3]) / math.log(prof[2])
    return m


def ffn_width(activation: str, d: int) -> int:
    """The hidden size with 8 d^2 weights: 4d for ReLU / GELU, 2/3 * 4d for SwiGLU (Shazeer
    2020, §2); ``d`` must be a multiple of 3 so that both counts are exactly equal."""
    activation = check_choice("activation", activation, ("relu", "gelu", "swiglu"), fn="ffn_width")
    d = check_int("d", d, fn="ffn_width")
    if activation != "swiglu":
        return 4 * d
    if d % 3:
        raise ValueError(f"ffn_width: `d` must be a multiple of 3 for SwiGLU, got {d}")
    return 8 * d // 3


class ModSum(nn.Module):
    """``(a + b) mod P`` from two positions: token + position embeddings, one Pre-LN layer
    (attention, then a bias-free FFN of width ``d_ff``, by default :func:`ffn_width`, or
    none), a final LN, a readout at the second position."""

    def __init__(self, activation: str | None, p: int = P_MOD, d: int = D_MOD, n_heads: int = 2,
                 d_ff: int | None = None):
        super().__init__()
        self.emb = nn.Embedding(p, d)
        self.pos = nn.Parameter(0.5 * torch.randn(2, d))
        self.norm1, self.attn = LayerNorm(d), MultiHeadAttention(d, n_heads)
        self.norm2 = LayerNorm(d)
        self.ffn = None if activation is None else FeedForward(
            d, d_ff or ffn_width(activation, d), activation=activation, bias=False)
        self.final, self.head = LayerNorm(d), nn.Linear(d, p)

    def forward(self, ab: torch.Tensor) -> torch.Tensor:
        x = self.emb(ab) + self.pos                                # (B, 2, d)
        x = x + self.attn(self.norm1(x)).out
        if self.ffn is not None:
            x = x + self.ffn(self.norm2(x))
        return self.head(self.final(x[:, -1]))                     # (B, P) logits


def mod_sum_data(p: int = P_MOD):
    """Every pair ``(a, b)`` with ``0 <= a, b < p`` (shape ``(p*p, 2)``) and ``(a + b) % p``."""
    p = check_int("p", p, fn="mod_sum_data", minimum=2)
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    ab = torch.stack([a.flatten(), b.flatten()], 1)
    return ab, (ab[:, 0] + ab[:, 1]) % p


def train_mod_sum(activation: str | None, seed: int, steps: int = MOD_STEPS, lr: float = 3e-3,
                  d: int = D_MOD, d_ff: int | None = None):
    """Train :class:`ModSum` on all pairs (full batch, Adam, ``steps`` steps, seed ``seed``).

    Returns ``(model, loss, accuracy)`` on the same pairs after training.
    """
    steps = check_int("steps", steps, fn="train_mod_sum")
    torch.manual_seed(seed)
    model = ModSum(activation, d=d, d_ff=d_ff)
    ab, y = mod_sum_data()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = F.cross_entropy(model(ab), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z = model(ab)
    return model, F.cross_entropy(z, y).item(), (z.argmax(-1) == y).double().mean().item()


def _ffn_params(model):
    return 0 if model.ffn is None else sum(p.numel() for p in model.ffn.parameters())


def run_activations(seed: int) -> dict:
    """One seed: loss and accuracy after ``MOD_STEPS`` steps for each FFN and without one
    (learning rate 3e-3); and, at the learning rates ``OTHER_LRS``, the lower of the ReLU
    and GELU losses over the SwiGLU loss."""
    m = {}
    for act in ("relu", "gelu", "swiglu", None):
        tag = act or "none"
        model, m[f"{tag}_loss"], m[f"{tag}_acc"] = train_mod_sum(act, seed)
        m[f"{tag}_ffn_params"] = _ffn_params(model)
    m["relu_over_swiglu"] = m["relu_loss"] / m["swiglu_loss"]
    m["relu_over_gelu"] = m["relu_loss"] / m["gelu_loss"]
    return {**m, **other_lr_ratios(seed)}


def other_lr_ratios(seed: int) -> dict:
    """``best_other_over_swiglu_<tag>``: min(ReLU loss, GELU loss) / SwiGLU loss after
    ``MOD_STEPS`` steps at each learning rate of ``OTHER_LRS`` (> 1: SwiGLU lowest)."""
    m = {}
    for tag, lr in OTHER_LRS.items():
        loss = {act: train_mod_sum(act, seed, lr=lr)[1] for act in ("relu", "gelu", "swiglu")}
        m[f"best_other_over_swiglu_{tag}"] = min(loss["relu"], loss["gelu"]) / loss["swiglu"]
    return m


# d_ff / d = r at about the same layer parameters (attention 4d^2 + 4d, FFN 2 r d^2)
RATIO_WIDTHS = {1: 34, 2: 30, 4: 24, 8: 18}


def layer_params(model: ModSum) -> int:
    """Parameters of the attention and FFN sublayers (not embeddings, norms or readout)."""
    return sum(p.numel() for p in model.attn.parameters()) + _ffn_params(model)


def run_ratios(seed: int) -> dict:
    """One seed: ReLU FFNs with d_ff = r d for r in 1, 2, 4, 8 at about 7000 layer
    parameters (d = 34, 30, 24, 18), ``MOD_STEPS`` steps each."""
    m = {}
    for r, d in RATIO_WIDTHS.items():
        model, m[f"loss_r{r}"], _ = train_mod_sum("relu", seed, d=d, d_ff=r * d)
        m[f"params_r{r}"] = layer_params(model)
    return m


LN2 = math.log(2)

register("ch07.xor", chapter="07", run=run_xor,
         rule=All(Lt("one_att_identity", 1e-10), Gt("one_att_loss", LN2 - 1e-9),
                  Gt("one_ffn_correct", 3.5),
                  Lt("one_ffn_loss", 0.05), Gt("two_att_correct", 3.5), Lt("two_att_loss", 0.05)),
         claim="一个位置上，只有注意力的模型停在 ln 2（四个 logit 满足仿射恒等式），每层加 FFN 后 200 步分对 4 个；"
               "两个比特放在两个位置上时，只有注意力也能 300 步分对 4 个",
         quoted=("one_ffn_loss", "two_att_loss"), fmt=".4f")
register("ch07.rank_collapse", chapter="07", run=run_collapse,
         rule=All(Lt("attn_12", 1e-12), Lt("attn_ffn_12", 1e-12), Gt("skip_12", 0.3),
                  Gt("skip_ffn_12", 0.3), Gt("attn_loglog", 2)),
         claim="初始化时，没有残差连接的纯注意力堆叠把各词元的表示压成同一个向量（秩 1，到舍入误差），"
               "而且快于指数（ln r 每层乘以 2 以上）；"
               "每层加 FFN 但没有残差连接也一样；有残差连接时 12 层后仍远离秩 1",
         quoted=("attn_1", "attn_loglog", "attn_ffn_1", "skip_12", "skip_ffn_12"))
register("ch07.activations", chapter="07", run=run_activations,
         rule=All(*(Near(f"{a}_ffn_params", 4608, 0.5) for a in ("relu", "gelu", "swiglu")),
                  Lt("swiglu_loss", "none_loss", scale=1 / 5),
                  Lt("swiglu_loss", "gelu_loss"), Lt("swiglu_loss", "relu_loss"),
                  Gt("best_other_over_swiglu_lo", 1)),
         overall=(Rate(All(Lt("relu_loss", "none_loss", scale=1 / 5), Lt("gelu_loss", "none_loss",
                  scale=1 / 5)),
                       at_least=0.8),
                  Rate(Gt("best_other_over_swiglu_hi", 1), at_least=0.8)),
         notes="Restated 2026-12-05 after seeds 5-9: SwiGLU is lowest at lr 3e-3 and 1e-3 on "
               "every run, but at lr 1e-2 not on seed 5 (0.61) and relu/gelu < none/5 fails "
               "on 2 of 25 runs: those two are rates (at least 80 % of the runs).",
         claim="模加法（P = 17，全部 289 对，100 步）上，参数相同的三种 FFN "
               "都远好于没有 FFN（SwiGLU 每次运行都是，ReLU、GELU 在绝大多数"
               "运行上）；这个玩具上学习率 3e-3 和 1e-3 时 SwiGLU 的损失在每"
               "次运行上都最低，1e-2 时在绝大多数运行上最低；GELU 与 ReLU 之间没"
               "有一致的先后",
         quoted=("relu_loss", "gelu_loss", "swiglu_loss", "none_loss", "relu_over_swiglu",
                 "relu_over_gelu", "best_other_over_swiglu_lo", "best_other_over_swiglu_hi"),
         fmt=".3f")
register("ch07.ffn_ratio", chapter="07", run=run_ratios,
         rule=All(*(Near(f"params_r{r}", 7000, 0.08 * 7000) for r in RATIO_WIDTHS)),
         overall=(Rate(Any(All(Lt("loss_r2", "loss_r1"), Lt("loss_r2", "loss_r8")),
                           All(Lt("loss_r4", "loss_r1"), Lt("loss_r4", "loss_r8"))), at_least=0.8),),
         notes="Restated 2026-12-05: 'min(r2, r4) < min(r1, r8) on every seed' fails on seed "
               "8 (r = 1 lowest); now on at least 80 % of the runs.",
         claim="层参数约 7000 时（注意力加 ReLU FFN），模加法 100 步后，在绝"
               "大多数运行上 d_ff/d = 2 或 4 的损失低于 1 和 8；2 与 4 "
               "之间没有一致的先后",
         quoted=("loss_r1", "loss_r2", "loss_r4", "loss_r8"), fmt=".3f")
