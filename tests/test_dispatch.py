"""Tests for attnbook.attention (the dispatcher): every backend returns the same thing."""
import pytest
import torch

import attnbook
from attnbook import attention, attention_ref, choose_backend
from attnbook.dispatch import triton_status
from attnbook.testing import assert_close_to_reference

F64 = dict(rtol=1e-10, atol=1e-12)
CPU_BACKENDS = ["ref", "tiled", "sdpa"]


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def test_entry_point_is_the_dispatcher():
    assert attnbook.attention is attention and callable(attnbook.attention)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq, tk", [(7, 7), (5, 9), (9, 5)])
def test_backends_agree_float64(backend, causal, tq, tk):
    q, k, v = rand(2, 3, tq, 8), rand(2, 3, tk, 8, seed=1), rand(2, 3, tk, 6, seed=2)
    mask = rand(tq, tk, seed=3) > -0.3
    mask[2] = False  # one fully masked row
    expected = attention_ref(q, k, v, mask=mask, causal=causal)[0]
    out = attention(q, k, v, mask=mask, causal=causal, backend=backend)
    torch.testing.assert_close(out, expected, **F64)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backends_float32_flash_rule(backend):
    q, k, v = rand(1, 2, 70, 16), rand(1, 2, 70, 16, seed=1), rand(1, 2, 70, 16, seed=2)
    ref64 = attention_ref(q, k, v, causal=True)[0]
    naive32 = attention_ref(q.float(), k.float(), v.float(), causal=True)[0]
    out = attention(q.float(), k.float(), v.float(), causal=True, backend=backend)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, naive32, ref64, name=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backends_gradients_agree(backend):
    q, k, v = (rand(1, 2, 6, 4, seed=s).requires_grad_() for s in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[4] = False
    grads_ref = torch.autograd.grad(attention_ref(q, k, v, mask=mask)[0].square().sum(), (q, k, v))
    grads = torch.autograd.grad(attention(q, k, v, mask=mask, backend=backend).square().sum(), (q, k, v))
    for g, gr in zip(grads, grads_ref):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, gr, **F64)


def test_sdpa_with_causal_and_mask_together():
    q, k, v = rand(1, 4, 4), rand(1, 4, 4, seed=1), rand(1, 4, 4, seed=2)
    mask = torch.tensor([True, False, True, True])
    for m in (mask, torch.where(mask, 0.0, float("-inf")).double()):
        out = attention(q, k, v, mask=m, causal=True, backend="sdpa")
        torch.testing.assert_close(out, attention_ref(q, k, v, mask=m, causal=True)[0], **F64)


def test_auto_on_cpu_is_tiled_and_never_fails():
    q = rand(1, 1, 5, 4)
    assert choose_backend(q, q, q) == "tiled"
    torch.testing.assert_close(attention(q, q, q), attention_ref(q, q, q)[0], **F64)


def test_triton_on_cpu_without_interpreter_raises_clearly(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = rand(1, 1, 5, 16, dtype=torch.float32)
    ok, why = triton_status(q, q, q)
    if ok:  # the interpreter was enabled when the kernel module was first imported
        pytest.skip("Triton kernel is usable here (TRITON_INTERPRET=1 was set at import)")
    with pytest.raises(RuntimeError, match="triton"):
        attention(q, q, q, backend="triton")
    assert why


def test_unknown_backend_and_bad_causal():
    q = rand(1, 3, 4)
    with pytest.raises(ValueError, match="unknown `backend`"):
        attention(q, q, q, backend="fast")
    with pytest.raises(TypeError, match="`causal`"):
        attention(q, q, q, causal=1)


def test_only_key_padding_masks_reach_triton():
    from attnbook.dispatch import _key_padding_view

    q = rand(2, 3, 4, 16, dtype=torch.float32)
    assert _key_padding_view(None, q) is None
    kp = torch.tensor([[True, True, False, False], [True, True, True, True]])[:, None, None, :]
    assert _key_padding_view(kp, q).shape == (2, 1, 1, 4)
    # a 2-D mask broadcasts as (Tq, Tk): it is not key padding even though B == 2 rows could look like it
    assert _key_padding_view(torch.ones(4, 4, dtype=torch.bool), q) is None
    assert _key_padding_view(torch.ones(1, 4, dtype=torch.bool), q).shape == (1, 1, 1, 4)
    assert _key_padding_view(torch.zeros(4, 4), q) is None  # additive float masks are not served
    ok, why = triton_status(q, q, q, torch.ones(4, 4, dtype=torch.bool))
    assert not ok and "key-padding" in why


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
    expected = attention_ref(q, k, v, mask=mask)[0]
    for backend in CPU_BACKENDS:
        out = attention(q, k, v, mask=mask, backend=backend)
        assert out.shape == (2, 3, 5, 3)
        torch.testing.assert_close(out, expected, **F64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_same_dtype_and_flash_rule_on_every_backend(dtype):
    q, k, v = rand(1, 2, 9, 16), rand(1, 2, 11, 16, seed=1), rand(1, 2, 11, 8, seed=2)
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[3] = False  # an empty row
    ref64 = attention_ref(q, k, v, mask=mask, causal=True)[0]
    low = [t.to(dtype) for t in (q, k, v)]
    naive = attention_ref(*low, mask=mask, causal=True)[0]
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
        ref64 = attention_ref(q, k, v, causal=causal)[0]
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
    expected = torch.autograd.grad(attention_ref(q, k, v, mask=bias, causal=True)[0], (q, k, v, bias), g)
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
    import attnbook.dispatch as dispatch

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
    expected = attention_ref(q, k, v, mask=mask)[0]
    torch.testing.assert_close(out, expected, **F64)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(expected, (q, k, v), g)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, **F64)


def test_auto_decision_on_cuda(monkeypatch):
    """"auto" on CUDA: Triton when it can serve, the tiled kernel (never a failure) when it cannot."""
    from attnbook import dispatch

    class CudaLike:  # stands in for a CUDA tensor: this machine has no GPU
        is_cuda = True

    q = CudaLike()
    monkeypatch.setattr(dispatch, "check_attention_args", lambda *a, **k: 1.0)  # validated elsewhere
    monkeypatch.setattr(dispatch, "triton_status", lambda *a, **k: (True, ""))
    assert dispatch.choose_backend(q, q, q) == "triton"
    for why in ("triton is not installed", "bfloat16 needs compute capability >= 8.0 (found 7.5)"):
        monkeypatch.setattr(dispatch, "triton_status", lambda *a, _w=why, **k: (False, _w))
        assert dispatch.choose_backend(q, q, q) == "tiled"
