"""Chapter 01's exercises (attnbook.exercises.clipping, bptt, bptt_build): wrong answers outside
the galleries are rejected on seeds 0-3 with the hint that names them, correct but unusual
answers pass, and the shortcuts (the library's function, torch's one-call equivalent, autograd,
the exercise's own .solution) are rejected by name."""

import pytest
import torch

from attnbook import exercises
from attnbook.exercises import check
from exercise_run import run

SEEDS = (0, 1, 2, 3)


def hint(text):
    return "".join(text[text.index("提示："):].split())


# --------------------------------------------------------------------------- clip_grad_norm
def _norm(grads):
    return torch.stack([g.norm() for g in grads]).norm()


def clip_return_in_loop(parameters, max_norm):  # return inside the loop: only the first scaled
    grads = [p.grad for p in parameters if p.grad is not None]
    total = _norm(grads)
    for g in grads:
        g.mul_(torch.clamp(max_norm / total, max=1.0))
        return total


def clip_no_divide(parameters, max_norm):  # the factor is max_norm itself (forgot / N)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = _norm(grads)
    for g in grads:
        if total > max_norm:
            g.mul_(max_norm)
    return total


def clip_inf_norm(parameters, max_norm):  # the infinity norm instead of L2
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.abs().max() for g in grads]).max()
    for g in grads:
        g.mul_(torch.clamp(max_norm / total, max=1.0))
    return total


def clip_last_skipped(parameters, max_norm):  # the scaling loop misses the last parameter
    grads = [p.grad for p in parameters if p.grad is not None]
    total = _norm(grads)
    for g in grads[:-1]:
        g.mul_(torch.clamp(max_norm / total, max=1.0))
    return total


def clip_python_floats(parameters, max_norm):  # correct: Python floats, p.grad rebound
    ps = [p for p in parameters if p.grad is not None]
    total = sum(float((p.grad.double() ** 2).sum()) for p in ps) ** 0.5
    for p in ps:
        p.grad = p.grad * min(1.0, max_norm / total)
    return total


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_return_inside_the_loop_is_named(seed):
    ok, text = run("ch01.clip_grad_norm", clip_return_in_loop, seed)
    assert not ok and "return写在了for循环里面" in hint(text), text
    assert "只裁剪了前面的梯度" in hint(text)


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_factor_without_division_is_named(seed):
    ok, text = run("ch01.clip_grad_norm", clip_no_divide, seed)
    assert not ok and "max_norm本身" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [clip_inf_norm, clip_last_skipped])
def test_clip_other_wrong_answers_are_rejected(fn, seed):
    ok, text = run("ch01.clip_grad_norm", fn, seed)
    assert not ok, text


@pytest.mark.parametrize("seed", SEEDS)
def test_clip_correct_unusual_answer_passes(seed):
    ok, text = run("ch01.clip_grad_norm", clip_python_floats, seed)
    assert ok, text


def test_clip_hints_fire_only_on_their_mistake():
    # the per-tensor bug leaves every gradient unchanged in case 1: not "return in the loop"
    bug = exercises.get("ch01.clip_grad_norm").bugs["clipped_per_tensor"]
    ok, text = run("ch01.clip_grad_norm", bug)
    assert not ok and "return" not in hint(text) and "max_norm本身" not in hint(text)


def test_clip_cases_vary_the_threshold_and_shapes_with_the_seed():
    ex = exercises.get("ch01.clip_grad_norm")
    firsts = [ex.cases(s)[0] for s in SEEDS]
    assert len({c.args[1] for c in firsts}) == len(SEEDS)
    assert any(c.args[1] != 1.0 for c in firsts)
    assert len({tuple(g.shape for g in c.args[0]) for c in firsts}) > 1
    assert any(g is not None and g.dtype == torch.float32 for c in ex.cases(0) for g in c.args[0])


# --------------------------------------------------------------------------- jacobian_product
def jac_misses_last(factors, t, k):  # range stops before J_t
    prod = torch.eye(factors.shape[-1], dtype=factors.dtype).expand(factors.shape[0], -1, -1)
    for j in range(k + 1, t):
        prod = factors[:, j - 1] @ prod
    return prod


def jac_reduce(factors, t, k):  # correct: functools.reduce, the identity as the start
    import functools
    eye = torch.eye(factors.shape[-1], dtype=factors.dtype).expand(factors.shape[0], -1, -1)
    return functools.reduce(lambda p, j: factors[:, j - 1] @ p, range(k + 1, t + 1), eye)


