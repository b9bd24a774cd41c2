"""Tests for lib/attnbook/selfcheck.py (benchmarks/gpu.sh: tests/book/test_gpu_script.py).

The first-use check decides what ``backend="auto"`` does on CUDA, and this machine has no GPU.
So the CUDA branch runs with stand-ins: ``cuda_like`` makes CPU tensors that say ``is_cuda``
(``dispatch._choose`` takes its CUDA branch; the check itself runs on their real device, the CPU),
and the registered ``"triton"`` backend is replaced by a fake that passes, fails to compile, runs
out of shared memory, disagrees in the forward or only in the backward. The real kernel is
checked too, under Triton's interpreter (``TRITON_INTERPRET=1``, set for the import as in
tests/lib/test_triton_flash.py).
"""
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import attnbook
from attnbook import attention, attention_tiled, dispatch

from attnbook.testing import import_triton_flash

tf = import_triton_flash()  # TRITON_INTERPRET set for this import only, as in test_triton_flash.py

from attnbook import selfcheck as sc  # noqa: E402  (after the interpreter import above)

ROOT = Path(__file__).resolve().parents[2]
INTERPRETER = tf.triton is not None and tf._INTERPRETED and not torch.cuda.is_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason="needs triton imported under TRITON_INTERPRET=1 "
                                       "(run this file on its own or with TRITON_INTERPRET=1) on a machine without CUDA")


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch):
    sc.clear_verdicts()
    if INTERPRETER:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    sc.clear_verdicts()


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA: ``_choose`` takes its CUDA branch on a machine without a GPU."""

    @property
    def is_cuda(self):
        return True


def cuda_like(*shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).as_subclass(CudaLike).requires_grad_(grad)


def qkv_like(d=64, dv=None, tq=9, tk=9, dtype=torch.float32, grad=False):
    return (cuda_like(1, 2, tq, d, dtype=dtype, grad=grad), cuda_like(1, 2, tk, d, dtype=dtype, seed=1, grad=grad),
            cuda_like(1, 2, tk, dv or d, dtype=dtype, seed=2, grad=grad))


def _plain(*ts):
    return tuple(None if t is None else t.as_subclass(torch.Tensor) for t in ts)


class FakeTriton:
    """A stand-in for the registered "triton" kernel: exact (attention_tiled) unless told otherwise."""

    def __init__(self, fail=None, forward_factor=1.0, grad_factor=1.0):
        self.fail, self.forward_factor, self.grad_factor, self.calls = fail, forward_factor, grad_factor, 0

    def __call__(self, q, k, v, mask, causal, scale):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        q, k, v, mask = _plain(q, k, v, mask)
        out = attention_tiled(q, k, v, mask=mask, causal=causal, scale=scale).out * self.forward_factor
        return _ScaleGrad.apply(out, self.grad_factor)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient (a kernel whose backward is wrong)."""

    @staticmethod
    def forward(ctx, out, factor):
        ctx.factor = factor
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def install(monkeypatch, fake):
    monkeypatch.setitem(dispatch.BACKENDS, "triton", dispatch.Backend(fake, lambda *a: (True, "")))
    return fake


