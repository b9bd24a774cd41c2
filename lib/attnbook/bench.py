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
once ``min_time`` has passed: one call is all that "ref" at T = 8192 (4.6 s a forward on the
2-core CPU of benchmarks/RESULTS.md) would get. CUDA: ``triton.testing.do_bench`` (median of CUDA-event times, L2 cache
flushed before each run, 25 ms of warm-up, ``min_time`` seconds of runs); without triton, the
same Timer as on CPU, which synchronises CUDA. Mode "fwd" times the forward under ``no_grad``;
"bwd" runs one forward untimed and times ``out.backward(dO, retain_graph=True)`` on its graph
(gradients reset to None in each call, as in FlashAttention's benchmarks); "fwd+bwd" times both.

Memory ("peak extra" = what one call adds on top of its inputs, outputs and gradients included).
CUDA: ``max_memory_allocated()`` minus ``memory_allocated()`` just before one more call after
timing. CPU: torch's CPU allocations are invisible to ``tracemalloc``, so ``memory=True`` runs
every case in a fresh subprocess that imports torch, calls the backend once on tiny inputs
(code pages and thread pools get loaded), allocates q, k, v (and dO), reads VmRSS from
/proc/self/status, resets the high-water mark (``5`` into /proc/self/clear_refs), calls the
backend once and reports VmHWM minus that VmRSS. The child runs with
``MALLOC_MMAP_THRESHOLD_=65536``: glibc then mmaps every tensor above 64 KiB and unmaps it at
free, instead of raising its threshold after the first free and serving later tensors from heap
pages that are already resident (and so invisible to VmHWM). A fresh subprocess knows only the
built-in backends: one registered in the calling process is skipped there.

Defaults (the ``None`` fields of :class:`BenchConfig`):

    dtype     float32 on CPU, float16 on CUDA
    batch     1 on CPU; 16384 // T on CUDA (16K tokens per batch)
    heads     8 on CPU, 2048 // D on CUDA; 1 with memory=True
    dims      64 on CPU; 64 and 128 on CUDA
    seqs      512, 1024, ..., 8192 on CPU; 1024, 2048, ..., 16384 on CUDA or with memory=True
    causal    non-causal on CPU; both on CUDA
    min_time  0.5 s on CPU, 0.1 s on CUDA
    max_time  10 s (CPU timing only)

``quick=True`` replaces them with tiny sizes on either device: batch 1, heads 2 (1 with
memory=True), dims 16, seqs 64 and 128 (256 and 512 with memory=True), non-causal,
min_time 0.01 s, max_time 0.1 s.
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
import subprocess
import sys

import torch
import torch.utils.benchmark as torch_benchmark

from ._checks import check_bool, check_choice, check_float, check_int
from .dispatch import BACKENDS, attention

MODES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FLOPs relative to one forward pass
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


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


@dataclasses.dataclass
class BenchConfig:
    """What to benchmark. ``None`` fields take the defaults tabled in the module docstring."""
    device: str = "cpu"                      # "cpu" or "cuda"
    dtype: str | None = None                 # float32 on CPU; float16 on CUDA
    batch: int | None = None                 # 1 on CPU; 16384 // T on CUDA (B * T = 16K tokens)
    heads: int | None = None                 # 8 on CPU, 2048 // D on CUDA; 1 with memory=True
    dims: tuple[int, ...] | None = None      # (64,) on CPU; (64, 128) on CUDA
    seqs: tuple[int, ...] | None = None      # 512..8192 on CPU, 1024..16384 on CUDA or with memory=True
    causal: tuple[bool, ...] | None = None   # (False,) on CPU; (False, True) on CUDA
    mode: str = "fwd"                        # "fwd", "bwd" or "fwd+bwd"
    backends: tuple[str, ...] | None = None  # names in attnbook.dispatch.BACKENDS; None: all of them
    min_time: float | None = None            # seconds of timed runs at least: 0.5 on CPU, 0.1 on CUDA
    max_time: float | None = None            # CPU: stop timing a case after this many seconds (10)
    memory: bool = False                     # memory mode: peak extra memory only (no timing)
    threads: int | None = None               # torch.set_num_threads; None keeps torch's default
    jobs: int = 1                            # CPU memory mode: subprocesses run at once
    quick: bool = False                      # tiny sizes (tests, smoke runs), see the module docstring


def _resolve(cfg) -> BenchConfig:
    """A copy of ``cfg`` (a BenchConfig or a dict of its fields) validated, defaults filled in."""
    fn = "run_benchmark"
    cfg = BenchConfig(**cfg) if isinstance(cfg, dict) else dataclasses.replace(cfg)
    check_choice("device", cfg.device, ("cpu", "cuda"), fn=fn)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}; no GPU"
        raise ValueError(f"{fn}: device 'cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__} is {why}); use --device cpu")
    cfg.quick, cfg.memory = check_bool("quick", cfg.quick, fn=fn), check_bool("memory", cfg.memory, fn=fn)
    gpu, quick, memory = cfg.device == "cuda", cfg.quick, cfg.memory
    cfg.dtype = check_choice("dtype", cfg.dtype or ("float16" if gpu else "float32"), DTYPES, fn=fn)
    cfg.mode = check_choice("mode", cfg.mode, MODES, fn=fn)
    if cfg.dims is None:
        cfg.dims = (16,) if quick else (64, 128) if gpu else (64,)
    if cfg.seqs is None:
        cfg.seqs = ((256, 512) if memory else (64, 128)) if quick else \
            (1024, 2048, 4096, 8192, 16384) if gpu or memory else (512, 1024, 2048, 4096, 8192)
    if cfg.causal is None:
        cfg.causal = (False, True) if gpu and not quick else (False,)
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
    if cfg.min_time is None:
        cfg.min_time = 0.01 if quick else 0.1 if gpu else 0.5
    if cfg.max_time is None:
        cfg.max_time = 0.1 if quick else 10.0
    cfg.min_time = check_float("min_time", cfg.min_time, fn=fn, minimum=0.0, inclusive=False)
    cfg.max_time = check_float("max_time", cfg.max_time, fn=fn, minimum=cfg.min_time)
    return cfg


