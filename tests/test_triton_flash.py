"""Tests for the fused Triton FlashAttention kernel (lib/attnbook/triton_flash.py).

Without CUDA the kernels run under Triton's interpreter (TRITON_INTERPRET=1), which executes
every program one after another with numpy on the CPU. That checks the algorithm: tiling and
tails of every size, Tq != Tk, causal tile skipping and the diagonal split, key padding, empty
rows, the online softmax, the log-sum-exp and the whole backward pass, against a float64
reference. It cannot catch:
- TF32 vs IEEE fp32 dot products: numpy multiplies in exact fp32 whatever `input_precision`
  says (on an Ampere+ GPU a TF32 dot would lose ~3 decimal digits);
- bfloat16 at all (the interpreter's tl.dot multiplies raw bf16 bit patterns, so the kernel
  reports bf16 unsupported there), nor the tensor-core rounding and accumulation order of the
  fp16 matmuls (the interpreter does round P to fp16 before P V, as the explicit cast says);
- race conditions and atomics (programs never run concurrently; the kernel has no atomics,
  each output tile has one writer, which is what makes that safe);
- shared-memory / register limits, num_warps / num_stages and autotuning (a fixed tile is used),
  and any error that only compilation finds (e.g. a loop-carried value changing dtype):
  `test_kernels_compile_for_sm90_without_a_gpu` covers part of that by compiling, not running,
  the kernels for sm_90 with the ptxas that ships with triton;
- performance.
Tests marked `gpu` cover fp16 / bf16 / fp32 on CUDA with autotuned tiles and larger shapes; they
skip without CUDA. Sizes here stay tiny because the interpreter is slow.

Tolerances follow FlashAttention's rule (`attnbook.testing.assert_close_to_reference`): error vs
float64 <= 2x (3x for gradients) the error of the naive kernel in the same dtype + one rounding step.
"""
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbook.attention import attention_ref, causal_mask, padding_mask
from attnbook.testing import assert_close_to_reference, max_abs_error

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# @triton.jit reads TRITON_INTERPRET when attnbook.triton_flash is first imported; the interpreter
# also reads it while running. Set it only for that import and for this module's tests (fixture
# below), so that the rest of the session - notebooks above all - never sees it.
_saved_env = os.environ.get("TRITON_INTERPRET")
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
try:
    from attnbook import triton_flash as tf
finally:
    if _saved_env is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _saved_env

if tf.triton is None:
    _SKIP = "triton is not installed"
elif not CUDA and not tf._INTERPRETED:
    _SKIP = ("attnbook.triton_flash was imported before this module without TRITON_INTERPRET=1; "
             "run this file on its own or with TRITON_INTERPRET=1 in the environment")
else:
    _SKIP = ""
needs_kernel = pytest.mark.skipif(bool(_SKIP), reason=_SKIP)


