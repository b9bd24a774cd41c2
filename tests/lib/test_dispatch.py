"""Tests for attnbook.attention (the dispatcher): every backend returns the same thing."""
import math

import pytest
import torch

import attnbook
from attnbook import attention, attention_ref, choose_backend
from attnbook import dispatch
from attnbook.testing import assert_close_to_reference
from attnbook.testing import CPU_BACKENDS, F64_TOL as F64, rand


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk", [(7, 7), (5, 9), (9, 5)])
def test_backends_agree_float64(backend, causal, tq, tk):
    q, k, v = rand(2, 3, tq, 8), rand(2, 3, tk, 8, seed=1), rand(2, 3, tk, 6, seed=2)
    mask = rand(tq, tk, seed=3) > -0.3
    mask[2] = False  # one fully masked row
    expected = attention_ref(q, k, v, mask=mask, causal=causal).out
    out = attention(q, k, v, mask=mask, causal=causal, backend=backend)
    torch.testing.assert_close(out, expected, **F64)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backends_float32_flash_rule(backend):
    q, k, v = rand(1, 2, 70, 16), rand(1, 2, 70, 16, seed=1), rand(1, 2, 70, 16, seed=2)
    ref64 = attention_ref(q, k, v, causal=True).out
    naive32 = attention_ref(q.float(), k.float(), v.float(), causal=True).out
    out = attention(q.float(), k.float(), v.float(), causal=True, backend=backend)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, naive32, ref64, name=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backends_gradients_agree(backend):
    q, k, v = (rand(1, 2, 6, 4, seed=s).requires_grad_() for s in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[4] = False
    grads_ref = torch.autograd.grad(attention_ref(q, k, v, mask=mask).out.square().sum(), (q, k, v))
    grads = torch.autograd.grad(attention(q, k, v, mask=mask, backend=backend).square().sum(), (q, k, v))
    for g, gr in zip(grads, grads_ref):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, gr, **F64)


def test_sdpa_with_causal_and_mask_together():
    q, k, v = rand(1, 4, 4), rand(1, 4, 4, seed=1), rand(1, 4, 4, seed=2)
    mask = torch.tensor([True, False, True, True])
    for m in (mask, torch.where(mask, 0.0, float("-inf")).double()):
        out = attention(q, k, v, mask=m, causal=True, backend="sdpa")
        torch.testing.assert_close(out, attention_ref(q, k, v, mask=m, causal=True).out, **F64)


def test_auto_on_cpu_is_tiled_and_never_fails():
    q = rand(1, 1, 5, 4)
    assert choose_backend(q, q, q) == "tiled"
    torch.testing.assert_close(attention(q, q, q), attention_ref(q, q, q).out, **F64)


