"""The other parts of a Transformer layer: LayerNorm, the position-wise FFN, residual blocks in
Pre-LN and Post-LN form, and parameter counting (chapters 07 and 08).

Every piece is written from its formula, so the book can show it, and is tested against its
PyTorch counterpart: ``LayerNorm`` equals ``nn.LayerNorm`` (in float16/bfloat16 the statistics
are computed in float32 and the result cast back, as PyTorch does). The encoder and decoder
layers that wire these parts together live in ``blocks``.

Conventions: inputs are ``(..., T, d_model)``; row vectors, ``y = x W + b`` with
``nn.Linear.weight = W.T``. The argument checks sit at the end of the module, out of the code
the book shows.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import (check_bool, check_choice, check_device, check_dtype, check_float, check_int,
                      check_tensor, describe)
from .multihead import MultiHeadAttention

__all__ = [
    "ACTIVATIONS",
    "FeedForward",
    "LayerNorm",
    "RMSNorm",
    "ResidualBlock",
    "count_parameters",
    "layer_norm",
    "rms_norm",
    "swiglu_hidden_size",
]

ACTIVATIONS = ("relu", "gelu", "swiglu")


# ---------------------------------------------------------------------------------------------
# LayerNorm (chapter 08)
# ---------------------------------------------------------------------------------------------

def layer_norm(x: torch.Tensor, weight=None, bias=None,
               eps: float = 1e-5) -> torch.Tensor:
    """Layer normalization over the last dim (chapter 08, eq-ch08-layernorm).

    y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias, where mean and var are taken
    over the last dim and var is the *biased* variance (divide by d, not d - 1), with
    eps inside the square root: the definition ``torch.nn.LayerNorm`` uses. A
    float16/bfloat16 ``x`` is normalised in float32 (its variance would overflow or
    round away otherwise) and the result cast back, as ``nn.LayerNorm`` does.

    Where it differs from PyTorch: each row is first divided by a power of two s near
    its largest magnitude (and eps by s^2). That is exact in binary floating point, so
    the result is bit for bit the same in the ordinary range, but ``(x - mu)^2`` can
    no longer overflow (bfloat16 rows near 1e20, where ``nn.LayerNorm`` returns NaN
    and the unscaled formula zeros) or underflow (rows near 1e-30 with ``eps=0``): the
    way ``torch.linalg.vector_norm`` scales before squaring.

    Args:
        x: floating tensor ``(..., d)``.
        weight, bias: ``(d,)`` gain gamma and shift beta, or None (no gain / no shift).
        eps: added to the variance, >= 0.
    Returns:
        tensor of the shape and dtype of ``x``.
    """
    _check_layer_norm(x, weight, bias, eps)
    # statistics in >= float32
    h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    s = _power_of_two_scale(h, eps)  # exact: LN(x; eps) = LN(x / s; eps / s^2), so the
    h, eps = h / s, eps / s / s      # squares below neither overflow nor underflow
    mean = h.mean(-1, keepdim=True)                      # mu = (1/d) sum_i x_i
    centered = h - mean
    var = centered.pow(2).mean(-1, keepdim=True)  # biased: (1/d) sum_i (x_i - mu)^2
    y = centered / torch.sqrt(var + eps)                 # eps inside the square root
    if weight is not None:
        y = y * weight                                   # gamma: one gain per feature
    if bias is not None:
        y = y + bias                                     # beta: one shift per feature
    return y.to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm written from its formula (chapter 08, eq-ch08-layernorm); equals ``nn.LayerNorm``.

    Normalizes each row (one token's d features) with its own mean and biased variance; no
    statistics are shared across the batch or kept between calls, so training and evaluation
    compute the same function.

    Args:
        d: number of features (the last dim of the input).
        eps: added to the variance inside the square root (default 1e-5, as PyTorch).
        elementwise_affine: learn a gain gamma (init 1) and, with ``bias``, a shift beta (init 0).
        bias: learn beta (only with ``elementwise_affine``).
    """

    def __init__(self, d: int, eps: float = 1e-5, *, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        fn = "LayerNorm"
        self.d = check_int("d", d, fn=fn)
        self.eps = check_float("eps", eps, fn=fn, minimum=0.0)
        affine = check_bool("elementwise_affine", elementwise_affine, fn=fn)
        bias = check_bool("bias", bias, fn=fn)
        check_dtype("dtype", dtype, fn=fn)
        check_device("device", device, fn=fn)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(self.d, **factory)) if affine else None
        self.bias = nn.Parameter(torch.zeros(self.d, **factory)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_last_dim(x, self.d, "LayerNorm", "d")
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps:g}, elementwise_affine={self.weight is not None}"

    @classmethod
    def from_torch(cls, ln: nn.LayerNorm) -> "LayerNorm":
        """A copy of ``nn.LayerNorm`` over one trailing dim (same eps, gain and shift)."""
        if not isinstance(ln, nn.LayerNorm):
            raise TypeError(f"LayerNorm.from_torch: `ln` must be an nn.LayerNorm, got {type(ln).__name__}")
        if len(ln.normalized_shape) != 1:
            raise ValueError("LayerNorm.from_torch: only normalized_shape of one dim is supported, got "
                             f"{tuple(ln.normalized_shape)}")
        w = ln.weight
        new = cls(ln.normalized_shape[0], ln.eps, elementwise_affine=w is not None, bias=ln.bias is not None,
                  device=w.device if w is not None else None, dtype=w.dtype if w is not None else None)
        with torch.no_grad():
            if w is not None:
                new.weight.copy_(w)
            if ln.bias is not None:
                new.bias.copy_(ln.bias)
        return new


