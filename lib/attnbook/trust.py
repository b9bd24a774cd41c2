"""The first-use check behind ``backend="auto"``: is a fused kernel right here, for this kind of call? (chapter 09)

On CUDA, ``auto`` would pick the Triton kernel. Before it trusts the kernel for a kind of call
(:func:`check_key`: device, dtype, the head dims D and Dv themselves, causal, masked, backward)
it runs :func:`check` once per process and kind, and caches the verdict (:func:`verdicts`). The
check runs what such calls will run:

- the caller's D and Dv, so the zero padding up to the kernels' power-of-two head-dim tile is
  exercised (a D = 80 call is not vouched for by a check at D = 128);
- every shape of ``CHECK_SHAPES``: several tiles along each axis with ragged tails at every tile
  size, rows >= 128, Tq > Tk and Tq < Tk, lengths that are and are not multiples of 16 (Triton
  compiles the two apart), and a single query (KV-cache decoding);
- every tile configuration the kernel can run (the caller passes them; for the built-in kernel
  ``attnbook.dispatch`` passes every entry of its autotuning lists with their warps and stages,
  or its float32 tile). One that needs more shared memory than the GPU has is skipped, as the
  autotuner skips it, provided another passes;
- in true fp32: TF32 is off while the check runs, whatever ``torch.set_float32_matmul_precision``
  or ``torch.backends.cuda.matmul.allow_tf32`` say (the naive baseline too);
- the forward, and the backward when the call builds a graph.

Each result is judged by :func:`judge`: FlashAttention's rule against a float64 reference, error
<= 2x (3x for gradients) the error of a naive kernel in the same dtype on the same device (the
larger of ``attention_ref``'s and ``attention_tiled``'s), plus FlashAttention's rounding margin
(:func:`attnbook.tolerance.fa_rounding_margin`). A kernel that
fails to compile, raises or disagrees is not trusted: ``auto`` uses ``"tiled"`` for that kind
from then on, and one ``RuntimeWarning`` says why. On a GPU a check costs the compilation of
each configuration for each shape (Triton compiles lengths of 1, multiples of 16 and the rest
apart; the autotuner compiles the same configurations for the caller's lengths anyway, and
Triton caches compiled kernels on disk), then milliseconds per run.

This module imports neither ``attnbook.dispatch`` (which consults it) nor triton: the kernels
under check are passed in, as functions ``fn(q, k, v, mask, causal, scale) -> out``.
"""
from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
import warnings
from typing import NamedTuple

import torch

from ._checks import as_backend, check_bool, check_int
from .flash import attention_tiled
from .reference import attention_ref, padding_mask
from . import tolerance
from .tolerance import fa_rounding_margin, max_abs_error

__all__ = ["BASELINES", "CHECK_SHAPES", "FIELDS", "Verdict", "check", "check_key", "clear_verdicts", "inputs",
           "judge", "key_lengths", "needs_grad", "run", "trusted", "verdicts"]

CHECK_SHAPES = {  # name: (B, H, Tq, Tk); tiles are 16..128 wide
    "multi-tile, ragged, Tq > Tk": (2, 2, 300, 211),  # 300 = 2 * 128 + 44, 211 = 3 * 64 + 19 = 13 * 16 + 3
    "multiples of 16, Tq < Tk": (2, 1, 144, 400),  # 144 = 128 + 16, 400 = 3 * 128 + 16: tails at 32..128
    "one query (decoding)": (2, 2, 1, 211),  # non-causal kinds only: see check()
}
FIELDS = ("out", "dq", "dk", "dv")
FACTORS = {"out": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0}  # FlashAttention's tests: 2x outputs, 3x gradients
reference = as_backend(attention_ref)  # the truth in float64, and a naive baseline
BASELINES = {"attention_ref": reference, "attention_tiled": as_backend(attention_tiled)}


class Verdict(NamedTuple):
    """The outcome of one first-use check.

    ``ok``; why not (``""`` when ok); its cost in seconds; the configurations skipped because
    they need more resources than this GPU has (the autotuner skips them too).
    """

    ok: bool
    reason: str
    seconds: float
    skipped: tuple = ()


_VERDICTS: dict[tuple, Verdict] = {}
_LOCK = threading.RLock()


