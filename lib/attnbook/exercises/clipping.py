"""Chapter 01's exercise ``ch01.clip_grad_norm``: clip all gradients by their global norm.

``N = sqrt(sum_p ||g_p||^2)``; every gradient is multiplied by ``min(1, max_norm / N)`` in place
and N (before clipping) is returned, like ``torch.nn.utils.clip_grad_norm_``. PyTorch divides by
``N + 1e-6``; both that and ``max_norm / N`` are accepted (relative tolerance 1e-5). The classic
bugs clip each tensor by its own norm, rescale even below the threshold, sum the norms, return
the norm after clipping, trip over a parameter whose ``.grad`` is None, or compute the factor
and never write the scaled gradients back (``g = g * c`` rebinds a local name).
"""
from __future__ import annotations

import torch

from ..rnn import clip_grad_norm as _lib_clip_grad_norm
from ._core import Case, Exercise, register

NORM = "返回的范数"


def clip_grad_norm(parameters, max_norm):
    """Scale every ``.grad`` by ``min(1, max_norm / N)`` (chapter 01, eq-ch01-clip); return N."""
    return _lib_clip_grad_norm(parameters, max_norm)


def _grads(parameters):
    return [p.grad for p in parameters if p.grad is not None]


def _per_tensor(parameters, max_norm):
    grads = _grads(parameters)
    for g in grads:
        g.mul_(min(1.0, max_norm / float(g.norm())))
    return torch.stack([g.norm() for g in grads]).norm()  # (not the norm before clipping)


def _always(parameters, max_norm):
    grads = _grads(parameters)
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_(max_norm / total)
    return total


def _sum_of_norms(parameters, max_norm):
    grads = _grads(parameters)
    total = sum(g.norm() for g in grads)
    for g in grads:
        g.mul_(torch.clamp(max_norm / total, max=1.0))
    return total


def _after(parameters, max_norm):
    _lib_clip_grad_norm(parameters, max_norm)
    return torch.stack([g.norm() for g in _grads(parameters)]).norm()


def _none_grad(parameters, max_norm):
    total = torch.stack([p.grad.norm() for p in parameters]).norm()
    for p in parameters:
        p.grad.mul_(torch.clamp(max_norm / total, max=1.0))
    return total


def _not_written_back(parameters, max_norm):
    grads = _grads(parameters)
    total = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g = g * torch.clamp(max_norm / total, max=1.0)  # noqa: PLW2901  (the bug: a new tensor)
    return total


BUGS = {
    "clipped_per_tensor": _per_tensor,
    "rescaled_below_threshold": _always,
    "sum_of_norms": _sum_of_norms,
    "returns_norm_after_clipping": _after,
    "grad_none_not_skipped": _none_grad,
    "grads_not_written_back": _not_written_back,
}


def _run(fn, args, kwargs):
    """Build parameters holding the case's gradients, clip, read the gradients back."""
    grads, max_norm = args
    params = []
    for g in grads:
        p = torch.zeros(() if g is None else g.shape, dtype=torch.float64 if g is None else g.dtype,
                        requires_grad=True)
        p.grad = g
        params.append(p)
    ret = fn(params, max_norm, **kwargs)
    # the norm is a number: a Python float or a 0-dim tensor of any float dtype (rtol 1e-5),
    # judged in the gradients' dtype
    scalar = isinstance(ret, (int, float)) and not isinstance(ret, bool) or (
        isinstance(ret, torch.Tensor) and ret.ndim == 0 and ret.is_floating_point())
    dtype = next((g.dtype for g in grads if g is not None), torch.float64)  # the grads' dtype
    norm = torch.tensor(float(ret), dtype=dtype) if scalar else ret
    out = {NORM: norm}
    out.update({f"parameters[{i}].grad": p.grad for i, p in enumerate(params)
                if grads[i] is not None})
    return ret, out


def _is_stub(ret, outputs, case):
    if ret is NotImplemented:
        return True
    given = [g for g in case.args[0] if g is not None]
    grads = [v for key, v in outputs.items() if key != NORM]
    return ret is None and all(torch.equal(a, b) for a, b in zip(given, grads))


def _scaled(g, shape, norm):
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return t * (norm / t.norm())


