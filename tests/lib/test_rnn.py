"""Tests for attnbook.rnn: SimpleRNN vs torch.nn.RNN, BPTT Jacobians vs autograd, gradient clipping."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.rnn import (
    GAMMA,
    SimpleRNN,
    activation_derivative,
    clip_grad_norm,
    clip_grad_value,
    jacobian_norms,
    jacobian_product,
    step_jacobians,
)

F64 = torch.float64
from attnbook.testing import F64_TOL as TOL  # noqa: E402 (the one float64 tolerance)


def make_rnn(d_in=3, d_h=5, nonlinearity="tanh", bias=True, seed=0, scale=1.0):
    torch.manual_seed(seed)
    rnn = SimpleRNN(d_in, d_h, nonlinearity=nonlinearity, bias=bias, dtype=F64)
    with torch.no_grad():
        rnn.W_hh.mul_(scale)
    return rnn


def inputs(b=2, t=7, d_in=3, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(b, t, d_in, generator=g, dtype=F64)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------------------------------------- SimpleRNN


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_from_torch_equals_nn_rnn(nonlinearity, bias, batch_first):
    torch.manual_seed(0)
    ref = nn.RNN(3, 5, nonlinearity=nonlinearity, bias=bias, batch_first=batch_first, dtype=F64)
    rnn = SimpleRNN.from_torch(ref)
    x = inputs(b=4, t=9)
    h0 = torch.randn(4, 5, dtype=F64)
    for init in (None, h0):
        h, z = rnn(x, init)
        x_ref = x if batch_first else x.transpose(0, 1)
        out, h_last = ref(x_ref, None if init is None else init[None])
        out = out if batch_first else out.transpose(0, 1)
        torch.testing.assert_close(h, out, **TOL)
        torch.testing.assert_close(h[:, -1], h_last[0], **TOL)
        torch.testing.assert_close(h, rnn.activation(z), rtol=0, atol=0)


def test_from_torch_weight_layout_is_transposed():
    torch.manual_seed(0)
    ref = nn.RNN(4, 4, dtype=F64)
    rnn = SimpleRNN.from_torch(ref)
    assert torch.equal(rnn.W_hh, ref.weight_hh_l0.T) and torch.equal(rnn.W_xh, ref.weight_ih_l0.T)
    assert torch.equal(rnn.b, ref.bias_ih_l0 + ref.bias_hh_l0)
    # control: loading weight_hh_l0 without the transpose gives a different RNN
    wrong = SimpleRNN.from_torch(ref)
    with torch.no_grad():
        wrong.W_hh.copy_(ref.weight_hh_l0)
    x = inputs(b=2, t=6, d_in=4)
    assert rel_err(wrong(x).h, rnn(x).h) > 1e-2
    # the copy is independent of the torch module
    with torch.no_grad():
        ref.weight_hh_l0.zero_()
    assert rnn.W_hh.abs().sum() > 0


def test_forward_matches_the_equation_and_shapes():
    rnn = make_rnn(nonlinearity="sigmoid")
    x = inputs()
    h, z = rnn(x)
    assert h.shape == z.shape == (2, 7, 5)
    prev = torch.zeros(2, 5, dtype=F64)
    for t in range(7):
        z_t = x[:, t] @ rnn.W_xh + prev @ rnn.W_hh + rnn.b
        torch.testing.assert_close(z[:, t], z_t, **TOL)
        prev = torch.sigmoid(z_t)
        torch.testing.assert_close(h[:, t], prev, **TOL)
    assert rnn.gamma == 0.25 and make_rnn().gamma == 1.0


def test_default_init_range_like_nn_rnn():
    torch.manual_seed(3)
    rnn = SimpleRNN(10, 64)
    bound = 1 / math.sqrt(64)
    for p in (rnn.W_xh, rnn.W_hh, rnn.b):
        assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound
    assert rnn.W_hh.dtype == torch.float32


def test_forward_is_differentiable_and_zero_length():
    rnn = make_rnn()
    x = inputs().requires_grad_()
    rnn(x).h.sum().backward()
    assert x.grad is not None and rnn.W_hh.grad is not None
    h, z = rnn(inputs(t=0))
    assert h.shape == (2, 0, 5) and z.shape == (2, 0, 5)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: SimpleRNN(0, 3), ValueError, "d_in"),
        (lambda: SimpleRNN(3, 2.5), TypeError, "d_hidden"),
        (lambda: SimpleRNN(3, 3, nonlinearity="gelu"), ValueError, "nonlinearity"),
        (lambda: SimpleRNN(3, 3, bias=1), TypeError, "bias"),
        (lambda: make_rnn()(torch.randn(2, 7, 4, dtype=F64)), ValueError, "d_in=3"),
        (lambda: make_rnn()(torch.randn(7, 3, dtype=F64)), ValueError, "at least 3 dims"),
        (lambda: make_rnn()(torch.randn(2, 7, 3)), TypeError, "dtype"),
        (lambda: make_rnn()(torch.ones(2, 7, 3, dtype=torch.long)), TypeError, "floating"),
        (lambda: make_rnn()(inputs(), torch.zeros(3, 5, dtype=F64)), ValueError, "h0"),
        (lambda: SimpleRNN.from_torch(nn.GRU(3, 3)), TypeError, "nn.RNN"),
        (lambda: SimpleRNN.from_torch(nn.RNN(3, 3, num_layers=2)), ValueError, "one-layer"),
        (lambda: SimpleRNN.from_torch(nn.RNN(3, 3, bidirectional=True)), ValueError, "unidirectional"),
    ],
)
def test_simple_rnn_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("nonlinearity", ["tanh", "sigmoid", "relu"])
def test_activation_derivative_equals_autograd_and_gamma(nonlinearity):
    z = torch.linspace(-8, 8, 1601, dtype=F64)            # includes 0, where tanh' and sigmoid' peak
    z = z[z != 0] if nonlinearity == "relu" else z         # relu'(0): checked separately below
    zz = z.clone().requires_grad_()
    act = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}[nonlinearity]
    (auto,) = torch.autograd.grad(act(zz).sum(), zz)
    d = activation_derivative(z, nonlinearity)
    torch.testing.assert_close(d, auto, **TOL)
    assert d.max().item() == pytest.approx(GAMMA[nonlinearity], abs=1e-15)
    assert d.min().item() >= 0


def test_relu_derivative_at_zero_is_zero_like_autograd():
    z = torch.zeros(3, dtype=F64, requires_grad=True)
    (auto,) = torch.autograd.grad(torch.relu(z).sum(), z)
    assert torch.equal(activation_derivative(z.detach(), "relu"), auto)


# ------------------------------------------------------------------------------------- Jacobians


def autograd_product(rnn, x, h_k, k, t):
    """d h_t / d h_k by torch.autograd.functional.jacobian (one sequence, batch of 1)."""
    def run(h):
        return rnn(x[:, k:t], h[None])[0][0, -1] if t > k else h
    return torch.autograd.functional.jacobian(run, h_k)


@pytest.mark.parametrize("nonlinearity", ["tanh", "sigmoid", "relu"])
def test_jacobian_product_equals_autograd_for_every_pair(nonlinearity):
    rnn = make_rnn(d_in=3, d_h=6, nonlinearity=nonlinearity, scale=2.0)
    x = inputs(b=1, t=8)
    with torch.no_grad():
        h, z = rnn(x)
    factors = step_jacobians(rnn, z)
    assert factors.shape == (1, 8, 6, 6)
    states = torch.cat([torch.zeros(1, 1, 6, dtype=F64), h], 1)      # states[:, t] = h_t, with h_0 = 0
    for k in range(0, 8):
        for t in range(k, 9):
            auto = autograd_product(rnn, x, states[0, k], k, t)
            mine = jacobian_product(factors, t, k)[0]
            torch.testing.assert_close(mine, auto, rtol=1e-12, atol=1e-14)


def test_step_jacobian_closed_form_and_the_seeds_transpose():
    rnn = make_rnn(d_in=3, d_h=6, scale=1.5)
    x = inputs(b=1, t=8)
    with torch.no_grad():
        h, z = rnn(x)
    factors = step_jacobians(rnn, z)[0]                               # (T, d, d)
    d = activation_derivative(z[0], "tanh")
    for t in range(8):
        torch.testing.assert_close(factors[t], torch.diag(d[t]) @ rnn.W_hh.T, **TOL)
    # the seed's factor W_h^T diag(sigma'(z)), W_h = W_hh^T (column convention), is J_t^T
    seed_factors = [rnn.W_hh @ torch.diag(d[t]) for t in range(8)]
    seed_product = torch.linalg.multi_dot(seed_factors)              # j = 1 .. T, left to right
    true = jacobian_product(step_jacobians(rnn, z), 8, 0)[0]
    auto = autograd_product(rnn, x, torch.zeros(6, dtype=F64), 0, 8)
    torch.testing.assert_close(true, auto, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(seed_product, auto.T, rtol=1e-12, atol=1e-14)
    assert rel_err(seed_product, auto) > 0.1
    # the gradient: row vector (numerator) g P equals the seed product applied to a column
    g = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(g @ true, seed_product @ g, rtol=1e-12, atol=1e-14)
    assert rel_err(g @ seed_product, g @ true) > 0.1


def test_step_jacobians_batched_and_unbatched():
    rnn = make_rnn()
    x = inputs(b=3)
    with torch.no_grad():
        z = rnn(x).z
    batched = step_jacobians(rnn, z)
    assert batched.shape == (3, 7, 5, 5)
    for b in range(3):
        torch.testing.assert_close(step_jacobians(rnn, z[b]), batched[b], rtol=0, atol=0)
    assert torch.equal(jacobian_product(batched, 4, 4), torch.eye(5, dtype=F64).expand(3, 5, 5))


@pytest.mark.parametrize("ord_", [2, "fro"])
def test_jacobian_norms_are_the_norms_of_the_products(ord_):
    rnn = make_rnn(d_h=5, scale=2.0)
    with torch.no_grad():
        factors = step_jacobians(rnn, rnn(inputs(b=2, t=9)).z)
    for k in (0, 3, 9):
        norms = jacobian_norms(factors, k, ord=ord_)
        assert norms.shape == (2, 9 - k + 1)
        for gap in range(9 - k + 1):
            expected = torch.linalg.matrix_norm(jacobian_product(factors, k + gap, k), ord=ord_)
            torch.testing.assert_close(norms[:, gap], expected, rtol=1e-10, atol=1e-300)


@settings(max_examples=25, deadline=None)
@given(d_h=st.integers(1, 6), steps=st.integers(1, 12), scale=st.floats(0.1, 3.0),
       nonlinearity=st.sampled_from(["tanh", "sigmoid", "relu"]), seed=st.integers(0, 10_000))
def test_norm_bound_gamma_smax_holds(d_h, steps, scale, nonlinearity, seed):
    """||d h_t / d h_0||_2 <= (gamma s_max)^t for any weights and inputs."""
    rnn = make_rnn(d_in=2, d_h=d_h, nonlinearity=nonlinearity, seed=seed, scale=scale)
    with torch.no_grad():
        factors = step_jacobians(rnn, rnn(inputs(b=1, t=steps, d_in=2, seed=seed)).z)
    s_max = torch.linalg.matrix_norm(rnn.W_hh.detach(), ord=2).item()
    norms = jacobian_norms(factors, 0)[0]
    bound = (rnn.gamma * s_max) ** torch.arange(steps + 1, dtype=F64)
    assert (norms <= bound * (1 + 1e-9) + 1e-300).all()


def test_bound_is_tight_for_small_inputs_and_orthogonal_weights():
    """Control for the bound test: with sigma' ~ 1 and W = s Q the norm is ~ s^t, so a smaller base fails."""
    torch.manual_seed(0)
    rnn = SimpleRNN(8, 8, bias=False, dtype=F64)
    q, _ = torch.linalg.qr(torch.randn(8, 8, dtype=F64))
    with torch.no_grad():
        rnn.W_hh.copy_(1.1 * q)
    factors = step_jacobians(rnn, rnn(inputs(b=1, t=20, d_in=8, scale=1e-6)).z.detach())
    norms = jacobian_norms(factors)[0]
    t = torch.arange(21, dtype=F64)
    assert (norms <= 1.1**t * (1 + 1e-9)).all()
    assert (norms[1:] > (0.99 * 1.1) ** t[1:]).all()


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: step_jacobians(nn.RNN(3, 3), torch.zeros(2, 3)), TypeError, "SimpleRNN"),
        (lambda: step_jacobians(make_rnn(), torch.zeros(2, 4, dtype=F64)), ValueError, "d_h=5"),
        (lambda: step_jacobians(make_rnn(), torch.zeros(5, dtype=F64)), ValueError, "at least 2 dims"),
        (lambda: jacobian_product(torch.zeros(4, 3, 3), 5, 0), ValueError, "k <= t <= T=4"),
        (lambda: jacobian_product(torch.zeros(4, 3, 3), 1, 2), ValueError, "k <= t"),
        (lambda: jacobian_product(torch.zeros(4, 3, 3), 1, -1), ValueError, "`k`"),
        (lambda: jacobian_product(torch.zeros(4, 3, 2), 1, 0), ValueError, "square"),
        (lambda: jacobian_product(torch.zeros(4, 3, 3), 1.0, 0), TypeError, "`t`"),
        (lambda: jacobian_norms(torch.zeros(4, 3, 3), 5), ValueError, "k <= T=4"),
        (lambda: activation_derivative(torch.zeros(3), "elu"), ValueError, "nonlinearity"),
    ],
)
def test_jacobian_helpers_reject_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ------------------------------------------------------------------------------------- clipping