def needs_grad(q, k, v) -> bool:
    """Whether a call on these tensors builds a graph, so that a backward pass may follow."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def check_key(q, k, v, mask=None, causal=False, grad=None) -> tuple:
    """The kind of a call, as the first-use check caches it.

    ``(device, dtype, D, Dv, causal, masked, backward)``: the head dims themselves, not their
    padded tile, since the padding is part of what is checked. ``grad=None`` reads it from the
    tensors (:func:`needs_grad`).
    """
    grad = needs_grad(q, k, v) if grad is None else bool(grad)
    return (str(q.device), q.dtype, int(q.shape[-1]), int(v.shape[-1]), bool(causal), mask is not None, grad)


def verdicts() -> dict[tuple, Verdict]:
    """A copy of this process's cached first-use verdicts, ``{check_key: Verdict}``."""
    with _LOCK:
        return dict(_VERDICTS)


def clear_verdicts() -> None:
    """Forget every cached verdict: the next ``auto`` call of each kind checks again."""
    with _LOCK:
        _VERDICTS.clear()


# ---------------------------------------------------------------------------------------------
# Running and judging
# ---------------------------------------------------------------------------------------------

def inputs(shape, d, dv, masked, seed=0):
    """float64 q, k, v, dO of ``shape`` (B, H, Tq, Tk) on the CPU, and a key-padding mask or None.

    Own generator: the global RNG is untouched. The mask (B, 1, 1, Tk) keeps :func:`key_lengths` keys.
    """
    b, h, tq, tk = shape
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*s, generator=gen, dtype=torch.float64)
                   for s in ((b, h, tq, d), (b, h, tk, d), (b, h, tk, dv), (b, h, tq, dv)))
    mask = padding_mask(key_lengths(b, tk), tk) if masked else None
    return q, k, v, do, mask


def key_lengths(b, tk) -> list[int]:
    """The key-padding lengths of :func:`inputs`: all Tk keys for the first sequence, about half for the others."""
    return [tk] + [tk // 2 + 3] * (b - 1)


def run(fn, q, k, v, do, mask, causal, scale, dtype, device):
    """``fn`` on copies of q, k, v in ``dtype`` on ``device``: (out, dq, dk, dv) on the CPU (grads None without dO).

    Every input is a fresh clone (``.to`` alone is no copy when dtype and device already
    match), so a kernel that changes its inputs in place changes neither the caller's tensors
    nor what the next kernel under check is given.
    """
    q, k, v = (t.detach().to(device=device, dtype=dtype).clone().requires_grad_(do is not None)
               for t in (q, k, v))
    mask = None if mask is None else mask.to(device).clone()
    out = fn(q, k, v, mask, causal, scale)
    grads = (None, None, None)
    if do is not None:
        grads = torch.autograd.grad(out, (q, k, v), do.to(device=device, dtype=dtype).clone())
    return tuple(None if t is None else t.detach().cpu() for t in (out, *grads))


def judge(dtype, actual, naives, truth) -> str | None:
    """None when every result obeys the rule, else the first reason (the one judge of check and report).

    The rule is :func:`attnbook.tolerance.judge`'s. float64: elementwise
    ``|a - truth| <= atol + rtol * |truth|`` with :data:`attnbook.tolerance.F64_TOL`. Lower
    precision: FlashAttention's rule, ``error <= factor * error(naive) + fa_rounding_margin``,
    factor 2 for ``out`` and 3 for gradients, where ``error(naive)`` is the larger error of the
    ``naives`` (the :data:`BASELINES` run in the same dtype: in float16 the materialised kernel's,
    in float32 often the online softmax's, which at a few hundred keys can be 3x the former's).
    Fields whose truth is None (no backward) are skipped.

    Args:
        dtype: the dtype the kernel ran in; actual, truth: (out, dq, dk, dv) tuples;
        naives: a list of such tuples (the baselines), or one.
    """
    naives = naives if isinstance(naives, list) else [naives]
    for i, (name, a, r) in enumerate(zip(FIELDS, actual, truth)):
        if r is None:
            continue
        n = max((nv[i] for nv in naives), key=lambda x: max_abs_error(x, r) if x.shape == r.shape else -1.0)
        if a is None or a.shape != r.shape or a.dtype != dtype:
            got = "no result" if a is None else f"shape {tuple(a.shape)}, dtype {a.dtype}"
            return f"the kernel returned the wrong {name}: {got}, expected {tuple(r.shape)}, {dtype}"
        low = dtype != torch.float64
        try:
            verdict = tolerance.judge(a, r, naive=n if low else None, factor=FACTORS[name], name=name,
                                      step=fa_rounding_margin(r, dtype) if low else None)
        except ValueError as exc:  # the naive baseline itself is not finite: no bound to hold it to
            return str(exc)
        if not verdict.ok:
            return verdict.message
    return None


@contextlib.contextmanager
def _true_fp32():
    """float32 matmuls in full precision (no TF32) inside, the caller's settings restored after."""
    saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1], saved[2]


