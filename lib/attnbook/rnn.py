"""A plain RNN, its backpropagation-through-time Jacobians, and gradient clipping (chapter 01).

Convention (the book's, see appendix "记号与约定"): states are **row vectors** and weights
multiply from the right,

    z_t = x_t W_xh + h_{t-1} W_hh + b,        h_t = sigma(z_t),        t = 1..T,

with ``W_xh`` of shape (d_in, d_h) and ``W_hh`` of shape (d_h, d_h). ``torch.nn.RNN`` computes
``h_t = sigma(x_t weight_ih^T + b_ih + h_{t-1} weight_hh^T + b_hh)``, so ``weight_ih_l0 = W_xh^T``,
``weight_hh_l0 = W_hh^T`` and ``b = b_ih + b_hh``. The column-vector notation of seed 001
(``h = sigma(W_h h + W_x x)``) has ``W_h = W_hh^T`` = ``nn.RNN``'s ``weight_hh_l0``.

Jacobians are in numerator layout, ``J[a, b] = d out_a / d in_b`` (what
``torch.autograd.functional.jacobian`` returns). For one step,

    J_t = d h_t / d h_{t-1} = diag(sigma'(z_t)) W_hh^T     ( = diag(sigma'(z_t)) weight_hh_l0 ),

and the chain rule puts the latest step on the left:

    d h_t / d h_k = J_t J_{t-1} ... J_{k+1},        d L / d h_k = (d L / d h_t) J_t ... J_{k+1}

(a gradient is a row vector). Seed 001's ``W_h^T diag(sigma'(z))`` is ``J_t^T``: the
denominator layout, in which the column gradient is ``J_{k+1}^T ... J_t^T (grad_t)^T``.

Indexing: ``forward`` returns ``h[:, t-1] = h_t`` for t = 1..T (the initial state ``h_0`` is
not included), and ``step_jacobians`` returns ``factors[..., t-1, :, :] = J_t``.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import nn

from ._checks import (check_bool, check_choice, check_device, check_dtype, check_float, check_int, check_tensor,
                      describe)

__all__ = [
    "GAMMA",
    "MATRIX_NORMS",
    "NONLINEARITIES",
    "RNNOutput",
    "SimpleRNN",
    "activation_derivative",
    "clip_grad_norm",
    "clip_grad_value",
    "flat_grad",
    "jacobian_norms",
    "jacobian_product",
    "orthogonal",
    "product_norms",
    "rnn_with",
    "step_jacobians",
]

NONLINEARITIES = ("tanh", "sigmoid", "relu")
# gamma = sup |sigma'|: tanh' = 1 - tanh^2 <= 1 (at 0), sigmoid' = s(1 - s) <= 1/4 (at 0), relu' in {0, 1}
GAMMA = {"tanh": 1.0, "sigmoid": 0.25, "relu": 1.0}

_ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}


def activation_derivative(z: torch.Tensor, nonlinearity: str = "tanh") -> torch.Tensor:
    """sigma'(z) elementwise for the RNN's nonlinearity (chapter 01, eq-ch01-gamma; the diagonal of J_t).

    tanh: 1 - tanh(z)^2;  sigmoid: s (1 - s) with s = sigmoid(z);  relu: 1 where z > 0, else 0
    (PyTorch's convention at z = 0, so the result equals autograd's).

    Args:
        z: pre-activations, any shape, floating.
        nonlinearity: "tanh", "sigmoid" or "relu".
    Returns:
        a tensor shaped like ``z``.
    """
    fn = "activation_derivative"
    check_tensor("z", z, fn=fn, min_ndim=0)
    check_choice("nonlinearity", nonlinearity, NONLINEARITIES, fn=fn)
    if nonlinearity == "tanh":
        return 1 - torch.tanh(z) ** 2
    if nonlinearity == "sigmoid":
        s = torch.sigmoid(z)
        return s * (1 - s)
    return (z > 0).to(z.dtype)


class RNNOutput(NamedTuple):
    """What ``SimpleRNN.forward`` returns: hidden states and pre-activations, both (B, T, d_h)."""

    h: torch.Tensor
    z: torch.Tensor


class SimpleRNN(nn.Module):
    """A one-layer RNN in the row-vector convention (chapter 01, eq-ch01-rnn).

        z_t = x_t W_xh + h_{t-1} W_hh + b,    h_t = sigma(z_t),    h_0 = h0 (zeros by default)

    Parameters (``nn.Parameter``): ``W_xh`` (d_in, d_h), ``W_hh`` (d_h, d_h), ``b`` (d_h,) or
    None. They are initialised like ``torch.nn.RNN``: uniform in [-1/sqrt(d_h), 1/sqrt(d_h)].
    With ``nonlinearity`` "tanh" or "relu" it computes exactly what ``torch.nn.RNN`` computes
    (load its weights with :meth:`from_torch`); "sigmoid" has no ``torch.nn.RNN`` counterpart
    (it is here because its derivative is bounded by 1/4, not 1).

    Args:
        d_in: input size.
        d_hidden: hidden size d_h.
        nonlinearity: "tanh" (default), "sigmoid" or "relu".
        bias: whether to learn ``b``.
        dtype, device: of the parameters (a floating dtype; default torch's default dtype).
    """

    def __init__(self, d_in: int, d_hidden: int, *, nonlinearity: str = "tanh", bias: bool = True,
                 dtype: torch.dtype | None = None, device=None):
        super().__init__()
        fn = "SimpleRNN"
        self.d_in = check_int("d_in", d_in, fn=fn)
        self.d_hidden = check_int("d_hidden", d_hidden, fn=fn)
        self.nonlinearity = check_choice("nonlinearity", nonlinearity, NONLINEARITIES, fn=fn)
        bias = check_bool("bias", bias, fn=fn)
        kw = dict(dtype=check_dtype("dtype", dtype, fn=fn), device=check_device("device", device, fn=fn))
        bound = 1.0 / math.sqrt(self.d_hidden)
        self.W_xh = nn.Parameter(torch.empty(self.d_in, self.d_hidden, **kw).uniform_(-bound, bound))
        self.W_hh = nn.Parameter(torch.empty(self.d_hidden, self.d_hidden, **kw).uniform_(-bound, bound))
        self.b = nn.Parameter(torch.empty(self.d_hidden, **kw).uniform_(-bound, bound)) if bias else None

    @property
    def gamma(self) -> float:
        """sup |sigma'| of this RNN's nonlinearity: 1 (tanh, relu) or 1/4 (sigmoid)."""
        return GAMMA[self.nonlinearity]

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """sigma(z)."""
        return _ACTIVATIONS[self.nonlinearity](z)

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> RNNOutput:
        """Unroll over time.

        Args:
            x: inputs (B, T, d_in), batch first.
            h0: initial state (B, d_h); zeros when None.
        Returns:
            ``RNNOutput(h, z)``, both (B, T, d_h): ``h[:, t-1] = h_t`` and
            ``z[:, t-1] = z_t``.
        """
        h = self._check_forward(x, h0)                       # h_0: h0, or zeros (B, d_h)
        batch, steps = x.shape[0], x.shape[1]
        xw = x @ self.W_xh  # (B, T, d_h): input terms of every step
        if self.b is not None:
            xw = xw + self.b
        hs, zs = [], []
        for t in range(steps):
            z = xw[:, t] + h @ self.W_hh  # z_t = x_t W_xh + b + h_{t-1} W_hh
            h = self.activation(z)                           # h_t = sigma(z_t)
            zs.append(z)
            hs.append(h)
        if steps == 0:
            empty = x.new_zeros(batch, 0, self.d_hidden)
            return RNNOutput(empty, empty)
        return RNNOutput(torch.stack(hs, 1), torch.stack(zs, 1))   # (B, T, d_h) each

    def _check_forward(self, x, h0) -> torch.Tensor:
        """Every check of ``forward``'s arguments; returns the initial state h_0."""
        fn = "SimpleRNN.forward"
        check_tensor("x", x, fn=fn, min_ndim=3)
        if x.ndim != 3 or x.shape[-1] != self.d_in:
            raise ValueError(f"{fn}: `x` must be (B, T, d_in={self.d_in}), got {describe(x)}")
        if x.dtype != self.W_hh.dtype or x.device != self.W_hh.device:
            raise TypeError(f"{fn}: `x` must match the parameters' dtype {self.W_hh.dtype} and device "
                            f"{self.W_hh.device}, got {describe(x)}")
        if h0 is None:
            return x.new_zeros(x.shape[0], self.d_hidden)
        check_tensor("h0", h0, fn=fn, min_ndim=2)
        if tuple(h0.shape) != (x.shape[0], self.d_hidden) or h0.dtype != x.dtype or h0.device != x.device:
            raise ValueError(f"{fn}: `h0` must be (B={x.shape[0]}, d_h={self.d_hidden}) with x's dtype and "
                             f"device, got {describe(h0)}")
        return h0

    @classmethod
    def from_torch(cls, rnn: nn.RNN) -> "SimpleRNN":
        """A SimpleRNN computing exactly what a one-layer, one-way ``nn.RNN`` computes.

        ``W_xh = weight_ih_l0.T``, ``W_hh = weight_hh_l0.T``,
        ``b = bias_ih_l0 + bias_hh_l0`` (the weights are copied; the two are independent
        afterwards). ``nn.RNN`` with ``batch_first=False`` takes (T, B, d_in); this
        class always takes (B, T, d_in).
        """
        _check_from_torch(rnn)
        w_ih, w_hh = rnn.weight_ih_l0.detach(), rnn.weight_hh_l0.detach()
        model = cls(rnn.input_size, rnn.hidden_size, nonlinearity=rnn.nonlinearity,
                    bias=rnn.bias, dtype=w_hh.dtype, device=w_hh.device)
        with torch.no_grad():
            model.W_xh.copy_(w_ih.T)                         # weight_ih_l0 = W_xh^T
            model.W_hh.copy_(w_hh.T)                         # weight_hh_l0 = W_hh^T
            if rnn.bias:
                model.b.copy_(rnn.bias_ih_l0.detach() + rnn.bias_hh_l0.detach())
        return model

    def extra_repr(self) -> str:
        return f"{self.d_in}, {self.d_hidden}, nonlinearity={self.nonlinearity!r}, bias={self.b is not None}"


def _check_from_torch(rnn) -> None:
    fn = "SimpleRNN.from_torch"
    if not isinstance(rnn, nn.RNN):
        raise TypeError(f"{fn}: `rnn` must be a torch.nn.RNN, got {type(rnn).__name__}")
    if rnn.num_layers != 1 or rnn.bidirectional or getattr(rnn, "proj_size", 0):
        raise ValueError(f"{fn}: only a one-layer, unidirectional nn.RNN without projection is supported, got "
                         f"num_layers={rnn.num_layers}, bidirectional={rnn.bidirectional}")


def step_jacobians(rnn: SimpleRNN, z: torch.Tensor) -> torch.Tensor:
    """Per-step Jacobians J_t = d h_t/d h_{t-1} = diag(sigma'(z_t)) W_hh^T (chapter 01).

    This is eq-ch01-step.

    Numerator layout:
    ``J_t[a, b] = d h_t[a] / d h_{t-1}[b] = sigma'(z_t[a]) W_hh[b, a]``.

    Args:
        rnn: the SimpleRNN whose ``W_hh`` and nonlinearity are used.
        z: pre-activations (..., T, d_h), e.g. ``rnn(x).z`` of shape (B, T, d_h).
    Returns:
        factors (..., T, d_h, d_h) with ``factors[..., t-1, :, :] = J_t``.
    """
    _check_step_jacobians(rnn, z)
    # (..., T, d_h): the diagonal of diag(sigma'(z_t))
    d = activation_derivative(z, rnn.nonlinearity)
    # row a scaled by sigma'(z_t[a]): diag(d) W_hh^T
    return d[..., :, None] * rnn.W_hh.T


def _check_step_jacobians(rnn, z) -> None:
    fn = "step_jacobians"
    if not isinstance(rnn, SimpleRNN):
        raise TypeError(f"{fn}: `rnn` must be an attnbook.rnn.SimpleRNN, got {type(rnn).__name__}")
    check_tensor("z", z, fn=fn, min_ndim=2)
    if z.shape[-1] != rnn.d_hidden:
        raise ValueError(f"{fn}: `z` must be (..., T, d_h={rnn.d_hidden}), got {describe(z)}")
    if z.dtype != rnn.W_hh.dtype or z.device != rnn.W_hh.device:
        raise TypeError(f"{fn}: `z` must have the RNN's dtype {rnn.W_hh.dtype} and device {rnn.W_hh.device}, "
                        f"got {describe(z)}")


def _check_factors(fn: str, factors) -> None:
    check_tensor("factors", factors, fn=fn, min_ndim=3)
    if factors.shape[-1] != factors.shape[-2]:
        raise ValueError(f"{fn}: `factors` must be (..., T, d_h, d_h) square Jacobians, got {describe(factors)}")


def jacobian_product(factors: torch.Tensor, t: int, k: int) -> torch.Tensor:
    """d h_t / d h_k = J_t J_{t-1} ... J_{k+1}, latest step on the left (chapter 01).

    This is eq-ch01-full.

    Args:
        factors: (..., T, d_h, d_h) from :func:`step_jacobians`
            (``factors[..., j-1] = J_j``).
        t, k: time steps with 0 <= k <= t <= T (h_0 is the initial state);
            t == k gives I.
    Returns:
        (..., d_h, d_h).
    """
    t, k = _check_jacobian_product(factors, t, k)
    d = factors.shape[-1]
    eye = torch.eye(d, dtype=factors.dtype, device=factors.device)
    out = eye.expand(*factors.shape[:-3], d, d).clone()
    for j in range(k + 1, t + 1):
        # P <- J_j P: each newer step multiplies on the left
        out = factors[..., j - 1, :, :] @ out
    return out


def _check_jacobian_product(factors, t, k) -> tuple[int, int]:
    fn = "jacobian_product"
    _check_factors(fn, factors)
    t, k = check_int("t", t, fn=fn, minimum=0), check_int("k", k, fn=fn, minimum=0)
    if not k <= t <= factors.shape[-3]:
        raise ValueError(f"{fn}: need 0 <= k <= t <= T={factors.shape[-3]}, got k={k}, t={t}")
    return t, k


MATRIX_NORMS = (2, -2, 1, -1, math.inf, -math.inf, "fro", "nuc")  # what torch.linalg.matrix_norm takes


def jacobian_norms(factors: torch.Tensor, k: int = 0, *, ord: int | float | str = 2) -> torch.Tensor:
    """Norms ||d h_t / d h_k|| for t = k, ..., T from one running product (chapter 01, eq-ch01-bound).

    Args:
        factors: (..., T, d_h, d_h) from :func:`step_jacobians`.
        k: the earlier step, 0 <= k <= T.
        ord: matrix norm for ``torch.linalg.matrix_norm``, one of ``MATRIX_NORMS``: 2 (spectral,
            the default), -2, 1, -1, inf, -inf, "fro", "nuc".
    Returns:
        (..., T - k + 1): entry i is the norm of the product over a gap of t - k = i steps (1 at i = 0).
    """
    fn = "jacobian_norms"
    _check_factors(fn, factors)
    steps = factors.shape[-3]
    k = check_int("k", k, fn=fn, minimum=0)
    if k > steps:
        raise ValueError(f"{fn}: need 0 <= k <= T={steps}, got k={k}")
    numeric = isinstance(ord, numbers.Real) and not isinstance(ord, bool)
    if not (ord in ("fro", "nuc") if isinstance(ord, str) else numeric and ord in MATRIX_NORMS):
        raise ValueError(f"{fn}: `ord` must be one of {MATRIX_NORMS} (torch.linalg.matrix_norm), got {ord!r}")
    d = factors.shape[-1]
    prod = torch.eye(d, dtype=factors.dtype, device=factors.device).expand(*factors.shape[:-3], d, d)
    norms = [torch.linalg.matrix_norm(prod, ord=ord)]
    for j in range(k + 1, steps + 1):
        prod = factors[..., j - 1, :, :] @ prod
        norms.append(torch.linalg.matrix_norm(prod, ord=ord))
    return torch.stack(norms, -1)


def _grads(fn: str, parameters) -> list[torch.Tensor]:
    params = [parameters] if isinstance(parameters, torch.Tensor) else parameters
    if not isinstance(params, Iterable):
        raise TypeError(f"{fn}: `parameters` must be a tensor or an iterable of tensors, got "
                        f"{type(parameters).__name__}")
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{fn}: `parameters[{i}]` must be a torch.Tensor, got {type(p).__name__}")
    return [p.grad for p in params if p.grad is not None]


def _check_clip(fn: str, parameters, threshold) -> tuple[float, list[torch.Tensor]]:
    """The threshold (finite, > 0) and the gradients of ``parameters`` that exist."""
    name = "max_norm" if fn == "clip_grad_norm" else "clip_value"
    return check_float(name, threshold, fn=fn, minimum=0.0, inclusive=False), _grads(fn, parameters)


@torch.no_grad()
def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """Rescale all gradients together when their global L2 norm exceeds ``max_norm``.

    Chapter 01, eq-ch01-clip.

    The global norm is taken over every gradient concatenated into one vector,

        N = sqrt(sum_p ||g_p||^2),        g_p <- g_p * min(1, max_norm / (N + 1e-6)),

    exactly as ``torch.nn.utils.clip_grad_norm_`` (PyTorch 2.x,
    ``torch/nn/utils/clip_grad.py``): the 1e-6 guards against N = 0, leaves a clipped
    norm of ``max_norm * N / (N + 1e-6)``, just under ``max_norm``, and also rescales
    (slightly) when ``max_norm - 1e-6 < N <= max_norm``. Pascanu et al. (2013, Alg. 1)
    rescale to exactly the threshold when ``N >= threshold``. Every gradient is scaled
    by the same factor, so the direction of the whole gradient is kept.

    Args:
        parameters: a tensor or an iterable of tensors; those whose ``.grad`` is None
            are skipped.
        max_norm: the threshold tau > 0.
    Returns:
        the global norm N **before** clipping (a 0-dim tensor), like PyTorch.
    """
    max_norm, grads = _check_clip("clip_grad_norm", parameters, max_norm)
    if not grads:
        return torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(g, 2) for g in grads]  # ||g_p|| per tensor
    device = grads[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), 2)  # N
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # min(1, tau / (N + 1e-6))
    for g in grads:
        g.mul_(coef.to(g.device))
    return total


