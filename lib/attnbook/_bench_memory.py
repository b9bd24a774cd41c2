"""One benchmark case of ``attnbook.bench``, and its peak extra CPU memory in a fresh subprocess (Linux).

``inputs`` and ``call`` are the case both the timing and the memory measurement run: q, k, v
(and dO) from a fixed seed, one call through ``attnbook.attention(..., backend=name)``. torch's
CPU allocations are invisible to ``tracemalloc``, so :func:`cpu_memory` runs the case in a fresh
``python -m attnbook._bench_memory JSON`` that imports torch, calls the backend once on tiny
inputs (code pages and thread pools get loaded), allocates q, k, v (and dO), reads VmRSS from
/proc/self/status, resets the high-water mark (``5`` into /proc/self/clear_refs), calls the
backend once and reports VmHWM minus that VmRSS. The child runs with
``MALLOC_MMAP_THRESHOLD_=65536``: glibc then mmaps every tensor above 64 KiB and unmaps it at
free, instead of raising its threshold after the first free and serving later tensors from heap
pages that are already resident (and so invisible to VmHWM). A fresh subprocess knows only the
built-in backends: one registered in the calling process is skipped there.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import torch

from .dispatch import BACKENDS, attention

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


class Unsupported(Exception):
    """The backend's ``supports`` says no for this case: a skip with its reason, not a failure."""


def inputs(b, h, t, d, dtype, device, grad):
    """q, k, v ``(B, H, T, D)`` from a fixed seed, and dO for the backward (None for "fwd")."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, t, d, generator=gen, device=device, dtype=dtype) for _ in range(4))  # (B, H, T, D)
    return (*(x.requires_grad_(grad) for x in (q, k, v)), do if grad else None)


def call(name, q, k, v, do, causal, mode):
    """One forward through the dispatcher (``no_grad`` in "fwd" mode) or forward plus ``out.backward(dO)``."""
    if mode == "fwd":
        with torch.no_grad():
            attention(q, k, v, causal=causal, backend=name)
    else:
        attention(q, k, v, causal=causal, backend=name).backward(do)


def supported(name, q, k, v):
    """Raise :class:`Unsupported` with the reason when backend ``name`` cannot serve these inputs."""
    ok, why = BACKENDS[name].supports(q, k, v, None)
    if not ok:
        raise Unsupported(why)


def is_oom(exc) -> bool:
    """Whether an exception (or a child's stderr text) says the machine ran out of memory."""
    text = str(exc).lower()
    # torch.OutOfMemoryError is new in torch 2.5; torch.cuda.OutOfMemoryError is the older name.
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, (oom, MemoryError)) or "out of memory" in text or "can't allocate" in text


def _status_kib(field) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def child(case) -> dict:
    """Body of the fresh memory subprocess: ``{"extra_bytes": n}`` or ``{"skipped": why}``."""
    name = case["backend"]
    if name not in BACKENDS:
        return {"skipped": "registered in the calling process only; CPU memory mode runs each case in a "
                           "fresh interpreter, which knows the built-in backends"}
    if case["threads"]:
        torch.set_num_threads(case["threads"])
    dtype, grad, (b, h, t, d) = DTYPES[case["dtype"]], case["mode"] != "fwd", case["shape"]
    q, k, v, do = inputs(b, h, t, d, dtype, "cpu", grad)
    try:
        supported(name, q, k, v)
    except Unsupported as exc:
        return {"skipped": str(exc)}
    call(name, *inputs(1, 1, min(t, 64), d, dtype, "cpu", grad), case["causal"], case["mode"])  # load code
    gc.collect()
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current VmRSS
    call(name, q, k, v, do, case["causal"], case["mode"])
    return {"extra_bytes": (_status_kib("VmHWM") - base) * 1024}


def cpu_memory(name, dtype, mode, shape, causal, threads) -> int:
    """Peak extra bytes of one CPU call of backend ``name`` on ``shape`` (B, H, T, D), in a fresh subprocess.

    Raises :class:`Unsupported` when the backend cannot serve the case there, MemoryError when the
    child ran out of memory, RuntimeError when it failed otherwise.
    """
    case = {"backend": name, "dtype": dtype, "mode": mode, "shape": list(shape), "causal": causal, "threads": threads}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-m", "attnbook._bench_memory", json.dumps(case)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if is_oom(proc.stderr) or proc.returncode == -9:
            raise MemoryError(proc.stderr[-300:])
        raise RuntimeError(f"memory subprocess for {name} T={shape[2]} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        raise Unsupported(result["skipped"])
    return result["extra_bytes"]


if __name__ == "__main__":  # the child: run the package's copy (python -m attnbook._bench_memory JSON)
    from attnbook._bench_memory import child as _child

    print(json.dumps(_child(json.loads(sys.argv[1]))))
