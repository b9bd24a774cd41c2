"""Which attention backends run here and agree with the float64 reference: the machine report (chapter 09).

:func:`selfcheck` (and ``python -m attnbook.selfcheck``) runs every registered backend in every
dtype on small inputs (``REPORT_SHAPE``, causal, a key-padding mask, forward and backward)
through ``attnbook.attention``, compares each with ``attention_ref`` in float64 by the rule of
:func:`attnbook.trust.judge`, and prints a table: what runs here, pass or fail, and which backend
``auto`` picks for each dtype (:func:`attnbook.choose_backend`), with the reason. It is the first
thing to run on a new GPU.

The first-use check that decides what ``auto`` picks on CUDA is :mod:`attnbook.trust`; on a GPU
the ``auto`` lines of the report run it (and show its verdict).
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings

import torch

from ._checks import check_bool, check_choice, check_int
from .bench import machine_info
from . import dispatch
from .tolerance import max_abs_error
from .trust import BASELINES, check_key, inputs, judge, key_lengths, reference, run, verdicts

__all__ = ["DTYPES", "KEY_LENGTHS", "REPORT_SHAPE", "main", "selfcheck"]

REPORT_SHAPE = (2, 2, 70, 53)  # B, H, Tq, Tk: no multiple of 16 or 32, so every tile size has a tail
KEY_LENGTHS = tuple(key_lengths(REPORT_SHAPE[0], REPORT_SHAPE[3]))  # key-padding lengths of the two sequences
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def _errors(actual, truth):
    """(max error of out, max error over dq, dk, dv) against the float64 truth."""
    return max_abs_error(actual[0], truth[0]), max(max_abs_error(a, r) for a, r in zip(actual[1:], truth[1:]))


def _one_row(name, device, dtype, case, truth):
    """Run backend ``name`` through attnbook.attention and judge it; a dict for the table."""
    q, k, v, do, mask = case
    row = {"device": str(device), "backend": name, "dtype": str(dtype).replace("torch.", ""),
           "err_out": None, "err_grad": None, "result": "", "why": ""}
    probe = tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))
    ok, why = dispatch.BACKENDS[name].supports(*probe, None if mask is None else mask.to(device))
    if not ok:
        row["result"], row["why"] = "skipped", why
        return row
    scale = 1.0 / math.sqrt(q.shape[-1])
    def via(q_, k_, v_, m_, c_, s_):
        return dispatch.attention(q_, k_, v_, mask=m_, causal=c_, scale=s_, backend=name)

    try:
        actual = run(via, q, k, v, do, mask, True, scale, dtype, device)
        naives = [run(fn, q, k, v, do, mask, True, scale, dtype, device) for fn in BASELINES.values()]
    except Exception as exc:  # a backend that raises here is a finding, reported in the table
        row["result"], row["why"] = "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        return row
    row["err_out"], row["err_grad"] = _errors(actual, truth)
    reason = judge(dtype, actual, naives, truth)
    row["result"] = "FAIL" if reason else "pass"
    baseline = name in ("ref", "tiled") and dtype != torch.float64
    row["why"] = reason or ("a naive baseline of the rule" if baseline else "")
    return row


def _auto_row(device, dtype, case):
    """Which backend ``auto`` picks for these inputs (causal, with grads), and why."""
    q, k, v, _, mask = case
    q, k, v = (t.detach().to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v))
    mask = None if mask is None else mask.to(device)
    with warnings.catch_warnings():  # the report says why; no second message
        warnings.simplefilter("ignore", RuntimeWarning)
        choice = dispatch.choose_backend(q, k, v, mask, causal=True)
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


def _names(arg, value, fn="selfcheck") -> list:
    """A list or tuple argument as a list (a bare string is one name, not its letters)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{fn}: `{arg}` must be a non-empty list or tuple (or None for the default), got {value!r}")
    return list(value)


def _devices(devices) -> list[str]:
    if devices is None:
        return ["cpu"] + ([f"cuda:{torch.cuda.current_device()}"] if torch.cuda.is_available() else [])
    out = []
    for dev in _names("devices", devices):
        try:
            parsed = torch.device(dev)
        except (RuntimeError, TypeError):
            raise ValueError(f"selfcheck: `devices` must hold device names such as 'cpu' or 'cuda:0', "
                             f"got {dev!r}") from None
        if parsed.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"selfcheck: `devices` names {dev!r} but torch.cuda.is_available() is False")
        if parsed.type not in ("cpu", "cuda"):
            raise ValueError(f"selfcheck: `devices` must be CPU or CUDA devices, got {dev!r}")
        out.append(str(parsed))
    return out