def model_with_grads(seed=0, scale=1.0):
    """A few float64 parameters of different sizes with random gradients, and a twin copy."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 5), (5,), (3, 3, 2), (1,)]
    params, twins = [], []
    for shape in shapes:
        p = nn.Parameter(torch.randn(shape, generator=g, dtype=F64))
        p.grad = scale * torch.randn(shape, generator=g, dtype=F64)
        q = nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        params.append(p)
        twins.append(q)
    return params, twins


def flat(params):
    return torch.cat([p.grad.flatten() for p in params])


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 100.0])
def test_clip_grad_norm_equals_torch(max_norm):
    params, twins = model_with_grads(scale=1.0)
    pre = flat(params).norm()
    total = clip_grad_norm(params, max_norm)
    total_torch = torch.nn.utils.clip_grad_norm_(twins, max_norm)
    torch.testing.assert_close(total, pre, rtol=1e-14, atol=0)      # returns the pre-clip norm
    torch.testing.assert_close(total, total_torch, rtol=1e-15, atol=0)
    for p, q in zip(params, twins):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-15, atol=0)
    post = flat(params).norm().item()
    n = pre.item()
    if n > max_norm:
        assert post == pytest.approx(max_norm * n / (n + 1e-6), rel=1e-13)
        assert max_norm * (1 - 1e-5) <= post < max_norm
    else:
        assert post == n


def test_clip_grad_norm_keeps_direction_and_is_global():
    params, _ = model_with_grads(scale=3.0)
    before = flat(params).clone()
    clip_grad_norm(params, 1.0)
    after = flat(params)
    cos = torch.dot(before, after) / (before.norm() * after.norm())
    assert cos > 1 - 1e-14
    # control: clipping each tensor separately (a per-parameter norm) changes the direction
    params2, _ = model_with_grads(scale=3.0)
    for p in params2:
        clip_grad_norm([p], 1.0)
    per = flat(params2)
    assert torch.dot(before, per) / (before.norm() * per.norm()) < 1 - 1e-3


def test_clip_grad_norm_below_threshold_is_bit_identical_and_epsilon_at_threshold():
    params, _ = model_with_grads()
    before = [p.grad.clone() for p in params]
    n = flat(params).norm().item()
    clip_grad_norm(params, 2 * n)
    assert all(torch.equal(a, p.grad) for a, p in zip(before, params))
    # at N == tau exactly the seed (">") and Pascanu (">=", rescale to tau) change nothing numerically,
    # but the 1e-6 makes PyTorch (and this function) scale by tau / (tau + 1e-6) < 1
    clip_grad_norm(params, n)
    assert not torch.equal(before[0], params[0].grad)
    torch.testing.assert_close(flat(params).norm().item(), n * n / (n + 1e-6), rtol=1e-14, atol=0)


def test_clip_grad_norm_skips_missing_grads_accepts_a_tensor_and_a_generator():
    params, twins = model_with_grads()
    params[1].grad, twins[1].grad = None, None
    total = clip_grad_norm((p for p in params), 0.1)
    torch.testing.assert_close(total, torch.nn.utils.clip_grad_norm_(twins, 0.1), rtol=1e-15, atol=0)
    assert params[1].grad is None
    single = nn.Parameter(torch.ones(3, dtype=F64))
    single.grad = torch.full((3,), 4.0, dtype=F64)
    assert clip_grad_norm(single, 1.0).item() == pytest.approx(math.sqrt(48))
    assert clip_grad_norm([nn.Parameter(torch.ones(2))], 1.0).item() == 0.0        # no grads at all


def test_clip_grad_value_equals_torch_and_changes_direction():
    params, twins = model_with_grads(scale=2.0)
    before = flat(params).clone()
    assert clip_grad_value(params, 0.5) is None
    torch.nn.utils.clip_grad_value_(twins, 0.5)
    for p, q in zip(params, twins):
        assert torch.equal(p.grad, q.grad)
    after = flat(params)
    assert after.abs().max() <= 0.5
    assert torch.dot(before, after) / (before.norm() * after.norm()) < 1 - 1e-3


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: clip_grad_norm(model_with_grads()[0], 0.0), ValueError, "max_norm"),
        (lambda: clip_grad_norm(model_with_grads()[0], float("nan")), ValueError, "max_norm"),
        (lambda: clip_grad_norm(model_with_grads()[0], "1"), TypeError, "max_norm"),
        (lambda: clip_grad_norm([1.0, 2.0], 1.0), TypeError, r"parameters\[0\]"),
        (lambda: clip_grad_norm(3, 1.0), TypeError, "parameters"),
        (lambda: clip_grad_value(model_with_grads()[0], -1.0), ValueError, "clip_value"),
    ],
)
def test_clipping_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_orthogonal_rnn_with_product_norms_and_flat_grad():
    from attnbook.rnn import flat_grad, orthogonal, product_norms, rnn_with
    q = orthogonal(6, torch.Generator().manual_seed(0))
    torch.testing.assert_close(q @ q.T, torch.eye(6, dtype=F64), **TOL)
    assert not torch.equal(q, orthogonal(6, torch.Generator().manual_seed(1)))
    net = rnn_with(0.5 * q, b=torch.ones(6, dtype=F64))
    x = 0.1 * torch.randn(1, 7, 6, generator=torch.Generator().manual_seed(2), dtype=F64)
    # W_xh = I: z_1 = x_1 + b exactly
    torch.testing.assert_close(net(x).z[0, 0], x[0, 0] + 1.0, **TOL)
    norms = product_norms(net, x)
    assert norms.shape == (8,) and norms[0] == 1.0
    fac = step_jacobians(net, net(x).z.detach())
    torch.testing.assert_close(norms[3], torch.linalg.matrix_norm(jacobian_product(fac, 3, 0)[0], ord=2),
                               **TOL)
    assert (norms[1:] <= 0.5 ** torch.arange(1, 8, dtype=F64) * (1 + 1e-12)).all()   # eq-ch01-bound
    with pytest.raises(ValueError, match="rnn_with: `W_hh` must be square"):
        rnn_with(torch.zeros(3, 4, dtype=F64))
    with pytest.raises(ValueError, match="rnn_with: `b` must have shape"):
        rnn_with(q, b=torch.ones(3, dtype=F64))
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    a.grad, b.grad = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])
    c = torch.zeros(1, requires_grad=True)                      # .grad is None: skipped
    assert torch.equal(flat_grad([a, c, b]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    with pytest.raises(ValueError, match="flat_grad: `parameters` must have at least one .grad"):
        flat_grad([c])