@pytest.mark.parametrize("seed", SEEDS)
def test_jacobian_wrong_and_unusual_answers(seed):
    assert not run("ch01.jacobian_product", jac_misses_last, seed)[0]
    ok, text = run("ch01.jacobian_product", jac_reduce, seed)
    assert ok, text


# --------------------------------------------------------------------------- bptt (build)
def _forward(x, h0, W_xh, W_hh, b):
    hs = [h0]
    for t in range(x.shape[1]):
        hs.append(torch.tanh(x[:, t] @ W_xh + hs[-1] @ W_hh + b))
    return torch.stack(hs, 1)                                  # (B, T + 1, d_h): h_0 .. h_T


def bptt_einsum(x, h0, W_xh, W_hh, b, dh):  # correct: dz kept for all steps, sums by einsum
    H = _forward(x, h0, W_xh, W_hh, b)
    T = x.shape[1]
    dz = torch.zeros_like(dh)
    g = torch.zeros_like(h0)
    for t in reversed(range(T)):
        dz[:, t] = (dh[:, t] + g) * (1 - H[:, t + 1] ** 2)
        g = dz[:, t] @ W_hh.T
    return (torch.einsum("bti,btj->ij", x, dz), torch.einsum("bti,btj->ij", H[:, :-1], dz),
            dz.sum((0, 1)), g)


def bptt_db_first_row(x, h0, W_xh, W_hh, b, dh):  # db from the first batch row only
    out = list(bptt_einsum(x, h0, W_xh, W_hh, b, dh))
    H = _forward(x, h0, W_xh, W_hh, b)
    g, db = torch.zeros_like(h0), torch.zeros_like(b)
    for t in reversed(range(x.shape[1])):
        dz = (dh[:, t] + g) * (1 - H[:, t + 1] ** 2)
        db = db + dz[0]
        g = dz @ W_hh.T
    out[2] = db
    return tuple(out)


def bptt_dh1_not_dh0(x, h0, W_xh, W_hh, b, dh):  # returns dL/dh_1 instead of dL/dh_0
    out = list(bptt_einsum(x, h0, W_xh, W_hh, b, dh))
    H = _forward(x, h0, W_xh, W_hh, b)
    g = torch.zeros_like(h0)
    for t in reversed(range(x.shape[1])):
        total = dh[:, t] + g
        g = total * (1 - H[:, t + 1] ** 2) @ W_hh.T
    out[3] = total
    return tuple(out)


def bptt_autograd(x, h0, W_xh, W_hh, b, dh):  # the shortcut: autograd
    with torch.enable_grad():
        ps = [p.clone().requires_grad_(True) for p in (W_xh, W_hh, b, h0)]
        H = _forward(x, ps[3], ps[0], ps[1], ps[2])
        return torch.autograd.grad((H[:, 1:] * dh).sum(), ps)


def bptt_vjp(x, h0, W_xh, W_hh, b, dh):  # the shortcut: torch.func.vjp
    _, pull = torch.func.vjp(lambda a, c, d, e: _forward(x, e, a, c, d)[:, 1:], W_xh, W_hh, b, h0)
    return pull(dh)


@pytest.mark.parametrize("seed", SEEDS)
def test_bptt_correct_unusual_answer_passes(seed):
    ok, text = run("ch01.bptt", bptt_einsum, seed)
    assert ok, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [bptt_db_first_row, bptt_dh1_not_dh0])
def test_bptt_wrong_answers_outside_the_gallery_are_rejected(fn, seed):
    ok, text = run("ch01.bptt", fn, seed)
    assert not ok, text


@pytest.mark.parametrize("fn,word", [(bptt_autograd, "torch.autograd.grad"),
                                     (bptt_vjp, "torch.func.vjp")])
def test_bptt_autograd_is_ruled_out_by_name(fn, word):
    ok, text = run("ch01.bptt", fn)
    assert not ok and "不许" in text and word in text, text


def test_bptt_is_the_build_exercise_and_its_solution_is_off_limits():
    ex = exercises.get("ch01.bptt")
    assert ex.build and not ex.autograd and len(ex.bugs) >= 5
    ok, text = run("ch01.bptt", ex.solution)
    assert ok  # the reference itself passes (check lets the solution run)
    ok, text = run("ch01.bptt", lambda *a: ex.solution(*a))
    assert not ok and ".solution" in text and "不许" in text, text