def _inputs(b, h, t, d, dtype, device, grad):
    """q, k, v ``(B, H, T, D)`` from a fixed seed, and dO for the backward (None for "fwd")."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, t, d, generator=gen, device=device, dtype=dtype) for _ in range(4))  # (B, H, T, D)
    return (*(x.requires_grad_(grad) for x in (q, k, v)), do if grad else None)


def _call(name, q, k, v, do, causal, mode):
    """One forward through the dispatcher (``no_grad`` in "fwd" mode) or forward plus ``out.backward(dO)``."""
    if mode == "fwd":
        with torch.no_grad():
            attention(q, k, v, causal=causal, backend=name)
    else:
        attention(q, k, v, causal=causal, backend=name).backward(do)


def _timed(name, q, k, v, do, causal, mode):
    """The call to time, as a function of no arguments (see "Timing" in the module docstring)."""
    if mode == "fwd":
        return lambda: _call(name, q, k, v, do, causal, mode)
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


class _Unsupported(Exception):
    """The backend's ``supports`` says no for this case: a skip with its reason, not a failure."""


def _is_oom(exc) -> bool:
    text = str(exc).lower()
    # torch.OutOfMemoryError is new in torch 2.5; torch.cuda.OutOfMemoryError is the older name.
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, (oom, MemoryError)) or "out of memory" in text or "can't allocate" in text


def _supported(name, q, k, v):
    ok, why = BACKENDS[name].supports(q, k, v, None)
    if not ok:
        raise _Unsupported(why)


def _time_and_cuda_memory(cfg, name, b, h, t, d, causal):
    """Median seconds per call, timed calls, and (on CUDA) peak extra bytes of one more call."""
    q, k, v, do = _inputs(b, h, t, d, DTYPES[cfg.dtype], cfg.device, cfg.mode != "fwd")
    _supported(name, q, k, v)
    seconds, runs = (None, None) if cfg.memory else _median_seconds(_timed(name, q, k, v, do, causal, cfg.mode), cfg)
    mem = None
    if cfg.device == "cuda":
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _call(name, q, k, v, do, causal, cfg.mode)
        torch.cuda.synchronize()
        mem = torch.cuda.max_memory_allocated() - base
    return seconds, runs, mem


def _status_kib(field) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _child(case) -> dict:
    """Body of the fresh memory subprocess (``python -m attnbook.bench --_child JSON``)."""
    name = case["backend"]
    if name not in BACKENDS:
        return {"skipped": "registered in the calling process only; CPU memory mode runs each case in a "
                           "fresh interpreter, which knows the built-in backends"}
    if case["threads"]:
        torch.set_num_threads(case["threads"])
    dtype, grad, (b, h, t, d) = DTYPES[case["dtype"]], case["mode"] != "fwd", case["shape"]
    q, k, v, do = _inputs(b, h, t, d, dtype, "cpu", grad)
    try:
        _supported(name, q, k, v)
    except _Unsupported as exc:
        return {"skipped": str(exc)}
    _call(name, *_inputs(1, 1, min(t, 64), d, dtype, "cpu", grad), case["causal"], case["mode"])  # load code
    gc.collect()
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current VmRSS
    _call(name, q, k, v, do, case["causal"], case["mode"])
    return {"extra_bytes": (_status_kib("VmHWM") - base) * 1024}


