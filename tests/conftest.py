"""Shared test helpers: one random-tensor helper, one float64 tolerance, one masked-lse oracle,
one loader for the book's scripts in tools/.

Test modules import them with ``from conftest import ...`` (pytest puts ``tests/`` on the path).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str):
    """Import tools/<name>.py as module `name` (tools/ is not a package; its scripts import each other)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(TOOLS / f"{name}.py"):
        return sys.modules[name]
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


F64_TOL = dict(rtol=1e-10, atol=1e-12)  # float64 identities: a wrong rescale or a missed tile is >> this
NEG_INF = float("-inf")
CPU_BACKENDS = ("ref", "tiled", "sdpa")  # the explicit backends every CPU machine runs


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: intra-op threads only add synchronisation on a busy 2-core machine; restored after.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rand(*shape, dtype=torch.float64, seed=0, scale=1.0):
    """Standard normal tensor from its own seeded generator (tests never share global RNG state)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def qkv(b=2, h=3, tq=7, tk=9, d=5, dv=4, *, dtype=torch.float64, seed=0, scale=1.0):
    """q ``(b, h, tq, d)``, k ``(b, h, tk, d)`` (both times ``scale``), v ``(b, h, tk, dv)``."""
    return (rand(b, h, tq, d, dtype=dtype, seed=seed, scale=scale),
            rand(b, h, tk, d, dtype=dtype, seed=seed + 1, scale=scale),
            rand(b, h, tk, dv, dtype=dtype, seed=seed + 2))


def make_mask(kind, b, h, tq, tk, seed=0):
    """None, a random bool mask (True = attend) or an additive float mask with some -inf, ``(b, 1, tq, tk)``."""
    if kind is None:
        return None
    g = torch.Generator().manual_seed(seed + 10)
    keep = torch.rand(b, 1, tq, tk, generator=g) > 0.3  # broadcast over heads
    if kind == "bool":
        return keep
    bias = torch.randn(b, 1, tq, tk, generator=g, dtype=torch.float64)
    return bias.masked_fill(~keep, NEG_INF)


def lse_ref(q, k, mask=None, causal=False, scale=None):
    """The masked-lse oracle: log-sum-exp of each row of the materialised, masked, scaled scores."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else s + mask
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), NEG_INF)
    return torch.logsumexp(s, -1)


def assert_lse(lse, expected):
    """``lse`` equals the oracle: -inf exactly where it is -inf, float64-close elsewhere, never NaN."""
    assert not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected))
    fin = torch.isfinite(expected)
    torch.testing.assert_close(lse[fin], expected[fin].to(lse.dtype), **F64_TOL)


def import_triton_flash():
    """``attnbook.triton_flash``, with its kernels built for the CPU interpreter when there is no GPU.

    ``@triton.jit`` reads ``TRITON_INTERPRET`` when ``attnbook.triton_kernels`` is first imported
    (by ``attnbook.triton_flash``), so it is set for that import only and restored after it: the
    rest of the session (notebooks above all) never sees it. Tests that run the kernels set it
    again while they run (the interpreter reads it then too).
    """
    saved = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from attnbook import triton_flash
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return triton_flash