@pytest.fixture(autouse=True)
def _interpreter_env(monkeypatch):
    if tf._INTERPRETED:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def reference(q, k, v, *, mask=None, causal=False, scale=None, dtype=torch.float64):
    """attention_ref's out and the log-sum-exp of the visible scores, in `dtype`, with autograd."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
    if mask is not None and mask.dtype != torch.bool:
        mask = padding_mask(mask.cpu(), Tk).to(q.device)  # (B, 1, 1, Tk)
    elif mask is not None and mask.ndim == 2:
        mask = mask[:, None, None, :]  # (B, 1, 1, Tk)
    out, _ = attention_ref(q, k, v, mask=mask, causal=causal, scale=scale)
    scores = (q @ k.transpose(-2, -1)) * (scale or 1 / math.sqrt(q.shape[-1]))  # (B, H, Tq, Tk)
    visible = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        visible = visible & mask
    if causal:
        visible = visible & causal_mask(Tq, Tk, device=q.device)
    has_key = visible.any(-1, keepdim=True)
    lse = torch.logsumexp(torch.where(visible & has_key, scores, float("-inf")).where(has_key, 0.0), -1)
    return (q, k, v), out, lse.masked_fill(~has_key[..., 0], float("-inf"))  # (B, H, Tq)


def loss(out, lse, seed=1):
    """A random linear function of out and the finite lse entries (so both gradients are exercised)."""
    g_out = rand(*out.shape, seed=seed, dtype=torch.float64)
    g_lse = rand(*lse.shape, seed=seed + 1, dtype=torch.float64)
    return (out.double() * g_out).sum() + (lse.double().masked_fill(torch.isinf(lse), 0.0) * g_lse).sum()


def delta_rounding(q, k, v, scale=None):
    """Extra error allowed in dq, dk where the naive kernel is exact by luck (a one-hot softmax row).

    FlashAttention's Delta = rowsum(dO * O) stands in for rowsum(P * dP): the two agree only to fp32
    rounding of dP (~eps |dP|), which dQ = scale * dS K and dK = scale * dS^T Q multiply by |K|, |Q|.
    Where P is exactly one-hot the naive backward has no such error, so the rule cannot bound it:
    allow two rounding steps of dP, carried through (dP from the upstream gradient `loss` uses).
    """
    dp = (rand(*q.shape[:3], v.shape[3], seed=1, dtype=torch.float64) @ v.double().transpose(-2, -1)).abs().max()
    step = 2 * torch.finfo(torch.float32).eps * (scale or 1 / math.sqrt(q.shape[-1])) * float(dp)
    return {"dq": step * float(k.abs().max()), "dk": step * float(q.abs().max())}


def run_and_compare(q, k, v, *, mask=None, causal=False, scale=None, blocks=None, grad_step=None):
    """Kernel vs float64 reference by the FlashAttention rule, for out, lse, dq, dk, dv."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out, lse = tf._attention(q, k, v, mask=mask, causal=causal, scale=scale, blocks=blocks)
    loss(out, lse).backward()
    results = {}
    for dtype in (torch.float64, q.dtype):
        inputs, r_out, r_lse = reference(q, k, v, mask=mask, causal=causal, scale=scale, dtype=dtype)
        loss(r_out, r_lse).backward()
        results[dtype] = (r_out, r_lse, *(x.grad for x in inputs))
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert torch.equal(torch.isinf(lse), torch.isinf(results[torch.float64][1]))  # same empty rows
    finite = torch.isfinite(results[torch.float64][1])
    names = ("out", "lse", "dq", "dk", "dv")
    for i, (name, actual) in enumerate(zip(names, (out, lse, q.grad, k.grad, v.grad))):
        assert torch.isfinite(actual[finite] if name == "lse" else actual).all(), f"{name} has NaN/inf"
        ref64, naive = results[torch.float64][i], results[q.dtype][i]
        if name == "lse":
            actual, naive, ref64 = actual[finite], naive[finite], ref64[finite]
        factor = 2.0 if name in ("out", "lse") else 3.0
        if grad_step and name in grad_step:
            err, base = max_abs_error(actual, ref64), max_abs_error(naive, ref64)
            bound = factor * base + grad_step[name]
            assert err <= bound, f"{name}: error {err:.3e} > {factor} x naive {base:.3e} + {grad_step[name]:.3e}"
        else:
            assert_close_to_reference(actual, naive.to(actual.dtype), ref64, factor=factor, name=name)
    return out, lse, q.grad, k.grad, v.grad


CASES = {  # B, H, Tq, Tk, D, Dv, causal, (BLOCK_Q, BLOCK_K) or None for the default tile
    "tail-tiles": (2, 2, 37, 37, 24, 24, False, None),
    "tail-tiles-causal": (2, 2, 37, 37, 24, 24, True, None),
    "T-below-block": (1, 2, 9, 9, 16, 16, True, None),
    "Tq>Tk-causal": (2, 1, 40, 23, 40, 40, True, (32, 16)),
    "Tq<Tk-causal": (1, 2, 23, 40, 64, 64, True, (16, 32)),
    "Tq<Tk": (1, 2, 23, 40, 16, 16, False, (32, 16)),
    "Tq>Tk-Dv!=D": (1, 1, 40, 23, 8, 40, False, None),
}