def _cases(g):
    u = torch.rand(4, generator=g, dtype=torch.float64)
    s = float(0.5 + 3.0 * u[3])                   # the threshold's scale varies with the seed
    n1, n2 = (int(n) for n in torch.randint(2, 6, (2,), generator=g))
    scales = torch.tensor([1e-3, 1.0, 1e2], dtype=torch.float64) * (1 + u[:3])
    max32 = round(1.0 + 4.0 * float(u[0]), 3)
    return [
        Case("全局范数超过阈值，但每个张量单独都没超过",
             ([_scaled(g, (n1,), s * (0.8 + 0.15 * u[0])),
               _scaled(g, (2, n2), s * (0.8 + 0.15 * u[1]))], round(s, 3)),
             note=f"两个梯度的范数都在 max_norm 的 0.8 到 0.95 倍之间，合起来的全局范数超过它的 "
                  f"1.13 倍；max_norm = {round(s, 3)}。",
             tags=frozenset({"global"})),
        Case("全局范数低于阈值", ([_scaled(g, (4,), 1.0), _scaled(g, (3,), 2.0)], 5.0),
             note="全局范数约 2.24，max_norm = 5.0：梯度应保持不变。", tags=frozenset({"below"})),
        Case("有一个参数的 .grad 是 None",
             ([_scaled(g, (4,), 6.0 + u[2]), None, _scaled(g, (2, 3), 8.0)], 2.0),
             note="parameters[1].grad 是 None（例如它没有参与前向计算），应跳过；max_norm = 2.0。",
             tags=frozenset({"none"})),
        Case("float32，三个梯度的量级差 10 万倍",
             ([_scaled(g, (n2, 3), float(scales[0])).float(),
               _scaled(g, (n1,), float(scales[1])).float(),
               _scaled(g, (3, 2, 2), float(scales[2])).float()], max32),
             note=f"三个梯度的范数约为 0.001、1 和 100；max_norm = {max32}：所有梯度乘同一个系数，"
                  "小的那两个也要缩小。", tags=frozenset({"mixed"})),
    ]


def _hint(f):
    grads = [g for g in f.inputs["parameters"] if g is not None]
    if f.kind == "exception" and "none" in f.case.tags and "NoneType" in str(f.exc):
        return "跳过 .grad 为 None 的参数（它们没有梯度可裁剪）：for p in parameters: if p.grad is None: continue。"
    if f.kind != "value":
        return None
    total = torch.stack([g.norm() for g in grads]).norm()
    if f.label == NORM:
        got = float(f.got)
        if abs(got - float(sum(g.norm() for g in grads))) < 1e-6 * got:
            return "全局范数是所有梯度拼成一个向量后的 L2 范数 sqrt(Σ‖g_p‖²)，不是各个范数之和 Σ‖g_p‖。"
        if abs(got - min(float(total), f.inputs["max_norm"])) < 1e-4:
            return "返回的应是裁剪之前的全局范数（和 torch.nn.utils.clip_grad_norm_ 一样），不是裁剪之后的。"
        if abs(got - float(total) ** 2) < 1e-6 * got:
            return "返回的像是 Σ‖g_p‖²：全局范数还要开平方，N = sqrt(Σ‖g_p‖²)。"
        return None
    i = int(f.label.split("[")[1].split("]")[0])
    given = f.inputs["parameters"][i]
    coef = min(1.0, f.inputs["max_norm"] / float(total))
    earlier = [j for j in range(i) if f.inputs["parameters"][j] is not None]
    if earlier and coef < 1 and torch.allclose(f.got.double(), given):
        return (f"parameters[{earlier[0]}].grad 已经按系数缩放了，{f.label} 却一点都没变："
                "只裁剪了前面的梯度，循环提前结束了。是不是把 return 写在了 for 循环里面"
                "（或者循环的范围少了后面的参数）？先缩放所有梯度，循环结束后再 return N。")
    if coef < 1 and abs(f.inputs["max_norm"] - 1.0) > 1e-6 and torch.allclose(
            f.got.double(), given * f.inputs["max_norm"]):
        return (f"梯度像是乘了 max_norm 本身（{f.inputs['max_norm']:g}）：系数是 max_norm / N，"
                f"还要除以全局范数 N = {float(total):.4f}。")
    if "below" in f.case.tags:
        return "全局范数没有超过 max_norm 时梯度应保持不变：系数是 min(1, max_norm / N)，不会放大。"
    if torch.allclose(f.got.double(), given) and "global" in f.case.tags:
        return ("梯度一点都没变。每个张量单独看都没有超过阈值，但应该用所有梯度合起来的全局范数 "
                "N = sqrt(Σ‖g_p‖²) 判断，并把所有梯度乘以同一个系数（逐个张量裁剪会改变整个梯度的"
                "方向）；如果算了系数，还要原地写回：g.mul_(c) 或 p.grad = p.grad * c，"
                "g = g * c 只改了局部变量。")
    return f"所有梯度都乘以同一个系数 min(1, max_norm / N)，N = {float(total):.4f} 是全局范数。"


register(Exercise("ch01.clip_grad_norm", "按全局范数裁剪梯度", clip_grad_norm, BUGS, _cases,
                  (_hint,), run=_run, is_stub=_is_stub, f64_tol=dict(rtol=1e-5, atol=1e-8)))