def rms_norm(x: torch.Tensor, weight=None, eps: float | None = None) -> torch.Tensor:
    """RMSNorm over the last dim (chapter 08, eq-ch08-rmsnorm; Zhang & Sennrich 2019).

    y = x / sqrt(mean(x^2) + eps) * weight, the mean of squares taken over the last dim: no
    mean is subtracted and there is no shift. The definition ``torch.nn.RMSNorm`` uses,
    including its default: ``eps=None`` means ``torch.finfo(x.dtype).eps``. A
    float16/bfloat16 ``x`` is normalised in float32 and the result cast back.

    Where it differs from PyTorch: each row is first divided by a power of two s near
    its largest magnitude (and eps by s^2). That is exact in binary floating point (bit
    for bit the same result in the ordinary range), so ``x^2`` neither overflows
    (bfloat16 rows near 1e20: ``nn.RMSNorm`` returns zeros) nor underflows (float32
    rows near 1e-30 with ``eps=0``: ``nn.RMSNorm`` returns +-inf), the way
    ``torch.linalg.vector_norm`` scales before squaring.

    Args:
        x: floating tensor ``(..., d)``.
        weight: ``(d,)`` gain gamma, or None (no gain).
        eps: added to the mean square, >= 0; None: the machine epsilon of ``x``'s dtype.
    Returns:
        tensor of the shape and dtype of ``x``.
    """
    _check_layer_norm(x, weight, None, 0.0 if eps is None else eps, fn="rms_norm")
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    s = _power_of_two_scale(h, eps)  # exact: RMS(x; eps) = RMS(x / s; eps / s^2), so
    h, eps = h / s, eps / s / s      # x^2 below neither overflows nor underflows
    ms = h.pow(2).mean(-1, keepdim=True)                 # (1/d) sum_i x_i^2, no mean removed
    y = h / torch.sqrt(ms + eps)                         # eps inside the square root
    if weight is not None:
        y = y * weight                                   # gamma: one gain per feature
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm (chapter 08, eq-ch08-rmsnorm; Zhang & Sennrich 2019); equals ``nn.RMSNorm``.

    Divides each row by its root mean square and multiplies by a learned gain; unlike
    LayerNorm it subtracts no mean and has no shift. Used, in Pre-LN position, by LLaMA.

    Args:
        d: number of features (the last dim of the input).
        eps: added to the mean square; None (PyTorch's default): the input dtype's machine eps.
        elementwise_affine: learn a gain gamma (init 1).
    """

    def __init__(self, d: int, eps: float | None = None, *, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        fn = "RMSNorm"
        self.d = check_int("d", d, fn=fn)
        self.eps = None if eps is None else check_float("eps", eps, fn=fn, minimum=0.0)
        affine = check_bool("elementwise_affine", elementwise_affine, fn=fn)
        check_dtype("dtype", dtype, fn=fn)
        check_device("device", device, fn=fn)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(self.d, **factory)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_last_dim(x, self.d, "RMSNorm", "d")
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}, elementwise_affine={self.weight is not None}"

    @classmethod
    def from_torch(cls, rms: nn.RMSNorm) -> "RMSNorm":
        """A copy of ``nn.RMSNorm`` over one trailing dim (same eps and gain)."""
        if not isinstance(rms, nn.RMSNorm):
            raise TypeError(f"RMSNorm.from_torch: `rms` must be an nn.RMSNorm, got {type(rms).__name__}")
        if len(rms.normalized_shape) != 1:
            raise ValueError("RMSNorm.from_torch: only normalized_shape of one dim is supported, got "
                             f"{tuple(rms.normalized_shape)}")
        w = rms.weight
        new = cls(rms.normalized_shape[0], rms.eps, elementwise_affine=w is not None,
                  device=w.device if w is not None else None, dtype=w.dtype if w is not None else None)
        if w is not None:
            with torch.no_grad():
                new.weight.copy_(w)
        return new


# ---------------------------------------------------------------------------------------------
# Position-wise feed-forward network (chapter 07)
# ---------------------------------------------------------------------------------------------

def swiglu_hidden_size(d_model: int, *, multiple_of: int = 1) -> int:
    """The SwiGLU hidden size with about a 4 d_model ReLU FFN's parameters (chapter 07).

    Three d_model x d_ff matrices instead of two: d_ff = 2/3 * 4 d_model
    = 8 d_model / 3, then rounded up to a multiple of ``multiple_of`` (LLaMA uses 256:
    d_model 4096 gives 11008).
    """
    d_model = check_int("d_model", d_model, fn="swiglu_hidden_size")
    multiple_of = check_int("multiple_of", multiple_of, fn="swiglu_hidden_size")
    hidden = (8 * d_model) // 3                                 # int(2 * 4d / 3)
    return multiple_of * -(-hidden // multiple_of)  # round up to multiple_of


class FeedForward(nn.Module):
    """Position-wise feed-forward network (chapter 07, eq-ch07-ffn): the same map on every row.

    relu / gelu:  FFN(x) = act(x W_1 + b_1) W_2 + b_2         (W_1: d_model x d_ff)
    swiglu:       FFN(x) = (SiLU(x W_g + b_g) * (x W_1 + b_1)) W_2 + b_2   (Shazeer 2020)

    ``linear1`` and ``linear2`` are named as in ``nn.TransformerEncoderLayer``; ``gate`` exists
    only for SwiGLU. ``dropout`` acts on the hidden activations (where PyTorch puts it).

    Args:
        d_model: size of each position's vector.
        d_ff: hidden size (4 d_model in the original Transformer; about 8 d_model / 3 for SwiGLU,
            see :func:`swiglu_hidden_size`).
        activation: ``"relu"``, ``"gelu"`` (exact, erf-based) or ``"swiglu"``.
        bias: give every linear map a bias.
        dropout: dropout probability on the hidden layer (training only).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", bias: bool = True,
                 dropout: float = 0.0, device=None, dtype=None):
        super().__init__()
        fn = "FeedForward"
        self.d_model = check_int("d_model", d_model, fn=fn)
        self.d_ff = check_int("d_ff", d_ff, fn=fn)
        self.activation = check_choice("activation", activation, ACTIVATIONS, fn=fn)
        bias = check_bool("bias", bias, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        check_dtype("dtype", dtype, fn=fn)
        check_device("device", device, fn=fn)
        factory = {"device": device, "dtype": dtype}
        self.linear1 = nn.Linear(self.d_model, self.d_ff, bias=bias, **factory)   # W_1: up
        self.gate = nn.Linear(self.d_model, self.d_ff, bias=bias, **factory) if activation == "swiglu" else None
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(self.d_ff, self.d_model, bias=bias, **factory)   # W_2: down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_last_dim(x, self.d_model, "FeedForward", "d_model", like=self.linear1.weight)
        h = self.linear1(x)                                   # (..., d_ff): x W_1 + b_1
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)                                     # exact x * Phi(x)
        else:
            h = F.silu(self.gate(x)) * h  # SwiGLU: SiLU(x W_g) * (x W_1)
        return self.linear2(self.dropout(h))                  # (..., d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


