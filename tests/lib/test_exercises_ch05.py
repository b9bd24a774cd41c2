"""Chapter 05's hands-on exercises beyond the shared battery (tests/lib/test_exercises.py):
independent right answers pass, plausible wrong answers outside the galleries are rejected, and
the references agree with the chapter's own layout (head i = feature block i; query head i reads
KV head i // n_rep)."""
import contextlib
import io

import pytest
import torch

from attnbook import exercises
from attnbook.exercises import check
from attnbook.multihead import merge_heads, repeat_kv, split_heads


def run(name, fn):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn)
    return bool(ok), buf.getvalue()


@pytest.mark.parametrize("name,fn", [
    ("ch05.merge_heads", lambda x: torch.cat(x.unbind(1), dim=-1)),
    ("ch05.merge_heads", lambda x: x.transpose(1, 2).flatten(-2)),
    ("ch05.repeat_kv", lambda x, n_rep: x.repeat_interleave(n_rep, dim=1)),
    ("ch05.repeat_kv", lambda x, n_rep: torch.stack([x] * n_rep, 2).flatten(1, 2)),
])
def test_independent_right_answers_pass(name, fn):
    ok, text = run(name, fn)
    assert ok is True, text


def test_plausible_wrong_answers_are_rejected():
    # heads in reverse order: right shape, right blocks, wrong pairing
    ok, text = run("ch05.merge_heads", lambda x: torch.cat(x.unbind(1)[::-1], dim=-1))
    assert ok is False and "第 i 块特征" in text
    # mean over heads: the sum's shape, named as such
    ok, text = run("ch05.merge_heads", lambda x: x.mean(1))
    assert ok is False and "不是拼接" in text
    # KV head j serves the LAST n_rep query heads first: reversed groups
    ok, text = run("ch05.repeat_kv", lambda x, n_rep: x.repeat_interleave(n_rep, 1).flip(1))
    assert ok is False and "i // n_rep" in text


def _merge_stub(x):
    ...  # 你的代码


def _repeat_stub(x, n_rep):
    ...  # 你的代码


def test_stubs_are_not_yet_implemented():
    for name, stub in (("ch05.merge_heads", _merge_stub), ("ch05.repeat_kv", _repeat_stub)):
        ok, text = run(name, stub)
        assert ok is False and "还没有实现" in "".join(text.split())


