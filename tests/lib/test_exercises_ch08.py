"""Chapter 08's hands-on exercises (attnbook.exercises.layernorm, residual_stack), beyond what
tests/lib/test_exercises.py checks for every exercise: wrong answers outside the gallery are
rejected over seeds 0-3, independent right answers pass, the library's blocks are ruled out by
name, and the build exercise's stream measurement matches the chapter's claim (Pre-LN grows,
Post-LN stays at 1)."""
import contextlib
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import check
from attnbook.layers import ResidualBlock
from exercise_run import run

SEEDS = (0, 1, 2, 3)


def _ln(z, eps=1e-5):
    return F.layer_norm(z, z.shape[-1:], eps=eps)


def _stack(x, w1s, w2s, norm_first, eps=1e-5, unbiased=False, rms_of="stream"):
    rms = []
    for w1, w2 in zip(w1s, w2s):
        f = lambda z: torch.relu(z @ w1) @ w2  # noqa: E731
        x = x + f(_ln(x, eps)) if norm_first else _ln(x + f(x), eps)
        rms.append(x.std(unbiased=unbiased) if rms_of == "std" else x.pow(2).mean().sqrt())
    return (_ln(x, eps) if norm_first else x), torch.stack(rms)


def stack_eps6(x, w1s, w2s, norm_first):  # the Annotated Transformer's eps = 1e-6
    return _stack(x, w1s, w2s, norm_first, eps=1e-6)


def stack_std(x, w1s, w2s, norm_first):  # std of the stream instead of its root mean square
    return _stack(x, w1s, w2s, norm_first, rms_of="std")


def stack_reversed(x, w1s, w2s, norm_first):  # layers applied last to first
    return _stack(x, w1s.flip(0), w2s.flip(0), norm_first)


def stack_rms_per_row(x, w1s, w2s, norm_first):  # one rms per token, then averaged
    out, _ = _stack(x, w1s, w2s, norm_first)
    rms = []
    for w1, w2 in zip(w1s, w2s):
        f = lambda z: torch.relu(z @ w1) @ w2  # noqa: E731
        x = x + f(_ln(x)) if norm_first else _ln(x + f(x))
        rms.append(x.pow(2).mean(-1).sqrt().mean())
    return out, torch.stack(rms)


def stack_only_out(x, w1s, w2s, norm_first):  # forgets the second output
    return _stack(x, w1s, w2s, norm_first)[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [stack_eps6, stack_std, stack_reversed, stack_rms_per_row,
                                stack_only_out], ids=lambda f: f.__name__)
def test_wrong_stacks_outside_the_gallery_are_rejected(fn, seed):
    ok, text = run("ch08.residual_stack", fn, seed=seed)
    assert ok is False and "✗" in text, text


def test_a_missing_second_output_is_named():
    ok, text = run("ch08.residual_stack", stack_only_out)
    assert ok is False and "rms" in text, text


@pytest.mark.parametrize("seed", SEEDS)
def test_independent_right_stacks_pass(seed):
    def by_hand(x, w1s, w2s, norm_first):  # LN written out, a Python list of rms values
        def ln(z):
            mu = z.mean(-1, keepdim=True)
            return (z - mu) / ((z - mu).pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
        rms = []
        for layer in range(len(w1s)):
            h = ln(x) if norm_first else x
            y = F.relu(h @ w1s[layer]) @ w2s[layer]
            x = x + y if norm_first else ln(x + y)
            rms.append(x.square().mean().sqrt())
        return (ln(x) if norm_first else x), torch.stack(rms)

    def own_block(x, w1s, w2s, norm_first):  # the reader's own residual block, reused
        def block(z, w1, w2):
            f = lambda u: F.relu(u @ w1) @ w2  # noqa: E731
            return z + f(_ln(z)) if norm_first else _ln(z + f(z))
        rms = []
        for w1, w2 in zip(w1s.unbind(0), w2s.unbind(0)):
            x = block(x, w1, w2)
            rms.append(torch.linalg.vector_norm(x) / x.numel() ** 0.5)
        return [(_ln(x) if norm_first else x), torch.stack(rms)]

    for fn in (by_hand, own_block):
        ok, text = run("ch08.residual_stack", fn, seed=seed)
        assert ok is True, text


class _FFN(nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.w1, self.w2 = w1, w2

    def forward(self, z):
        return torch.relu(z @ self.w1) @ self.w2


def test_the_librarys_blocks_are_ruled_out_by_name():
    def with_library(x, w1s, w2s, norm_first):
        rms = []
        for w1, w2 in zip(w1s, w2s):
            blk = ResidualBlock(_FFN(w1, w2), x.shape[-1], norm_first=norm_first).double()
            with torch.no_grad():
                blk.norm.weight.fill_(1.0)
                blk.norm.bias.zero_()
            x = blk(x)
            rms.append(x.pow(2).mean().sqrt())
        return (_ln(x) if norm_first else x), torch.stack(rms)

    ok, text = run("ch08.residual_stack", with_library)
    assert ok is False and "不许" in text and "ResidualBlock" in text, text

    solution = exercises.get("ch08.residual_block").solution

    def with_block_solution(x, w1s, w2s, norm_first):
        rms = []
        for w1, w2 in zip(w1s, w2s):
            x = solution(x, w1, w2, norm_first)
            rms.append(x.pow(2).mean().sqrt())
        return (_ln(x) if norm_first else x), torch.stack(rms)

    ok, text = run("ch08.residual_stack", with_block_solution)
    assert ok is False and "不许" in text and "residual_block" in text, text


def test_the_stream_grows_in_pre_ln_and_stays_at_one_in_post_ln():
    # the chapter's claim (sec-ch08-stream-growth), on the exercise's own reference
    ref = exercises.get("ch08.residual_stack").solution
    g = torch.Generator().manual_seed(0)
    n, d = 12, 16
    x = torch.randn(4, 8, d, generator=g, dtype=torch.float64)
    w1s = torch.randn(n, d, 4 * d, generator=g, dtype=torch.float64) * d ** -0.5
    w2s = torch.randn(n, 4 * d, d, generator=g, dtype=torch.float64) * (4 * d) ** -0.5
    _, pre = ref(x, w1s, w2s, True)
    _, post = ref(x, w1s, w2s, False)
    assert bool((pre[1:] > pre[:-1]).all()) and pre[-1] > 2 * pre[0]
    assert bool(((post - 1).abs() < 1e-3).all())
    assert exercises.get("ch08.residual_stack").build


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
def test_batch_norm_over_the_transposed_rows_is_ruled_out(seed):  # review R3: it passed before
    def via_batch_norm(x, weight, bias, eps=1e-5):
        rows = x.reshape(-1, x.shape[-1]).T
        y = torch.nn.functional.batch_norm(rows, None, None, training=True, eps=eps)
        return y.T.reshape(x.shape) * weight + bias
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check("ch08.layer_norm", via_batch_norm, seed=seed)
    assert not ok and "batch_norm" in buf.getvalue(), buf.getvalue()
