"""Chapter 01's build exercise ``ch01.bptt``: backpropagation through time by hand.

A tanh RNN ``z_t = x_t W_xh + h_{t-1} W_hh + b``, ``h_t = tanh(z_t)`` (t = 1..T, row vectors, the
convention of ``attnbook.rnn``) runs on ``x`` ``(B, T, d_in)`` from ``h0`` ``(B, d_h)``; ``dh``
``(B, T, d_h)`` holds ``dh[:, t-1] = dL/dh_t`` as the loss sees it directly at every step (the
partial derivative, later states held fixed). The reader runs the forward pass, then walks
back from t = T to 1 carrying ``g = dL/dh_t`` (the direct term plus what flows back from
h_{t+1}); returns ``(dW_xh, dW_hh, db, dh0)``, the gradients of L summed over the batch and
over time. Autograd is off while the answer runs (``autograd=False``).

The classic bugs: the tanh derivative forgotten, the derivative taken of z instead of h
(1 - z^2), the weight gradients overwritten instead of accumulated over time, h_t used in
place of h_{t-1} for dW_hh, W_hh not transposed on the way back, the gradient not carried
back through the recurrence (every step sees only its own dL/dh_t), and only the last step's
dL/dh_T used.
"""
from __future__ import annotations

import torch

from ..tolerance import max_abs_error, rounding_step
from ._core import Case, Exercise, register
from ._report import close

LABELS = ("dW_xh", "dW_hh", "db", "dh0")


def _bptt(x, h0, W_xh, W_hh, b, dh, *, deriv="h", accumulate=True, prev=True,
          transpose=True, carry=True, direct="all"):
    T = x.shape[1]
    hs = [h0]
    zs = []
    for t in range(T):                                    # forward: h_1 .. h_T
        z = x[:, t] @ W_xh + hs[-1] @ W_hh + b
        zs.append(z)
        hs.append(torch.tanh(z))
    dW_xh, dW_hh = torch.zeros_like(W_xh), torch.zeros_like(W_hh)
    db = torch.zeros_like(b)
    g = torch.zeros_like(h0)                              # dL/dh_t from the future
    for t in range(T, 0, -1):
        own = dh[:, t - 1] if direct == "all" or t == T else torch.zeros_like(g)
        g = g + own if carry else own                     # total dL/dh_t
        d = {"h": 1 - hs[t] ** 2, "none": torch.ones_like(g), "z": 1 - zs[t - 1] ** 2}[deriv]
        dz = g * d                                        # dL/dz_t
        h_in = hs[t - 1] if prev else hs[t]
        if accumulate:
            dW_xh = dW_xh + x[:, t - 1].transpose(0, 1) @ dz
            dW_hh = dW_hh + h_in.transpose(0, 1) @ dz
            db = db + dz.sum(0)
        else:
            dW_xh, dW_hh, db = x[:, t - 1].transpose(0, 1) @ dz, h_in.transpose(0, 1) @ dz, \
                dz.sum(0)
        g = dz @ (W_hh.transpose(0, 1) if transpose else W_hh)   # dL/dh_{t-1}
    return dW_xh, dW_hh, db, g


def bptt(x, h0, W_xh, W_hh, b, dh):
    """Gradients of a tanh RNN by backpropagation through time (chapter 01, build exercise).

    Args: x ``(B, T, d_in)``, h0 ``(B, d_h)``, W_xh ``(d_in, d_h)``, W_hh ``(d_h, d_h)``, b
    ``(d_h,)``, dh ``(B, T, d_h)`` with ``dh[:, t-1] = dL/dh_t`` (the loss's direct term).
    Returns: ``(dW_xh, dW_hh, db, dh0)``, shaped like W_xh, W_hh, b, h0.
    """
    return _bptt(x, h0, W_xh, W_hh, b, dh)


