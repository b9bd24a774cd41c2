"""Which attention backends run here and agree with the float64 reference (chapter 09).

Two things live here.

**The first-use check behind ``backend="auto"``.** On CUDA, ``auto`` would pick the fused Triton
kernel; before it trusts it for a kind of input it runs :func:`check_triton` once per process and
kind, the kind being the key of :func:`check_key`: (device, dtype, head-dim buckets, causal,
masked, backward). The check runs the kernel behind the registered ``"triton"`` backend and
:func:`attnbook.flash.attention_tiled` on the same small random inputs of that kind, on that
device (``CHECK_SHAPE``: tail tiles at every tile size, ``Tq != Tk``, two key lengths when
masked), forward and, when the call needs gradients, backward, and judges both by the library's
tolerance rule (:func:`attnbook.testing.assert_close_to_reference`: error against a float64
reference at most 2x, 3x for gradients, the error of ``attention_tiled`` in the same dtype, plus
one rounding step). If the kernel fails to compile, needs more shared memory than the GPU has,
raises, or disagrees, ``auto`` uses ``"tiled"`` for that kind from then on and one
``RuntimeWarning`` says why; the verdict is cached for the process (:func:`verdicts`).
``backend="triton"`` never runs the check: it calls the kernel and raises its errors.

The built-in kernel is checked with fixed ``CHECK_BLOCKS`` tiles (one compilation per kernel, no
autotuning, small enough for any GPU's shared memory): after compilation the check costs a few
milliseconds. What it proves is that this device compiles and runs the kernels and that their
results in this dtype, head-dim bucket and mask kind are right; the autotuned tiles of later
calls are compiled by Triton's autotuner, which skips configurations that do not fit.

**The machine report.** :func:`selfcheck` (also ``attnbook.selfcheck()`` once
``attnbook.selfcheck`` is imported, and ``python -m attnbook.selfcheck``) runs every registered
backend in every dtype on small inputs (causal, key-padding mask, forward and backward) through
``attnbook.attention``, compares each with ``attention_ref`` in float64, and prints a table:
what runs here, pass or fail, and which backend ``auto`` picks for each dtype, with the reason.
It is the first thing to run on a new GPU.

Importing this module imports neither triton nor ``attnbook.triton_flash``.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
import time
import types
import warnings
from typing import NamedTuple

import torch

from ._checks import check_choice
from .flash import attention_tiled
from .reference import attention_ref, padding_mask
from .testing import assert_close_to_reference, max_abs_error

__all__ = [
    "CHECK_BLOCKS", "CHECK_SHAPE", "Verdict", "check_key", "check_triton", "clear_verdicts",
    "head_dim_bucket", "main", "selfcheck", "triton_trusted", "verdicts",
]

CHECK_SHAPE = (2, 2, 70, 53)  # B, H, Tq, Tk: no multiple of 16 or 32, so every tile size has a tail
CHECK_BLOCKS = (16, 16)  # (BLOCK_Q, BLOCK_K) of the built-in kernel during the check
KEY_LENGTHS = (53, 32)  # key-padding lengths of the two sequences when the kind is "masked"
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
F64_RTOL, F64_ATOL = 1e-10, 1e-12  # float64 rows of the report: the identity tolerance


class Verdict(NamedTuple):
    """The outcome of one first-use check: ``ok``, why not (``""`` when ok), and its cost in seconds."""

    ok: bool
    reason: str
    seconds: float


_VERDICTS: dict[tuple, Verdict] = {}
_LOCK = threading.RLock()


def head_dim_bucket(d: int) -> int:
    """The padded head dim the Triton kernels compile for: the next power of two >= max(d, 16)."""
    return max(16, 1 << (int(d) - 1).bit_length()) if d > 0 else 16


def needs_grad(q, k, v) -> bool:
    """Whether a call on these tensors builds a graph, so that a backward pass may follow."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def check_key(q, k, v, mask=None, causal=False, grad=None) -> tuple:
    """The kind of a call, as the first-use check caches it.

    ``(device, dtype, head-dim bucket of q/k, of v, causal, masked, backward)``: calls that share
    a key compile the same kernels (the buckets are the kernels' padded head dims), so one check
    vouches for all of them. ``grad=None`` reads it from the tensors (:func:`needs_grad`).
    """
    grad = needs_grad(q, k, v) if grad is None else bool(grad)
    return (str(q.device), q.dtype, head_dim_bucket(q.shape[-1]), head_dim_bucket(v.shape[-1]),
            bool(causal), mask is not None, grad)