def test_references_match_the_chapter_layout():
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    heads = split_heads(x, 3)
    assert torch.equal(exercises.get("ch05.merge_heads").solution(heads), x)
    assert torch.equal(merge_heads(heads)[..., 4:8], heads[:, 1])        # block 1 = head 1
    kv = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    rep = exercises.get("ch05.repeat_kv").solution(kv, 3)
    assert torch.equal(rep, repeat_kv(kv, 3))
    for i in range(6):
        assert torch.equal(rep[:, i], kv[:, i // 3])
    assert not torch.equal(rep[:, 1], kv[:, 1 % 2])                       # control: not i % H_kv


# --------------------------------------------------------------------------- issue 29
SEEDS = (0, 1, 2, 3)


def run_seed(name, fn, seed):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, seed=seed)
    return bool(ok), buf.getvalue()


@pytest.mark.parametrize("name,fn,words", [
    ("ch05.split_heads", lambda x, h: x.view(*x.shape[:2], h, -1).transpose(1, 3).reshape(
        x.shape[0], h, x.shape[1], -1), "transpose(1, 3)"),
    ("ch05.split_heads", lambda x, h: x.reshape(*x.shape[:2], h, -1).transpose(1, 2).reshape(
        -1, x.shape[1], x.shape[2] // h), "nn.MultiheadAttention"),
    ("ch05.split_heads", lambda x, h: x.transpose(1, 2).reshape(x.shape[0], h, x.shape[1], -1),
     "先转置、后 reshape"),
    ("ch05.split_heads", lambda x, h: x.reshape(x.shape[0] * x.shape[1], h, -1).transpose(
        0, 1).reshape(x.shape[0], h, x.shape[1], -1), "批和时间混在了一起"),
    ("ch05.split_heads", lambda x, h: torch.stack(x.split(h, -1), 1), "chunk(n_heads, -1)"),
    ("ch05.merge_heads", lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), ".reshape"),
    ("ch05.merge_heads", lambda x: x.transpose(1, 3).reshape(x.shape[0], x.shape[2], -1),
     "transpose(1, 3)"),
    ("ch05.repeat_kv", lambda x, n: x.repeat_interleave(n), "dim=1"),
    ("ch05.repeat_kv", lambda x, n: x.repeat_interleave(n, dim=0), "批这一维"),
    ("ch05.repeat_kv", lambda x, n: x.expand(x.shape[0], x.shape[1] * n, *x.shape[2:]),
     "x[:, :, None]"),
])
def test_layout_hints_name_the_mistake(name, fn, words):
    for seed in SEEDS:
        ok, text = run_seed(name, fn, seed)
        assert ok is False and words in "".join(text.split("\n  ")), (seed, text)


def test_layout_cases_vary_shapes_with_the_seed():
    for name in ("ch05.split_heads", "ch05.merge_heads", "ch05.repeat_kv"):
        ex = exercises.get(name)
        assert len({tuple(ex.cases(s)[-1].args[0].shape) for s in SEEDS}) > 1


# ch05.multi_head_attention: the build exercise
def mha_loop(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):  # head by head
    kv = x if memory is None else memory
    d_k = x.shape[-1] // n_heads
    heads = []
    for i in range(n_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        s = (x @ W_q[:, cols]) @ (kv @ W_k[:, cols]).transpose(-2, -1) / d_k ** 0.5
        if mask is not None:
            s = s.masked_fill(~mask, -1e9)
        heads.append(torch.softmax(s, -1) @ (kv @ W_v[:, cols]))
    return torch.cat(heads, -1) @ W_o


def mha_sdpa(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):  # SDPA per head: allowed
    kv = x if memory is None else memory

    def split(t):
        return t.unflatten(-1, (n_heads, -1)).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(
        split(x @ W_q), split(kv @ W_k), split(kv @ W_v),
        attn_mask=None if mask is None else mask[:, None])
    return o.transpose(1, 2).flatten(-2) @ W_o


def test_mha_unusual_right_answers_pass():
    for seed in SEEDS:
        for fn in (mha_loop, mha_sdpa):
            ok, text = run_seed("ch05.multi_head_attention", fn, seed)
            assert ok is True, text


def test_mha_wrong_answers_outside_the_gallery_are_rejected():
    def mask_for_self_only(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        return mha_loop(x, W_q, W_k, W_v, W_o, n_heads, None if memory is not None else mask,
                        memory)

    def values_from_x(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        kv = x if memory is None else memory
        d_k = x.shape[-1] // n_heads
        heads = []
        for i in range(n_heads):
            cols = slice(i * d_k, (i + 1) * d_k)
            s = (x @ W_q[:, cols]) @ (kv @ W_k[:, cols]).transpose(-2, -1) / d_k ** 0.5
            if mask is not None:
                s = s.masked_fill(~mask, -1e9)
            heads.append(torch.softmax(s, -1) @ (kv @ W_v[:, cols])[..., :1].expand(
                *kv.shape[:2], d_k))
        return torch.cat(heads, -1) @ W_o

    def w_o_transposed(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        return mha_loop(x, W_q, W_k, W_v, W_o.T, n_heads, mask, memory)

    def heads_reversed(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        d = x.shape[-1] // n_heads
        out = mha_loop(x, W_q, W_k, W_v, torch.eye(x.shape[-1], dtype=x.dtype), n_heads, mask,
                       memory)
        return torch.cat(out.split(d, -1)[::-1], -1) @ W_o

    for seed in SEEDS:
        for fn in (mask_for_self_only, values_from_x, w_o_transposed, heads_reversed):
            assert run_seed("ch05.multi_head_attention", fn, seed)[0] is False, (fn, seed)


def test_mha_shortcuts_are_rejected_by_name():
    from attnbook.multihead import MultiHeadAttention, merge_heads, split_heads

    def lib_layout(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        kv = x if memory is None else memory
        q, k, v = (split_heads(t, n_heads) for t in (x @ W_q, kv @ W_k, kv @ W_v))
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else mask[:, None])
        return merge_heads(o) @ W_o

    def module(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        kv = x if memory is None else memory
        m = MultiHeadAttention(x.shape[-1], n_heads, kdim=kv.shape[-1], vdim=kv.shape[-1],
                               bias=False, dtype=x.dtype)
        with torch.no_grad():
            for p, w in zip((m.q_proj, m.k_proj, m.v_proj, m.out_proj), (W_q, W_k, W_v, W_o)):
                p.weight.copy_(w.T)
        return m(x, kv, mask=None if mask is None else mask[:, None]).out.detach()

    def torch_mha(x, W_q, W_k, W_v, W_o, n_heads, mask=None, memory=None):
        kv = x if memory is None else memory
        d = x.shape[-1]
        m = torch.nn.MultiheadAttention(d, n_heads, bias=False, batch_first=True,
                                        kdim=kv.shape[-1], vdim=kv.shape[-1], dtype=x.dtype)
        return m(x, kv, kv)[0]

    for fn, word in ((lib_layout, "split_heads"), (module, "MultiHeadAttention"),
                     (torch_mha, "MultiheadAttention")):
        ok, text = run_seed("ch05.multi_head_attention", fn, 0)
        assert ok is False and word in text, text


def test_mha_cases_are_adversarial():
    ex = exercises.get("ch05.multi_head_attention")
    for seed in SEEDS:
        cases = ex.cases(seed)
        assert not cases[0].kwargs                                   # defaults left alone
        cross = [c for c in cases if "memory" in c.kwargs]
        x, mem = cross[0].args[0], cross[0].kwargs["memory"]
        assert x.shape[1] != mem.shape[1] and x.shape[2] != mem.shape[2]
        assert any(c.args[0].shape[0] == c.args[5] and "mask" in c.kwargs for c in cases)
        for c in cases:
            if "mask" in c.kwargs:
                assert c.kwargs["mask"].any(-1).all()                # no fully masked row
    shapes = {tuple(tuple(c.args[0].shape) for c in ex.cases(s)) for s in SEEDS}
    assert len(shapes) > 1
