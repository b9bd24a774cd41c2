"""Chapter 09's teaching loops, traffic model, random features, exercises and claim.

The loops agree with attention_ref; the traffic counts that the loops record equal the closed
forms of the chapter's element model (and the FA1/FA2 total ratio is 1.50-1.55, not 16x); the
tiled kernel's causal FLOPs are (n + 1) / 2n of 4T^2 d, attention_ref's are all of it; the
random features are unbiased for exp(q.k / sqrt d); the exercises' references match autograd,
independent right answers pass and the galleries are rejected; the Performer claim holds on
seed 0 and its rule rejects elu + 1's error as if it were a random-feature error.
"""
import contextlib
import io
import math

import pytest
import torch

from attnbook import attention_ref, attention_tiled, exercises
from attnbook.efficient import linear_attention, random_feature_map
from attnbook.exercises import check
from attnbook.experiments import ch09
from attnbook.flash_teaching import (Traffic, count_matmul_flops, fa1_loop, fa1_tile_sizes,
                                     tiled_loop)
from attnbook.testing import F64_TOL

f64 = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


def run(name, fn):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn)
    return bool(ok), buf.getvalue()  # check returns a Verdict (a bool-like)


@pytest.mark.parametrize("t,tk,bq,bk,causal", [(40, 40, 8, 8, False), (37, 29, 16, 5, False),
                                               (33, 33, 7, 11, True), (5, 5, 1, 1, True)])
def test_tiled_loop_matches_the_reference(t, tk, bq, bk, causal):
    q, k, v = rand(t, 6, seed=1), rand(tk, 6, seed=2), rand(tk, 4, seed=3)
    out, lse = tiled_loop(q, k, v, bq, bk, causal)
    ref = attention_ref(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref.out, **F64_TOL)
    torch.testing.assert_close(lse, ref.lse, **F64_TOL)
    wrong, _ = tiled_loop(q, k, v, bq, bk, causal, rescale=False)  # control
    if not causal and tk > bk:
        assert (wrong - ref.out).abs().max() > 1e-3


def test_fa1_loop_matches_the_reference():
    q, k, v = rand(50, 8, seed=4), rand(30, 8, seed=5), rand(30, 3, seed=6)
    torch.testing.assert_close(fa1_loop(q, k, v, 16, 7), attention_ref(q, k, v).out, **F64_TOL)


@pytest.mark.parametrize("t,d,b,ratio", [(256, 16, 32, 1.55), (1024, 64, 128, 1.47)])
def test_traffic_counts_follow_the_closed_forms(t, d, b, ratio):
    q, k, v = rand(t, d, seed=7), rand(t, d, seed=8), rand(t, d, seed=9)
    t1, t2 = Traffic(), Traffic()
    fa1_loop(q, k, v, b, b, traffic=t1)
    tiled_loop(q, k, v, b, b, traffic=t2)
    n = t // b
    assert t1.total == 2 * t * d + n * (3 * t * d + 4 * t)  # K, V once; Q, O, l, m per pair
    assert t2.total == 2 * t * d + t + n * 2 * t * d  # Q, O, lse once; K, V per query tile
    assert abs(t1.total / t2.total - ratio) < 0.01
    assert t1.total / t2.total < 2  # not the 2 n_c = 16x of the O traffic alone
    causal = Traffic()
    tiled_loop(q, k, v, b, b, causal=True, traffic=causal)
    assert causal.reads < 0.6 * t2.reads  # about half the key tiles are skipped


def test_causal_flops_skip_masked_tiles_only_in_the_tiled_kernel():
    t, d = 512, 16
    q, k, v = (rand(1, 1, t, d, seed=s).float() for s in range(3))
    full = 4 * t * t * d
    assert count_matmul_flops(lambda: attention_ref(q, k, v, causal=True)) == full
    n = t // 64
    tiled = count_matmul_flops(lambda: attention_tiled(q, k, v, causal=True, block_q=64,
                                                       block_k=64))
    assert tiled == full * (n + 1) // (2 * n)
    dense = torch.ones(t, t, dtype=torch.bool).tril()  # the same pattern as a dense mask
    assert count_matmul_flops(lambda: attention_tiled(q, k, v, mask=dense, block_q=64,
                                                      block_k=64)) == full
    with pytest.raises(TypeError, match="count_matmul_flops: `fn`"):
        count_matmul_flops(3)


def test_fa1_tile_sizes_fit_on_chip():
    b_r, b_c = fa1_tile_sizes(100_000, 64)
    assert (b_r, b_c) == (64, 391)
    assert b_r * b_c <= 100_000 / 4 + 64  # the S tile fits; square 391 x 391 would not
    assert 391 * 391 > 100_000
    with pytest.raises(ValueError, match="fa1_tile_sizes: `d`"):
        fa1_tile_sizes(1000, 0)


