"""Chapter 07's hands-on exercises (attnbook.exercises.ffn), beyond what tests/lib/test_exercises.py
checks for every exercise (references pass, every gallery bug rejected with its symptom, stubs):
the column convention is rejected, independent right answers pass, and the references equal the
library's FeedForward (relu and swiglu, weights copied)."""
import contextlib
import io

import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import check
from attnbook.layers import FeedForward


def run(name, fn, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, **kw)
    return bool(ok), buf.getvalue()


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
