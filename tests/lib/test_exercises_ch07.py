"""Chapter 07's hands-on exercises (attnbook.exercises.ffn): the references pass, every gallery
bug is rejected with its symptom named, stubs say 还没有实现, independent right answers pass and
the references equal the library's FeedForward (relu and swiglu, weights copied)."""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import check
from attnbook.layers import FeedForward

SYMPTOMS = {
    ("ch07.feed_forward", "no_relu"): ["少了 ReLU", "仿射"],
    ("ch07.feed_forward", "relu_on_output"): ["输出不过 ReLU"],
    ("ch07.feed_forward", "b1_added_after_relu"): ["b1 要加在 ReLU 之前"],
    ("ch07.feed_forward", "gelu_instead_of_relu"): ["max(0, ·)", "不是 GELU"],
    ("ch07.feed_forward", "b2_forgotten"): ["输出偏置 b2"],
    ("ch07.swiglu", "silu_on_the_up_branch"): ["两支用反了"],
    ("ch07.swiglu", "sigmoid_gate"): ["不是 σ(u)", "GLU"],
    ("ch07.swiglu", "relu_gate"): ["不是 ReLU", "ReGLU"],
    ("ch07.swiglu", "gate_ignored"): ["少了门"],
    ("ch07.swiglu", "branches_added"): ["逐元素相乘", "不是相加"],
    ("ch07.swiglu", "silu_after_product"): ["在相乘之前"],
}


def run(name, fn, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, **kw)
    return ok, buf.getvalue()


def test_the_gallery_is_the_table():
    for name in ("ch07.feed_forward", "ch07.swiglu"):
        assert sorted(exercises.get(name).bugs) == sorted(b for n, b in SYMPTOMS if n == name)


@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("name", ("ch07.feed_forward", "ch07.swiglu"))
def test_reference_passes(name, seed):
    ok, text = run(name, exercises.get(name).solution, seed=seed)
    assert ok is True and text.startswith("✓ " + name), text


@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("name,bug", sorted(SYMPTOMS))
def test_every_bug_is_rejected_with_its_symptom(name, bug, seed):
    ok, text = run(name, exercises.get(name).bugs[bug], seed=seed)
    assert ok is False, f"{name}:{bug} accepted"
    flat = "".join(text.split())
    for word in SYMPTOMS[name, bug]:
        assert "".join(word.split()) in flat, f"{name}:{bug}: hint lacks {word!r}:\n{text}"


def test_stubs_and_transposed_weights():
    def ff_stub(x, w1, b1, w2, b2):
        ...  # 你的代码

    def sw_stub(x, w_gate, w_up, w_down):
        ...  # 你的代码
    for name, stub in (("ch07.feed_forward", ff_stub), ("ch07.swiglu", sw_stub)):
        ok, text = run(name, stub)
        assert ok is False and "还没有实现" in "".join(text.split())
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
