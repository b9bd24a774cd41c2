"""The two causal alignments, named (rev4-code finding 8; CHAPTER.md point 26).

``"top_left"``: query i sees key j iff j <= i. ``"bottom_right"``: iff j <= i + (Tk - Tq), the
queries being the last Tq positions (incremental decoding). Every place of the library that takes
``causal`` is checked against an explicit loop with Tq != Tk, for both alignments.
"""
from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from attnbook import cache as cache_module
from attnbook.cache import CachedAttention, KVCache
from attnbook.multihead import MultiHeadAttention
from attnbook.positional import alibi_bias, alibi_slopes
from attnbook.reference import (CAUSAL_ALIGNMENTS, attention_ref, causal_alignment, causal_mask,
                                fold_causal, visible_keys)
from attnbook.testing import F64_TOL, rand

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64
SIZES = [(3, 5), (5, 3), (4, 4), (1, 6), (0, 3), (3, 0)]


def loop_mask(tq, tk, align):
    """The definition, one entry at a time."""
    offset = tk - tq if align == "bottom_right" else 0
    return torch.tensor([[j <= i + offset for j in range(tk)] for i in range(tq)],
                        dtype=torch.bool).reshape(tq, tk)


def loop_attention(q, k, v, allowed):
    """softmax over the allowed keys of each query row, one row at a time; zeros for no key."""
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        keys = allowed[i].nonzero().flatten()
        if len(keys):
            s = q[..., i:i + 1, :] @ k[..., keys, :].transpose(-2, -1) / q.shape[-1] ** 0.5
            out[..., i:i + 1, :] = torch.softmax(s, -1) @ v[..., keys, :]         # (..., 1, Dv)
    return out


@pytest.mark.parametrize("tq, tk", SIZES)
@pytest.mark.parametrize("align", CAUSAL_ALIGNMENTS)
def test_causal_mask_is_the_loop_and_torchs_variant(tq, tk, align):
    got = causal_mask(tq, tk, align=align)
    assert torch.equal(got, loop_mask(tq, tk, align))
    if tq and tk:
        if align == "top_left" or tq <= tk:      # torch warns (NaN rows) for lower-right tq > tk
            variant = causal_lower_right if align == "bottom_right" else causal_upper_left
            assert torch.equal(got, variant(tq, tk)._materialize())


def test_causal_mask_default_is_top_left_and_the_alignments_differ():
    assert torch.equal(causal_mask(3, 5), causal_mask(3, 5, align="top_left"))
    assert not torch.equal(causal_mask(3, 5, align="top_left"), causal_mask(3, 5, align="bottom_right"))
    assert torch.equal(causal_mask(4, align="top_left"), causal_mask(4, align="bottom_right"))
    with pytest.raises(ValueError, match="causal_mask: `align`"):
        causal_mask(3, 5, align="lower_right")


def test_causal_alignment_reads_bools_and_names():
    for default in CAUSAL_ALIGNMENTS:
        assert causal_alignment(True, default=default, fn="f") == default
        assert causal_alignment(np.bool_(True), default=default, fn="f") == default
        assert causal_alignment(False, default=default, fn="f") is None
        for name in CAUSAL_ALIGNMENTS:
            assert causal_alignment(name, default=default, fn="f") == name
    with pytest.raises(ValueError, match="f: `causal`"):
        causal_alignment("upper_left", default="top_left", fn="f")
    with pytest.raises(TypeError, match="f: `causal`"):
        causal_alignment(1, default="top_left", fn="f")
    with pytest.raises(ValueError, match="causal_alignment: `default`"):
        causal_alignment(True, default="left", fn="f")


