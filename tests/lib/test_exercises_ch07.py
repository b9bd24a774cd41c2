"""Chapter 07's hands-on exercises (attnbook.exercises.ffn), beyond what tests/lib/test_exercises.py
checks for every exercise (references pass, every gallery bug rejected with its symptom, stubs):
the column convention is rejected, independent right answers pass, and the references equal the
library's FeedForward (relu and swiglu, weights copied)."""

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import check
from attnbook.layers import FeedForward
from exercise_run import run


def test_transposed_weights_are_rejected():
    # the column convention (001's W_1 of shape (d_ff, d)) fails on the shapes, reported
    ok, text = run("ch07.feed_forward", lambda x, w1, b1, w2, b2: F.relu(x @ w1.T + b1) @ w2.T + b2)
    assert ok is False and "✗" in text


def test_independent_right_answers_pass():
    ok, text = run("ch07.feed_forward",
                   lambda x, w1, b1, w2, b2: F.linear(F.relu(F.linear(x, w1.T, b1)), w2.T, b2))
    assert ok, text
    ok, text = run("ch07.swiglu", lambda x, wg, wu, wd: torch.einsum(
        "...f,fd->...d", (x @ wg) * torch.sigmoid(x @ wg) * (x @ wu), wd))
    assert ok, text


def test_references_equal_the_library():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    relu = FeedForward(6, 24, dtype=torch.float64)
    w = [relu.linear1.weight.T, relu.linear1.bias, relu.linear2.weight.T, relu.linear2.bias]
    torch.testing.assert_close(exercises.get("ch07.feed_forward").solution(x, *w), relu(x))
    sw = FeedForward(6, 16, activation="swiglu", bias=False, dtype=torch.float64)
    ws = [sw.gate.weight.T, sw.linear1.weight.T, sw.linear2.weight.T]
    torch.testing.assert_close(exercises.get("ch07.swiglu").solution(x, *ws), sw(x))
    # control: the up and gate weights swapped give another function
    assert not torch.allclose(exercises.get("ch07.swiglu").solution(x, ws[1], ws[0], ws[2]), sw(x))


# ----------------------------------------------------------------------------- the build exercise
def _matched(x, params, d_ff):  # an independent right answer: split, reshape, einsum
    d = x.shape[-1]
    h = d_ff * 2 // 3
    wg, wu, wd = params.split([d * h, d * h, h * d])
    u = torch.einsum("...d,dh->...h", x, wg.reshape(d, h))
    return (u * torch.sigmoid(u) * (x @ wu.reshape(d, h))) @ wd.reshape(h, d)


def test_matched_swiglu_unusual_right_answers_pass():
    ok, text = run("ch07.matched_swiglu", _matched)
    assert ok, text

    def loop(x, params, d_ff):  # row by row, the same map on every position
        flat = x.reshape(-1, x.shape[-1])
        rows = [_matched(row, params, d_ff) for row in flat]
        return torch.stack(rows).reshape(x.shape)
    ok, text = run("ch07.matched_swiglu", loop)
    assert ok, text