BUGS = {
    "tanh_derivative_forgotten": lambda *a: _bptt(*a, deriv="none"),
    "derivative_of_z_not_h": lambda *a: _bptt(*a, deriv="z"),
    "not_accumulated_over_time": lambda *a: _bptt(*a, accumulate=False),
    "h_t_instead_of_h_prev": lambda *a: _bptt(*a, prev=False),
    "W_hh_not_transposed": lambda *a: _bptt(*a, transpose=False),
    "gradient_not_carried_back": lambda *a: _bptt(*a, carry=False),
    "only_last_step_loss": lambda *a: _bptt(*a, direct="last"),
}


class ComplexStepError(TypeError):
    """The answer computed with complex tensors (the complex-step derivative, a forward-mode
    trick that differentiates the loss numerically instead of walking back through time)."""


class _SeeComplex(torch.overrides.TorchFunctionMode):
    """Notes whether any torch operation run by the answer returned a complex tensor."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.seen = any(isinstance(o, torch.Tensor) and o.is_complex() for o in outs)
        return out


def _run(fn, args, kwargs):
    with _SeeComplex() as seen:
        ret = fn(*args, **kwargs)
    if seen.seen:
        raise ComplexStepError("ch01.bptt 的答案里出现了复数张量")
    if isinstance(ret, (tuple, list)) and len(ret) == 4:
        return ret, dict(zip(LABELS, ret))
    return ret, {LABELS[0]: ret}


def _draw(g, b, t, d_in, d_h, *, w_scale=0.8, x_scale=1.0, h0_scale=0.5, last_only=False,
          dtype=torch.float64):
    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    x = x_scale * r(b, t, d_in)
    h0 = h0_scale * torch.tanh(r(b, d_h))
    W_xh = r(d_in, d_h) / d_in ** 0.5
    W_hh = w_scale * r(d_h, d_h) / d_h ** 0.5
    bias = 0.3 * r(d_h)
    dh = r(b, t, d_h)
    if last_only:
        dh[:, :-1] = 0.0
    return tuple(a.to(dtype) for a in (x, h0, W_xh, W_hh, bias, dh))


def _cases(g):
    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    scale = 0.6 + 0.8 * float(torch.rand(1, generator=g))      # varies with the seed
    b1, t1, din1, dh1 = pick(2, 3), pick(3, 5), pick(2, 3), pick(4, 5)
    b2, t2, din2, dh2 = pick(2, 4), pick(5, 8), pick(3, 5), pick(2, 3)
    d5 = pick(3, 5)
    return [
        Case(f"B = {b1}，T = {t1}，d_in = {din1}，d_h = {dh1}", _draw(g, b1, t1, din1, dh1,
                                                                   w_scale=scale),
             note="每一步都有 dL/dh_t；h0 不为 0；d_in ≠ d_h，B ≠ T。"),
        Case("只有一步：T = 1", _draw(g, 3, 1, 2, 3),
             note="z_1 = x_1 W_xh + h_0 W_hh + b：dW_hh 用的是 h_0。", tags=frozenset({"one"})),
        Case(f"损失只在最后一步：T = {t2}", _draw(g, b2, t2, din2, dh2, last_only=True),
             note="dh[:, :-1] 全是 0，只有 dL/dh_T 不为 0：前面各步的梯度全靠沿时间传回来。",
             tags=frozenset({"last"})),
        Case("饱和的 tanh：权重和输入都很大", _draw(g, 2, 4, 3, 4, w_scale=3.0, x_scale=3.0 * scale),
             note="|z_t| 常常大于 2，tanh′(z) = 1 − h² 远小于 1。", tags=frozenset({"saturated"})),
        Case(f"float32，d_in = d_h = {d5}", _draw(g, 1, 6, d5, d5, w_scale=scale,
                                                 dtype=torch.float32),
             note="方阵的 W_xh 与 W_hh：转置错了形状也对得上，只有数值会错。"),
    ]


_TEXTS = (
    ("tanh_derivative_forgotten",
     "少乘了 tanh 的导数：dL/dz_t = dL/dh_t ∘ (1 − h_t²)，不是 dL/dh_t 本身。"),
    ("derivative_of_z_not_h",
     "tanh′(z) = 1 − tanh(z)² = 1 − h_t²：要用 h_t（tanh 的输出）算，不是 1 − z_t²。"),
    ("h_t_instead_of_h_prev",
     "dW_hh 的每一项是 h_{t-1}ᵀ dL/dz_t：z_t 里乘 W_hh 的是上一步的状态 h_{t-1}，不是 h_t。"),
    ("W_hh_not_transposed",
     "沿时间往回传时要乘 W_hhᵀ：dL/dh_{t-1} = dL/dz_t W_hhᵀ（z_t = h_{t-1} W_hh，行向量在左）。"),
    ("gradient_not_carried_back",
     "每一步只用了它自己的 dL/dh_t，没有加上从 h_{t+1} 传回来的梯度：从 t = T 往回走，"
     "g = dh[:, t-1] + dL/dz_{t+1} W_hhᵀ，传回来的那部分不能丢。"),
    ("only_last_step_loss",
     "只用了最后一步的 dL/dh_T：每一步的 dh[:, t-1] 都要在走到第 t 步时加进 g。"),
    ("not_accumulated_over_time",
     "权重在每一步都用到，梯度要沿时间累加（dW += …）：你的结果像是被最后处理的那一步"
     "（t = 1）覆盖了，只剩一项。"),
)


def _hint(f):
    if f.kind == "exception" and isinstance(f.exc, ComplexStepError):
        return ("你用复数张量求了导数（复步长法，一种前向模式的数值求导）：它不沿时间往回走。"
                "本题要的是反向传播：先做前向存下 h_t，再从 t = T 往回传 dL/dh_t。")
    if f.kind != "value":
        return None
    a = [f.inputs[n] for n in ("x", "h0", "W_xh", "W_hh", "b", "dh")]
    i = LABELS.index(f.label) if f.label in LABELS else 0
    for bug, text in _TEXTS:
        try:
            if close(f.got, BUGS[bug](*a)[i]):
                return text
        except Exception:  # noqa: BLE001  (a hint never hides the report)
            continue
    return ("先做前向，存下 h_0 … h_T；再从 t = T 走到 1：g = dh[:, t-1] + 传回来的梯度，"
            "dz = g ∘ (1 − h_t²)，dW_xh += x_tᵀ dz，dW_hh += h_{t-1}ᵀ dz，db += dz 对批求和，"
            "传回去的是 dz W_hhᵀ；走完后它就是 dh0。")


def _low_atol(case, dtype):
    """FlashAttention's rule (twice the solution's own error in ``dtype`` plus one rounding step)
    widened by the length of the recursion: each of the T backward steps rounds once more at the
    gradients' magnitude, and another right order of the same sums (the chapter's own Jacobian
    helpers, an einsum, a loop over the batch) may land anywhere within that. Seen: a correct
    answer through ``attnbook.rnn.step_jacobians`` off by 3.1 rounding steps in float32 on an
    AVX-512 CPU, where the solution was off by less than one."""
    exact = _bptt(*(a.double() for a in case.args))
    naive = _bptt(*(a.to(dtype) for a in case.args))
    err = max(max_abs_error(n, e) for n, e in zip(naive, exact))
    step = max(rounding_step(e, dtype) for e in exact)
    return 2 * err + (case.args[0].shape[1] + 1) * step


register(Exercise("ch01.bptt", "手写沿时间反向传播", bptt, BUGS, _cases, (_hint,), run=_run,
                  autograd=False, build=True, low_atol=_low_atol,
                  forbidden=((torch.func.vjp, "torch.func.vjp"),
                             (torch.func.grad, "torch.func.grad"),
                             (torch.func.grad_and_value, "torch.func.grad_and_value"),
                             (torch.func.jacrev, "torch.func.jacrev"),
                             (torch.func.jvp, "torch.func.jvp"),
                             (torch.func.jacfwd, "torch.func.jacfwd"),
                             (torch.func.linearize, "torch.func.linearize"),
                             (torch.func.hessian, "torch.func.hessian"),
                             (torch.autograd.functional.jvp, "torch.autograd.functional.jvp"),
                             (torch.autograd.forward_ad.make_dual,
                              "torch.autograd.forward_ad.make_dual"),
                             (_bptt, "exercises.bptt_build._bptt"))))