def test_random_features_are_unbiased_for_the_softmax_kernel():
    d = 8
    q, k = rand(3, d, seed=10) * 0.5, rand(4, d, seed=11) * 0.5
    exact = torch.exp(q @ k.T / math.sqrt(d))
    draws = torch.stack([random_feature_map(d, 64, seed=s)(q)
                         @ random_feature_map(d, 64, seed=s)(k).T for s in range(400)])
    se = draws.std(0) / math.sqrt(400)
    assert ((draws.mean(0) - exact).abs() / se).max() < 4.5  # unbiased: within 4.5 SE
    biased = draws * torch.exp((q * q).sum(-1) / (2 * math.sqrt(d)))[:, None]  # no |x|^2/2
    assert ((biased.mean(0) - exact).abs() / se).max() > 10  # control: rejected
    one = random_feature_map(d, 64, seed=0)
    assert ((one(q) @ one(k).T - exact).abs() / exact).max() > 0.05  # one draw is noisy
    assert (one(q) > 0).all()
    with pytest.raises(ValueError, match="random_feature_map: `x` must have last dim 8"):
        one(rand(2, 5))
    with pytest.raises(ValueError, match="random_feature_map: `features`"):
        random_feature_map(d, 0)


def test_more_features_approximate_softmax_attention_better():
    q, k, v = ch09.performer_inputs(0)
    m = ch09.performer_metrics(q, k, v)
    assert m["err_m16"] > m["err_m256"] > m["err_m4096"]
    soft = attention_ref(q, k, v).out
    lin = linear_attention(q, k, v)
    assert m["err_elu"] == pytest.approx(float((lin - soft).norm() / soft.norm()))


def test_performer_claim_rule_can_fail():
    exp = __import__("attnbook").experiments.get("ch09.performer")
    good = ch09.run_performer(0)
    assert exp.holds(good)
    assert not exp.holds(dict(good, err_m4096=good["err_elu"]))  # elu's error is not < 0.1
    assert not exp.holds(dict(good, slope=0.0))  # no decrease with m


def test_backward_reference_matches_autograd():
    ex = exercises.get("ch09.attention_backward")
    for case in ex.cases():
        q, k, v = (t.double().clone().requires_grad_() for t in case.args[:3])
        _, lse, do = (t.double() for t in case.args[3:])
        mask = case.kwargs.get("mask")
        ref = attention_ref(q, k, v, mask=mask)
        grads = torch.autograd.grad(ref.out, (q, k, v), do)
        mine = ex.solution(q.detach(), k.detach(), v.detach(), ref.out.detach(), lse, do,
                           mask=mask)
        for a, b in zip(mine, grads):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_merge_reference_matches_full_attention():
    q, k, v = rand(2, 2, 6, 4, seed=12), rand(2, 2, 9, 4, seed=13), rand(2, 2, 9, 3, seed=14)
    one, two = attention_ref(q, k[..., :4, :], v[..., :4, :]), attention_ref(q, k[..., 4:, :],
                                                                            v[..., 4:, :])
    o, lse = exercises.get("ch09.merge_partial").solution(one.out, one.lse, two.out, two.lse)
    full = attention_ref(q, k, v)
    torch.testing.assert_close(o, full.out, **F64_TOL)
    torch.testing.assert_close(lse, full.lse, **F64_TOL)


@pytest.mark.parametrize("name", ["ch09.merge_partial", "ch09.attention_backward"])
def test_solution_passes_and_every_bug_is_rejected(name):
    ex = exercises.get(name)
    ok, text = run(name, ex.solution)
    assert ok is True, text
    for bug, fn in ex.bugs.items():
        ok, text = run(name, fn)
        assert ok is False, bug
        assert "对照" not in text.split("提示")[-1][:4], (bug, text)  # a named hint


def test_independent_right_answers_pass():
    def merge(o1, lse1, o2, lse2):
        lse = torch.logaddexp(lse1, lse2)
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        return (torch.exp(lse1 - safe)[..., None] * o1
                + torch.exp(lse2 - safe)[..., None] * o2), lse
    ok, text = run("ch09.merge_partial", merge)
    assert ok is True, text

    # Written from dS = P * (dP - rowsum(dO * O)) with whole matrices (autograd is off limits
    # in this exercise since issue 29), in float64 whatever the inputs, cast back at the end.
    def backward(q, k, v, out, lse, dout, mask=None):
        dtype = q.dtype
        q, k, v, out, lse, dout = (t.double() for t in (q, k, v, out, lse, dout))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        p = torch.exp(s - safe[..., None]).masked_fill(torch.isinf(lse)[..., None], 0.0)
        ds = p * (dout @ v.transpose(-2, -1) - (dout * out).sum(-1, keepdim=True))
        scale = 1 / math.sqrt(q.shape[-1])
        grads = (scale * ds @ k, scale * ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ dout)
        return tuple(g.to(dtype) for g in grads)
    ok, text = run("ch09.attention_backward", backward)
    assert ok is True, text


def test_importing_the_teaching_module_does_not_import_triton():
    """torch.utils.flop_counter imports triton; imported at the top of flash_teaching it made
    every interpreted Triton test after this file fail ("Cannot call @triton.jit'd outside of
    the scope of a kernel"), so it is imported inside count_matmul_flops."""
    import subprocess
    import sys
    code = "import sys, attnbook.flash_teaching; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
