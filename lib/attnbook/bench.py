"""Benchmark of the attention backends against PyTorch's SDPA (chapter 09, "Performance").

Run as ``python -m attnbook.bench`` (``--help`` lists the options). For every backend and sequence
length it reports, side by side with ``torch.nn.functional.scaled_dot_product_attention`` ("sdpa")
measured in the same run:

    time      = median wall time of `repeats` runs after `warmup` untimed runs
    FLOPs     = 4 * B * H * Tq * Tk * D per forward pass, halved when causal; backward = 2.5 x
                forward, forward + backward = 3.5 x forward (FlashAttention-2 / Triton convention)
    time / sdpa = time / sdpa's time;   mem / ref = peak extra memory / the "ref" backend's

Timing: ``time.perf_counter`` on CPU, ``torch.cuda.Event`` pairs plus synchronize on CUDA. Mode
"fwd" times the forward under ``no_grad``; "bwd" runs the forward untimed in every repeat and times
only ``out.backward(dO)``; "fwd+bwd" times both together.

Memory ("peak extra" = what one call adds on top of its inputs, outputs and gradients included).
CUDA: ``max_memory_allocated()`` minus ``memory_allocated()`` just before the call, in the timing
run. CPU: torch's CPU allocations are invisible to ``tracemalloc``, so ``--memory`` runs every case
in a fresh subprocess that imports torch, calls the backend once on tiny inputs (code pages and
thread pools get loaded), allocates q, k, v (and dO), reads VmRSS from /proc/self/status, resets
the high-water mark (``5`` into /proc/self/clear_refs), calls the backend once and reports VmHWM
minus that VmRSS. The child runs with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc then mmaps every
tensor above 64 KiB and unmaps it at free, instead of raising its threshold after the first free
and serving later tensors from heap pages that are already resident (and so invisible to VmHWM).
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
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

BACKENDS = ("sdpa", "ref", "tiled", "triton")
MODES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FLOPs relative to one forward pass
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def attention_flops(batch, heads, tq, tk, dim, *, causal=False, mode="fwd") -> float:
    """FLOPs of exact attention in the FlashAttention convention (chapter 09).

    forward = 4 * B * H * Tq * Tk * D (two matmuls of 2 * Tq * Tk * D each), halved when causal;
    backward = 2.5 x forward; "fwd+bwd" = 3.5 x forward.
    """
    if mode not in MODES:
        raise ValueError(f"attention_flops: mode must be one of {list(MODES)}, got {mode!r}")
    for name, val in (("batch", batch), ("heads", heads), ("tq", tq), ("tk", tk), ("dim", dim)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"attention_flops: {name} must be an int >= 1, got {val!r}")
    return 4.0 * batch * heads * tq * tk * dim * (0.5 if causal else 1.0) * MODES[mode]


@dataclasses.dataclass
class BenchConfig:
    """What to benchmark. ``None`` fields take the device default listed on each line."""
    device: str = "cpu"
    dtype: str | None = None                 # float32 on CPU; float16 on CUDA
    batch: int | None = None                 # 1 on CPU; 16384 // T on CUDA (B * T = 16K tokens)
    heads: int | None = None                 # 8 on CPU, 1 with memory=True; 2048 // D on CUDA
    dims: tuple[int, ...] | None = None      # (64,) on CPU; (64, 128) on CUDA
    seqs: tuple[int, ...] | None = None      # 512..8192 on CPU (..16384 with memory); 1024..16384 CUDA
    causal: tuple[bool, ...] | None = None   # (False,) on CPU; (False, True) on CUDA
    mode: str = "fwd"                        # "fwd", "bwd" or "fwd+bwd"
    backends: tuple[str, ...] = BACKENDS     # ratios need "sdpa" (time) and "ref" (memory) in the run
    repeats: int | None = None               # timed runs, the median is reported: 5 on CPU, 20 on CUDA
    warmup: int | None = None                # untimed runs before them: 1 on CPU, 3 on CUDA
    memory: bool = False                     # memory mode: peak extra memory only (no timing)
    threads: int | None = None               # torch.set_num_threads; None keeps torch's default
    block_q: int | None = None               # tile sizes for "tiled" (None: its defaults)
    block_k: int | None = None
    jobs: int = 1                            # CPU memory mode: subprocesses run at once
    quick: bool = False                      # tiny default sizes (tests, smoke runs)


def _resolve(cfg) -> BenchConfig:
    cfg = BenchConfig(**cfg) if isinstance(cfg, dict) else dataclasses.replace(cfg)
    if cfg.device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {cfg.device!r}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}; no GPU"
        raise ValueError(f"device 'cuda' requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__} is {why}); use --device cpu")
    gpu, q = cfg.device == "cuda", cfg.quick
    cfg.dtype = cfg.dtype or ("float16" if gpu else "float32")
    cfg.dims = tuple(cfg.dims or ((16,) if q and not gpu else (64,) if q or not gpu else (64, 128)))
    cfg.causal = tuple(cfg.causal if cfg.causal is not None else ((False, True) if gpu and not q else (False,)))
    if cfg.seqs is None:
        cfg.seqs = ((128, 256) if gpu else (256, 512) if cfg.memory else (64, 128)) if q else \
            (1024, 2048, 4096, 8192, 16384) if gpu or cfg.memory else (512, 1024, 2048, 4096, 8192)
    cfg.seqs, cfg.backends = tuple(cfg.seqs), tuple(cfg.backends)
    cfg.repeats = cfg.repeats if cfg.repeats is not None else 20 if gpu and not q else 5
    cfg.warmup = cfg.warmup if cfg.warmup is not None else 3 if gpu and not q else 1
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {cfg.dtype!r}")
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {cfg.mode!r}")
    bad = [b for b in cfg.backends if b not in BACKENDS]
    if bad or not cfg.backends:
        raise ValueError(f"unknown backend(s) {bad or '(none given)'}; choose from {list(BACKENDS)}")
    for name in ("batch", "heads", "threads", "block_q", "block_k", "jobs"):
        val = getattr(cfg, name)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(f"{name} must be an int >= 1, got {val!r}")
    for name, vals in (("seqs (T, --seq)", cfg.seqs), ("dims (D)", cfg.dims), ("repeats", (cfg.repeats,))):
        if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in vals):
            raise ValueError(f"{name} must be ints >= 1, got {vals!r}")
    if isinstance(cfg.warmup, bool) or not isinstance(cfg.warmup, int) or cfg.warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {cfg.warmup!r}")
    return cfg


def _backend(name, device, block_q=None, block_k=None):
    """Return ``f(q, k, v, causal) -> out`` for a backend, or raise ImportError saying why not."""
    if name == "sdpa":
        return lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "ref":
        from attnbook.attention import attention_ref
        return lambda q, k, v, causal: attention_ref(q, k, v, causal=causal)[0]
    if name == "tiled":
        from attnbook.flash import attention_tiled
        blocks = {k: v for k, v in (("block_q", block_q), ("block_k", block_k)) if v is not None}
        return lambda q, k, v, causal: attention_tiled(q, k, v, causal=causal, **blocks)[0]
    if device != "cuda":
        raise ImportError(f"needs CUDA (device is {device})")
    from attnbook.triton_flash import attention_triton, triton_support
    fn = lambda q, k, v, causal: attention_triton(q, k, v, causal=causal)[0]  # noqa: E731
    fn.support = triton_support  # (ok, reason) for given q, k, v: checked once per case, untimed
    return fn


def _inputs(b, h, t, d, dtype, device, grad):
    """q, k, v ``(B, H, T, D)`` from a fixed seed, and dO for the backward (None for "fwd")."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, t, d, generator=gen, device=device, dtype=dtype) for _ in range(4))  # (B, H, T, D)
    return (*(x.requires_grad_(grad) for x in (q, k, v)), do if grad else None)