def verdicts() -> dict[tuple, Verdict]:
    """A copy of this process's cached first-use verdicts, ``{check_key: Verdict}``."""
    with _LOCK:
        return dict(_VERDICTS)


def clear_verdicts() -> None:
    """Forget every cached verdict: the next ``auto`` call of each kind checks again."""
    with _LOCK:
        _VERDICTS.clear()


# ---------------------------------------------------------------------------------------------
# One check
# ---------------------------------------------------------------------------------------------

def _check_inputs(d, dv, masked, seed=0):
    """float64 q, k, v, dO of CHECK_SHAPE on the CPU (own generator: the global RNG is untouched)."""
    b, h, tq, tk = CHECK_SHAPE
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                   for shape in ((b, h, tq, d), (b, h, tk, d), (b, h, tk, dv), (b, h, tq, dv)))
    mask = padding_mask(list(KEY_LENGTHS), tk) if masked else None  # (B, 1, 1, Tk)
    return q, k, v, do, mask


def _run(fn, q, k, v, do, mask, causal, scale, dtype, device):
    """``fn`` on copies of q, k, v in ``dtype`` on ``device``: (out, dq, dk, dv) on the CPU (grads None without dO)."""
    q, k, v = (t.detach().to(device=device, dtype=dtype).requires_grad_(do is not None) for t in (q, k, v))
    mask = None if mask is None else mask.to(device)
    out = fn(q, k, v, mask, causal, scale)
    grads = (None, None, None)
    if do is not None:
        grads = torch.autograd.grad(out, (q, k, v), do.to(device=device, dtype=dtype))
    return tuple(None if t is None else t.detach().cpu() for t in (out, *grads))


def _tiled(q, k, v, mask, causal, scale):
    return attention_tiled(q, k, v, mask=mask, causal=causal, scale=scale).out


def _reference(q, k, v, mask, causal, scale):
    return attention_ref(q, k, v, mask=mask, causal=causal, scale=scale).out


def _kernel_under_check():
    """The function behind the registered ``"triton"`` backend; the built-in one with fixed tiles."""
    from . import dispatch

    fn = dispatch.BACKENDS["triton"].fn
    if fn is not dispatch._triton:  # a backend registered under that name by the reader: as it is
        return fn
    from .triton_flash import _attention_triton  # the built-in kernel: one compilation, no autotuning

    return lambda q, k, v, mask, causal, scale: _attention_triton(q, k, v, mask, causal, scale, CHECK_BLOCKS).out


def _describe(exc: BaseException) -> str:
    """A one-line reason for a kernel that raised."""
    name, text = type(exc).__name__, str(exc).strip()
    first = text.splitlines()[0][:300] if text else ""
    low = f"{name} {text}".lower()
    if "outofresources" in low.replace(" ", "") or "out of resource" in low or "shared memory" in low:
        kind = "the kernel needs more shared memory or registers than this GPU has"
    elif "compil" in low or "ptxas" in low:
        kind = "the kernel failed to compile"
    else:
        kind = "the kernel raised an error"
    return f"{kind} ({name}: {first})" if first else f"{kind} ({name})"


def check_triton(device, dtype, d=64, dv=None, *, causal=False, masked=False, backward=False) -> Verdict:
    """Run the first-use check for one kind of input now (uncached; never raises for kernel failures).

    The registered ``"triton"`` kernel and ``attention_tiled`` run on the same ``CHECK_SHAPE``
    inputs of this kind on ``device``; ``attention_ref`` in float64 on the CPU is the truth.
    Passes when out (and dq, dk, dv with ``backward``) obey the FlashAttention rule against
    ``attention_tiled``: error <= 2x (3x for gradients) its error + one rounding step.

    Args:
        device: where to run (a ``torch.device`` or string); dtype: the inputs' dtype.
        d, dv: head dims of q/k and of v (``dv`` defaults to ``d``).
        causal, masked, backward: the kind (a key-padding mask with lengths ``KEY_LENGTHS``).
    Returns:
        :class:`Verdict` ``(ok, reason, seconds)``; ``reason`` says what failed (compilation,
        shared memory, an exception, or which result disagreed and by how much).
    """
    dv = d if dv is None else dv
    start = time.perf_counter()
    try:
        device = torch.device(device)
        no_autocast = (torch.autocast(device.type, enabled=False) if device.type in ("cpu", "cuda")
                       else contextlib.nullcontext())
        with torch.inference_mode(False), torch.enable_grad(), no_autocast:
            reason = _compare(device, dtype, d, dv, causal, masked, backward)
    except Exception as exc:  # anything the kernel raises is a verdict, not a crash of the caller
        reason = _describe(exc)
    return Verdict(reason is None, reason or "", time.perf_counter() - start)