def test_bptt_cases_vary_shapes_and_hold_the_adversarial_inputs():
    ex = exercises.get("ch01.bptt")
    shapes = [tuple(ex.cases(s)[0].args[0].shape) for s in SEEDS]
    assert len(set(shapes)) > 1
    cases = ex.cases(0)
    assert any(c.args[0].shape[1] == 1 for c in cases)                        # T = 1
    assert any(bool((c.args[5][:, :-1] == 0).all()) for c in cases)            # loss at T only
    assert any(c.args[0].dtype == torch.float32 for c in cases)
    assert any(c.args[2].shape[0] == c.args[2].shape[1] for c in cases)      # square W_xh


def test_bptt_hint_names_only_its_own_mistake():
    bugs = exercises.get("ch01.bptt").bugs
    _, text = run("ch01.bptt", bugs["h_t_instead_of_h_prev"])
    assert "h_{t-1}" in hint(text) and "tanh" not in hint(text)
    _, text = run("ch01.bptt", bptt_db_first_row)
    assert "1−z_t²" not in hint(text) and "W_hhᵀ：" not in hint(text)


# --------------------------------------------------------------------------- red-team regressions
def clip_running_norm(parameters, max_norm):  # clips inside the accumulation loop
    sq = 0.0
    for p in parameters:
        if p.grad is None:
            continue
        sq += float(p.grad.pow(2).sum())
        p.grad.mul_(min(1.0, max_norm / sq ** 0.5))
    return sq ** 0.5


def clip_shape1(parameters, max_norm):  # the norm as a shape-(1,) tensor
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.cat([g.flatten() for g in grads]).norm(dim=0, keepdim=True)
    for g in grads:
        g.mul_(torch.clamp(max_norm / total, max=1.0))
    return total


def jac_eye_float32(factors, t, k):  # t == k: torch.eye(d), float32 without the batch axis
    if t == k:
        return torch.eye(factors.shape[-1])
    prod = factors[:, t - 1]
    for j in range(t - 1, k, -1):
        prod = prod @ factors[:, j - 1]
    return prod


def jac_batch1(factors, t, k):  # only batch element 0, broadcast to every batch
    prod = torch.eye(factors.shape[-1], dtype=factors.dtype)
    for j in range(k + 1, t + 1):
        prod = factors[0, j - 1] @ prod
    return prod.expand(factors.shape[0], -1, -1).clone()


def jac_swapped_tk(factors, t, k):  # t and k swapped in the range: always the identity
    prod = torch.eye(factors.shape[-1], dtype=factors.dtype).expand(factors.shape[0], -1, -1)
    for j in range(t + 1, k + 1):
        prod = factors[:, j - 1] @ prod
    return prod


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,fn", [
    ("ch01.clip_grad_norm", clip_running_norm), ("ch01.clip_grad_norm", clip_shape1),
    ("ch01.jacobian_product", jac_eye_float32), ("ch01.jacobian_product", jac_batch1),
    ("ch01.jacobian_product", jac_swapped_tk)], ids=lambda x: getattr(x, "__name__", str(x)))