def _call(fn, q, k, v, do, causal, mode):
    """One forward (``no_grad`` in "fwd" mode) or forward plus ``out.backward(dO)``."""
    if mode == "fwd":
        with torch.no_grad():
            fn(q, k, v, causal)
    else:
        fn(q, k, v, causal).backward(do)


class _Unsupported(Exception):
    """A backend declines a case (e.g. the Triton kernel and this head dim): a note, not a failure."""


def _is_oom(exc) -> bool:
    text = str(exc).lower()
    # torch.OutOfMemoryError is new in torch 2.5; torch.cuda.OutOfMemoryError is the older name.
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, (oom, MemoryError)) or "out of memory" in text or "can't allocate" in text


def _time_and_cuda_memory(fn, cfg, b, h, t, d, causal):
    """Median seconds over cfg.repeats and (on CUDA) peak extra bytes of one more call."""
    q, k, v, do = _inputs(b, h, t, d, DTYPES[cfg.dtype], cfg.device, cfg.mode != "fwd")
    ok, why = fn.support(q, k, v) if hasattr(fn, "support") else (True, "")
    if not ok:
        raise _Unsupported(why)
    gpu = cfg.device == "cuda"
    times = []
    for i in range(cfg.warmup + cfg.repeats):
        out = fn(q, k, v, causal) if cfg.mode == "bwd" else None  # untimed forward
        if gpu:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        if out is not None:
            out.backward(do)
        else:
            _call(fn, q, k, v, do, causal, cfg.mode)
        if gpu:
            stop.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(stop) / 1e3
        else:
            elapsed = time.perf_counter() - t0
        q.grad = k.grad = v.grad = out = None  # untimed; backward would otherwise accumulate into them
        if i >= cfg.warmup:
            times.append(elapsed)
    mem = None
    if gpu:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _call(fn, q, k, v, do, causal, cfg.mode)
        torch.cuda.synchronize()
        mem = torch.cuda.max_memory_allocated() - base
    return statistics.median(times), mem