def test_triton_on_cpu_without_interpreter_raises_clearly(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = rand(1, 1, 5, 16, dtype=torch.float32)
    ok, why = dispatch.BACKENDS["triton"].supports(q, q, q, None)
    if ok:  # the interpreter was enabled when the kernel module was first imported
        pytest.skip("Triton kernel is usable here (TRITON_INTERPRET=1 was set at import)")
    with pytest.raises(RuntimeError, match="triton"):
        attention(q, q, q, backend="triton")
    assert why


def test_unknown_backend_and_bad_causal():
    q = rand(1, 3, 4)
    with pytest.raises(ValueError, match="attention: `backend` must be one of"):
        attention(q, q, q, backend="fast")
    with pytest.raises(TypeError, match="`causal`"):
        attention(q, q, q, causal=1)


def test_only_key_padding_masks_reach_triton():
    """A 2-D mask means (Tq, Tk) everywhere: the registry's Triton entry refuses it unless Tq == 1."""
    q = rand(2, 3, 4, 16, dtype=torch.float32)
    ok, why = dispatch.BACKENDS["triton"].supports(q, q, q, torch.ones(4, 4, dtype=torch.bool))
    assert not ok and why


# ---------------------------------------------------------------------------------------------
# Every CPU backend, every mask form, low precision, learned biases (review regressions)
# ---------------------------------------------------------------------------------------------

MASK_SHAPES = [(), (6,), (1, 6), (5, 6), (2, 1, 1, 6), (1, 3, 5, 1), (2, 3, 5, 6)]


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
def test_every_mask_broadcast_form_on_every_backend(shape, kind):
    """(Tk,) and 0-d masks used to crash the sdpa backend with an IndexError from inside SDPA."""
    q, k, v = rand(2, 3, 5, 4), rand(2, 3, 6, 4, seed=1), rand(2, 3, 6, 3, seed=2)
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(4)) > 0.3 if shape else torch.tensor(True)
    if len(shape) >= 1:
        keep[..., 0] = False  # key 0 hidden everywhere; with (5, 6) and (2, 3, 5, 6) some rows may be empty too
    mask = keep if kind == "bool" else torch.zeros(shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    expected = attention_ref(q, k, v, mask=mask).out
    for backend in CPU_BACKENDS:
        out = attention(q, k, v, mask=mask, backend=backend)
        assert out.shape == (2, 3, 5, 3)
        torch.testing.assert_close(out, expected, **F64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_same_dtype_and_flash_rule_on_every_backend(dtype):
    q, k, v = rand(1, 2, 9, 16), rand(1, 2, 11, 16, seed=1), rand(1, 2, 11, 8, seed=2)
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[3] = False  # an empty row
    ref64 = attention_ref(q, k, v, mask=mask, causal=True).out
    low = [t.to(dtype) for t in (q, k, v)]
    naive = attention_ref(*low, mask=mask, causal=True).out
    for backend in CPU_BACKENDS:
        out = attention(*low, mask=mask, causal=True, backend=backend)
        assert out.dtype == dtype and out.shape == ref64.shape
        assert torch.equal(out[..., 3, :], torch.zeros_like(out[..., 3, :]))
        assert_close_to_reference(out, naive, ref64, name=f"{backend} {dtype}")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_float16_logits_of_1e4_stay_finite(backend):
    """Logits ~1e4 fit float16 (max 65504), but Q K^T before scaling (x sqrt(64) = 8e4) does not:
    attention_ref multiplied by the scale after the product and returned NaN."""
    unit = lambda t: torch.nn.functional.normalize(t, dim=-1)  # noqa: E731
    k = unit(rand(1, 2, 6, 64, seed=3))
    q = unit(k.flip(-2) + 0.1 * rand(1, 2, 6, 64, seed=4)) * 1.2e4 * 8  # query i ~ key 5 - i
    assert 0.9e4 < float((q @ k.transpose(-1, -2)).amax() / 8) < 1.2e4  # logits ~1e4, Q K^T > 65504
    v = rand(1, 2, 6, 64, seed=5)
    for causal in (False, True):
        ref64 = attention_ref(q, k, v, causal=causal).out
        out = attention(q.half(), k.half(), v.half(), causal=causal, backend=backend)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref64, rtol=0, atol=1e-2)


@pytest.mark.parametrize("backend", ["auto", *CPU_BACKENDS])
def test_learned_float_mask_gets_the_same_gradient_everywhere(backend):
    """A float mask that requires grad (a learned bias): "tiled" (and so "auto") used to refuse it."""
    q, k, v = (rand(2, 2, 5, 4, seed=s).requires_grad_() for s in range(3))
    bias = rand(2, 1, 5, 5, seed=5)
    bias[0, 0, 1] = float("-inf")  # a fully masked row in batch 0
    bias.requires_grad_()
    g = rand(2, 2, 5, 4, seed=6)
    expected = torch.autograd.grad(attention_ref(q, k, v, mask=bias, causal=True).out, (q, k, v, bias), g)
    grads = torch.autograd.grad(attention(q, k, v, mask=bias, causal=True, backend=backend), (q, k, v, bias), g)
    for a, r in zip(grads, expected):
        assert a.shape == r.shape and torch.isfinite(a).all()
        torch.testing.assert_close(a, r, **F64)


def test_no_keys_gives_zeros_on_every_backend():
    q, k, v = rand(2, 3, 4), rand(2, 0, 4), rand(2, 0, 5)
    for backend in CPU_BACKENDS:
        out = attention(q, k, v, backend=backend)
        assert out.shape == (2, 3, 5) and torch.equal(out, torch.zeros_like(out))


def test_helpers_validate_their_arguments():
    q = rand(1, 3, 4)
    with pytest.raises(TypeError, match="choose_backend: `q` must be a torch.Tensor"):
        choose_backend([1.0], q, q)
    with pytest.raises(ValueError, match="available_backends: `mask`"):
        attnbook.available_backends(q, q, q, mask=torch.ones(2, 2, dtype=torch.bool))


def test_sdpa_backend_survives_a_kernel_that_returns_nan_on_empty_rows(monkeypatch):
    """Emulate SDPA's math kernel before torch 2.5 (softmax of an all -inf row = NaN): the sdpa
    backend must still give zeros there and finite, reference-equal gradients (NaN * 0 = NaN)."""
    def nan_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
        s = (q @ k.transpose(-2, -1)) * scale
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return torch.softmax(s, -1) @ v  # NaN on a fully masked row

    monkeypatch.setattr(dispatch.F, "scaled_dot_product_attention", nan_sdpa)
    q, k, v = (rand(1, 2, 5, 4, seed=s).requires_grad_() for s in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False
    g = rand(1, 2, 5, 4, seed=7)
    out = attention(q, k, v, mask=mask, backend="sdpa")
    expected = attention_ref(q, k, v, mask=mask).out
    torch.testing.assert_close(out, expected, **F64)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(expected, (q, k, v), g)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, **F64)


def test_auto_decision_on_cuda(monkeypatch):
    """"auto" on CUDA: Triton when it can serve, the tiled kernel (never a failure) when it cannot."""
    class CudaLike:  # stands in for a CUDA tensor: this machine has no GPU
        is_cuda = True
        dtype = torch.float16

    q = CudaLike()
    monkeypatch.setattr(dispatch, "check_attention_args", lambda *a, **k: 1.0)  # validated elsewhere
    # the first-use check has its own tests (test_trust.py); here it is the one module it lives in
    monkeypatch.setattr(dispatch.trust, "trusted", lambda *a, **k: True)
    fn = dispatch.BACKENDS["triton"].fn
    monkeypatch.setitem(dispatch.BACKENDS, "triton", dispatch.Backend(fn, lambda *a: (True, "")))
    assert dispatch.choose_backend(q, q, q) == "triton"
    for why in ("triton is not installed", "bfloat16 needs compute capability >= 8.0 (found 7.5)"):
        monkeypatch.setitem(dispatch.BACKENDS, "triton", dispatch.Backend(fn, lambda *a, _w=why: (False, _w)))
        assert dispatch.choose_backend(q, q, q) == "tiled"


def test_auto_keeps_float32_on_tiled_on_cuda(monkeypatch):
    """The fp32 Triton kernel (IEEE products, never benchmarked) is not auto's choice; 16-bit is."""
    class CudaLike:
        is_cuda = True

        def __init__(self, dtype):
            self.dtype = dtype

    monkeypatch.setattr(dispatch, "check_attention_args", lambda *a, **k: 1.0)
    monkeypatch.setattr(dispatch.trust, "trusted", lambda *a, **k: True)
    fn = dispatch.BACKENDS["triton"].fn
    monkeypatch.setitem(dispatch.BACKENDS, "triton", dispatch.Backend(fn, lambda *a: (True, "")))
    assert dispatch.choose_backend(*[CudaLike(torch.float32)] * 3) == "tiled"
    for dtype in (torch.float16, torch.bfloat16):
        assert dispatch.choose_backend(*[CudaLike(dtype)] * 3) == "triton"


# ---------------------------------------------------------------------------------------------
# The backend registry
# ---------------------------------------------------------------------------------------------

def test_registry_is_the_one_table(monkeypatch):
    """A backend registered once is reachable by attention, available_backends and bench."""
    calls = []

    def doubled(q, k, v, mask, causal, scale):  # a reader's own backend: 2 x the reference
        calls.append(scale)
        return 2 * attention_ref(q, k, v, mask=mask, causal=causal, scale=scale).out

    monkeypatch.setattr(dispatch, "BACKENDS", dict(dispatch.BACKENDS))
    dispatch.register_backend("doubled", doubled, lambda q, k, v, mask: (q.ndim == 3, "needs 3-D"))
    q = rand(2, 4, 3)
    torch.testing.assert_close(attention(q, q, q, backend="doubled"), 2 * attention_ref(q, q, q).out, **F64)
    assert calls == [1 / math.sqrt(3)]  # the scale arrives resolved, once
    assert "doubled" in attnbook.available_backends(q, q, q)
    q4 = rand(1, 2, 4, 3)
    assert "doubled" not in attnbook.available_backends(q4, q4, q4)
    with pytest.raises(RuntimeError, match="'doubled' cannot serve these arguments: needs 3-D"):
        attention(q4, q4, q4, backend="doubled")
    with pytest.raises(ValueError, match="register_backend: `name`"):
        dispatch.register_backend("auto", doubled)
    with pytest.raises(TypeError, match="register_backend: `fn` must be callable"):
        dispatch.register_backend("x", 3)


def test_arguments_are_validated_once_per_call(monkeypatch):
    calls = []
    real = dispatch.check_attention_args
    monkeypatch.setattr(dispatch, "check_attention_args", lambda *a, **k: calls.append(1) or real(*a, **k))
    q = rand(1, 1, 5, 4)
    for backend in ("auto", *CPU_BACKENDS):
        calls.clear()
        attention(q, q, q, backend=backend)
        assert len(calls) == 1, backend


# ---------------------------------------------------------------------------------------------
# Regressions: the six defects found by adversarial inputs against a float64 oracle (issue 6)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (2, 0, 5, 4), (0, 0, 5, 4)])
@pytest.mark.parametrize("backend", ["auto", *CPU_BACKENDS])
def test_empty_batch_or_zero_heads(backend, shape):
    """1: tiled crashed on B * H = 0 (a view of 0 elements with -1)."""
    q = rand(*shape).requires_grad_()
    out = attention(q, q, q, backend=backend)
    assert out.shape == shape
    out.sum().backward()
    assert q.grad.shape == shape


@pytest.mark.parametrize("backend", ["auto", *CPU_BACKENDS])
@pytest.mark.parametrize("tq, tk", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_causal_with_no_queries_or_keys(backend, tq, tk, with_mask):
    """2: causal with Tq = 0 or Tk = 0 raised about `tq` (an internal name) from ref and sdpa."""
    q, k, v = rand(2, 3, tq, 4), rand(2, 3, tk, 4, seed=1), rand(2, 3, tk, 6, seed=2)
    mask = torch.ones(tk, dtype=torch.bool) if with_mask else None
    out = attention(q, k, v, mask=mask, causal=True, backend=backend)
    assert out.shape == (2, 3, tq, 6) and not out.any()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_soft_masked_row_gradients_match_the_oracle(backend):
    """3: tiled's backward subtracted the row max before adding a -1e9 mask: max|dq| was 4.4e5."""
    q, k, v = (rand(1, 1, 4, 8, seed=s).requires_grad_() for s in range(3))
    mask = torch.zeros(4, 4, dtype=torch.float64)
    mask[2] = -1e9  # a whole row soft-masked (a common way to mask): its softmax is uniform
    g = rand(1, 1, 4, 8, seed=5)
    expected = torch.autograd.grad(attention_ref(q, k, v, mask=mask).out, (q, k, v), g)
    grads = torch.autograd.grad(attention(q, k, v, mask=mask, backend=backend), (q, k, v), g)
    for a, r in zip(grads, expected):
        # s - 1e9 is rounded to float64's ulp at 1e9 (~1e-7), so the backends differ by ~1e-10 here
        # (the bug gave max|dq| = 4.4e5 against 1.3)
        torch.testing.assert_close(a, r, rtol=1e-7, atol=1e-8)


def test_soft_masked_row_with_a_huge_scale_stays_finite():
    """3 (second form): float64 and scale=1e30 gave ~190 infinite gradients in tiled. The softmax is
    one-hot there, so dS = P (dP - D) is a difference of equal numbers: every FlashAttention-style
    backward (D = rowsum(dO * O)) leaves a rounding residue of ~1e-16 that the scale multiplies;
    SDPA's does too. The bound is that residue times the scale, far below inf."""
    q, k, v = (rand(1, 1, 4, 8, seed=s).requires_grad_() for s in range(3))
    mask = torch.zeros(4, 4, dtype=torch.float64)
    mask[2] = -1e9
    g = rand(1, 1, 4, 8, seed=5)
    expected = torch.autograd.grad(attention_ref(q, k, v, mask=mask, scale=1e30).out, (q, k, v), g)
    grads = torch.autograd.grad(attention(q, k, v, mask=mask, scale=1e30, backend="tiled"), (q, k, v), g)
    for a, r in zip(grads, expected):
        assert torch.isfinite(r).all() and torch.isfinite(a).all()
        assert float((a - r).abs().max()) <= 1e-13 * 1e30


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finfo_min_mask_is_a_finite_mask_on_every_backend(dtype):
    """4: a mask of finfo(dtype).min (the Hugging Face convention) overflowed to -inf in tiled
    (times log2 e): a row where every key carries it returned 0 instead of mean(v)."""
    q, k, v = (rand(2, 2, 5, 4, seed=s, dtype=dtype) for s in range(3))
    mask = torch.zeros(5, 5, dtype=dtype)
    mask[1] = torch.finfo(dtype).min  # every key of row 1
    mask[3, :2] = torch.finfo(dtype).min  # two keys of row 3
    expected = attention_ref(q, k, v, mask=mask).out
    torch.testing.assert_close(expected[..., 1, :], v.mean(-2), rtol=1e-5, atol=1e-6)  # the oracle's meaning
    for backend in CPU_BACKENDS:
        torch.testing.assert_close(attention(q, k, v, mask=mask, backend=backend), expected,
                                   rtol=1e-5, atol=1e-6, msg=backend)


@pytest.mark.parametrize("backend", ["ref", "tiled"])
def test_double_backward_is_exact_or_refused(backend):
    """5: tiled's once_differentiable backward let a gradient penalty run and drop the attention's
    second-order term. "ref" is built from differentiable ops (exact); "tiled" must refuse."""
    q, k, v = (rand(1, 2, 5, 4, seed=s).requires_grad_() for s in range(3))
    fn = lambda q, k, v: attention(q, k, v, causal=True, backend=backend)  # noqa: E731
    if backend == "ref":
        assert torch.autograd.gradgradcheck(fn, (q, k, v))
        return
    g, = torch.autograd.grad(fn(q, k, v).sum(), q, create_graph=False)  # first order still works
    assert g.shape == q.shape
    with pytest.raises(RuntimeError, match="double backward"):
        g, = torch.autograd.grad(fn(q, k, v).sum(), q, create_graph=True)
        (g ** 2).sum().backward()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.gradgradcheck(fn, (q, k, v))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("backend", ["ref", "tiled"])
def test_hidden_keys_never_reach_the_output(backend, where, bad):
    """6: NaN/inf in a key or value the mask hides (padding garbage) made every row of ref NaN
    (NaN + -inf = NaN), and NaN in v with a fully masked row gave NaN there in ref and tiled."""
    q, k, v = rand(2, 2, 5, 4), rand(2, 2, 6, 4, seed=1), rand(2, 2, 6, 3, seed=2)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)[:, None, None, :]
    clean = attention(q, k, v, mask=keep, backend="ref")
    garbage = {"k": k, "v": v}[where].clone()
    garbage[0, :, 4:] = bad  # batch 0's padding keys 4, 5
    garbage[1, :, 5] = bad  # batch 1's padding key 5
    kk, vv = (garbage, v) if where == "k" else (k, garbage)
    for mask in (keep, torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))):
        out = attention(q, kk, vv, mask=mask, backend=backend)
        torch.testing.assert_close(out, clean, **F64)
        # a fully masked row stays exactly 0 even though v holds garbage
        empty = mask.clone() if mask.dtype == torch.bool else mask.clone()
        empty = empty.expand(2, 1, 5, 6).clone()
        empty[:, :, 2] = False if mask.dtype == torch.bool else float("-inf")
        out = attention(q, kk, vv, mask=empty, backend=backend)
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))