@pytest.mark.parametrize("tq, tk", [(3, 5), (5, 3)])
def test_fold_causal_bool_and_additive_masks(tq, tk):
    allowed = loop_mask(tq, tk, "bottom_right")
    pad = torch.tensor([True] * (tk - 1) + [False])[None, None, None, :]          # (1, 1, 1, Tk)
    m, c = fold_causal(pad, "bottom_right", tq, tk)
    assert c is False and torch.equal(m, (pad & allowed).expand(1, 1, tq, tk))
    add = torch.zeros(2, 1, 1, tk, dtype=F64)
    m, c = fold_causal(add, "bottom_right", tq, tk)
    assert c is False and m.shape == (2, 1, tq, tk) and torch.equal(torch.isneginf(m[0, 0]), ~allowed)
    assert fold_causal(None, "top_left", tq, tk) == (None, True)
    assert fold_causal(None, None, tq, tk) == (None, False)
    assert fold_causal(pad, "bottom_right", 4, 4)[1] is True                     # equal when Tq = Tk


@pytest.mark.parametrize("tq, tk", [(3, 5), (5, 3), (2, 7)])
@pytest.mark.parametrize("align", CAUSAL_ALIGNMENTS)
def test_visible_keys_and_attention_ref_follow_the_loop(tq, tk, align):
    assert torch.equal(visible_keys(None, align, tq, tk), loop_mask(tq, tk, align))
    q, k, v = rand(2, 2, tq, 4, seed=0), rand(2, 2, tk, 4, seed=1), rand(2, 2, tk, 3, seed=2)
    want = loop_attention(q, k, v, loop_mask(tq, tk, align))
    mask = causal_mask(tq, tk, align=align)
    torch.testing.assert_close(attention_ref(q, k, v, mask=mask).out, want, **F64_TOL)
    if align == "top_left":          # attention_ref's causal=True is top-left
        torch.testing.assert_close(attention_ref(q, k, v, causal=True).out, want, **F64_TOL)