def _compare(device, dtype, d, dv, causal, masked, backward):
    q, k, v, do, mask = _check_inputs(d, dv, masked)
    do = do if backward else None
    scale = 1.0 / math.sqrt(d)
    truth = _run(_reference, q, k, v, do, mask, causal, scale, torch.float64, "cpu")
    naive = _run(_tiled, q, k, v, do, mask, causal, scale, dtype, device)
    actual = _run(_kernel_under_check(), q, k, v, do, mask, causal, scale, dtype, device)
    for name, a, n, r in zip(("out", "dq", "dk", "dv"), actual, naive, truth):
        if r is None:
            continue
        if a is None or a.shape != r.shape or a.dtype != dtype:
            got = "no result" if a is None else f"shape {tuple(a.shape)}, dtype {a.dtype}"
            return f"the kernel returned the wrong {name}: {got}, expected {tuple(r.shape)}, {dtype}"
        try:
            assert_close_to_reference(a, n, r, factor=2.0 if name == "out" else 3.0, name=name)
        except AssertionError as exc:
            return f"its results disagree with attention_tiled: {exc}"
    return None


# ---------------------------------------------------------------------------------------------
# The cached verdict "auto" asks for
# ---------------------------------------------------------------------------------------------

def _describe_key(key) -> str:
    device, dtype, bd, bdv, causal, masked, grad = key
    dims = f"head dim <= {bd}" if bd == bdv else f"head dims <= {bd} (q, k) and <= {bdv} (v)"
    return (f"{device}, {str(dtype).replace('torch.', '')}, {dims}, {'causal' if causal else 'non-causal'}, "
            f"{'key-padding mask' if masked else 'no mask'}, {'forward and backward' if grad else 'forward'}")