def _status_kib(field) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _child(case) -> dict:
    """Body of the fresh memory subprocess (``python -m attnbook.bench --_child JSON``)."""
    if case["threads"]:
        torch.set_num_threads(case["threads"])
    fn = _backend(case["backend"], "cpu", case["block_q"], case["block_k"])
    dtype, grad, (b, h, t, d) = DTYPES[case["dtype"]], case["mode"] != "fwd", case["shape"]
    _call(fn, *_inputs(1, 1, min(t, 64), d, dtype, "cpu", grad), case["causal"], case["mode"])  # load code
    q, k, v, do = _inputs(b, h, t, d, dtype, "cpu", grad)
    gc.collect()
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current VmRSS
    _call(fn, q, k, v, do, case["causal"], case["mode"])
    return {"extra_bytes": (_status_kib("VmHWM") - base) * 1024}


def _cpu_memory(cfg, name, b, h, t, d, causal):
    """Peak extra bytes of one CPU call, measured in a fresh subprocess (see module docstring)."""
    case = {"backend": name, "dtype": cfg.dtype, "mode": cfg.mode, "shape": [b, h, t, d], "causal": causal,
            "threads": cfg.threads, "block_q": cfg.block_q, "block_k": cfg.block_k}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "attnbook.bench", "--_child", json.dumps(case)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if _is_oom(proc.stderr) or proc.returncode == -9:
            raise MemoryError(proc.stderr[-300:])
        raise RuntimeError(f"memory subprocess for {name} T={t} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["extra_bytes"]


def _measure(cfg, fn, row) -> dict:
    """Fill one row's time_s / mem_bytes (or its note when the case runs out of memory)."""
    shape = (row["backend"], row["batch"], row["heads"], row["seq"], row["dim"], row["causal"])
    try:
        if cfg.memory and cfg.device == "cpu":
            row["mem_bytes"] = _cpu_memory(cfg, *shape)
        else:
            row["time_s"], row["mem_bytes"] = _time_and_cuda_memory(fn, cfg, *shape[1:])
            row["time_s"] = None if cfg.memory else row["time_s"]
    except _Unsupported as exc:  # the backend declines this case (e.g. no backward, head dim)
        row["note"] = f"not supported: {exc}"[:60]
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

    Rows carry backend, device, dtype, mode, batch, heads, dim, seq, causal, repeats, warmup,
    threads, memory_mode, time_s, flops, flops_per_s, ratio_sdpa, mem_bytes, mem_ratio_ref and note
    ("out of memory", "no backward", "not supported: ..."); an unavailable backend gets one row
    with just backend and skipped (the reason). ``log(str)`` receives progress lines and skips.
    """
    cfg, log, threads = _resolve(config), log or (lambda msg: None), torch.get_num_threads()
    cfg.threads = cfg.threads or threads
    if cfg.memory and cfg.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("CPU memory mode needs Linux: /proc/self/status and /proc/self/clear_refs")
    skipped, fns = [], {}
    for name in cfg.backends:
        try:
            fns[name] = _backend(name, cfg.device, cfg.block_q, cfg.block_k)
        except ImportError as exc:
            log(f"skipping backend {name}: {exc}")
            skipped.append({"backend": name, "skipped": str(exc)})
    rows = []
    for d in cfg.dims:
        h = cfg.heads or (1 if cfg.memory else 2 if cfg.quick else 8 if cfg.device == "cpu" else max(1, 2048 // d))
        for causal in cfg.causal:
            for t in cfg.seqs:
                b = cfg.batch or (max(1, 16384 // t) if cfg.device == "cuda" and not cfg.quick else 1)
                rows += [{"backend": name, "device": cfg.device, "dtype": cfg.dtype, "mode": cfg.mode,
                          "batch": b, "heads": h, "dim": d, "seq": t, "causal": causal, "repeats": cfg.repeats,
                          "warmup": cfg.warmup, "threads": cfg.threads, "memory_mode": cfg.memory,
                          "time_s": None, "mem_bytes": None, "note": "",
                          "flops": attention_flops(b, h, t, t, d, causal=causal, mode=cfg.mode)}
                         for name in fns]

    def one(row):
        log("{backend:6s} B={batch} H={heads} T={seq} D={dim} causal={causal} {mode} {dtype}".format(**row))
        return _measure(cfg, fns[row["backend"]], row)

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
    return rows + skipped


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.0f}" if abs(x) >= 100 else f"{x:#.3g}".rstrip(".")


def format_table(rows, *, title=None) -> str:
    """Markdown table of ``run_benchmark`` rows: a config line, one line per row, method notes."""
    done = [r for r in rows if not r.get("skipped")]
    if not done:
        raise ValueError("format_table: no measured rows (every backend was skipped)")
    gpu, memory_mode = done[0]["device"] == "cuda", done[0]["memory_mode"]
    unit, per = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)
    fixed = [k for k in ("batch", "heads", "dim", "causal") if len({r[k] for r in done}) == 1]
    cols = [("backend", lambda r: r["backend"])]
    label = {"batch": "B", "heads": "H", "dim": "D", "causal": "causal"}
    cols += [(label[k], lambda r, k=k: str(r[k])) for k in label if k not in fixed]
    cols += [("T", lambda r: str(r["seq"]))]
    if not memory_mode:
        cols += [("time (ms)", lambda r: r["note"] or _fmt(r["time_s"] and r["time_s"] * 1e3)),
                 (unit, lambda r: _fmt(r["flops_per_s"] and r["flops_per_s"] / per)),
                 ("time / sdpa", lambda r: _fmt(r["ratio_sdpa"]))]
    if memory_mode or gpu:
        mib = 2.0 ** 20
        cols += [("peak extra (MiB)", lambda r: r["note"] or _fmt(r["mem_bytes"] and r["mem_bytes"] / mib)),
                 ("mem / ref", lambda r: _fmt(r["mem_ratio_ref"])),
                 ("one T×T matrix (MiB)", lambda r: _fmt(r["batch"] * r["heads"] * r["seq"] ** 2
                                                         * DTYPES[r["dtype"]].itemsize / mib))]
    r0 = done[0]
    setting = [r0["mode"], r0["dtype"], r0["device"]] + [
        ("causal" if r0[k] else "non-causal") if k == "causal" else f"{k[0].upper()}={r0[k]}" for k in fixed]
    lines = [title] if title else []
    lines += [" · ".join(setting) + f" · torch threads {r0['threads']}", "",
              "| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fn(r) for _, fn in cols) + " |" for r in done]
    flops = ("FLOPs = 4·B·H·T²·D per forward (÷2 causal; backward ×2.5, fwd+bwd ×3.5), "
             "FlashAttention convention; time / sdpa = time ÷ scaled_dot_product_attention's time in this run.")
    timing = {"fwd": "forward under no_grad", "bwd": "out.backward(dO) only (forward untimed)",
              "fwd+bwd": "forward + backward together"}[r0["mode"]]
    notes = [] if memory_mode else [
        f"Time: median of {r0['repeats']} runs after {r0['warmup']} warm-up run(s), "
        f"{'CUDA events' if gpu else 'time.perf_counter'}; timed: {timing}.", flops]
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
    notes += [f"Skipped {r['backend']}: {r['skipped']}." for r in rows if r.get("skipped")]
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
        "--memory, peak extra\nmemory and its ratio to the 'ref' backend instead.",
        epilog="Defaults depend on --device (see BenchConfig in attnbook/bench.py).\nExamples:\n"
               "  python -m attnbook.bench --quick                     # smoke test, a few seconds\n"
               "  python -m attnbook.bench --seq 1024 4096 --mode bwd  # backward only, two lengths\n"
               "  python -m attnbook.bench --memory --jobs 2           # peak memory, T up to 16384")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when torch sees a GPU, else cpu")
    p.add_argument("--dtype", choices=list(DTYPES), help="default float32 on CPU, float16 on CUDA")
    p.add_argument("--batch", type=int, help="default 1 on CPU, 16384 // T on CUDA")
    p.add_argument("--heads", type=int, help="default 8 on CPU (1 with --memory), 2048 // D on CUDA")
    p.add_argument("--dim", type=int, nargs="+", help="head dimension(s) D; default 64 on CPU, 64 128 on CUDA")
    p.add_argument("--seq", type=int, nargs="+", help="sequence length(s) T; default 512 .. 8192 on CPU "
                   "(.. 16384 with --memory), 1024 .. 16384 on CUDA")
    p.add_argument("--causal", nargs="?", const="yes", choices=["yes", "no", "both"],
                   help="'--causal' alone: causal only; default: no on CPU, both on CUDA")
    p.add_argument("--mode", choices=list(MODES), default="fwd",
                   help="what is timed: the forward under no_grad, out.backward(dO) only, or both (default fwd)")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), metavar="NAME",
                   help=f"any of {', '.join(BACKENDS)} (default: all; unavailable ones are skipped)")
    p.add_argument("--repeats", type=int, help="timed runs (median reported); default 5 on CPU, 20 on CUDA")
    p.add_argument("--warmup", type=int, help="untimed runs first; default 1 on CPU, 3 on CUDA")
    p.add_argument("--memory", action="store_true", help="memory mode: peak extra memory, H=1, T up to 16384")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--block-q", type=int, help="block_q for the tiled backend")
    p.add_argument("--block-k", type=int, help="block_k for the tiled backend")
    p.add_argument("--jobs", type=int, default=1, help="memory mode on CPU: subprocesses run at once")
    p.add_argument("--quick", action="store_true",
                   help="tiny default sizes for a smoke test (CPU: H=2, D=16, T=64 128; 256 512 with --memory)")
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
                      seqs=args.seq, causal=causal, mode=args.mode, backends=tuple(args.backends),
                      repeats=args.repeats, warmup=args.warmup, memory=args.memory, threads=args.threads,
                      block_q=args.block_q, block_k=args.block_k, jobs=args.jobs, quick=args.quick)
    started, load = datetime.datetime.now().astimezone(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        _resolve(cfg)  # argument errors become usage errors; errors while running stay tracebacks
    except ValueError as exc:
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