def _mha(cls=MultiHeadAttention, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(8, 2, dtype=F64, **kw)


@pytest.mark.parametrize("cls", [MultiHeadAttention, CachedAttention])
@pytest.mark.parametrize("tq, tk", [(3, 5), (5, 3)])
@pytest.mark.parametrize("align", CAUSAL_ALIGNMENTS)
def test_modules_follow_the_loop_for_both_alignments(cls, tq, tk, align):
    m = _mha(cls)
    x, mem = rand(2, tq, 8, seed=3), rand(2, tk, 8, seed=4)
    q, k, v = m.project(x, mem, mem)
    heads = loop_attention(q, k, v, loop_mask(tq, tk, align))                       # (B, H, Tq, d_k)
    want = m.out_proj(heads.transpose(1, 2).reshape(2, tq, 8))
    torch.testing.assert_close(m(x, mem, causal=align).out, want, **F64_TOL)
    res = m(x, mem, causal=align, need_weights=True)
    torch.testing.assert_close(res.out, want, **F64_TOL)
    assert torch.equal(res.weights[0, 0] > 0, loop_mask(tq, tk, align))
    # causal=True is each module's documented default
    default = "top_left" if cls is MultiHeadAttention else "bottom_right"
    assert cls.causal_default == default
    same = m(x, mem, causal=True).out
    if align == default:
        torch.testing.assert_close(same, want, **F64_TOL)
    else:                                                    # control: the alignments differ here
        assert (same - want).abs().max() > 1e-6


def test_modules_reject_an_unknown_alignment():
    x = rand(1, 3, 8)
    for m in (_mha(), _mha(CachedAttention)):
        with pytest.raises(ValueError, match=f"{type(m).__name__}.forward: `causal`"):
            m(x, causal="lower_right")
        with pytest.raises(TypeError, match=f"{type(m).__name__}.forward: `causal`"):
            m(x, causal=1)


@pytest.mark.parametrize("rope", [False, True])
def test_cached_decoding_equals_the_full_forward(rope):
    m = _mha(CachedAttention, rope=rope)
    x = rand(2, 7, 8, seed=5)
    full = m(x, causal="top_left").out                 # one pass: Tq = Tk, both alignments agree
    cache = KVCache()
    chunks = [m(x[:, :3], causal=True, cache=cache).out]                         # a prompt of 3
    chunks += [m(x[:, t:t + 1], causal="bottom_right", cache=cache).out for t in range(3, 5)]
    chunks.append(m(x[:, 5:], causal=True, cache=cache).out)                      # 2 at once
    torch.testing.assert_close(torch.cat(chunks, 1), full, **F64_TOL)
    # control: a top-left step over the cache lets the 2 new queries see only keys 0 and 1
    cache = KVCache()
    m(x[:, :5], causal=True, cache=cache)
    wrong = m(x[:, 5:], causal="top_left", cache=cache).out
    assert (wrong - full[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("tq, tk", [(1, 6), (2, 6), (6, 6), (4, 2)])
def test_alibi_bias_bottom_right_is_the_last_rows_and_the_loop(tq, tk):
    h = 4
    slopes = alibi_slopes(h, dtype=F64)
    got = alibi_bias(h, tq, tk, align="bottom_right", dtype=F64)
    want = torch.full((h, tq, tk), float("-inf"), dtype=F64)
    for a in range(h):
        for i in range(tq):
            for j in range(tk):
                p = i + tk - tq                                  # query i sits at position p
                if j <= p:
                    want[a, i, j] = -slopes[a] * (p - j)
    assert torch.equal(got, want)
    if tq <= tk:
        assert torch.equal(got, alibi_bias(h, tk, dtype=F64)[:, tk - tq:])
    if tq != tk:                                  # control: the default is top-left, and differs
        assert not torch.equal(alibi_bias(h, tq, tk, dtype=F64), got)
    sym = alibi_bias(h, tq, tk, symmetric=True, align="bottom_right", dtype=F64)
    i = torch.arange(tq, dtype=F64)[:, None] + tk - tq
    j = torch.arange(tk, dtype=F64)[None, :]
    torch.testing.assert_close(sym, -slopes[:, None, None] * (i - j).abs(), **F64_TOL)
    with pytest.raises(ValueError, match="alibi_bias: `align`"):
        alibi_bias(h, tq, tk, align="top-left")


def test_alibi_bottom_right_for_a_cached_step():
    """A decoding step with ALiBi: one new query over the cached keys equals the full pass's last row."""
    m = _mha(CachedAttention)
    h, t = m.n_heads, 6
    x = rand(1, t, 8, seed=6)
    full = m(x, mask=alibi_bias(h, t, dtype=F64)).out                   # (1, t, d), causal inside
    cache = KVCache()
    m(x[:, :t - 1], mask=alibi_bias(h, t - 1, dtype=F64), cache=cache)
    step = m(x[:, t - 1:], mask=alibi_bias(h, 1, t, align="bottom_right", dtype=F64), cache=cache).out
    torch.testing.assert_close(step, full[:, t - 1:], **F64_TOL)
    cache = KVCache()                                                   # control: top-left is wrong
    m(x[:, :t - 1], mask=alibi_bias(h, t - 1, dtype=F64), cache=cache)
    wrong = m(x[:, t - 1:], mask=alibi_bias(h, 1, t, dtype=F64), cache=cache).out
    assert (wrong - full[:, t - 1:]).abs().max() > 1e-3


def test_cache_module_keeps_its_own_checks():
    """rev4-code finding 2: cache.py imports no private name of another module."""
    tree = ast.parse(inspect.getsource(cache_module))
    private = [(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names if a.name.startswith("_") and node.module not in ("__future__",)
               and node.module != "_checks"]
    assert private == [], private
    # control: the walk sees a private import when there is one
    fake = ast.parse("from .multihead import _check_inputs")
    assert [a.name for n in ast.walk(fake) if isinstance(n, ast.ImportFrom) for a in n.names] == ["_check_inputs"]