@torch.no_grad()
def clip_grad_value(parameters, clip_value: float) -> None:
    """Clamp every gradient entry to [-clip_value, clip_value] (chapter 01, for contrast).

    Equal to ``torch.nn.utils.clip_grad_value_``. Unlike :func:`clip_grad_norm` it acts on each
    coordinate separately, so it changes the gradient's **direction** whenever some entries are
    clamped and others are not.

    Args:
        parameters: a tensor or an iterable of tensors; those whose ``.grad`` is None are skipped.
        clip_value: c > 0.
    """
    clip_value, grads = _check_clip("clip_grad_value", parameters, clip_value)
    for g in grads:
        g.clamp_(min=-clip_value, max=clip_value)


def orthogonal(n: int, generator: torch.Generator | None = None, *,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A uniformly random (Haar) orthogonal ``n x n`` matrix: QR of a Gaussian, signs fixed by diag(R).

    Chapter 01 builds ``W_hh = s Q`` from it, so that ``s_max = rho = s``.
    """
    n = check_int("n", n, fn="orthogonal", minimum=1)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=dtype))
    return q * torch.sign(torch.diagonal(r))


def rnn_with(W_hh: torch.Tensor, *, nonlinearity: str = "tanh", b: torch.Tensor | None = None) -> SimpleRNN:
    """A float64 :class:`SimpleRNN` with the given ``W_hh`` (d, d), ``W_xh = I`` (inputs enter directly)
    and bias ``b`` (d,) or none (chapter 01's measurements)."""
    check_tensor("W_hh", W_hh, fn="rnn_with", min_ndim=2)
    n_h = W_hh.shape[0]
    if tuple(W_hh.shape) != (n_h, n_h):
        raise ValueError(f"rnn_with: `W_hh` must be square, got shape {tuple(W_hh.shape)}")
    if b is not None and tuple(b.shape) != (n_h,):
        raise ValueError(f"rnn_with: `b` must have shape ({n_h},), got {tuple(b.shape)}")
    net = SimpleRNN(n_h, n_h, nonlinearity=nonlinearity, bias=b is not None, dtype=torch.float64)
    with torch.no_grad():
        net.W_hh.copy_(W_hh)
        net.W_xh.copy_(torch.eye(n_h, dtype=torch.float64))
        if b is not None:
            net.b.copy_(b)
    return net


@torch.no_grad()
def product_norms(net: SimpleRNN, x: torch.Tensor) -> torch.Tensor:
    """``||dh_t/dh_0||_2`` for t = 0..T along the trajectory that ``x`` (1, T, d_in) drives: shape (T + 1,)."""
    return jacobian_norms(step_jacobians(net, net(x).z))[0]


def flat_grad(parameters) -> torch.Tensor:
    """Every existing ``.grad`` of ``parameters`` flattened and concatenated: the global gradient vector."""
    grads = _grads("flat_grad", parameters)
    if not grads:
        raise ValueError("flat_grad: `parameters` must have at least one .grad, got none")
    return torch.cat([g.flatten() for g in grads])
