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