@pytest.mark.parametrize("seed", range(4))
def test_matched_swiglu_wrong_answers_outside_the_gallery(seed):
    def h_rounded_up(x, params, d_ff):  # 2 d_ff / 3 rounded up to a multiple of 4
        d = x.shape[-1]
        h = -(-(2 * d_ff // 3) // 4) * 4
        wg, wu, wd = params[:d * h], params[d * h:2 * d * h], params[2 * d * h:]
        return (F.silu(x @ wg.view(d, h)) * (x @ wu.view(d, h))) @ wd.view(h, d)

    def silu_twice(x, params, d_ff):  # SiLU on both branches
        d = x.shape[-1]
        h = 2 * d_ff // 3
        wg, wu, wd = params.split([d * h, d * h, h * d])
        return (F.silu(x @ wg.view(d, h)) * F.silu(x @ wu.view(d, h))) @ wd.view(h, d)

    def gelu_gate(x, params, d_ff):  # GeGLU
        d = x.shape[-1]
        h = 2 * d_ff // 3
        wg, wu, wd = params.split([d * h, d * h, h * d])
        return (F.gelu(x @ wg.view(d, h)) * (x @ wu.view(d, h))) @ wd.view(h, d)

    for fn in (h_rounded_up, silu_twice, gelu_gate):
        ok, text = run("ch07.matched_swiglu", fn, seed=seed)
        assert ok is False and "✗" in text, (fn.__name__, text)


def test_matched_swiglu_shortcuts_are_rejected_by_name():
    def module(x, params, d_ff):
        d = x.shape[-1]
        h = 2 * d_ff // 3
        ffn = FeedForward(d, h, activation="swiglu", bias=False, dtype=x.dtype)
        wg, wu, wd = params.split([d * h, d * h, h * d])
        with torch.no_grad():
            ffn.gate.weight.copy_(wg.view(d, h).T)
            ffn.linear1.weight.copy_(wu.view(d, h).T)
            ffn.linear2.weight.copy_(wd.view(h, d).T)
        return ffn(x)

    ok, text = run("ch07.matched_swiglu", module)
    assert ok is False and "FeedForward" in text and "不许" in text, text

    sw = exercises.get("ch07.swiglu").solution
    ok, text = run("ch07.matched_swiglu", lambda x, p, d_ff: sw(
        x, *(t.view(s) for t, s in zip(p.split([x.shape[-1] * (2 * d_ff // 3)] * 3),
                                       [(x.shape[-1], 2 * d_ff // 3)] * 2
                                       + [(2 * d_ff // 3, x.shape[-1])]))))
    assert ok is False and "ch07.swiglu" in text, text


def test_matched_swiglu_hints_name_the_width():
    def h_is_d_ff(x, params, d_ff):
        d = x.shape[-1]
        return (F.silu(x @ params[:d * d_ff].view(d, d_ff))
                * (x @ params[d * d_ff:2 * d * d_ff].view(d, d_ff))) @ params[2 * d * d_ff:].view(d_ff, d)
    ok, text = run("ch07.matched_swiglu", h_is_d_ff)
    assert ok is False and "隐藏宽度不是 d_ff" in text and "2·d_ff/3 = 8" in text, text
    # the 8d/3 rule passes the d_ff = 4d case and is named where d_ff != 4d
    ok, text = run("ch07.matched_swiglu", exercises.get("ch07.matched_swiglu").bugs["hidden_from_d_model"])
    assert ok is False and "8d/3" in text and "d_ff = 4d" in text, text


def test_feed_forward_relu6_is_rejected_on_every_seed():
    for seed in range(4):
        ok, text = run("ch07.feed_forward", lambda x, w1, b1, w2, b2: F.relu6(x @ w1 + b1) @ w2 + b2,
                       seed=seed)
        assert ok is False and "超过 6" in text, text


@pytest.mark.parametrize("name", ["ch07.feed_forward", "ch07.swiglu"])
def test_shapes_and_dtypes_vary_with_the_seed(name):
    ex = exercises.get(name)
    shapes = {tuple(tuple(a.shape) for a in case.args) for s in range(4) for case in ex.cases(s)}
    assert len(shapes) > len(ex.cases(0)), shapes
    assert any(case.args[0].dtype == torch.float32 for case in ex.cases(0))
    if name == "ch07.swiglu":                       # the prompt: d_ff = 8d/3 in every case
        for s in range(4):
            for case in ex.cases(s):
                d, d_ff = case.args[1].shape
                assert 3 * d_ff == 8 * d


@pytest.mark.parametrize("seed", range(4))
def test_ffn_and_swiglu_wrong_answers_outside_the_gallery(seed):
    ff = {
        "leaky_relu": lambda x, w1, b1, w2, b2: F.leaky_relu(x @ w1 + b1) @ w2 + b2,
        "softplus": lambda x, w1, b1, w2, b2: F.softplus(x @ w1 + b1) @ w2 + b2,
        "elu": lambda x, w1, b1, w2, b2: F.elu(x @ w1 + b1) @ w2 + b2,
    }
    sw = {
        "gelu gate": lambda x, g, u, d: (F.gelu(x @ g) * (x @ u)) @ d,
        "silu on both branches": lambda x, g, u, d: (F.silu(x @ g) * F.silu(x @ u)) @ d,
        "swish beta 2": lambda x, g, u, d: ((x @ g) * torch.sigmoid(2 * (x @ g)) * (x @ u)) @ d,
    }
    for name, wrong in (("ch07.feed_forward", ff), ("ch07.swiglu", sw)):
        for why, fn in wrong.items():
            ok, text = run(name, fn, seed=seed)
            assert ok is False and "✗" in text, (why, text)


def test_swiglu_silu_on_both_branches_is_not_called_a_sigmoid_gate():
    ok, text = run("ch07.swiglu", lambda x, g, u, d: (F.silu(x @ g) * F.silu(x @ u)) @ d)
    flat = text.replace("\n", "").replace(" ", "")
    assert ok is False and "两支都过SiLU" in flat and "GLU。" not in flat, text