@needs_kernel
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_float64_reference(case):
    B, H, Tq, Tk, D, Dv, causal, blocks = case
    q, k, v = rand(B, H, Tq, D, seed=1), rand(B, H, Tk, D, seed=2), rand(B, H, Tk, Dv, seed=3)
    run_and_compare(q, k, v, causal=causal, blocks=blocks)


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_forms_agree_and_empty_rows_are_zero(causal):
    B, H, Tq, Tk, D = 3, 2, 20, 19, 16
    q, k, v = rand(B, H, Tq, D, seed=4), rand(B, H, Tk, D, seed=5), rand(B, H, Tk, D, seed=6)
    lengths = torch.tensor([19, 0, 7], device=DEVICE)  # batch row 1 has no real key at all
    forms = [lengths, padding_mask(lengths.cpu(), Tk).to(DEVICE), padding_mask(lengths.cpu(), Tk)[:, 0, 0].to(DEVICE)]
    out, lse, dq, dk, dv = run_and_compare(q, k, v, mask=forms[0], causal=causal)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.all(lse[1] == float("-inf"))
    for grad in (dq[1], dk[1], dv[1], dk[2, :, 7:], dv[2, :, 7:]):  # empty rows, padded keys: zero gradients
        assert torch.equal(grad, torch.zeros_like(grad))
    for form in forms[1:]:
        out2, lse2 = tf.attention_triton(q, k, v, mask=form, causal=causal)
        assert torch.equal(out2, out) and torch.equal(lse2, lse)


@needs_kernel
def test_mask_broadcast_over_keys():
    # A (B, 1, 1, 1) mask broadcasts over all keys (stride 0 inside the kernel): all or nothing per batch.
    q, k, v = rand(2, 1, 18, 16, seed=1), rand(2, 1, 18, 16, seed=2), rand(2, 1, 18, 16, seed=3)
    out, lse = tf.attention_triton(q, k, v, mask=torch.tensor([True, False], device=DEVICE).view(2, 1, 1, 1))
    expected, expected_lse = tf.attention_triton(q[:1], k[:1], v[:1])
    assert torch.equal(out[:1], expected) and torch.equal(lse[:1], expected_lse)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.all(lse[1] == float("-inf"))


@needs_kernel
def test_fully_masked_first_key_tile_and_per_head_masks():
    B, H, Tq, Tk, D = 2, 2, 21, 45, 16
    q, k, v = rand(B, H, Tq, D, seed=7), rand(B, H, Tk, D, seed=8), rand(B, H, Tk, D, seed=9)
    mask = torch.rand(B, H, 1, Tk, generator=torch.Generator().manual_seed(0)) < 0.6  # scattered holes
    mask[:, :, :, :16] = False  # the whole first key tile (16 wide) is padding ...
    mask[0, 1, :, :32] = False  # ... or the first two, for one head
    mask[1, 0, :, :] = False  # and one (batch, head) sees nothing
    mask[1, 0, :, 40] = True  # ... but a single late key
    run_and_compare(q, k, v, mask=mask.to(DEVICE), causal=False)
    run_and_compare(q, k, v, mask=mask.to(DEVICE), causal=True, blocks=(16, 32))


@needs_kernel
def test_large_logits_stay_finite_and_accurate():
    # Logits near +-1e4: the softmax is (nearly) one-hot, fp32 exp would overflow without the running max.
    B, H, Tq, Tk, D = 2, 2, 37, 29, 16
    q, k, v = rand(B, H, Tq, D, seed=0, scale=3e3), rand(B, H, Tk, D, seed=1), rand(B, H, Tk, D, seed=2)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    assert logits.abs().max() > 5e3
    grad_step = delta_rounding(q, k, v)  # |Q| ~ 1e4 makes this term dominate dK
    for causal in (False, True):
        run_and_compare(q, k, v, causal=causal, grad_step=grad_step)