def _cpu_memory(cfg, name, b, h, t, d, causal):
    """Peak extra bytes of one CPU call, measured in a fresh subprocess (see module docstring)."""
    case = {"backend": name, "dtype": cfg.dtype, "mode": cfg.mode, "shape": [b, h, t, d], "causal": causal,
            "threads": cfg.threads}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "attnbook.bench", "--_child", json.dumps(case)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if _is_oom(proc.stderr) or proc.returncode == -9:
            raise MemoryError(proc.stderr[-300:])
        raise RuntimeError(f"memory subprocess for {name} T={t} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        raise _Unsupported(result["skipped"])
    return result["extra_bytes"]


def _measure(cfg, row) -> dict:
    """Fill one row's time_s, runs, mem_bytes, or its skip reason or note (out of memory)."""
    shape = (row["backend"], row["batch"], row["heads"], row["seq"], row["dim"], row["causal"])
    try:
        if cfg.memory and cfg.device == "cpu":
            row["mem_bytes"] = _cpu_memory(cfg, *shape)
        else:
            row["time_s"], row["runs"], row["mem_bytes"] = _time_and_cuda_memory(cfg, *shape)
    except _Unsupported as exc:
        row["skipped"] = str(exc)
    except Exception as exc:  # running out of memory is a result; anything else is a bug
        if not _is_oom(exc) and "does not require grad" not in str(exc):
            raise
        row["note"] = "out of memory" if _is_oom(exc) else "no backward"
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
        h = cfg.heads or (1 if cfg.memory else 2 if cfg.quick else 8 if cfg.device == "cpu" else max(1, 2048 // d))
        for causal in cfg.causal:
            for t in cfg.seqs:
                b = cfg.batch or (max(1, 16384 // t) if cfg.device == "cuda" and not cfg.quick else 1)
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
    """One line naming the machine and software: OS, CPU model and cores, torch, triton, GPU."""
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
        parts.append(f"GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, {driver})")
    return "; ".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnbook.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n")[0] + "\n\nPrints a Markdown table: one row per backend and sequence "
        "length T with the median time,\nthroughput (FlashAttention FLOP convention) and time / sdpa; with "
        "--memory, peak extra\nmemory and its ratio to the 'ref' backend instead. Every backend is called "
        "through\nattnbook.attention(..., backend=name); one that cannot serve a case is reported as skipped.",
        epilog="Defaults depend on --device (listed in attnbook/bench.py's docstring).\nExamples:\n"
               "  python -m attnbook.bench --quick                     # smoke test, a few seconds\n"
               "  python -m attnbook.bench --seq 1024 4096 --mode bwd  # backward only, two lengths\n"
               "  python -m attnbook.bench --memory --jobs 2           # peak memory, T up to 16384")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when torch sees a GPU, else cpu")
    p.add_argument("--dtype", choices=list(DTYPES), help="default float32 on CPU, float16 on CUDA")
    p.add_argument("--batch", type=int, help="default 1 on CPU, 16384 // T on CUDA")
    p.add_argument("--heads", type=int, help="default 8 on CPU, 2048 // D on CUDA; 1 with --memory")
    p.add_argument("--dim", type=int, nargs="+", help="head dimension(s) D; default 64 on CPU, 64 128 on CUDA")
    p.add_argument("--seq", type=int, nargs="+", help="sequence length(s) T; default 512 .. 8192 on CPU, "
                   "1024 .. 16384 on CUDA or with --memory (doubling)")
    p.add_argument("--causal", nargs="?", const="yes", choices=["yes", "no", "both"],
                   help="'--causal' alone: causal only; default: no on CPU, both on CUDA")
    p.add_argument("--mode", choices=list(MODES), default="fwd",
                   help="what is timed: the forward under no_grad, out.backward(dO) only, or both (default fwd)")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help=f"names in attnbook.dispatch.BACKENDS ({', '.join(BACKENDS)}); default: all of them; "
                        "one whose supports() says no is skipped with the reason")
    p.add_argument("--min-time", type=float, help="seconds of timed runs per case at least; default 0.5 on CPU, "
                   "0.1 on CUDA (do_bench's rep)")
    p.add_argument("--max-time", type=float, help="CPU: seconds after which timing a case stops; default 10")
    p.add_argument("--memory", action="store_true", help="memory mode: peak extra memory, H=1, T up to 16384")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--jobs", type=int, default=1, help="memory mode on CPU: subprocesses run at once")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes for a smoke test: B=1, H=2, D=16, T=64 128, non-causal "
                        "(H=1, T=256 512 with --memory)")
    p.add_argument("--markdown", action="store_true", help="add a header with machine, date and command")
    p.add_argument("--json", metavar="FILE", help="also write the rows (raw numbers) to FILE as JSON")
    return p


def main(argv=None) -> int:
    """Command-line entry point: parse arguments, run, print the table (and write rows with --json)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--_child"]:
        print(json.dumps(_child(json.loads(argv[1]))))
        return 0
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
