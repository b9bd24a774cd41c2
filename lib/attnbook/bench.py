"""Benchmark of the attention backends against PyTorch's SDPA (chapter 09, "Performance").

Run as ``python -m attnbook.bench`` (``--help`` lists the options). Every backend is called the
way a reader calls it, through the dispatcher: ``attnbook.attention(q, k, v, causal=...,
backend=name)`` for each name in the registry :data:`attnbook.dispatch.BACKENDS` (default: all
of them, a backend added with ``register_backend`` included). Before a case is timed the
backend's ``supports(q, k, v, None)`` is asked; a "no" is reported as skipped, with its reason.
The dispatcher's argument check (some microseconds) is part of every time. For every backend
and sequence length the table reports, side by side with the "sdpa" backend
(``torch.nn.functional.scaled_dot_product_attention``) measured in the same run:

    time        = median time of one call (see Timing)
    FLOPs       = 4 * B * H * Tq * Tk * D per forward pass, halved when causal; backward = 2.5 x
                  forward, forward + backward = 3.5 x forward (FlashAttention-2 / Triton convention)
    time / sdpa = time / sdpa's time;   mem / ref = peak extra memory / the "ref" backend's

Timing. CPU: ``torch.utils.benchmark.Timer(...).adaptive_autorange``: it picks how many calls
make one block (at least one), runs blocks until at least ``min_time`` seconds and 4 blocks are
timed and their spread (IQR / median) is below 10%, or ``max_time`` seconds have passed, and
reports the median block time per call; it runs with ``threads`` torch threads (Timer's own
default would be 1). It is used rather than ``blocked_autorange``, which stops after one block
once ``min_time`` has passed: one call is all that "ref" at T = 8192 would get (seconds per
forward on a 2-core CPU: see its row in benchmarks/RESULTS.md). CUDA: ``triton.testing.do_bench``
(median of CUDA-event times, L2 cache flushed before each run, 25 ms of warm-up, ``min_time``
seconds of runs); without triton, the same Timer as on CPU, which synchronises CUDA. Mode "fwd"
times the forward under ``no_grad``; "bwd" runs one forward untimed and times
``out.backward(dO, retain_graph=True)`` on its graph (gradients reset to None in each call, as
in FlashAttention's benchmarks); "fwd+bwd" times both.

Memory ("peak extra" = what one call adds on top of its inputs, outputs and gradients included).
CUDA: ``max_memory_allocated()`` minus ``memory_allocated()`` just before one more call after
timing. CPU (``memory=True``): every case runs in a fresh subprocess that reads its peak RSS
(``attnbook._bench_memory``, Linux only).

Defaults: the ``None`` fields of :class:`BenchConfig` take their value from :data:`DEFAULTS`,
the one table of them (``--help`` prints it). ``quick=True`` selects tiny sizes on either device.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import gc
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.utils.benchmark as torch_benchmark

from ._checks import check_bool, check_choice, check_float, check_int
from ._bench_memory import DTYPES, Unsupported, call, cpu_memory, inputs, is_oom, supported
from .dispatch import BACKENDS, attention

__all__ = ["DEFAULTS", "BenchConfig", "attention_flops", "format_table", "machine_info", "main", "run_benchmark"]

MODES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FLOPs relative to one forward pass


def attention_flops(batch, heads, tq, tk, dim, *, causal=False, mode="fwd") -> float:
    """FLOPs of exact attention in the FlashAttention convention (chapter 09).

    forward = 4 * B * H * Tq * Tk * D (two matmuls of 2 * Tq * Tk * D each), halved when causal;
    backward = 2.5 x forward; "fwd+bwd" = 3.5 x forward.
    """
    fn = "attention_flops"
    check_choice("mode", mode, MODES, fn=fn)
    causal = check_bool("causal", causal, fn=fn)
    sizes = [check_int(name, val, fn=fn) for name, val in
             (("batch", batch), ("heads", heads), ("tq", tq), ("tk", tk), ("dim", dim))]
    b, h, tq, tk, d = sizes
    return 4.0 * b * h * tq * tk * d * (0.5 if causal else 1.0) * MODES[mode]


class PerCase(NamedTuple):
    """A default that depends on the case: ``fn(T, D)``, described as ``text``."""
    text: str
    fn: Callable


def _doubling(lo, hi):
    return tuple(2 ** i for i in range(lo.bit_length() - 1, hi.bit_length()))


# The defaults of BenchConfig's None fields: the one table (the docstring points here, --help
# prints it). Per field, (situation, value) pairs: the first whose words all apply wins; the
# words are "quick", "memory" (memory=True) and the device, "cuda" or "cpu".
DEFAULTS = {
    "dtype": [("cuda", "float16"), ("cpu", "float32")],
    "batch": [("quick", 1), ("cuda", PerCase("16384 // T", lambda t, d: max(1, 16384 // t))), ("cpu", 1)],
    "heads": [("memory", 1), ("quick", 2), ("cuda", PerCase("2048 // D", lambda t, d: max(1, 2048 // d))),
              ("cpu", 8)],
    "dims": [("quick", (16,)), ("cuda", (64, 128)), ("cpu", (64,))],
    "seqs": [("quick memory", (256, 512)), ("quick", (64, 128)), ("memory", _doubling(1024, 16384)),
             ("cuda", _doubling(1024, 16384)), ("cpu", _doubling(512, 8192))],
    "causal": [("quick", (False,)), ("cuda", (False, True)), ("cpu", (False,))],
    "min_time": [("quick", 0.01), ("cuda", 0.1), ("cpu", 0.5)],
    "max_time": [("quick", 0.1), ("cuda", 10.0), ("cpu", 10.0)],
}


def _default(field, cfg, t=None, d=None):
    """The DEFAULTS value of ``field`` for ``cfg`` (T and D: for the per-case batch and heads)."""
    words = {cfg.device} | ({"quick"} if cfg.quick else set()) | ({"memory"} if cfg.memory else set())
    value = next(val for case, val in DEFAULTS[field] if set(case.split()) <= words)
    return value.fn(t, d) if isinstance(value, PerCase) else value


def describe_default(field) -> str:
    """One field's row of DEFAULTS in words, e.g. ``"float16 on CUDA, float32 on CPU"``."""
    where = {"quick memory": "with quick and memory", "quick": "with quick", "memory": "with memory",
             "cuda": "on CUDA", "cpu": "on CPU"}

    def text(val):
        if isinstance(val, PerCase):
            return val.text
        if isinstance(val, tuple) and all(isinstance(x, bool) for x in val):
            return "both" if len(val) == 2 else "causal" if val[0] else "non-causal"
        if isinstance(val, tuple) and len(val) > 3:
            return f"{val[0]}, {val[1]}, ..., {val[-1]}"
        return " and ".join(map(str, val)) if isinstance(val, tuple) else f"{val:g}" if isinstance(val, float) \
            else str(val)
    return "; ".join(f"{text(val)} {where[case]}" for case, val in DEFAULTS[field])