def _describe(exc: BaseException) -> str:
    """A one-line reason for a kernel that raised."""
    name, text = type(exc).__name__, str(exc).strip()
    first = text.splitlines()[0][:300] if text else ""
    low = f"{name} {text}".lower()
    if _needs_more_resources(exc):
        kind = "the kernel needs more shared memory or registers than this GPU has"
    elif "compil" in low or "ptxas" in low:
        kind = "the kernel failed to compile"
    else:
        kind = "the kernel raised an error"
    return f"{kind} ({name}: {first})" if first else f"{kind} ({name})"


def _needs_more_resources(exc: BaseException) -> bool:
    """Triton's OutOfResources (by name: triton is not imported here), or a message that says so."""
    low = f"{type(exc).__name__} {exc}".lower()
    return "outofresources" in low.replace(" ", "") or "out of resource" in low or "shared memory" in low


def check(kernels, device, dtype, d=64, dv=None, *, causal=False, masked=False, backward=False,
          shapes=None) -> Verdict:
    """Run the first-use check for one kind of call now (uncached; never raises for kernel failures).

    Every kernel of ``kernels`` runs on every shape, on ``device`` in ``dtype``; ``attention_ref``
    in float64 on the CPU is the truth, and :data:`BASELINES` in ``dtype`` on ``device`` the naive
    baselines of :func:`judge`. All of it in true fp32 (no TF32).

    Args:
        kernels: ``{label: fn(q, k, v, mask, causal, scale) -> out}``, e.g. one entry per tile
            configuration; or one such function.
        device: where to run (a ``torch.device`` or string); dtype: the inputs' dtype.
        d, dv: head dims of q/k and of v (``dv`` defaults to ``d``): the caller's own.
        causal, masked, backward: the kind (``masked``: a key-padding mask, see :func:`inputs`).
        shapes: ``{name: (B, H, Tq, Tk)}``; default ``CHECK_SHAPES``. With ``causal``, shapes
            with Tq = 1 are left out: a single top-left causal query sees key 0 alone, a one-hot
            row whose naive gradient is exact by luck, so the rule cannot judge it.
    Returns:
        :class:`Verdict`: ok only if every kernel passed on every shape, except kernels that need
        more resources than the GPU has (listed in ``skipped``) as long as one kernel passed.
        ``reason`` names the kernel, the shape and what failed (compilation, shared memory, an
        exception, or which result disagreed and by how much).
    """
    kernels, dtype, d, dv, shapes = _check_args(kernels, dtype, d, dv, shapes)
    causal, masked, backward = (check_bool(n, x, fn="check") for n, x in
                                (("causal", causal), ("masked", masked), ("backward", backward)))
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"check: `device` must name a torch device, got {device!r}") from exc
    elif not isinstance(device, torch.device):
        raise TypeError(f"check: `device` must be a torch.device or str, got {type(device).__name__}")
    start, skipped, reason = time.perf_counter(), [], None
    try:
        no_autocast = (torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda")
                       else contextlib.nullcontext())
        with torch.inference_mode(False), torch.enable_grad(), no_autocast, _true_fp32():
            cases = []
            for shape_name, shape in shapes.items():
                if causal and shape[2] == 1:
                    continue
                q, k, v, do, mask = inputs(shape, d, dv, masked)
                args = (q, k, v, do if backward else None, mask, causal, 1.0 / math.sqrt(d))
                truth = run(reference, *args, torch.float64, "cpu")
                naives = [run(fn, *args, dtype, device) for fn in BASELINES.values()]
                cases.append((shape_name, shape, args, truth, naives))
            for label, fn in kernels.items():
                reason = _check_one(fn, cases, dtype, device)
                if reason is not None and reason[0] == "resources":
                    skipped.append(f"{label}: {reason[1]}")
                    reason = None
                elif reason is not None:
                    reason = f"{label}: {reason[1]}"
                    break
            else:
                if len(skipped) == len(kernels):
                    reason = "no configuration fits this GPU: " + "; ".join(skipped)
    except Exception as exc:  # noqa: BLE001 - the baselines failing is a verdict too, not a crash of the caller
        reason = _describe(exc)
    return Verdict(reason is None, reason or "", time.perf_counter() - start, tuple(skipped))


