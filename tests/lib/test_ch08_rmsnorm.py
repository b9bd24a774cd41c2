"""RMSNorm (chapter 08): ``rms_norm`` / ``RMSNorm`` equal ``torch.nn.RMSNorm`` in float64 for random
shapes, eps and gains (eps=None included), differ from LayerNorm, and reject bad input clearly."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbook.layers import LayerNorm, RMSNorm, layer_norm, rms_norm
from attnbook.testing import F64_TOL

f64 = torch.float64


@pytest.mark.parametrize("seed", range(6))
def test_rms_norm_equals_torch_for_random_shapes_and_eps(seed):
    g = torch.Generator().manual_seed(seed)
    ndim = int(torch.randint(1, 4, (1,), generator=g))
    shape = tuple(int(n) for n in torch.randint(1, 6, (ndim,), generator=g)) + (
        int(torch.randint(2, 40, (1,), generator=g)),)
    d = shape[-1]
    scale = 10.0 ** float(torch.empty(1).uniform_(-4, 1, generator=g))
    x = scale * torch.randn(shape, generator=g, dtype=f64) + 0.3
    for eps in (None, 0.0, 1e-6, 1e-5, float(torch.rand(1, generator=g)) * 1e-2):
        ref = nn.RMSNorm(d, eps=eps, dtype=f64)
        with torch.no_grad():
            ref.weight.copy_(1.0 + 0.3 * torch.randn(d, generator=g, dtype=f64))
        mine = RMSNorm.from_torch(ref)
        torch.testing.assert_close(mine(x), ref(x), **F64_TOL)
        torch.testing.assert_close(rms_norm(x, ref.weight, eps), ref(x), **F64_TOL)
        torch.testing.assert_close(rms_norm(x, None, eps),
                                   F.rms_norm(x, (d,), None, eps), **F64_TOL)


def test_rms_norm_float32_and_half():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 16, generator=g)
    w = torch.rand(16, generator=g) + 0.5
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (16,), w, 1e-6),
                               rtol=1e-6, atol=1e-6)
    xh = (300 * torch.randn(4, 16, generator=g)).half()  # x^2 overflows float16
    y = rms_norm(xh, None, 1e-6)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), F.rms_norm(xh.float(), (16,), None, 1e-6),
                               rtol=2e-3, atol=2e-3)


def test_rms_norm_is_not_layer_norm_unless_mean_is_zero():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 12, generator=g, dtype=f64) + 2.0
    assert (rms_norm(x, eps=1e-5) - layer_norm(x, eps=1e-5)).abs().max() > 0.1
    xc = x - x.mean(-1, keepdim=True)                   # zero mean: the two agree
    torch.testing.assert_close(rms_norm(xc, eps=1e-5), layer_norm(xc, eps=1e-5), **F64_TOL)
    ms = rms_norm(x, eps=0.0).pow(2).mean(-1)           # unit root mean square
    torch.testing.assert_close(ms, torch.ones(5, dtype=f64), **F64_TOL)


def test_rms_norm_module_defaults_and_repr():
    m = RMSNorm(8, dtype=f64)
    assert m.eps is None and torch.equal(m.weight, torch.ones(8, dtype=f64))
    assert "eps=None" in repr(m)
    assert RMSNorm(8, elementwise_affine=False).weight is None
    x = torch.randn(3, 8, dtype=f64)
    torch.testing.assert_close(m(x), nn.RMSNorm(8, dtype=f64)(x), **F64_TOL)


def test_rms_norm_rejects_bad_input():
    x = torch.randn(2, 4, dtype=f64)
    with pytest.raises(ValueError, match=r"rms_norm: `weight` must have shape \(4,\)"):
        rms_norm(x, torch.ones(3, dtype=f64))
    with pytest.raises(ValueError, match=r"rms_norm: `eps` must lie in \[0, inf\], got -1.0"):
        rms_norm(x, None, -1.0)
    with pytest.raises(TypeError, match="rms_norm: `x` must be"):
        rms_norm([1.0, 2.0])
    with pytest.raises(ValueError, match=r"RMSNorm: `x` must have last dim d = 8"):
        RMSNorm(8, dtype=f64)(x)
    with pytest.raises(ValueError, match="RMSNorm: `eps` must lie in"):
        RMSNorm(4, eps=-1e-6)
    with pytest.raises(TypeError, match="RMSNorm.from_torch: `rms` must be an nn.RMSNorm"):
        RMSNorm.from_torch(nn.LayerNorm(4))
    with pytest.raises(TypeError, match="rms_norm: `eps` must be a finite number"):
        rms_norm(x, None, "1e-6")