def _dtypes(dtypes) -> list[torch.dtype]:
    out = []
    for t in _names("dtypes", list(DTYPES) if dtypes is None else dtypes):
        if isinstance(t, str):
            t = DTYPES[check_choice("dtypes", t, DTYPES, fn="selfcheck")]
        if t not in DTYPES.values():
            raise ValueError(f"selfcheck: `dtypes` must hold names or torch dtypes among {tuple(DTYPES)}, got {t!r}")
        out.append(t)
    return out


def selfcheck(*, devices=None, dtypes=None, backends=None, d=64, file=None, verbose=True) -> dict:
    """Print which backends run on this machine, whether they agree with float64, and what ``auto`` picks.

    Every backend in ``attnbook.dispatch.BACKENDS`` (or ``backends``) runs in every dtype (or
    ``dtypes``) on every device (CPU, and the current CUDA device if there is one) through
    ``attnbook.attention``: inputs ``REPORT_SHAPE`` with head dim ``d``, causal, a key-padding
    mask (lengths ``KEY_LENGTHS``), forward and backward. Each result is compared with
    ``attention_ref`` in float64 on the CPU by :func:`attnbook.trust.judge`: float64 rows to
    ``attnbook.tolerance.F64_TOL``; lower precision by FlashAttention's rule (error <= 2x, 3x for
    gradients, the larger of ``attention_ref``'s and ``attention_tiled``'s in the same dtype, +
    FlashAttention's rounding margin). A
    backend whose ``supports`` says no is listed as skipped, with the reason (on a CPU the Triton
    kernel runs only under ``TRITON_INTERPRET=1``, set before triton is first imported). On CUDA
    the ``auto`` line runs the first-use check of each dtype (:mod:`attnbook.trust`).

    Args:
        devices: device names (default: cpu, and the current CUDA device if any).
        dtypes: names in ``DTYPES`` or those torch dtypes (default: all four).
        backends: names in ``BACKENDS`` (default: all). d: head dim, an int >= 1.
        file: where to print (default stdout); verbose: print at all.
    Returns:
        ``{"rows": [...], "auto": [...], "text": str}``: one dict per (device, backend, dtype)
        with err_out, err_grad, result ("pass", "FAIL", "error", "skipped") and why; one per
        (device, dtype) with the backend ``auto`` picks and why; the printed text.
    Raises:
        TypeError / ValueError for bad arguments, naming the argument.
    """
    d = check_int("d", d, fn="selfcheck")
    if d > 1024:  # the inputs are (2, 2, 70, d) float64 tensors, per dtype and device
        raise ValueError(f"selfcheck: `d` must be a head dim of at most 1024, got {d}")
    verbose = check_bool("verbose", verbose, fn="selfcheck")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"selfcheck: `file` must be a writable text stream or None, got {type(file).__name__}")
    devices, dtypes = _devices(devices), _dtypes(dtypes)
    names = [check_choice("backends", b, tuple(dispatch.BACKENDS), fn="selfcheck")
             for b in (list(dispatch.BACKENDS) if backends is None else _names("backends", backends))]
    case = inputs(REPORT_SHAPE, d, d, masked=True)
    q, k, v, do, mask = case
    truth = run(reference, q, k, v, do, mask, True, 1.0 / math.sqrt(d), torch.float64, "cpu")
    rows, autos = [], []
    for device in devices:
        for dtype in dtypes:
            for name in names:
                rows.append(_one_row(name, device, dtype, case, truth))
            autos.append(_auto_row(device, dtype, case))
    text = _report(rows, autos, d)
    if verbose:
        print(text, file=file or sys.stdout)
    return {"rows": rows, "auto": autos, "text": text}


def _report(rows, autos, d):
    b, h, tq, tk = REPORT_SHAPE
    lines = [f"attnbook self-check: {machine_info()}",
             f"inputs: B={b}, H={h}, Tq={tq}, Tk={tk}, D={d}, causal, key-padding mask {list(KEY_LENGTHS)}, "
             "forward and backward; truth: attention_ref in float64 on the CPU", "",
             "| device | backend | dtype | max err out | max err grads | result | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['device']} | {r['backend']} | {r['dtype']} | {_fmt(r['err_out'])} | "
                     f"{_fmt(r['err_grad'])} | {r['result']} | {r['why']} |")
    lines += ["", "Rule: float64 within attnbook.tolerance.F64_TOL; lower precision: error <= 2x (grads 3x) the "
              "larger error of attention_ref and attention_tiled in the same dtype + 2 max|(ref + 0.3) - 0.3 - ref| "
              "(FlashAttention's test rule).", "", "backend='auto' picks:"]
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
    try:
        result = selfcheck(devices=args.device, dtypes=args.dtypes, backends=args.backends, d=args.dim)
    except (TypeError, ValueError) as exc:
        p.error(str(exc))
    return 1 if any(r["result"] in ("FAIL", "error") for r in result["rows"]) else 0


if __name__ == "__main__":  # run the package's copy, whose verdict cache attnbook.attention shares
    from attnbook.selfcheck import main as _main

    sys.exit(_main())