# ---------------------------------------------------------------------------------------------
# Residual blocks (chapter 08)
# ---------------------------------------------------------------------------------------------

class ResidualBlock(nn.Module):
    """A sublayer f with its residual connection and LayerNorm (chapter 08, eq-ch08-pre-post).

    Post-LN (``norm_first=False``, the original Transformer):  y = LN(x + f(x))
    Pre-LN  (``norm_first=True``, e.g. GPT-2):                y = x + f(LN(x))

    Extra positional and keyword arguments of ``forward`` go to ``f`` (e.g. an attention mask);
    a sublayer returning a named tuple with an ``out`` field (``MultiHeadAttention``) contributes
    that field.
    ``dropout`` acts on f's output before it is added (training only).

    Args:
        sublayer: a module mapping ``(..., d_model)`` to ``(..., d_model)``.
        d_model: size of the LayerNorm.
        norm_first: Pre-LN if True, Post-LN if False.
        eps: the LayerNorm's eps.
        dropout: dropout probability on f's output.
    """

    def __init__(self, sublayer: nn.Module, d_model: int, *, norm_first: bool = False, eps: float = 1e-5,
                 dropout: float = 0.0, bias: bool = True, device=None, dtype=None):
        super().__init__()
        fn = "ResidualBlock"
        if not isinstance(sublayer, nn.Module):
            raise TypeError(f"{fn}: `sublayer` must be an nn.Module, got {type(sublayer).__name__}")
        self.norm_first = check_bool("norm_first", norm_first, fn=fn)
        dropout = check_float("dropout", dropout, fn=fn, minimum=0.0, maximum=1.0)
        self.sublayer = sublayer
        self.norm = LayerNorm(d_model, eps, bias=bias, device=device, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def _f(self, x, args, kwargs):
        out = self.sublayer(x, *args, **kwargs)
        return self.dropout(out.out if hasattr(out, "out") else out)   # MultiHeadOutput -> out

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.norm_first:
            return x + self._f(self.norm(x), args, kwargs)          # x + f(LN(x))
        return self.norm(x + self._f(x, args, kwargs))              # LN(x + f(x))

    def extra_repr(self) -> str:
        return "Pre-LN: x + f(LN(x))" if self.norm_first else "Post-LN: LN(x + f(x))"


# ---------------------------------------------------------------------------------------------
# Counting parameters (chapters 05, 07, 10)
# ---------------------------------------------------------------------------------------------

KINDS = ("embedding", "attention", "ffn", "norm", "other")

# PyTorch's Transformer layers keep their FFN as two bare nn.Linear children with these names.
_TORCH_FFN_CHILDREN = {"linear1", "linear2"}


def _kind(module: nn.Module, name: str, parent: nn.Module | None) -> str | None:
    """The kind a whole module counts as, or None to look inside it."""
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, (nn.MultiheadAttention, MultiHeadAttention)):
        return "attention"
    if isinstance(module, FeedForward):
        return "ffn"
    torch_layers = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
    if isinstance(parent, torch_layers) and name in _TORCH_FFN_CHILDREN:
        return "ffn"
    norms = (nn.LayerNorm, LayerNorm, RMSNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())
    if isinstance(module, norms):
        return "norm"
    return None