def _stacklevel() -> int:
    """The stack level of the first frame outside attnbook, so the warning points at the reader's call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "attnbook":
        frame, level = frame.f_back, level + 1
    return level


def _verdict(key) -> Verdict:
    with _LOCK:
        found = _VERDICTS.get(key)
        if found is not None:
            return found
        fwd_key = key[:-1] + (False,)
        if key[-1] and fwd_key in _VERDICTS and not _VERDICTS[fwd_key].ok:
            found = _VERDICTS[fwd_key]  # the forward already failed (and warned): the backward cannot pass
        else:
            device, dtype, bd, bdv, causal, masked, grad = key
            found = check_triton(device, dtype, bd, bdv, causal=causal, masked=masked, backward=grad)
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


def triton_trusted(q, k, v, mask=None, causal=None) -> bool:
    """Whether the Triton kernel has passed its first-use check for this kind of call (``auto`` asks).

    Runs :func:`check_triton` the first time a kind (:func:`check_key`) is seen in this process
    and caches the verdict; a failure warns once (RuntimeWarning) with the reason. ``causal=None``
    (the caller does not know) requires both the causal and the non-causal kind to pass. Inside
    ``torch.compile`` tracing or CUDA-graph capture an unchecked kind is not trusted (and not
    checked: the next eager call checks it).
    """
    kinds = (False, True) if causal is None else (bool(causal),)
    keys = [check_key(q, k, v, mask, c) for c in kinds]
    if _cannot_check_now():
        with _LOCK:
            return all(key in _VERDICTS and _VERDICTS[key].ok for key in keys)
    return all(_verdict(key).ok for key in keys)


# ---------------------------------------------------------------------------------------------
# The machine report
# ---------------------------------------------------------------------------------------------

def _errors(actual, truth):
    """(max error of out, max error over dq, dk, dv) against the float64 truth."""
    return max_abs_error(actual[0], truth[0]), max(max_abs_error(a, r) for a, r in zip(actual[1:], truth[1:]))


def _judge(dtype, actual, naive, truth):
    """None when every result obeys the rule (float64: rtol 1e-10, atol 1e-12), else the reason."""
    for name, a, n, r in zip(("out", "dq", "dk", "dv"), actual, naive, truth):
        if dtype == torch.float64:
            bound = F64_ATOL + F64_RTOL * float(r.abs().max())
            err = max_abs_error(a, r)
            if not err <= bound:
                return f"{name}: max error {err:.3e} > {bound:.3e} (rtol {F64_RTOL:g}, atol {F64_ATOL:g})"
        else:
            try:
                assert_close_to_reference(a, n, r, factor=2.0 if name == "out" else 3.0, name=name)
            except AssertionError as exc:
                return str(exc)
    return None


def _one_row(name, device, dtype, inputs, truth):
    """Run backend ``name`` through attnbook.attention and judge it; a dict for the table."""
    from .dispatch import BACKENDS, attention

    q, k, v, do, mask = inputs
    row = {"device": str(device), "backend": name, "dtype": str(dtype).replace("torch.", ""),
           "err_out": None, "err_grad": None, "result": "", "why": ""}
    probe = tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))
    ok, why = BACKENDS[name].supports(*probe, None if mask is None else mask.to(device))
    if not ok:
        row["result"], row["why"] = "skipped", why
        return row
    scale = 1.0 / math.sqrt(q.shape[-1])
    via = lambda q_, k_, v_, m_, c_, s_: attention(q_, k_, v_, mask=m_, causal=c_, scale=s_, backend=name)  # noqa: E731
    try:
        actual = _run(via, q, k, v, do, mask, True, scale, dtype, device)
        naive = actual if name == "ref" else _run(_reference, q, k, v, do, mask, True, scale, dtype, device)
    except Exception as exc:  # a backend that raises here is a finding, reported in the table
        row["result"], row["why"] = "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        return row
    row["err_out"], row["err_grad"] = _errors(actual, truth)
    reason = _judge(dtype, actual, naive, truth)
    row["result"] = "FAIL" if reason else "pass"
    row["why"] = reason or ("the naive baseline of the rule" if name == "ref" and dtype != torch.float64 else "")
    return row


def _auto_row(device, dtype, inputs):
    """Which backend ``auto`` picks for these inputs (with grads), and why."""
    from . import dispatch

    q, k, v, _, mask = inputs
    q, k, v = (t.detach().to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v))
    mask = None if mask is None else mask.to(device)
    with warnings.catch_warnings():  # the report says why; no second message
        warnings.simplefilter("ignore", RuntimeWarning)
        choice = dispatch._choose(q, k, v, mask, True)
    if not q.is_cuda:
        why = "auto uses Triton only on CUDA tensors"
    else:
        ok, unsupported = dispatch.BACKENDS["triton"].supports(q, k, v, mask)
        if not ok:
            why = f"triton cannot serve: {unsupported}"
        else:
            found = verdicts().get(check_key(q, k, v, mask, True))
            why = ("passed its first-use self-check" if found and found.ok else
                   f"failed its first-use self-check: {found.reason}" if found else "")
    return {"device": str(device), "dtype": str(dtype).replace("torch.", ""), "auto": choice, "why": why}


def _fmt(x):
    return "—" if x is None else f"{x:.1e}"


def selfcheck(*, devices=None, dtypes=None, backends=None, d=64, file=None, verbose=True) -> dict:
    """Print which backends run on this machine, whether they agree with float64, and what ``auto`` picks.

    Every backend in ``attnbook.dispatch.BACKENDS`` (or ``backends``) runs in every dtype (or
    ``dtypes``) on every device (CPU, and the current CUDA device if there is one) through
    ``attnbook.attention``: inputs ``CHECK_SHAPE`` with head dim ``d``, causal, a key-padding
    mask, forward and backward. Each result is compared with ``attention_ref`` in float64 on the
    CPU: float64 rows to rtol 1e-10, atol 1e-12; lower precision by the FlashAttention rule
    (error <= 2x, 3x for gradients, that of ``attention_ref`` in the same dtype + one rounding
    step). A backend whose ``supports`` says no is listed as skipped, with the reason (on a CPU
    the Triton kernel runs only under ``TRITON_INTERPRET=1``, set before
    ``attnbook.triton_flash`` is first imported). On CUDA the ``auto`` line runs the first-use
    check of each dtype (:func:`triton_trusted`).

    Returns:
        ``{"rows": [...], "auto": [...], "text": str}``: one dict per (device, backend, dtype)
        with err_out, err_grad, result ("pass", "FAIL", "error", "skipped") and why; one per
        (device, dtype) with the backend ``auto`` picks and why; the printed text.
    """
    from .dispatch import BACKENDS

    devices = list(devices) if devices is not None else (
        ["cpu"] + ([f"cuda:{torch.cuda.current_device()}"] if torch.cuda.is_available() else []))
    dtypes = [DTYPES[check_choice("dtypes", t, DTYPES, fn="selfcheck")] if isinstance(t, str) else t
              for t in (dtypes or DTYPES)]
    names = [check_choice("backends", b, tuple(BACKENDS), fn="selfcheck") for b in (backends or BACKENDS)]
    q, k, v, do, mask = inputs = _check_inputs(d, d, masked=True)
    truth = _run(_reference, q, k, v, do, mask, True, 1.0 / math.sqrt(d), torch.float64, "cpu")
    rows, autos = [], []
    for device in devices:
        for dtype in dtypes:
            for name in names:
                rows.append(_one_row(name, device, dtype, inputs, truth))
            autos.append(_auto_row(device, dtype, inputs))
    text = _report(rows, autos, d)
    if verbose:
        print(text, file=file or sys.stdout)
    return {"rows": rows, "auto": autos, "text": text}


def _machine() -> str:
    parts = [f"torch {torch.__version__}"]
    try:
        import importlib.metadata

        parts.append(f"triton {importlib.metadata.version('triton')}")
    except Exception:  # noqa: BLE001 - not installed, or metadata missing
        parts.append("no triton")
    if torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name()} (compute capability "
                     f"{'.'.join(map(str, torch.cuda.get_device_capability()))})")
    else:
        parts.append("no CUDA GPU")
    return ", ".join(parts)


def _report(rows, autos, d):
    b, h, tq, tk = CHECK_SHAPE
    lines = [f"attnbook self-check: {_machine()}",
             f"inputs: B={b}, H={h}, Tq={tq}, Tk={tk}, D={d}, causal, key-padding mask {list(KEY_LENGTHS)}, "
             "forward and backward; truth: attention_ref in float64 on the CPU", "",
             "| device | backend | dtype | max err out | max err grads | result | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['device']} | {r['backend']} | {r['dtype']} | {_fmt(r['err_out'])} | "
                     f"{_fmt(r['err_grad'])} | {r['result']} | {r['why']} |")
    lines += ["", "Rule: float64 within rtol 1e-10, atol 1e-12; lower precision: error <= 2x (grads 3x) the "
              "error of attention_ref in the same dtype + one rounding step (FlashAttention's test rule).", "",
              "backend='auto' picks:"]
    lines += [f"- {a['device']} {a['dtype']}: {a['auto']} ({a['why']})" for a in autos]
    failed = [r for r in rows if r["result"] in ("FAIL", "error")]
    lines += ["", f"{len(failed)} failure(s)." if failed else "Every backend that runs here passed."]
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m attnbook.selfcheck``: print the report; exit status 1 if any backend failed."""
    p = argparse.ArgumentParser(prog="python -m attnbook.selfcheck", description=__doc__.split("\n")[0])
    p.add_argument("--device", nargs="+", help="devices (default: cpu, and the current CUDA device if any)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="default: all four")
    p.add_argument("--backends", nargs="+", metavar="NAME", help="default: every registered backend")
    p.add_argument("--dim", type=int, default=64, help="head dim D of the test inputs (default 64)")
    p.add_argument("--interpret", action="store_true",
                   help="run the Triton kernel under TRITON_INTERPRET=1 on the CPU (slow; a machine without CUDA)")
    args = p.parse_args(argv)
    if args.interpret:
        import os

        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            # triton's own @triton.jit helpers (the combine functions of tl.max, tl.sum) are built
            # when triton is imported: the interpreter must be chosen before that
            p.error("--interpret: triton was already imported without TRITON_INTERPRET=1; "
                    "run TRITON_INTERPRET=1 python -m attnbook.selfcheck instead")
        os.environ["TRITON_INTERPRET"] = "1"
    result = selfcheck(devices=args.device, dtypes=args.dtypes, backends=args.backends, d=args.dim)
    return 1 if any(r["result"] in ("FAIL", "error") for r in result["rows"]) else 0


class _CallableModule(types.ModuleType):
    """Lets a notebook write ``attnbook.selfcheck()`` after ``import attnbook.selfcheck``."""

    def __call__(self, *args, **kwargs):
        return selfcheck(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":  # run the package's copy, whose verdict cache attnbook.attention shares
    from attnbook.selfcheck import main as _main

    sys.exit(_main())