@dataclasses.dataclass
class BenchConfig:
    """What to benchmark. ``None`` fields take their :data:`DEFAULTS` (which depend on device, quick, memory)."""
    device: str = "cpu"                      # "cpu" or "cuda"
    dtype: str | None = None                 # a name in DTYPES
    batch: int | None = None                 # B
    heads: int | None = None                 # H
    dims: tuple[int, ...] | None = None      # head dims D
    seqs: tuple[int, ...] | None = None      # sequence lengths T (Tq = Tk = T)
    causal: tuple[bool, ...] | None = None   # which of non-causal (False) / causal (True)
    mode: str = "fwd"                        # "fwd", "bwd" or "fwd+bwd"
    backends: tuple[str, ...] | None = None  # names in attnbook.dispatch.BACKENDS; None: all of them
    min_time: float | None = None            # seconds of timed runs per case at least
    max_time: float | None = None            # CPU: stop timing a case after this many seconds
    memory: bool = False                     # memory mode: peak extra memory only (no timing)
    threads: int | None = None               # torch.set_num_threads; None keeps torch's default
    jobs: int = 1                            # CPU memory mode: subprocesses run at once
    quick: bool = False                      # tiny sizes (tests, smoke runs)


def _resolve(cfg) -> BenchConfig:
    """A copy of ``cfg`` (a BenchConfig or a dict of its fields) validated, defaults filled in.

    ``batch`` and ``heads`` stay None when defaulted: they depend on T and D (``_sizes``).
    """
    fn = "run_benchmark"
    fields = [f.name for f in dataclasses.fields(BenchConfig)]
    if isinstance(cfg, dict):
        unknown = sorted(set(cfg) - set(fields), key=str)
        if unknown:
            raise TypeError(f"{fn}: `config` has no field {unknown[0]!r} (BenchConfig's fields: {', '.join(fields)})")
        cfg = BenchConfig(**cfg)
    elif isinstance(cfg, BenchConfig):
        cfg = dataclasses.replace(cfg)
    else:
        raise TypeError(f"{fn}: `config` must be a BenchConfig or a dict of its fields, got {cfg!r} "
                        f"({type(cfg).__name__}); e.g. BenchConfig(quick=True)")
    check_choice("device", cfg.device, ("cpu", "cuda"), fn=fn)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}; no GPU"
        raise ValueError(f"{fn}: device 'cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__} is {why}); use --device cpu")
    cfg.quick, cfg.memory = check_bool("quick", cfg.quick, fn=fn), check_bool("memory", cfg.memory, fn=fn)
    for name in ("dtype", "dims", "seqs", "causal", "min_time", "max_time"):
        if getattr(cfg, name) is None:
            setattr(cfg, name, _default(name, cfg))
    cfg.dtype = check_choice("dtype", cfg.dtype, DTYPES, fn=fn)
    cfg.mode = check_choice("mode", cfg.mode, MODES, fn=fn)
    if cfg.backends is None:  # all registered, "sdpa" (the baseline of time / sdpa) first
        cfg.backends = tuple(sorted(BACKENDS, key=lambda name: name != "sdpa"))
    for name in ("dims", "seqs", "causal", "backends"):
        val = getattr(cfg, name)
        if isinstance(val, (str, int)) or not val:
            raise ValueError(f"{fn}: `{name}` must be a non-empty sequence, got {val!r}")
    cfg.dims = tuple(check_int("dims", d, fn=fn) for d in cfg.dims)
    cfg.seqs = tuple(check_int("seqs", t, fn=fn) for t in cfg.seqs)
    cfg.causal = tuple(check_bool("causal", c, fn=fn) for c in cfg.causal)
    cfg.backends = tuple(check_choice("backends", b, BACKENDS, fn=fn) for b in cfg.backends)
    for name in ("batch", "heads", "threads"):
        if getattr(cfg, name) is not None:
            setattr(cfg, name, check_int(name, getattr(cfg, name), fn=fn))
    cfg.jobs = check_int("jobs", cfg.jobs, fn=fn)
    cfg.min_time = check_float("min_time", cfg.min_time, fn=fn, minimum=0.0, inclusive=False)
    cfg.max_time = check_float("max_time", cfg.max_time, fn=fn, minimum=cfg.min_time)
    return cfg