@needs_kernel
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 2), H=st.integers(1, 2), Tq=st.integers(1, 40), Tk=st.integers(1, 40), D=st.integers(1, 72),
       Dv=st.integers(1, 72), causal=st.booleans(), padded=st.booleans(),
       blocks=st.sampled_from([(16, 16), (32, 16), (16, 32)]), seed=st.integers(0, 2**16))
def test_random_shapes(B, H, Tq, Tk, D, Dv, causal, padded, blocks, seed):
    q, k, v = rand(B, H, Tq, D, seed=seed), rand(B, H, Tk, D, seed=seed + 1), rand(B, H, Tk, Dv, seed=seed + 2)
    lengths = torch.randint(0, Tk + 1, (B,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    run_and_compare(q, k, v, mask=lengths if padded else None, causal=causal, blocks=blocks,
                    grad_step=delta_rounding(q, k, v))  # e.g. Tk = 1: every softmax row is one-hot


@needs_kernel
def test_lse_is_logsumexp_of_scaled_scores():
    q, k, v = rand(1, 2, 19, 32, seed=3), rand(1, 2, 19, 32, seed=4), rand(1, 2, 19, 32, seed=5)
    out, lse = tf.attention_triton(q, k, v, scale=0.3)
    expected = torch.logsumexp((q.double() @ k.double().transpose(-2, -1)) * 0.3, dim=-1)
    assert max_abs_error(lse, expected) < 1e-5
    assert out.dtype == q.dtype and out.shape == (1, 2, 19, 32)


@needs_kernel
def test_float16():
    q, k, v = (rand(2, 2, 33, 40, seed=s, dtype=torch.float16) for s in (1, 2, 3))
    for causal in (False, True):
        out, *_ = run_and_compare(q, k, v, causal=causal, mask=torch.tensor([33, 20], device=DEVICE))
        assert out.dtype == torch.float16


@needs_kernel
def test_strided_and_broadcast_inputs_match_contiguous():
    B, H, T, D = 2, 3, 21, 16
    q = rand(B, T, H, D, seed=1).transpose(1, 2).requires_grad_()  # (B, H, T, D) with (B, T, H, D) strides
    k_shared = rand(B, 1, T, D, seed=2).requires_grad_()  # one key head for all heads: stride 0 over H
    v = rand(B, H, D, T, seed=3).transpose(2, 3).requires_grad_()  # the feature dim is not the fastest
    out, lse = tf.attention_triton(q, k_shared.expand(B, H, T, D), v, causal=True)
    loss(out, lse).backward()
    copies = [x.detach().contiguous().requires_grad_() for x in (q, k_shared.expand(B, H, T, D), v)]
    out2, lse2 = tf.attention_triton(*copies, causal=True)
    loss(out2, lse2).backward()
    torch.testing.assert_close(out, out2)
    torch.testing.assert_close(lse, lse2)
    torch.testing.assert_close(q.grad, copies[0].grad)
    torch.testing.assert_close(k_shared.grad, copies[1].grad.sum(1, keepdim=True))
    torch.testing.assert_close(v.grad, copies[2].grad)


@needs_kernel
def test_no_keys_or_no_queries():
    q, k, v = rand(2, 1, 5, 16), rand(2, 1, 0, 16), rand(2, 1, 0, 24)
    q.requires_grad_()
    out, lse = tf.attention_triton(q, k, v)
    assert out.shape == (2, 1, 5, 24) and torch.equal(out, torch.zeros_like(out))
    assert torch.all(lse == float("-inf"))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    out, lse = tf.attention_triton(rand(2, 1, 0, 16), rand(2, 1, 4, 16), rand(2, 1, 4, 16))
    assert out.shape == (2, 1, 0, 16) and lse.shape == (2, 1, 0)


@needs_kernel
def test_triton_support_reasons(monkeypatch):
    q = rand(1, 2, 8, 16)
    assert tf.triton_support(q, q, q) == (True, "")
    assert tf.triton_support(q, q, q, mask=torch.tensor([3], device=DEVICE)) == (True, "")
    bad = {
        "4-D": (q[0], q[0], q[0], None),
        "dtype": (q.double(), q.double(), q.double(), None),
        "head dim D=129": (rand(1, 2, 8, 129),) * 3 + (None,),
        "head dim Dv=0": (q, q, q[..., :0], None),
        "same D": (q, rand(1, 2, 8, 32), rand(1, 2, 8, 32), None),
        "only key-padding": (q, q, q, torch.zeros(1, 1, 8, 8, device=DEVICE)),  # additive float mask
    }
    shaped = {"(B, 1, Tq, Tk)": torch.ones(1, 1, 8, 8, dtype=torch.bool), "3-D": torch.ones(1, 1, 8, dtype=torch.bool),
              "wrong Tk": torch.ones(1, 7, dtype=torch.bool), "lengths (B, 1)": torch.ones(1, 1, dtype=torch.long)}
    for name, mask in shaped.items():
        bad[f"only key-padding [{name}]"] = (q, q, q, mask.to(DEVICE))
    for expected, (a, b, c, mask) in bad.items():
        ok, why = tf.triton_support(a, b, c, mask=mask)
        assert not ok and expected.split(" [")[0] in why, (expected, why)
    if tf._INTERPRETED:
        ok, why = tf.triton_support(q.bfloat16(), q.bfloat16(), q.bfloat16())
        assert not ok and "bfloat16" in why and "TRITON_INTERPRET" in why
        monkeypatch.delenv("TRITON_INTERPRET")
        ok, why = tf.triton_support(q, q, q)
        assert not ok and "must stay set" in why
    if q.device.type == "cpu":
        monkeypatch.setattr(tf, "_INTERPRETED", False)
        ok, why = tf.triton_support(q, q, q)
        assert not ok and "CUDA" in why
    monkeypatch.setattr(tf, "triton", None)
    assert tf.triton_support(q, q, q) == (False, "triton is not installed (pip install attnbook[gpu])")


@needs_kernel
def test_bad_arguments_raise_clear_errors():
    q = rand(1, 1, 8, 16)
    with pytest.raises(ValueError, match="only key-padding masks are supported by the Triton backend"):
        tf.attention_triton(q, q, q, mask=torch.zeros(1, 1, 8, 8, device=DEVICE))
    with pytest.raises(ValueError, match=r"`mask` lengths must lie in 0..Tk=8, got \[9\]"):
        tf.attention_triton(q, q, q, mask=torch.tensor([9], device=DEVICE))
    with pytest.raises(TypeError, match="`causal` must be a bool"):
        tf.attention_triton(q, q, q, causal=1)
    with pytest.raises(ValueError, match="`scale` must be finite and positive"):
        tf.attention_triton(q, q, q, scale=-1.0)
    with pytest.raises(TypeError, match="`scale`"):
        tf.attention_triton(q, q, q, scale="0.5")
    with pytest.raises(TypeError, match="dtype"):
        tf.attention_triton(q, q.double(), q)
    with pytest.raises(TypeError, match="`k` must be a torch.Tensor"):
        tf.attention_triton(q, q.tolist(), q)
    with pytest.raises(ValueError, match=r"same D .* got q \(1, 1, 8, 16\), k \(1, 1, 8, 24\)"):
        tf.attention_triton(q, rand(1, 1, 8, 24), rand(1, 1, 8, 24))
    if tf._INTERPRETED:
        with pytest.raises(RuntimeError, match="bfloat16"):
            tf.attention_triton(q.bfloat16(), q.bfloat16(), q.bfloat16())


def test_module_imports_and_reports_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("_triton_flash_without_triton", tf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q = torch.randn(1, 1, 4, 16)
    assert module.triton_support(q, q, q) == (False, "triton is not installed (pip install attnbook[gpu])")
    with pytest.raises(RuntimeError, match=r"pip install attnbook\[gpu\]"):
        module.attention_triton(q, q, q)


# Compiles (without running) every kernel for an H100/H200-class target (sm_90) in a process without
# TRITON_INTERPRET: type errors in loop-carried values, bad tl.dot shapes and shared memory beyond
# the target's limit only show up in compilation, which the interpreter skips. ptxas ships with
# triton, so no GPU is needed. Triton APIs this relies on that are missing give "SKIP".
_COMPILE_SCRIPT = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from attnbook import triton_flash as tf
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler.errors import CompilationError
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
except Exception as exc:
    sys.exit(print("SKIP", type(exc).__name__, exc))
POINTERS = {"KM": "*i8", **{n: "*fp32" for n in ("LSE", "M", "LOGL", "DELTA", "DLSE")},
            **{n: "*fp16" for n in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")}}
def compile_kernel(fn, consts, warps, stages):
    sig = {n: "constexpr" if n in consts else POINTERS.get(n, "fp32" if n == "scale" else "i32")
           for n in fn.arg_names}
    try:
        options = backend.parse_options({"num_warps": warps, "num_stages": stages}).__dict__
        compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=target, options=options)
    except CompilationError:
        raise
    except Exception as exc:
        if "ptxas" in type(exc).__name__.lower():
            raise
        sys.exit(print("SKIP", type(exc).__name__, str(exc)[:300]))
    assert compiled.metadata.shared <= 232448, (fn.__name__, consts, compiled.metadata.shared)
for name in ("fwd", "dkdv", "dq"):
    kernel, tuned, _ = tf._KERNELS[name]
    config = tuned.configs[0]  # the largest tiles of each list
    consts = dict(HAS_MASK=True, CAUSAL=True, BLOCK_D=64, BLOCK_DV=64, **config.kwargs)
    compile_kernel(kernel, consts, config.num_warps, config.num_stages)
compile_kernel(tf._attn_bwd_preprocess, dict(BLOCK_Q=64, BLOCK_DV=64), 4, 2)
print("COMPILED")
"""


@pytest.mark.skipif(tf.triton is None, reason="triton is not installed")
def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    if result.stdout.startswith("SKIP"):
        pytest.skip(f"this triton cannot compile ahead of time here: {result.stdout.strip()}")
    assert result.returncode == 0 and "COMPILED" in result.stdout, result.stderr[-3000:]


GPU_CASES = {  # B, H, Tq, Tk, D, causal, key lengths or None
    "d64-causal-padded": (2, 4, 1000, 1000, 64, True, (1000, 300)),
    "d128-causal-Tq<Tk": (1, 4, 700, 1100, 128, True, None),
    "d80-Tq>Tk-padded": (2, 2, 900, 513, 80, False, (513, 0)),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_autotuned_kernel_matches_reference(case, dtype):
    # float32 here is what catches TF32: torch's matmul (the naive kernel) is true fp32 by default.
    B, H, Tq, Tk, D, causal, lengths = case
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bfloat16 needs compute capability >= 8.0")
    q, k, v = rand(B, H, Tq, D, seed=1, dtype=dtype), rand(B, H, Tk, D, seed=2, dtype=dtype), rand(
        B, H, Tk, D, seed=3, dtype=dtype)
    mask = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    run_and_compare(q, k, v, mask=mask, causal=causal)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_bfloat16_needs_ampere(monkeypatch):
    q = rand(1, 1, 8, 16, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    ok, why = tf.triton_support(q, q, q)
    assert not ok and "compute capability >= 8.0" in why
