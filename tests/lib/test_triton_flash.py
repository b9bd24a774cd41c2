"""Tests for the fused Triton FlashAttention kernel (lib/attnbook/triton_flash.py, triton_kernels.py).

Without CUDA the kernels run under Triton's interpreter (TRITON_INTERPRET=1), which executes
every program one after another with numpy on the CPU. That checks the algorithm: tiling and
tails of every size, Tq != Tk, causal tile skipping and the two causal stages, key padding,
empty rows, hidden NaN / inf, the online softmax, the log-sum-exp and the whole backward pass,
against a float64 reference. It cannot catch:
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
import inspect
import math
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnbook._policy import DOUBLE_BACKWARD_ERROR
from attnbook.reference import attention_ref, padding_mask, visible_keys
from attnbook.testing import assert_close_to_reference, max_abs_error
from attnbook.tolerance import rounding_step
from attnbook.testing import NEG_INF, import_triton_flash, lse_ref
from attnbook.testing import rand as _rand

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# TRITON_INTERPRET is set for the import only (conftest.import_triton_flash) and again for this
# module's tests (fixture below), so that the rest of the session never sees it.
tf = import_triton_flash()

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
    """conftest's seeded normal tensor, float32 by default, on the device the kernel runs on."""
    return _rand(*shape, seed=seed, dtype=dtype, scale=scale).to(DEVICE)


def key_padding(lengths, tk):
    """``padding_mask(lengths, tk)`` -> (B, 1, 1, Tk) on the kernel's device."""
    return padding_mask(lengths, tk).to(DEVICE)


def reference(q, k, v, *, mask=None, causal=False, scale=None, dtype=torch.float64):
    """attention_ref's out and conftest's masked-lse oracle, in `dtype`, with autograd.

    An empty row gets lse = -inf with a zero gradient: the oracle is asked about it with every key
    open, and the result is replaced by -inf (logsumexp of an all -inf row has a NaN gradient).
    """
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    out = attention_ref(q, k, v, mask=mask, causal=causal, scale=scale).out
    shape = (*q.shape[:3], k.shape[2])  # (B, H, Tq, Tk)
    vis = visible_keys(mask, causal, shape[2], shape[3], device=q.device).expand(shape)
    has_key = vis.any(-1)  # (B, H, Tq)
    lse = lse_ref(q, k, vis | ~has_key[..., None], scale=scale).masked_fill(~has_key, NEG_INF)
    return (q, k, v), out, lse


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


def recompute_rounding(q, k, v, *, mask=None, causal=False, scale=None):
    """Extra error allowed in dq, dk, dv because the backward recomputes P instead of keeping it.

    FlashAttention's backward recomputes S = scale * Q K^T tile by tile and P = exp(S - lse) with
    the forward's lse. The same dot product summed in another order (another tile shape, another
    BLAS kernel under the interpreter: FMA or not) differs by a few fp32 rounding steps of
    scale * |q_i| . |k_j|, and lse carries its own; so P_ij moves by a relative
    delta_ij = 4 eps scale (|q_i| . |k_j|). The naive backward reuses the P it saved: it has no
    such term, and the 3 x naive rule cannot cover it. To first order dS_ij = P_ij (dP_ij - D_i +
    dlse_i) moves by delta_ij P_ij |dP_ij - D_i + dlse_i|, which dq = scale dS K and
    dk = scale dS^T Q carry; dv = P^T dO moves by delta_ij P_ij |dO_i|. Computed in float64 from
    the upstream gradients `loss` uses. With logits near 1e4 (one fp32 step there is 1e-3) this
    dominates dk; on an AMD EPYC (OpenBLAS's Haswell kernels) it is what the large-logit case
    needed, where an Intel Xeon's kernels happened to agree between the two passes.
    """
    q64, k64, v64 = (x.detach().double() for x in (q, k, v))
    scale = scale or 1 / math.sqrt(q.shape[-1])
    s = scale * (q64 @ k64.transpose(-2, -1))
    vis = visible_keys(mask, causal, s.shape[-2], s.shape[-1], device=s.device).expand(s.shape)
    p = torch.softmax(s.masked_fill(~vis, -math.inf), dim=-1).nan_to_num(0.0)
    g_out = rand(*q.shape[:3], v.shape[-1], seed=1, dtype=torch.float64)
    g_lse = rand(*q.shape[:3], seed=2, dtype=torch.float64).masked_fill(~vis.any(-1), 0.0)
    dp = g_out @ v64.transpose(-2, -1)
    g = (dp - (p * dp).sum(-1, keepdim=True) + g_lse[..., None]).abs()
    w = 4 * torch.finfo(torch.float32).eps * scale * (q64.abs() @ k64.abs().transpose(-2, -1)) * p
    bounds = {"dq": scale * (w * g) @ k64.abs(), "dk": scale * (w * g).transpose(-2, -1) @ q64.abs(),
              "dv": w.transpose(-2, -1) @ g_out.abs()}
    shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}  # a broadcast input sums its heads
    return {n: float(b.sum_to_size(shapes[n]).max()) if b.numel() else 0.0 for n, b in bounds.items()}