def _sizes(cfg, t, d):
    """(B, H) of the case with length T and head dim D: cfg's own or their DEFAULTS."""
    return cfg.batch or _default("batch", cfg, t, d), cfg.heads or _default("heads", cfg, t, d)


def _timed(name, q, k, v, do, causal, mode):
    """The call to time, as a function of no arguments (see "Timing" in the module docstring)."""
    if mode == "fwd":
        return lambda: call(name, q, k, v, do, causal, mode)
    out = attention(q, k, v, causal=causal, backend=name) if mode == "bwd" else None  # one graph for every run

    def run():
        q.grad = k.grad = v.grad = None  # backward would otherwise accumulate into them
        if out is None:
            attention(q, k, v, causal=causal, backend=name).backward(do)
        else:
            out.backward(do, retain_graph=True)
    return run


def _median_seconds(run, cfg):
    """(median seconds per call, number of timed calls or None) with Timer or do_bench."""
    if cfg.device == "cuda":
        try:
            import triton.testing
        except ImportError:
            pass
        else:
            return triton.testing.do_bench(run, warmup=25, rep=1e3 * cfg.min_time, return_mode="median") / 1e3, None
    timer = torch_benchmark.Timer(stmt="run()", globals={"run": run}, num_threads=cfg.threads)
    m = timer.adaptive_autorange(threshold=0.1, min_run_time=cfg.min_time, max_run_time=cfg.max_time)
    return m.median, len(m.raw_times) * m.number_per_run


def _time_and_cuda_memory(cfg, name, b, h, t, d, causal):
    """Median seconds per call, timed calls, and (on CUDA) peak extra bytes of one more call."""
    q, k, v, do = inputs(b, h, t, d, DTYPES[cfg.dtype], cfg.device, cfg.mode != "fwd")
    supported(name, q, k, v)
    seconds, runs = (None, None) if cfg.memory else _median_seconds(_timed(name, q, k, v, do, causal, cfg.mode), cfg)
    mem = None
    if cfg.device == "cuda":
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call(name, q, k, v, do, causal, cfg.mode)
        torch.cuda.synchronize()
        mem = torch.cuda.max_memory_allocated() - base
    return seconds, runs, mem