def count_parameters(module: nn.Module, *, by: str = "kind") -> dict[str, int]:
    """Number of parameters of ``module``, split by kind or by child (chapters 07, 08).

    ``by="kind"``: ``{"embedding", "attention", "ffn", "norm", "other"}`` (keys with 0
    omitted). A module is counted as a whole when it is an embedding (``nn.Embedding``),
    an attention (``nn.MultiheadAttention`` or
    :class:`attnbook.multihead.MultiHeadAttention`), an FFN (:class:`FeedForward`, or
    the ``linear1``/``linear2`` children of PyTorch's Transformer layers), or a norm
    (``nn.LayerNorm``, ``nn.RMSNorm``, this module's :class:`LayerNorm` and
    :class:`RMSNorm`); any other parameter is ``"other"`` (e.g. an output projection
    to the vocabulary that is not tied to the embedding).

    ``by="child"``: one entry per named child that holds parameters not counted before
    it, in order, plus ``"(own)"`` for parameters the module holds directly; a child
    whose parameters all belong to an earlier child (an output projection tied to the
    embedding) is left out, as kinds with 0 are.

    A parameter shared by several modules (tied embeddings) is counted once, where it is
    first met, so the values always add up to
    ``sum(p.numel() for p in module.parameters())``.
    """
    fn = "count_parameters"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: `module` must be an nn.Module, "
                        f"got {type(module).__name__}")
    check_choice("by", by, ("kind", "child"), fn=fn)
    seen: set[int] = set()

    def fresh(params) -> int:
        n = 0
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    counts: dict[str, int] = {}
    if by == "child":
        for name, child in module.named_children():
            n = fresh(child.parameters())  # 0: dropout, a tied output ...
            if n:
                counts[name] = n
        own = fresh(module.parameters(recurse=False))
        if own:
            counts["(own)"] = own
        return counts

    counts = dict.fromkeys(KINDS, 0)

    def walk(mod: nn.Module, name: str, parent: nn.Module | None) -> None:
        kind = _kind(mod, name, parent)
        if kind is not None:
            counts[kind] += fresh(mod.parameters())
            return
        counts["other"] += fresh(mod.parameters(recurse=False))
        for child_name, child in mod.named_children():
            walk(child, child_name, mod)

    walk(module, "", None)
    return {k: v for k, v in counts.items() if v}