def test_red_team_wrong_answers_stay_rejected(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert not ok, text


# --------------------------------------------------------------------------- R4 review: BPTT shortcuts
def _bptt_loss(x, h0, W_xh, W_hh, b, dh):
    return (_forward(x, h0, W_xh, W_hh, b)[:, 1:] * dh).sum()


def bptt_jacfwd(x, h0, W_xh, W_hh, b, dh):  # forward-mode autodiff of the whole loss
    return torch.func.jacfwd(lambda a, c, d, e: _bptt_loss(x, e, a, c, d, dh),
                             argnums=(0, 1, 2, 3))(W_xh, W_hh, b, h0)


def _one_hot_loop(params, value):
    out = []
    for k, p in enumerate(params):
        g = torch.zeros(p.numel(), dtype=p.dtype)
        for j in range(p.numel()):
            e = torch.zeros(p.numel(), dtype=p.dtype)
            e[j] = 1
            g[j] = value(k, p, e.reshape(p.shape))
        out.append(g.reshape(p.shape))
    return tuple(out)


def bptt_jvp(x, h0, W_xh, W_hh, b, dh):  # torch.func.jvp, one direction per parameter entry
    ps = [W_xh, W_hh, b, h0]

    def value(k, p, e):
        def f(q):
            a = list(ps)
            a[k] = q
            return _bptt_loss(x, a[3], a[0], a[1], a[2], dh)
        return torch.func.jvp(f, (p,), (e,))[1]
    return _one_hot_loop(ps, value)


def bptt_dual_numbers(x, h0, W_xh, W_hh, b, dh):  # forward_ad, autograd switched back on
    import torch.autograd.forward_ad as fwAD
    with torch.inference_mode(False):
        x, h0, W_xh, W_hh, b, dh = [t.clone() for t in (x, h0, W_xh, W_hh, b, dh)]
        ps = [W_xh, W_hh, b, h0]

        def value(k, p, e):
            with fwAD.dual_level():
                a = list(ps)
                a[k] = fwAD.make_dual(p, e)
                return fwAD.unpack_dual(_bptt_loss(x, a[3], a[0], a[1], a[2], dh)).tangent
        return tuple(g.clone() for g in _one_hot_loop(ps, value))


def bptt_complex_step(x, h0, W_xh, W_hh, b, dh):  # Im L(p + i h e) / h: exact, no backprop
    ct = torch.complex128 if x.dtype == torch.float64 else torch.complex64
    ps = [t.to(ct) for t in (W_xh, W_hh, b, h0)]
    xc, dc, step = x.to(ct), dh.to(ct), 1e-30

    def value(k, p, e):
        a = list(ps)
        a[k] = p + 1j * step * e
        return _bptt_loss(xc, a[3], a[0], a[1], a[2], dc).imag / step
    return tuple(g.real.to(x.dtype) for g in _one_hot_loop(ps, value))


def bptt_private_helper(x, h0, W_xh, W_hh, b, dh):  # the function behind the .solution
    from attnbook.exercises import bptt_build
    return bptt_build._bptt(x, h0, W_xh, W_hh, b, dh)


def bptt_chapter_helpers(x, h0, W_xh, W_hh, b, dh):  # correct: BPTT with attnbook.rnn's pieces
    from attnbook import rnn as R
    net = R.SimpleRNN(x.shape[2], h0.shape[1], dtype=x.dtype)
    net.W_xh.data, net.W_hh.data, net.b.data = W_xh, W_hh, b
    out = net(x, h0)
    J, d = R.step_jacobians(net, out.z), R.activation_derivative(out.z)
    g, grads = torch.zeros_like(h0), [torch.zeros_like(W_xh), torch.zeros_like(W_hh),
                                      torch.zeros_like(b)]
    for t in range(x.shape[1], 0, -1):
        dz = (g + dh[:, t - 1]) * d[:, t - 1]
        prev = h0 if t == 1 else out.h[:, t - 2]
        grads = [grads[0] + x[:, t - 1].T @ dz, grads[1] + prev.T @ dz, grads[2] + dz.sum(0)]
        g = torch.einsum("ba,bac->bc", g + dh[:, t - 1], J[:, t - 1])
    return (*grads, g)


@pytest.mark.parametrize("fn,word", [(bptt_jacfwd, "jacfwd"), (bptt_jvp, "torch.func.jvp"),
                                     (bptt_dual_numbers, "make_dual"),
                                     (bptt_private_helper, "_bptt")])
def test_bptt_forward_mode_and_private_helper_are_ruled_out_by_name(fn, word):
    ok, text = run("ch01.bptt", fn)
    assert not ok and "不许" in text and word in text, text


@pytest.mark.parametrize("seed", SEEDS)
def test_bptt_complex_step_is_rejected_and_named(seed):
    ok, text = run("ch01.bptt", bptt_complex_step, seed)
    assert not ok and "复步长" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_bptt_with_the_chapters_helpers_passes(seed):
    ok, text = run("ch01.bptt", bptt_chapter_helpers, seed)
    assert ok, text


def bptt_in_bfloat16(x, h0, W_xh, W_hh, b, dh):  # wrong: the right algorithm, rounded to bfloat16
    from attnbook.exercises import bptt_build
    out = bptt_build._bptt(*(a.to(torch.bfloat16) for a in (x, h0, W_xh, W_hh, b, dh)))
    return tuple(o.to(x.dtype) for o in out)


@pytest.mark.parametrize("seed", SEEDS)
def test_bptt_float32_bound_still_rejects_a_lower_precision_answer(seed):
    # the float32 case's bound is widened by T + 1 rounding steps (_low_atol): the same algorithm
    # in bfloat16 (eps 2^-7 instead of 2^-23) must still be far outside it.
    from attnbook.exercises import bptt_build
    ex = exercises.get("ch01.bptt")
    case = [c for c in ex.cases(seed) if "float32" in c.title][0]
    exact = bptt_build._bptt(*(a.double() for a in case.args))
    got = bptt_in_bfloat16(*case.args)
    err = max(float((g.double() - e).abs().max()) for g, e in zip(got, exact))
    assert err > bptt_build._low_atol(case, torch.float32), err