def run_and_compare(q, k, v, *, mask=None, causal=False, scale=None, blocks=None, grad_step=None):
    """Kernel vs float64 reference by the FlashAttention rule, for out, lse, dq, dk, dv."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    res = tf._attention_triton(q, k, v, mask, causal, scale or 1 / math.sqrt(q.shape[-1]), blocks)
    assert res.weights is None and res.lse.dtype == torch.float32 and res.lse.shape == q.shape[:3]
    loss(res.out, res.lse).backward()
    results = {}
    for dtype in (torch.float64, q.dtype):
        inputs, r_out, r_lse = reference(q, k, v, mask=mask, causal=causal, scale=scale, dtype=dtype)
        loss(r_out, r_lse).backward()
        results[dtype] = (r_out, r_lse, *(x.grad for x in inputs))
    assert torch.equal(torch.isinf(res.lse), torch.isinf(results[torch.float64][1]))  # same empty rows
    finite = torch.isfinite(results[torch.float64][1])
    recomp = recompute_rounding(q, k, v, mask=mask, causal=causal, scale=scale)
    names = ("out", "lse", "dq", "dk", "dv")
    for i, (name, actual) in enumerate(zip(names, (res.out, res.lse, q.grad, k.grad, v.grad))):
        ref64, naive = results[torch.float64][i], results[q.dtype][i]
        if name == "lse":
            actual, naive, ref64 = actual[finite], naive[finite], ref64[finite]
        factor = 2.0 if name in ("out", "lse") else 3.0
        extra = recomp.get(name, 0.0)  # the backward's recomputed P (recompute_rounding)
        if grad_step and name in grad_step:
            err, base = max_abs_error(actual, ref64), max_abs_error(naive, ref64)
            bound = factor * base + grad_step[name] + extra
            assert err <= bound, (f"{name}: error {err:.3e} > {factor} x naive {base:.3e} + {grad_step[name]:.3e}"
                                  f" + recompute {extra:.3e}")
        else:
            step = rounding_step(ref64, actual.dtype) + extra if actual.dtype != torch.float64 else None
            assert_close_to_reference(actual, naive.to(actual.dtype), ref64, factor=factor, name=name, step=step)
    return res.out, res.lse, q.grad, k.grad, v.grad


# ---------------------------------------------------------------------------------------------
# Against the float64 reference
# ---------------------------------------------------------------------------------------------

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
    # Causal row 0 sees key 0 only: a one-hot softmax row, where the naive backward is exact by luck.
    run_and_compare(q, k, v, causal=causal, blocks=blocks, grad_step=delta_rounding(q, k, v) if causal else None)


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_and_empty_rows_get_zero_output_and_gradients(causal):
    B, H, Tq, Tk, D = 3, 2, 20, 19, 16
    q, k, v = rand(B, H, Tq, D, seed=4), rand(B, H, Tk, D, seed=5), rand(B, H, Tk, D, seed=6)
    mask = key_padding([19, 0, 7], Tk)  # batch row 1 has no real key at all
    out, lse, dq, dk, dv = run_and_compare(q, k, v, mask=mask, causal=causal)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.all(lse[1] == NEG_INF)
    for grad in (dq[1], dk[1], dv[1], dk[2, :, 7:], dv[2, :, 7:]):  # empty rows, padded keys: zero gradients
        assert torch.equal(grad, torch.zeros_like(grad))


@needs_kernel
def test_every_key_padding_mask_form_gives_the_same_result():
    # One key pattern per head, written in every form that broadcasts to (B, H, Tq, Tk) with query dim 1.
    B, H, Tq, Tk, D = 2, 2, 17, 18, 16
    q, k, v = rand(B, H, Tq, D, seed=1), rand(B, H, Tk, D, seed=2), rand(B, H, Tk, D, seed=3)
    keys = torch.arange(Tk, device=DEVICE) % 3 != 1  # (Tk,)
    full = tf.attention_triton(q, k, v, mask=keys.expand(B, H, 1, Tk))
    for form in (keys, keys[None], keys[None, None], keys.expand(H, 1, Tk), keys[None, None, None]):
        res = tf.attention_triton(q, k, v, mask=form)
        assert torch.equal(res.out, full.out) and torch.equal(res.lse, full.lse), tuple(form.shape)
    no_mask = tf.attention_triton(q, k, v)
    for every_key in (torch.tensor(True), torch.ones(1, 1, 1, 1, dtype=torch.bool)):  # all keys visible
        res = tf.attention_triton(q, k, v, mask=every_key.to(DEVICE))
        assert torch.equal(res.out, no_mask.out) and torch.equal(res.lse, no_mask.lse)


@needs_kernel
def test_mask_broadcast_over_keys():
    # A (B, 1, 1, 1) mask broadcasts over all keys (stride 0 inside the kernel): all or nothing per batch.
    q, k, v = rand(2, 1, 18, 16, seed=1), rand(2, 1, 18, 16, seed=2), rand(2, 1, 18, 16, seed=3)
    res = tf.attention_triton(q, k, v, mask=torch.tensor([True, False], device=DEVICE).view(2, 1, 1, 1))
    expected = tf.attention_triton(q[:1], k[:1], v[:1])
    assert torch.equal(res.out[:1], expected.out) and torch.equal(res.lse[:1], expected.lse)
    assert torch.equal(res.out[1], torch.zeros_like(res.out[1])) and torch.all(res.lse[1] == NEG_INF)


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
    B, H, Tq, Tk, D = 1, 2, 37, 29, 16
    q, k, v = rand(B, H, Tq, D, seed=0, scale=3e3), rand(B, H, Tk, D, seed=1), rand(B, H, Tk, D, seed=2)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    assert logits.abs().max() > 5e3
    grad_step = delta_rounding(q, k, v)  # |Q| ~ 1e4 makes this term dominate dK
    for causal in (False, True):
        run_and_compare(q, k, v, causal=causal, grad_step=grad_step)


@needs_kernel
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 2), H=st.integers(1, 2), Tq=st.integers(1, 40), Tk=st.integers(1, 40), D=st.integers(1, 72),
       Dv=st.integers(1, 72), causal=st.booleans(), padded=st.booleans(),
       blocks=st.sampled_from([(16, 16), (32, 16), (16, 32)]), seed=st.integers(0, 2**16))
@example(B=1, H=1, Tq=1, Tk=1, D=1, Dv=1, causal=True, padded=False, blocks=(16, 16), seed=0).via("one key, D = 1")
@example(B=2, H=1, Tq=33, Tk=17, D=72, Dv=3, causal=True, padded=True, blocks=(16, 16), seed=3).via(
    "Tq > Tk causal: rows past Tk see every key; D above a power of two")
@example(B=1, H=2, Tq=16, Tk=32, D=16, Dv=16, causal=True, padded=True, blocks=(16, 32), seed=5).via(
    "T exactly one tile: no tail, the diagonal stage only")
def test_random_shapes(B, H, Tq, Tk, D, Dv, causal, padded, blocks, seed):
    q, k, v = rand(B, H, Tq, D, seed=seed), rand(B, H, Tk, D, seed=seed + 1), rand(B, H, Tk, Dv, seed=seed + 2)
    lengths = torch.randint(0, Tk + 1, (B,), generator=torch.Generator().manual_seed(seed))
    run_and_compare(q, k, v, mask=key_padding(lengths, Tk) if padded else None, causal=causal, blocks=blocks,
                    grad_step=delta_rounding(q, k, v))  # e.g. Tk = 1: every softmax row is one-hot


@needs_kernel
def test_float16():
    q, k, v = (rand(2, 1, 33, 40, seed=s, dtype=torch.float16) for s in (1, 2, 3))
    out, *_ = run_and_compare(q, k, v, causal=True, mask=key_padding([33, 20], 33))
    assert out.dtype == torch.float16


@needs_kernel
def test_strided_and_broadcast_inputs_match_contiguous():
    B, H, T, D = 2, 2, 18, 16
    q = rand(B, T, H, D, seed=1).transpose(1, 2).requires_grad_()  # (B, H, T, D) with (B, T, H, D) strides
    k_shared = rand(B, 1, T, D, seed=2).requires_grad_()  # one key head for all heads: stride 0 over H
    v = rand(B, H, D, T, seed=3).transpose(2, 3).requires_grad_()  # the feature dim is not the fastest
    res = tf.attention_triton(q, k_shared.expand(B, H, T, D), v, causal=True)
    loss(res.out, res.lse).backward()
    copies = [x.detach().contiguous().requires_grad_() for x in (q, k_shared.expand(B, H, T, D), v)]
    res2 = tf.attention_triton(*copies, causal=True)
    loss(res2.out, res2.lse).backward()
    torch.testing.assert_close(res.out, res2.out)
    torch.testing.assert_close(res.lse, res2.lse)
    torch.testing.assert_close(q.grad, copies[0].grad)
    torch.testing.assert_close(k_shared.grad, copies[1].grad.sum(1, keepdim=True))
    torch.testing.assert_close(v.grad, copies[2].grad)


@needs_kernel
def test_empty_batch_heads_queries_or_keys():
    q = rand(2, 1, 5, 16).requires_grad_()
    for causal in (False, True):  # no key at all: zeros, lse = -inf, zero gradients
        res = tf.attention_triton(q, rand(2, 1, 0, 16), rand(2, 1, 0, 24), causal=causal)
        assert torch.equal(res.out, torch.zeros(2, 1, 5, 24, device=DEVICE)) and torch.all(res.lse == NEG_INF)
        res.out.sum().backward()
        assert torch.equal(q.grad, torch.zeros_like(q))
    for shape in ((2, 1, 0, 16), (0, 2, 5, 16), (2, 0, 5, 16)):  # no query, no batch, no head
        x = rand(*shape)
        res = tf.attention_triton(x, x, x, causal=True)
        assert res.out.shape == shape and res.lse.shape == shape[:3]


# ---------------------------------------------------------------------------------------------
# Hidden keys never reach the output (issue 6, defect 6)
# ---------------------------------------------------------------------------------------------

def _garbage(x, where, seed):
    """x with NaN, +inf and -inf (in turn, along the last dim) in the rows of keys where `where` (B, H, Tk)."""
    junk = torch.tensor([float("nan"), float("inf"), float("-inf")], device=x.device)
    junk = junk[(torch.arange(x.shape[-1], device=x.device) + seed) % 3].expand(x.shape)
    return torch.where(where[..., None], junk, x)


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_hidden_keys_holding_nan_or_inf_never_reach_output_or_gradients(causal):
    # Keys hidden from every query (padding; with causal and Tq < Tk also keys j >= Tq) hold NaN / inf
    # in k and v. The result equals the float64 reference and, bit for bit, the kernel on clean inputs;
    # batch row 2 sees no key at all and stays exactly 0.
    B, H, Tq, Tk, D = 3, 2, 15, 19, 16
    q, k, v = rand(B, H, Tq, D, seed=1), rand(B, H, Tk, D, seed=2), rand(B, H, Tk, D, seed=3)
    mask = key_padding([19, 7, 0], Tk)
    hidden = ~visible_keys(mask, causal, Tq, Tk, device=DEVICE).expand(B, H, Tq, Tk).any(-2)  # (B, H, Tk)
    assert hidden[0].any() == causal and hidden[1, :, 7:].all() and hidden[2].all()
    k_bad, v_bad = _garbage(k, hidden, 0), _garbage(v, hidden, 1)
    results = []
    for inputs in ((q, k_bad, v_bad), (q, k, v)):
        leaves = [x.detach().requires_grad_() for x in inputs]
        res = tf.attention_triton(*leaves, mask=mask, causal=causal)
        loss(res.out, res.lse).backward()
        results.append((res.out, res.lse, *(x.grad for x in leaves)))
    for name, bad, clean in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(bad, clean), name
    out, lse = results[0][:2]
    expected = attention_ref(q.double(), k_bad.double(), v_bad.double(), mask=mask, causal=causal)
    torch.testing.assert_close(out.double(), expected.out, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse.double(), expected.lse, rtol=0, atol=1e-5)  # -inf rows included
    assert torch.equal(out[2], torch.zeros_like(out[2]))


@needs_kernel
def test_visible_nan_and_inf_in_v_reach_the_output_as_in_the_reference():
    # Causal, so row i sees keys 0..i: a NaN in key 5's value reaches rows 5.. only, +inf and -inf from
    # two keys give NaN from the later key's row on. Everything else stays as the clean computation.
    B, H, T, D = 1, 2, 20, 16
    q, k, v = rand(B, H, T, D, seed=1), rand(B, H, T, D, seed=2), rand(B, H, T, 4, seed=3)
    v[:, :, 5, 0] = float("nan")
    v[:, :, 8, 1] = float("inf")
    v[:, :, 3, 2], v[:, :, 12, 2] = float("inf"), float("-inf")
    out = tf.attention_triton(q, k, v, causal=True).out
    expected = attention_ref(q.double(), k.double(), v.double(), causal=True).out
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(test(out), test(expected)), test.__name__
    assert torch.isnan(out[0, 0, :5, 0]).sum() == 0 and torch.isnan(out[0, 0, 5:, 0]).all()
    finite = torch.isfinite(expected)
    torch.testing.assert_close(out.double()[finite], expected[finite], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Gradients of gradients (issue 6, defect 5)
# ---------------------------------------------------------------------------------------------

@needs_kernel
def test_double_backward_raises_a_clear_error():
    q, k, v = (rand(1, 1, 8, 16, seed=s).requires_grad_() for s in (1, 2, 3))
    message = re.escape(DOUBLE_BACKWARD_ERROR.format(fn="attention_triton"))
    out = tf.attention_triton(q, k, v).out
    with pytest.raises(RuntimeError, match=message):  # a gradient penalty
        g, = torch.autograd.grad(out.sum(), q, create_graph=True)
        (g ** 2).sum().backward()
    with warnings.catch_warnings():  # gradgradcheck warns that the inputs are not float64
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(RuntimeError, match=message):
            torch.autograd.gradgradcheck(lambda q, k, v: tf.attention_triton(q, k, v).out, (q, k, v))
    g, = torch.autograd.grad(tf.attention_triton(q, k, v).out.sum(), q)  # first derivatives still work
    (q64, k64, v64), out64, _ = reference(q, k, v)
    g64, = torch.autograd.grad(out64.sum(), q64)
    torch.testing.assert_close(g.double(), g64, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# What the kernel serves, and errors
# ---------------------------------------------------------------------------------------------

@needs_kernel
def test_triton_support_reasons(monkeypatch):
    q = rand(1, 2, 8, 16)
    for mask in (None, key_padding([3], 8), torch.tensor(True), torch.ones(8, dtype=torch.bool),
                 torch.ones(1, 8, dtype=torch.bool), torch.ones(2, 1, 8, dtype=torch.bool)):
        assert tf.triton_support(q, q, q, None if mask is None else mask.to(DEVICE)) == (True, "")
    bad = {
        "4-D (B, H, T, D)": (q[0], q[0], q[0], None),
        "fp32 only, got float64": (q.double(), q.double(), q.double(), None),
        "head dim D=129": (rand(1, 2, 8, 129),) * 3 + (None,),
        "head dim Dv=0": (q, q, q[..., :0], None),
        "bool key-padding masks only, got an additive torch.float32 mask": (q, q, q, torch.zeros(8, device=DEVICE)),
        "query dim of the mask (dim -2) must be 1, got a mask of shape (8, 8)":
            (q, q, q, torch.ones(8, 8, dtype=torch.bool, device=DEVICE)),  # 2-D means (Tq, Tk)
        "got a mask of shape (1, 1, 8, 8)": (q, q, q, torch.ones(1, 1, 8, 8, dtype=torch.bool, device=DEVICE)),
    }
    for expected, (a, b, c, mask) in bad.items():
        ok, why = tf.triton_support(a, b, c, mask)
        assert not ok and expected in why, (expected, why)
    if tf._INTERPRETED:
        ok, why = tf.triton_support(q.bfloat16(), q.bfloat16(), q.bfloat16())
        assert not ok and "bfloat16" in why and "TRITON_INTERPRET" in why
        monkeypatch.delenv("TRITON_INTERPRET")
        ok, why = tf.triton_support(q, q, q)
        assert not ok and "must stay set" in why
    if q.device.type == "cpu":
        monkeypatch.setattr(tf, "_INTERPRETED", False)
        ok, why = tf.triton_support(q, q, q)
        assert not ok and "needs CUDA tensors" in why
    monkeypatch.setattr(tf, "triton", None)
    assert tf.triton_support(q, q, q) == (False, "triton is not installed (pip install attnbook[gpu])")


@needs_kernel
def test_bad_arguments_raise_the_library_wide_errors():
    q = rand(1, 1, 8, 16)
    fn = "attention_triton: "
    cases = [  # (kwargs or positional override, exception, message) - the _checks wording, prefixed
        (dict(causal=1), TypeError, fn + "`causal` must be a bool, got 1"),
        (dict(scale=-1.0), ValueError, fn + r"`scale` must lie in \(0, inf\), got -1.0"),
        (dict(scale="0.5"), TypeError, fn + "`scale` must be a finite number"),
        (dict(mask=torch.tensor([3])), TypeError, fn + "`mask` must be bool"),  # lengths: use padding_mask
        (dict(mask=torch.ones(2, 8, dtype=torch.bool)), ValueError,
         fn + r"`mask` of shape \(2, 8\) does not broadcast"),  # (B, Tk) is not a form: 2-D is (Tq, Tk)
        (dict(mask=torch.zeros(1, 1, 1, 8)), ValueError, fn + "the Triton kernel takes bool key-padding masks only"),
        (dict(mask=torch.ones(8, 8, dtype=torch.bool)), ValueError, fn + "the Triton kernel takes key-padding masks"),
    ]
    for kwargs, exc, message in cases:
        kwargs = {key: val.to(DEVICE) if isinstance(val, torch.Tensor) else val for key, val in kwargs.items()}
        with pytest.raises(exc, match=message):
            tf.attention_triton(q, q, q, **kwargs)
    with pytest.raises(TypeError, match=fn + "q, k, v must share one dtype"):
        tf.attention_triton(q, q.double(), q)
    with pytest.raises(TypeError, match=fn + "`k` must be a torch.Tensor, got list"):
        tf.attention_triton(q, q.tolist(), q)
    with pytest.raises(ValueError, match=fn + "q and k must have the same feature dim D"):
        tf.attention_triton(q, rand(1, 1, 8, 24), rand(1, 1, 8, 24))
    with pytest.raises(TypeError, match=fn + "fp16, bf16 or fp32 only, got float64"):
        tf.attention_triton(q.double(), q.double(), q.double())
    if tf._INTERPRETED:
        with pytest.raises(RuntimeError, match=fn + "bfloat16 is not supported under TRITON_INTERPRET=1"):
            tf.attention_triton(q.bfloat16(), q.bfloat16(), q.bfloat16())


@needs_kernel
def test_fixed_tiles_are_validated_and_every_form_gives_the_same_result():
    q, k, v = rand(1, 2, 40, 16, seed=1), rand(1, 2, 23, 16, seed=2), rand(1, 2, 23, 16, seed=3)
    pair = tf.attention_triton(q, k, v, causal=True, blocks=(16, 32))
    config = dict(tf.tile_configs(torch.float16)[0], fwd=(16, 32, 4, 2))  # one tile config per kernel
    assert torch.equal(tf.attention_triton(q, k, v, causal=True, blocks=config).out, pair.out)
    for bad in ((16, 24), (8, 16), [16, 16], (16, True), {"fwd": (16, 16, 4, 2)}, "auto",
                dict(config, dq=(16, 16, 0, 1))):
        with pytest.raises(ValueError, match=r"attention_triton: `blocks` must be None, \(BLOCK_Q, BLOCK_K\)"):
            tf.attention_triton(q, k, v, blocks=bad)


def test_module_imports_and_reports_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    spec = importlib.util.spec_from_file_location("attnbook._triton_flash_without_triton", tf.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # relative imports resolve inside the attnbook package
    assert module.kernels is None
    q = torch.randn(1, 1, 4, 16)
    assert module.triton_support(q, q, q) == (False, "triton is not installed (pip install attnbook[gpu])")
    with pytest.raises(RuntimeError, match=r"attention_triton: triton is not installed \(pip install attnbook\[gpu\]"):
        module.attention_triton(q, q, q)


# ---------------------------------------------------------------------------------------------
# Tiles and autotuning
# ---------------------------------------------------------------------------------------------

def test_one_rounding_rule_for_head_dims_and_lengths():
    assert [tf.head_dim_bucket(d) for d in (1, 15, 16, 17, 32, 33, 40, 64, 65, 100, 128)] == \
        [16, 16, 16, 32, 32, 64, 64, 64, 128, 128, 128]
    assert [tf.length_bucket(t) for t in (1, 2, 3, 4, 5, 1000, 1024, 1025)] == [1, 2, 4, 4, 8, 1024, 1024, 2048]


@pytest.mark.skipif(tf.triton is None, reason="triton is not installed")
def test_tile_configs_cover_every_entry_the_autotuner_can_pick():
    configs = tf.tile_configs(torch.float16)
    for name, (_, tuned, fp32_tile) in tf.kernels.KERNELS.items():
        entries = {(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in tuned.configs}
        assert {c[name] for c in configs} == entries, name
        assert tf.tile_configs(torch.float32)[0][name] == fp32_tile
    assert len(tf.tile_configs(torch.float32)) == 1 and tf.tile_configs(torch.bfloat16) == configs


class _Recorder:
    """Stands in for an autotuned kernel: records the autotuning key of every launch, runs nothing."""

    def __init__(self, kernel, tuned, keys):
        self.names, self.tuning_key, self.keys = list(inspect.signature(kernel.fn).parameters), tuned.keys, keys

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound = {**dict(zip(self.names, args)), **kwargs}
            self.keys.append(tuple(bound[name] for name in self.tuning_key))
        return launch


@pytest.mark.skipif(tf.triton is None, reason="triton is not installed")
def test_kv_cache_decoding_retunes_only_when_tk_crosses_a_power_of_two(monkeypatch):
    assert tf.kernels.TUNE_KEY == tf.kernels.KERNELS["fwd"][1].keys  # what the real autotuners key on
    assert not {"Tq", "Tk"} & set(tf.kernels.TUNE_KEY)
    keys = {name: [] for name in tf.kernels.KERNELS}
    for name, (kernel, tuned, tile) in list(tf.kernels.KERNELS.items()):
        monkeypatch.setitem(tf.kernels.KERNELS, name, (kernel, _Recorder(kernel, tuned, keys[name]), tile))
    monkeypatch.setattr(tf, "_INTERPRETED", False)  # take the GPU's autotuned path (nothing is launched)
    tks = range(1, 300)
    q = torch.zeros(1, 2, 1, 64, dtype=torch.float16)  # one new token per step
    for tk in tks:
        kv = torch.zeros(1, 2, tk, 64, dtype=torch.float16)
        km, has_mask = tf._key_mask(None, 1, 2, tk, "cpu")
        tf._forward(q, kv, kv, km, has_mask, False, 0.125, None)
    buckets = [tf.length_bucket(tk) for tk in tks]
    assert len(keys["fwd"]) == len(tks) and len(set(keys["fwd"])) == len(set(buckets)) == 10  # 1, 2, ..., 512
    for (a, b), (ka, kb) in zip(zip(buckets, buckets[1:]), zip(keys["fwd"], keys["fwd"][1:])):
        assert (ka == kb) == (a == b)  # the key changes exactly where the bucket does


# Compiles (without running) every kernel for an H100/H200-class target (sm_90) in a process without
# TRITON_INTERPRET: type errors in loop-carried values, bad tl.dot shapes and shared memory beyond
# the target's limit only show up in compilation, which the interpreter skips. ptxas ships with
# triton, so no GPU is needed. Triton APIs this relies on that are missing give "SKIP". It also pins
# what triton_kernels' docstring says of tl.exp: fp32 exponentials become the base-2 ex2.approx.
_COMPILE_SCRIPT = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from attnbook import triton_kernels as kernels
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
    return compiled
for name in ("fwd", "dkdv", "dq"):
    kernel, tuned, _ = kernels.KERNELS[name]
    config = tuned.configs[0]  # the largest tiles of each list
    consts = dict(HAS_MASK=True, CAUSAL=True, BLOCK_D=64, BLOCK_DV=64, **config.kwargs)
    if name == "dq":
        consts["K_NONFINITE"] = True
    compiled = compile_kernel(kernel, consts, config.num_warps, config.num_stages)
    assert "ex2.approx" in compiled.asm["ptx"], name
compile_kernel(kernels.attn_bwd_preprocess, dict(BLOCK_Q=64, BLOCK_DV=64), 4, 2)
print("COMPILED")
"""


@pytest.mark.slow
@pytest.mark.skipif(tf.triton is None, reason="triton is not installed")
def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the default of triton 3.9, stated (it warns otherwise)
    result = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    if result.stdout.startswith("SKIP"):
        pytest.skip(f"this triton cannot compile ahead of time here: {result.stdout.strip()}")
    assert result.returncode == 0 and "COMPILED" in result.stdout, result.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------------

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
    run_and_compare(q, k, v, mask=None if lengths is None else key_padding(lengths, Tk), causal=causal)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_bfloat16_needs_ampere(monkeypatch):
    q = rand(1, 1, 8, 16, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    ok, why = tf.triton_support(q, q, q)
    assert not ok and "compute capability >= 8.0" in why