def _measure(cfg, row) -> dict:
    """Fill one row's time_s, runs, mem_bytes, or its skip reason or note (out of memory)."""
    name, shape, causal = row["backend"], (row["batch"], row["heads"], row["seq"], row["dim"]), row["causal"]
    try:
        if cfg.memory and cfg.device == "cpu":
            row["mem_bytes"] = cpu_memory(name, cfg.dtype, cfg.mode, shape, causal, cfg.threads)
        else:
            row["time_s"], row["runs"], row["mem_bytes"] = _time_and_cuda_memory(cfg, name, *shape, causal)
    except Unsupported as exc:
        row["skipped"] = str(exc)
    except Exception as exc:  # running out of memory is a result; anything else is a bug
        if not is_oom(exc) and "does not require grad" not in str(exc):
            raise
        row["note"] = "out of memory" if is_oom(exc) else "no backward"
    if row["note"]:  # outside the except block, so the traceback's tensors are already freed
        gc.collect()
        if cfg.device == "cuda":
            torch.cuda.empty_cache()
    return row


def run_benchmark(config, *, log=None) -> list[dict]:
    """Run the benchmark described by a BenchConfig (or a dict of its fields); one dict per row.

    One row per (dim, causal, seq, backend), carrying backend, device, dtype, mode, batch, heads,
    dim, seq, causal, threads, min_time, max_time, memory_mode, time_s, runs (timed calls; None
    on CUDA), flops, flops_per_s, ratio_sdpa, mem_bytes, mem_ratio_ref, note ("out of memory",
    "no backward") and skipped (None, or why the backend's ``supports`` said no).
    ``log(str)`` receives a progress line per row.
    """
    cfg, log, threads = _resolve(config), log or (lambda msg: None), torch.get_num_threads()
    cfg.threads = cfg.threads or threads
    if cfg.memory and cfg.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("run_benchmark: CPU memory mode needs Linux: /proc/self/status and /proc/self/clear_refs")
    rows = []
    for d in cfg.dims:
        for causal in cfg.causal:
            for t in cfg.seqs:
                b, h = _sizes(cfg, t, d)
                rows += [{"backend": name, "device": cfg.device, "dtype": cfg.dtype, "mode": cfg.mode,
                          "batch": b, "heads": h, "dim": d, "seq": t, "causal": causal, "threads": cfg.threads,
                          "min_time": cfg.min_time, "max_time": cfg.max_time, "memory_mode": cfg.memory,
                          "time_s": None, "runs": None, "mem_bytes": None, "note": "", "skipped": None,
                          "flops": attention_flops(b, h, t, t, d, causal=causal, mode=cfg.mode)}
                         for name in cfg.backends]

    def one(row):
        log("{backend:6s} B={batch} H={heads} T={seq} D={dim} causal={causal} {mode} {dtype}".format(**row))
        row = _measure(cfg, row)
        if row["skipped"]:
            log(f"skipped {row['backend']}: {row['skipped']}")
        return row

    torch.set_num_threads(cfg.threads)
    try:
        if cfg.memory and cfg.device == "cpu" and cfg.jobs > 1:  # subprocesses: RSS is per process
            with concurrent.futures.ThreadPoolExecutor(cfg.jobs) as pool:
                rows = list(pool.map(one, rows))
        else:
            rows = [one(row) for row in rows]
    finally:  # the caller's thread count comes back (chapters run this in their own kernel)
        torch.set_num_threads(threads)
    key = lambda r: (r["dim"], r["causal"], r["seq"])  # noqa: E731 - rows compared within one case
    base_t = {key(r): r["time_s"] for r in rows if r["backend"] == "sdpa"}
    base_m = {key(r): r["mem_bytes"] for r in rows if r["backend"] == "ref"}
    for r in rows:
        bt, bm = base_t.get(key(r)), base_m.get(key(r))
        r["flops_per_s"] = r["flops"] / r["time_s"] if r["time_s"] else None
        r["ratio_sdpa"] = r["time_s"] / bt if r["time_s"] and bt else None
        r["mem_ratio_ref"] = r["mem_bytes"] / bm if r["mem_bytes"] is not None and bm else None
    return rows


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.0f}" if abs(x) >= 100 else f"{x:#.3g}".rstrip(".")


def format_table(rows, *, title=None) -> str:
    """Markdown table of ``run_benchmark`` rows: a config line, one line per row, method notes.

    A backend skipped in every case gets no line, only a note with the reason; one skipped in
    some cases shows "skipped" there, and the reasons are noted.
    """
    measured = {r["backend"] for r in rows if not r.get("skipped")}
    if not measured:
        raise ValueError("format_table: no measured rows (every backend was skipped)")
    shown = [r for r in rows if r["backend"] in measured]
    r0 = next(r for r in rows if not r.get("skipped"))
    gpu, memory_mode = r0["device"] == "cuda", r0["memory_mode"]
    unit, per = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)
    fixed = [k for k in ("batch", "heads", "dim", "causal") if len({r[k] for r in shown}) == 1]
    cols = [("backend", lambda r: r["backend"])]
    label = {"batch": "B", "heads": "H", "dim": "D", "causal": "causal"}
    cols += [(label[k], lambda r, k=k: str(r[k])) for k in label if k not in fixed]
    cols += [("T", lambda r: str(r["seq"]))]
    status = lambda r: "skipped" if r.get("skipped") else r["note"]  # noqa: E731
    if not memory_mode:
        cols += [("time (ms)", lambda r: status(r) or _fmt(r["time_s"] and r["time_s"] * 1e3)),
                 (unit, lambda r: _fmt(r["flops_per_s"] and r["flops_per_s"] / per)),
                 ("time / sdpa", lambda r: _fmt(r["ratio_sdpa"]))]
    if memory_mode or gpu:
        mib = 2.0 ** 20
        cols += [("peak extra (MiB)", lambda r: status(r) or _fmt(r["mem_bytes"] and r["mem_bytes"] / mib)),
                 ("mem / ref", lambda r: _fmt(r["mem_ratio_ref"])),
                 ("one T×T matrix (MiB)", lambda r: _fmt(r["batch"] * r["heads"] * r["seq"] ** 2
                                                         * DTYPES[r["dtype"]].itemsize / mib))]
    setting = [r0["mode"], r0["dtype"], r0["device"]] + [
        ("causal" if r0[k] else "non-causal") if k == "causal" else f"{k[0].upper()}={r0[k]}" for k in fixed]
    lines = [title] if title else []
    lines += [" · ".join(setting) + f" · torch threads {r0['threads']}", "",
              "| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fn(r) for _, fn in cols) + " |" for r in shown]
    flops = ("FLOPs = 4·B·H·T²·D per forward (÷2 causal; backward ×2.5, fwd+bwd ×3.5), "
             "FlashAttention convention; time / sdpa = time ÷ scaled_dot_product_attention's time in this run.")
    timed = {"fwd": "forward under no_grad", "bwd": "out.backward(dO, retain_graph=True) on one forward's graph",
             "fwd+bwd": "forward + backward together"}[r0["mode"]]
    how = ("triton.testing.do_bench: median of CUDA-event times, L2 flushed before each run, "
           f"{r0['min_time'] * 1e3:g} ms of runs" if gpu else
           f"torch.utils.benchmark.Timer.adaptive_autorange: median over ≥ 4 blocks, ≥ {r0['min_time']:g} s "
           f"timed (at most {r0['max_time']:g} s) per case")
    notes = [] if memory_mode else [
        f"Time per call through attnbook.attention(..., backend=name); {how}; timed: {timed}.", flops]
    if memory_mode and not gpu:
        notes.append("Peak extra memory: one fresh subprocess per row; peak RSS (VmHWM, reset through "
                     "/proc/self/clear_refs after q, k, v" + (", dO" if r0["mode"] != "fwd" else "")
                     + " were allocated) minus RSS at that point; glibc MALLOC_MMAP_THRESHOLD_=65536 so "
                     "every tensor above 64 KiB is mmapped and visible; outputs"
                     + (" and gradients" if r0["mode"] != "fwd" else "") + " count.")
    elif gpu:
        notes.append("Peak extra memory: torch.cuda.max_memory_allocated() minus memory_allocated() before "
                     "one call; outputs" + (" and gradients" if r0["mode"] != "fwd" else "") + " count.")
    else:
        notes.append("Memory is not measured in CPU timing runs; see the --memory table.")
    reasons = dict.fromkeys((r["backend"], r["skipped"]) for r in rows if r.get("skipped"))
    notes += [f"Skipped {b}{'' if b not in measured else ' (where marked)'}: {why}." for b, why in reasons]
    return "\n".join(lines + [""] + notes)


def machine_info() -> str:
    """One line naming the machine and software: OS, CPU model and cores, torch, triton, GPU (also the self-check's)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    parts = [platform.platform(), f"{cpu}, {os.cpu_count()} logical cores",
             f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    try:
        parts.append(f"triton {importlib.metadata.version('triton')}")
    except importlib.metadata.PackageNotFoundError:
        parts.append("no triton")
    if torch.cuda.is_available():
        driver = "driver unknown"
        if os.path.exists("/proc/driver/nvidia/version"):
            with open("/proc/driver/nvidia/version") as f:
                driver = " ".join(f.readline().split()[:8])
        capability = ".".join(map(str, torch.cuda.get_device_capability()))
        parts.append(f"GPU {torch.cuda.get_device_name()} (compute capability {capability}, "
                     f"CUDA {torch.version.cuda}, {driver})")
    else:
        parts.append("no CUDA GPU")
    return "; ".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnbook.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n")[0] + "\n\nPrints a Markdown table: one row per backend and sequence "
        "length T with the median time,\nthroughput (FlashAttention FLOP convention) and time / sdpa; with "
        "--memory, peak extra\nmemory and its ratio to the 'ref' backend instead. Every backend is called "
        "through\nattnbook.attention(..., backend=name); one that cannot serve a case is reported as skipped.",
        epilog="Defaults (attnbook.bench.DEFAULTS; they depend on --device, --quick and --memory):\n"
               + "".join(f"  {name:9s} {describe_default(name)}\n" for name in DEFAULTS) + "Examples:\n"
               "  python -m attnbook.bench --quick                     # smoke test, a few seconds\n"
               "  python -m attnbook.bench --seq 1024 4096 --mode bwd  # backward only, two lengths\n"
               "  python -m attnbook.bench --memory --jobs 2           # peak memory, T up to 16384")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when torch sees a GPU, else cpu")
    p.add_argument("--dtype", choices=list(DTYPES), help="default: see below")
    p.add_argument("--batch", type=int, help="B; default: see below")
    p.add_argument("--heads", type=int, help="H; default: see below")
    p.add_argument("--dim", type=int, nargs="+", help="head dimension(s) D; default: see below")
    p.add_argument("--seq", type=int, nargs="+", help="sequence length(s) T; default: see below")
    p.add_argument("--causal", nargs="?", const="yes", choices=["yes", "no", "both"],
                   help="'--causal' alone: causal only; default: see below")
    p.add_argument("--mode", choices=list(MODES), default="fwd",
                   help="what is timed: the forward under no_grad, out.backward(dO) only, or both (default fwd)")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help=f"names in attnbook.dispatch.BACKENDS ({', '.join(BACKENDS)}); default: all of them; "
                        "one whose supports() says no is skipped with the reason")
    p.add_argument("--min-time", type=float, help="seconds of timed runs per case at least (CUDA: do_bench's rep)")
    p.add_argument("--max-time", type=float, help="CPU: seconds after which timing a case stops")
    p.add_argument("--memory", action="store_true", help="memory mode: peak extra memory instead of time")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--jobs", type=int, default=1, help="memory mode on CPU: subprocesses run at once")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test (see the defaults below)")
    p.add_argument("--markdown", action="store_true", help="add a header with machine, date and command")
    p.add_argument("--json", metavar="FILE", help="also write the rows (raw numbers) to FILE as JSON")
    return p


def main(argv=None) -> int:
    """Command-line entry point: parse arguments, run, print the table (and write rows with --json)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    causal = {None: None, "yes": (True,), "no": (False,), "both": (False, True)}[args.causal]
    cfg = BenchConfig(device=args.device, dtype=args.dtype, batch=args.batch, heads=args.heads, dims=args.dim,
                      seqs=args.seq, causal=causal, mode=args.mode, backends=args.backends, min_time=args.min_time,
                      max_time=args.max_time, memory=args.memory, threads=args.threads, jobs=args.jobs,
                      quick=args.quick)
    started, load = datetime.datetime.now().astimezone(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        _resolve(cfg)  # argument errors become usage errors; errors while running stay tracebacks
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    rows = run_benchmark(cfg, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    title = None
    if args.markdown:  # the load average shows whether other work shared the machine
        title = (f"Machine: {machine_info()}  \nDate: {started:%Y-%m-%d %H:%M %Z}, 1-minute load average "
                 f"at start {_fmt(load)}  \nCommand: `{shlex.join(['python', '-m', 'attnbook.bench', *argv])}`\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "date": f"{started:%Y-%m-%d %H:%M %Z}", "argv": argv,
                       "rows": rows}, f, indent=1)
    print(format_table(rows, title=title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