def _power_of_two_scale(h: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row of ``h``, a power of two s with max(max|h|, sqrt(eps)) / s in [1, 2); 1 for a row
    of zeros with eps 0 or a row holding inf/NaN. Dividing by it is exact (no rounding), so the
    normalisations that use it return the same bits as without it wherever that did not over- or
    underflow. Detached: the normalisations are invariant to it, so no gradient flows through it.
    """
    m = h.detach().abs().amax(-1, keepdim=True).clamp_min(math.sqrt(eps))
    m = torch.where(torch.isfinite(m) & (m > 0), m, torch.ones_like(m))
    _, exponent = torch.frexp(m)                         # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    return torch.ldexp(torch.ones_like(m), exponent - 1)


# ---------------------------------------------------------------------------------------------
# Argument checks (kept out of the functions the book shows)
# ---------------------------------------------------------------------------------------------

def _check_layer_norm(x, weight, bias, eps, fn="layer_norm") -> None:
    check_tensor("x", x, fn=fn)
    check_float("eps", eps, fn=fn, minimum=0.0)
    d = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_tensor(name, p, fn=fn)
            if tuple(p.shape) != (d,):
                raise ValueError(f"{fn}: `{name}` must have shape ({d},) to match x's last dim, "
                                 f"got {tuple(p.shape)}")
            if p.device != x.device:
                raise ValueError(f"{fn}: `{name}` is on {p.device} but `x` is on {x.device}")


def _check_last_dim(x, d, fn, d_name, like=None) -> None:
    """``x``: a floating tensor ``(..., d)``; with ``like``, in its dtype and device."""
    check_tensor("x", x, fn=fn)
    if x.shape[-1] != d:
        raise ValueError(f"{fn}: `x` must have last dim {d_name} = {d}, got shape {tuple(x.shape)}")
    if like is not None and (x.dtype != like.dtype or x.device != like.device):
        raise TypeError(f"{fn}: `x` must have the module's dtype and device ({like.dtype}, "
                        f"{like.device}), got {describe(x)}")