def auto_choices(*calls):
    """Run _choose for each (q, k, v, mask, causal); return the choices and the RuntimeWarnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choices = [dispatch._choose(*c) for c in calls]
    return choices, [w for w in caught if issubclass(w.category, RuntimeWarning)]


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------

def test_head_dim_bucket_is_the_kernels_padded_dim():
    assert [sc.head_dim_bucket(d) for d in (1, 15, 16, 17, 32, 33, 40, 64, 65, 100, 128)] == \
        [16, 16, 16, 32, 32, 64, 64, 64, 128, 128, 128]
    assert tf._block(40) == sc.head_dim_bucket(40) == 64  # the same rule as the kernels' BLOCK_D


def test_check_key_names_the_kind():
    q, k, v = qkv_like(d=40, dv=20, grad=True)
    key = sc.check_key(q, k, v, None, True)
    assert key == ("cpu", torch.float32, 64, 32, True, False, True)
    with torch.no_grad():  # no graph, no backward
        assert sc.check_key(q, k, v, torch.ones(9, dtype=torch.bool), False)[-2:] == (True, False)


# ---------------------------------------------------------------------------------------------
# The CUDA branch of "auto", with stand-ins
# ---------------------------------------------------------------------------------------------

def test_a_passing_kernel_is_trusted_and_checked_once_per_kind(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    q, k, v = qkv_like()
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["triton", "triton"] and not warned
    assert fake.calls == 1  # checked once (forward only: no grad needed), then cached
    (key, verdict), = sc.verdicts().items()
    assert key == sc.check_key(q, k, v, None, False) and verdict.ok and verdict.reason == ""
    # attention(..., backend="auto") itself runs the kernel that passed
    attention(q, k, v)
    assert fake.calls > 1


@pytest.mark.parametrize("error, words", [
    (type("CompilationError", (Exception,), {})("at 12:8: unsupported tl.dot shape"), "failed to compile"),
    (type("OutOfResources", (Exception,), {})("out of resource: shared memory, Required: 131072, "
                                              "Hardware limit: 65536"), "shared memory"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "raised an error"),
])
def test_a_kernel_that_raises_warns_once_then_tiled(monkeypatch, error, words):
    install(monkeypatch, FakeTriton(fail=error))
    q, k, v = qkv_like()
    choices, warned = auto_choices(*[(q, k, v, None, True)] * 3)
    assert choices == ["tiled"] * 3
    assert len(warned) == 1, [str(w.message) for w in warned]
    message = str(warned[0].message)
    assert words in message and type(error).__name__ in message and "first-use self-check" in message
    assert "causal" in message and "float32" in message and "'tiled'" in message
    assert warned[0].filename == __file__  # points at the caller's line, not at the library


def test_a_kernel_that_disagrees_warns_once_then_tiled(monkeypatch):
    install(monkeypatch, FakeTriton(forward_factor=1 + 1e-3))  # 0.1% off: far above float32 rounding
    q, k, v = qkv_like()
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["tiled", "tiled"] and len(warned) == 1
    assert "disagree with attention_tiled" in str(warned[0].message) and "out: max error" in str(warned[0].message)
    # control: the same check passes a kernel that is off by float32 rounding only
    sc.clear_verdicts()
    install(monkeypatch, FakeTriton(forward_factor=1 + 1e-7))
    assert auto_choices((q, k, v, None, False)) == (["triton"], [])


def test_a_wrong_backward_is_caught_only_when_gradients_are_needed(monkeypatch):
    install(monkeypatch, FakeTriton(grad_factor=1.01))
    q, k, v = qkv_like(grad=True)
    with torch.no_grad():  # inference: the forward is right, so the kernel is trusted
        assert auto_choices((q, k, v, None, False)) == (["triton"], [])
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["tiled", "tiled"] and len(warned) == 1 and "dq: max error" in str(warned[0].message)
    with torch.no_grad():  # the forward-only verdict stands
        assert dispatch._choose(q, k, v, None, False) == "triton"


def test_a_failed_forward_needs_no_second_check_for_the_backward(monkeypatch):
    fake = install(monkeypatch, FakeTriton(forward_factor=2.0))
    q, k, v = qkv_like(grad=True)
    with torch.no_grad():
        choices, warned = auto_choices((q, k, v, None, False))
    calls = fake.calls
    choices2, warned2 = auto_choices((q, k, v, None, False))
    assert choices == choices2 == ["tiled"] and len(warned) == 1 and not warned2 and fake.calls == calls


def test_verdicts_are_cached_per_kind(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    mask = torch.ones(9, dtype=torch.bool)
    calls = [qkv_like(d=40) + (None, False), qkv_like(d=64) + (None, False),  # one bucket: one check
             qkv_like(d=65) + (None, False),                                    # bucket 128
             qkv_like(d=64, dv=16) + (None, False),                             # v's bucket
             qkv_like(d=64) + (None, True),                                     # causal
             qkv_like(d=64) + (mask, False),                                    # masked
             qkv_like(d=64, dtype=torch.float16) + (None, False)]               # dtype
    choices, warned = auto_choices(*calls)
    assert choices == ["triton"] * len(calls) and not warned
    assert fake.calls == len(sc.verdicts()) == len(calls) - 1


def test_causal_unknown_checks_both_kinds(monkeypatch):
    install(monkeypatch, FakeTriton())
    q, k, v = qkv_like()
    monkeypatch.setattr(dispatch, "check_attention_args", lambda *a, **kw: 0.125)  # CudaLike passes anyway
    assert attnbook.choose_backend(q, k, v) == "triton"  # the public helper does not know `causal`
    assert {key[4] for key in sc.verdicts()} == {False, True}


def test_no_check_while_compiling(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v = qkv_like()
    assert auto_choices((q, k, v, None, False)) == (["tiled"], [])
    assert fake.calls == 0 and not sc.verdicts()  # nothing ran, nothing cached: the next eager call checks


def test_explicit_triton_backend_runs_no_check(monkeypatch):
    error = type("CompilationError", (Exception,), {})("boom")
    fake = install(monkeypatch, FakeTriton(fail=error))
    q, k, v = _plain(*qkv_like())
    with pytest.raises(type(error), match="boom"):
        attention(q, k, v, backend="triton")  # the kernel's own error, not a fallback
    assert fake.calls == 1 and not sc.verdicts()


def test_explicit_triton_on_cpu_keeps_its_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 1, 4, 16)
    if tf.triton is None or not tf._INTERPRETED:
        with pytest.raises(RuntimeError, match="backend 'triton' cannot serve these arguments"):
            attention(q, q, q, backend="triton")
    else:  # imported under the interpreter, which must stay set
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            attention(q, q, q, backend="triton")
    assert not sc.verdicts()


def test_auto_on_plain_cpu_tensors_never_checks(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    q = torch.randn(1, 1, 4, 16)
    assert dispatch._choose(q, q, q, None) == "tiled" and fake.calls == 0 and not sc.verdicts()


# ---------------------------------------------------------------------------------------------
# The real kernel under the interpreter
# ---------------------------------------------------------------------------------------------

@needs_interpreter
def test_the_real_kernel_passes_its_check():
    verdict = sc.check_triton("cpu", torch.float32, 24, causal=True, masked=True, backward=True)
    assert verdict.ok, verdict.reason
    assert sc.check_triton("cpu", torch.float16, 64, 32).ok


@needs_interpreter
def test_the_real_kernel_with_a_bug_fails_its_check(monkeypatch):
    real = tf._attention_triton

    def off_by_one_key(q, k, v, mask, causal, scale, blocks=None):  # drops the last key
        return real(q, k[:, :, :-1], v[:, :, :-1], None if mask is None else mask[..., :-1], causal, scale, blocks)

    monkeypatch.setattr(tf, "_attention_triton", off_by_one_key)
    verdict = sc.check_triton("cpu", torch.float32, 16)
    assert not verdict.ok and "out: max error" in verdict.reason


# ---------------------------------------------------------------------------------------------
# The machine report
# ---------------------------------------------------------------------------------------------

def test_report_on_this_machine(capsys):
    result = sc.selfcheck(backends=["ref", "tiled", "sdpa"], dtypes=["float64", "float16"])
    text = capsys.readouterr().out
    assert text == result["text"] + "\n"
    assert {(r["backend"], r["dtype"], r["result"]) for r in result["rows"]} == {
        (b, t, "pass") for b in ("ref", "tiled", "sdpa") for t in ("float64", "float16")}
    assert [a["auto"] for a in result["auto"]] == ["tiled", "tiled"]
    assert "auto uses Triton only on CUDA tensors" in text and "Every backend that runs here passed." in text
    row = next(r for r in result["rows"] if r["backend"] == "tiled" and r["dtype"] == "float64")
    assert 0 < row["err_out"] < 1e-12  # the float64 tiled kernel: equal up to rounding, not bit for bit


def test_report_lists_skips_and_failures(monkeypatch, capsys):
    monkeypatch.setattr(dispatch, "BACKENDS", dict(dispatch.BACKENDS))
    dispatch.register_backend("off", lambda q, k, v, mask, causal, scale: 1.01 * attention_tiled(
        q, k, v, mask=mask, causal=causal, scale=scale).out)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert sc.main(["--backends", "off", "triton", "--dtypes", "float32", "--device", "cpu"]) == 1
    text = capsys.readouterr().out
    assert "| cpu | off | float32 |" in text and "FAIL" in text and "1 failure(s)." in text
    assert "| cpu | triton | float32 | — | — | skipped |" in text


def test_module_is_callable_in_a_notebook():
    import attnbook.selfcheck

    assert attnbook.selfcheck is sc and callable(attnbook.selfcheck)
    result = attnbook.selfcheck(backends=["tiled"], dtypes=["float32"], verbose=False)
    assert [r["result"] for r in result["rows"]] == ["pass"]


def test_python_dash_m(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnbook.selfcheck", "--backends", "tiled", "--dtypes", "float64",
                           "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| cpu | tiled | float64 |" in proc.stdout and "pass" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr  # e.g. runpy's "found in sys.modules" warning