def _check_args(kernels, dtype, d, dv, shapes):
    """check()'s arguments validated (TypeError / ValueError naming the argument), defaults filled in."""
    kernels = kernels if isinstance(kernels, dict) else {"kernel": kernels}
    if not kernels or not all(isinstance(k, str) and callable(f) for k, f in kernels.items()):
        raise TypeError(f"check: `kernels` must be a function fn(q, k, v, mask, causal, scale) or a non-empty "
                        f"dict {{label: fn}}, got {kernels!r:.200}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"check: `dtype` must be a floating torch.dtype, got {dtype!r}")
    d = check_int("d", d, fn="check")
    dv = d if dv is None else check_int("dv", dv, fn="check")
    shapes = CHECK_SHAPES if shapes is None else shapes
    def shape_ok(s):
        return isinstance(s, tuple) and len(s) == 4 and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in s)

    if not isinstance(shapes, dict) or not shapes or not all(map(shape_ok, shapes.values())):
        raise TypeError(f"check: `shapes` must be a non-empty dict {{name: (B, H, Tq, Tk)}} of ints >= 1, "
                        f"got {shapes!r:.200}")
    return kernels, dtype, d, dv, shapes


def _check_one(fn, cases, dtype, device):
    """None if ``fn`` passes every case, else ("resources" | "failed", reason)."""
    for shape_name, shape, args, truth, naive in cases:
        where = f"at (B, H, Tq, Tk) = {shape} ({shape_name})"
        try:
            actual = run(fn, *args, dtype, device)
        except Exception as exc:  # noqa: BLE001 - anything the kernel raises is a verdict
            return ("resources" if _needs_more_resources(exc) else "failed"), f"{_describe(exc)} {where}"
        problem = judge(dtype, actual, naive, truth)
        if problem is not None:
            return "failed", f"its results disagree with attention_ref {where}: {problem}"
    return None


# ---------------------------------------------------------------------------------------------
# The cached verdict "auto" asks for
# ---------------------------------------------------------------------------------------------

def _describe_key(key) -> str:
    device, dtype, d, dv, causal, masked, grad = key
    dims = f"head dim {d}" if d == dv else f"head dims {d} (q, k) and {dv} (v)"
    return (f"{device}, {str(dtype).replace('torch.', '')}, {dims}, {'causal' if causal else 'non-causal'}, "
            f"{'key-padding mask' if masked else 'no mask'}, {'forward and backward' if grad else 'forward'}")


def _stacklevel() -> int:
    """The stack level of the first frame outside attnbook, so the warning points at the reader's call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "attnbook":
        frame, level = frame.f_back, level + 1
    return level


def _verdict(key, kernels) -> Verdict:
    with _LOCK:
        found = _VERDICTS.get(key)
        if found is not None:
            return found
        fwd_key = key[:-1] + (False,)
        if key[-1] and fwd_key in _VERDICTS and not _VERDICTS[fwd_key].ok:
            found = _VERDICTS[fwd_key]  # the forward already failed (and warned): the backward cannot pass
        else:
            device, dtype, d, dv, causal, masked, grad = key
            found = check(kernels(dtype), device, dtype, d, dv, causal=causal, masked=masked, backward=grad)
            if not found.ok:
                warnings.warn(
                    f"attnbook: the Triton kernel failed its first-use self-check ({_describe_key(key)}): "
                    f"{found.reason}. backend='auto' uses 'tiled' for such inputs from now on in this process "
                    "(backend='triton' still runs the kernel; python -m attnbook.selfcheck shows the machine).",
                    RuntimeWarning, stacklevel=_stacklevel())
        _VERDICTS[key] = found
        if key[-1] and found.ok:
            _VERDICTS.setdefault(fwd_key, found)  # the backward check ran the forward too
        return found


def _cannot_check_now() -> bool:
    """Inside torch.compile tracing or CUDA-graph capture a check cannot run (nor should it)."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)()
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return bool(compiling or capturing)


def trusted(q, k, v, mask, causal, kernels) -> bool:
    """Whether the kernels have passed their first-use check for this kind of call (``auto`` asks).

    Runs :func:`check` the first time a kind (:func:`check_key`) is seen in this process and
    caches the verdict; a failure warns once (RuntimeWarning) with the reason. ``kernels(dtype)``
    returns the ``{label: fn}`` to check; it is called only when a check runs. ``causal=None``
    (the caller does not know) requires both the causal and the non-causal kind to pass. Inside
    ``torch.compile`` tracing or CUDA-graph capture an unchecked kind is not trusted (and not
    checked: the next eager call checks it).
    """
    kinds = (False, True) if causal is None else (bool(causal),)
    keys = [check_key(q, k, v, mask, c) for c in kinds]
    if _cannot_check_now():
        with _LOCK:
            return all(key in _VERDICTS and _VERDICTS[key].ok for key in keys)
    return all(_verdict(key, kernels).ok for key in keys)