@pytest.mark.parametrize("backend", ["ref", "tiled"])
def test_causally_hidden_nan_values_do_not_leak_backwards(backend):
    """A NaN in v_j reaches exactly the queries that see key j (i >= j), as the maths says."""
    q, k, v = rand(1, 1, 6, 4), rand(1, 1, 6, 4, seed=1), rand(1, 1, 6, 3, seed=2)
    v[0, 0, 3, 1] = float("nan")
    v[0, 0, 4, 2] = float("inf")
    out = attention(q, k, v, causal=True, backend=backend)
    clean = attention(q, k, v.nan_to_num(0.0, 0.0, 0.0), causal=True, backend="ref")
    torch.testing.assert_close(out[..., :3, :], clean[..., :3, :], **F64)  # rows 0-2 never see keys 3, 4
    assert out[..., 3:, 1].isnan().all() and torch.isfinite(out[..., 3, 2])
    assert (out[..., 4:, 2] == float("inf")).all()
    torch.testing.assert_close(out[..., 0], clean[..., 0], **F64)  # column 0 is clean everywhere


# ------------------------------------------------------------------ issue 30
def test_ref_backend_in_float16_survives_logits_near_1e5():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 4, 8, generator=g, dtype=torch.float64) + 200  # logits ~ 1e5: every
    k = torch.randn(1, 1, 6, 8, generator=g, dtype=torch.float64) + 200  # row overflows to +inf
    v = torch.randn(1, 1, 6, 8, generator=g, dtype=torch.float64)
    q16, k16, v16 = q.half(), k.half(), v.half()
    logits = (q16.double() @ k16.double().transpose(-2, -1)) * 8 ** -0.5
    assert float(logits.abs().max()) > 65504                    # past float16's largest value
    assert torch.isnan(attention_ref(q16, k16, v16).out).any()   # control: the kernel in float16
    truth = attention_ref(q16.double(), k16.double(), v16.double()).out
    for backend in CPU_BACKENDS:
        out = attention(q16, k16, v16, backend=backend)
        assert out.dtype == torch.float16 and not torch.isnan(out).any(), backend
        torch.testing.assert_close(out.double(), truth, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", ["auto", *CPU_BACKENDS])
def test_additive_mask_with_plus_inf_is_rejected_in_every_backend(backend):
    q, k, v = rand(1, 1, 3, 4), rand(1, 1, 3, 4, seed=1), rand(1, 1, 3, 4, seed=2)
    mask = torch.zeros(3, 3, dtype=torch.float64)
    mask[0, 1] = float("inf")
    with pytest.raises(ValueError, match=r"attention: .*`mask`.*\+inf"):
        attention(q, k, v, mask=mask, backend=backend)
    mask[0, 1] = float("-inf")                                    # control: -inf hides a key, fine
    attention(q, k, v, mask=mask, backend=backend)


@pytest.mark.parametrize("bad, exc, match", [
    (lambda q, k, v, m, c, s: attention_ref(q, k, v).out[..., :-1], RuntimeError, "returned shape"),
    (lambda q, k, v, m, c, s: attention_ref(q, k, v).out.float(), RuntimeError, "torch.float32"),
    (lambda q, k, v, m, c, s: attention_ref(q, k, v), TypeError, "returned AttentionResult"),
])
def test_a_registered_backend_that_returns_the_wrong_thing_is_caught(monkeypatch, bad, exc, match):
    monkeypatch.setitem(dispatch.BACKENDS, "bad", dispatch.Backend(bad, dispatch._always))
    q = rand(2, 3, 5, 4)
    with pytest.raises(exc, match=match):
        attention(q, q, q, backend="bad")
    good = lambda q, k, v, m, c, s: attention_ref(q, k, v).out  # noqa: E731 (control)
    monkeypatch.setitem(dispatch.BACKENDS, "bad", dispatch.Backend(good, dispatch._always))
    torch.testing.assert_close(attention(q, q, q, backend="bad"), attention_ref(q, q, q).out, **F64)


def test_a_registered_supports_that_returns_a_bare_bool_is_a_clear_error(monkeypatch):
    fn = lambda q, k, v, m, c, s: attention_ref(q, k, v).out  # noqa: E731
    monkeypatch.setitem(dispatch.BACKENDS, "bare", dispatch.Backend(fn, lambda *a: True))
    q = rand(1, 1, 3, 4)
    with pytest.raises(TypeError, match=r"backend 'bare'.s supports\(\) must return a pair"):
        attention(q, q, q, backend="bare")
    with pytest.raises(TypeError, match="supports"):
        attnbook.dispatch.available_backends(q, q, q)


def test_public_names_of_what_the_book_shows_keep_their_old_aliases():
    assert dispatch.auto_backend is dispatch._choose and "auto_backend" in dispatch.__all__
    assert dispatch.auto_backend.__doc__
