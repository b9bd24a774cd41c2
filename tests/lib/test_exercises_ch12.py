"""Chapter 12's hands-on exercises beyond the shared battery (tests/lib/test_exercises.py):
independent right answers pass, plausible wrong answers outside the galleries are rejected over
several seeds, the shortcuts are ruled out by name, the hints fire on the mistake they name only,
and the references agree with the library (ring attention, MLA's absorbed weights)."""
import contextlib
import io
import math

import pytest
import torch

from attnbook import exercises
from attnbook.exercises import check
from attnbook.mla import MultiHeadLatentAttention
from attnbook.reference import attention_ref
from attnbook.ring import merge_partials, ring_attention_simulated

SEEDS = (0, 1, 2, 3)


def run(name, fn, seed=0):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, seed=seed)
    return bool(ok), "".join(buf.getvalue().split())


# ------------------------------------------------------------------------ right answers
def ring_concat(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Not blockwise at all: concatenate every block, one masked softmax (also exact)."""
    k, v = torch.cat(k_blocks, -2), torch.cat(v_blocks, -2)
    pos = torch.cat([s + torch.arange(b.shape[-2]) for s, b in zip(k_starts, k_blocks)])
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(pos[None, :] > q0 + torch.arange(q.shape[-2])[:, None], -math.inf)
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0)[..., None])
    return w @ v, lse


def ring_running_max(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """The chapter 09 form: a running max m and sum l instead of a running lse."""
    m = q.new_full(q.shape[:-1], -math.inf)
    l_i = q.new_zeros(q.shape[:-1])
    acc = q.new_zeros(*q.shape[:-1], v_blocks[0].shape[-1])
    for k, v, k0 in zip(k_blocks, v_blocks, k_starts):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            i = q0 + torch.arange(q.shape[-2])[:, None]
            s = s.masked_fill(k0 + torch.arange(k.shape[-2])[None, :] > i, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        safe = m_new.masked_fill(torch.isneginf(m_new), 0)
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe[..., None])
        l_i = alpha * l_i + p.sum(-1)
        acc = alpha[..., None] * acc + p @ v
        m = m_new
    out = acc / l_i.masked_fill(l_i == 0, 1)[..., None]
    return out, m + torch.log(l_i)


def ring_skips_later_blocks(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Skips a fully masked block with `continue` and merges with torch.where."""
    out = q.new_zeros(*q.shape[:-1], v_blocks[0].shape[-1])
    lse = q.new_full(q.shape[:-1], -math.inf)
    for k, v, k0 in zip(k_blocks, v_blocks, k_starts):
        if causal and k0 > q0 + q.shape[-2] - 1:
            continue
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
        if causal:
            ok = k0 + torch.arange(k.shape[-2]) <= q0 + torch.arange(q.shape[-2])[:, None]
            s = torch.where(ok, s, -math.inf)
        lse_b = torch.logsumexp(s, -1)
        o_b = torch.nan_to_num(torch.softmax(s, -1)) @ v
        new = torch.logaddexp(lse, lse_b)
        seen = ~torch.isneginf(new)
        w_old = torch.where(seen, torch.exp(lse - new), 0.0)
        w_new = torch.where(seen, torch.exp(lse_b - new), 0.0)
        out, lse = w_old[..., None] * out + w_new[..., None] * o_b, new
    return out, lse


def absorb_loop(w_uk, w_uv, w_o, n_heads):
    dh = w_uk.shape[1] // n_heads
    q_lat = torch.stack([w_uk[:, i * dh:(i + 1) * dh].T for i in range(n_heads)])
    o_lat = torch.stack([w_uv[:, i * dh:(i + 1) * dh] @ w_o[i * dh:(i + 1) * dh]
                         for i in range(n_heads)])
    return q_lat, o_lat


def absorb_einsum(w_uk, w_uv, w_o, n_heads):
    dc = w_uk.shape[0]
    uk, uv = (w.view(dc, n_heads, -1) for w in (w_uk, w_uv))
    o = w_o.view(n_heads, -1, w_o.shape[1])
    return torch.einsum("chd->hdc", uk), torch.einsum("chd,hdm->hcm", uv, o)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,fn", [
    ("ch12.ring_worker", ring_concat), ("ch12.ring_worker", ring_running_max),
    ("ch12.ring_worker", ring_skips_later_blocks),
    ("ch12.mla_absorb", absorb_loop), ("ch12.mla_absorb", absorb_einsum),
])
def test_correct_but_unusual_answers_pass(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert ok is True, text


# ------------------------------------------------------------------------ wrong answers
def ring_last_block_only(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Overwrites instead of merging: only the last block's result survives."""
    return ring_concat(q, q0, k_blocks[-1:], v_blocks[-1:], k_starts[-1:], causal)


def ring_strict_mask(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Key visible iff key position < query position: a query never sees itself."""
    out = q.new_zeros(*q.shape[:-1], v_blocks[0].shape[-1])
    lse = q.new_full(q.shape[:-1], -math.inf)
    for k, v, k0 in zip(k_blocks, v_blocks, k_starts):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(k0 + torch.arange(k.shape[-2]) >= q0 + torch.arange(
                q.shape[-2])[:, None], -math.inf)
        lse_b = torch.logsumexp(s, -1)
        o_b = torch.nan_to_num(torch.softmax(s, -1)) @ v
        new = torch.logaddexp(lse, lse_b)
        ref = new.masked_fill(torch.isneginf(new), 0)
        out = torch.exp(lse - ref)[..., None] * out + torch.exp(lse_b - ref)[..., None] * o_b
        lse = new
    return out, lse


def ring_lse_is_max(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Keeps lse = max(lse, lse_b) (the running max, not the log of the running sum)."""
    out, _ = ring_concat(q, q0, k_blocks, v_blocks, k_starts, causal)
    lses = [ring_concat(q, q0, [k], [v], [k0], causal)[1]
            for k, v, k0 in zip(k_blocks, v_blocks, k_starts)]
    return out, torch.stack(lses).amax(0)


def ring_weights_by_block_length(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    """Weights each block's output by its number of keys."""
    n = sum(k.shape[-2] for k in k_blocks)
    outs = [ring_concat(q, q0, [k], [v], [k0], causal) for k, v, k0 in
            zip(k_blocks, v_blocks, k_starts)]
    out = sum(o * (k.shape[-2] / n) for (o, _), k in zip(outs, k_blocks))
    return out, ring_concat(q, q0, k_blocks, v_blocks, k_starts, causal)[1]


def absorb_no_heads(w_uk, w_uv, w_o, n_heads):
    """Absorbs the whole matrices and repeats them for every head."""
    return (w_uk.T[None].expand(n_heads, -1, -1)[:, :w_uk.shape[1] // n_heads],
            (w_uv @ w_o)[None].expand(n_heads, -1, -1))


def absorb_scaled(w_uk, w_uv, w_o, n_heads):
    """Folds 1/sqrt(d_h) into the query's matrix (the scale belongs to the scores)."""
    q_lat, o_lat = absorb_loop(w_uk, w_uv, w_o, n_heads)
    return q_lat / math.sqrt(q_lat.shape[1]), o_lat


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,fn", [
    ("ch12.ring_worker", ring_last_block_only), ("ch12.ring_worker", ring_strict_mask),
    ("ch12.ring_worker", ring_lse_is_max), ("ch12.ring_worker", ring_weights_by_block_length),
    ("ch12.mla_absorb", absorb_no_heads), ("ch12.mla_absorb", absorb_scaled),
])
def test_wrong_answers_outside_the_gallery_are_rejected(name, fn, seed):
    ok, text = run(name, fn, seed)
    assert ok is False and "提示：" in text, text


# ------------------------------------------------------------------------ shortcuts
def ring_via_library(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    out = q.new_zeros(*q.shape[:-1], v_blocks[0].shape[-1])
    lse = q.new_full(q.shape[:-1], -math.inf)
    for k, v, k0 in zip(k_blocks, v_blocks, k_starts):
        mask = None
        if causal:
            mask = k0 + torch.arange(k.shape[-2]) <= q0 + torch.arange(q.shape[-2])[:, None]
        r = attention_ref(q, k, v, mask=mask)
        out, lse = merge_partials(out, lse, r.out, r.lse)
    return out, lse


def ring_via_merge_only(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    res = [ring_concat(q, q0, [k], [v], [k0], causal) for k, v, k0 in
           zip(k_blocks, v_blocks, k_starts)]
    out, lse = res[0]
    for o, l_b in res[1:]:
        out, lse = merge_partials(out, lse, o, l_b)
    return out, lse


def ring_via_sdpa(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    k, v = torch.cat(k_blocks, -2), torch.cat(v_blocks, -2)
    pos = torch.cat([s + torch.arange(b.shape[-2]) for s, b in zip(k_starts, k_blocks)])
    mask = pos[None, :] <= q0 + torch.arange(q.shape[-2])[:, None] if causal else None
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, ring_concat(q, q0, k_blocks, v_blocks, k_starts, causal)[1]


def ring_via_solution(q, q0, k_blocks, v_blocks, k_starts, causal=False):
    return exercises.get("ch12.ring_worker").solution(q, q0, k_blocks, v_blocks, k_starts, causal)


def absorb_via_module(w_uk, w_uv, w_o, n_heads):
    dc, hd = w_uk.shape
    m = MultiHeadLatentAttention(w_o.shape[1], n_heads, dc, 2, d_head=hd // n_heads,
                                 dtype=w_uk.dtype)
    with torch.no_grad():
        m.up_k.weight.copy_(w_uk.T)
        m.up_v.weight.copy_(w_uv.T)
        m.out_proj.weight.copy_(w_o.T)
    return tuple(t.detach() for t in m.absorbed_weights())


@pytest.mark.parametrize("name,fn,word", [
    ("ch12.ring_worker", ring_via_library, "attention_ref"),
    ("ch12.ring_worker", ring_via_merge_only, "merge_partials"),
    ("ch12.ring_worker", ring_via_sdpa, "scaled_dot_product_attention"),
    ("ch12.ring_worker", ring_via_solution, "solution"),
    ("ch12.mla_absorb", absorb_via_module, "absorbed_weights"),
])
def test_the_shortcuts_are_ruled_out_by_name(name, fn, word):
    ok, text = run(name, fn)
    assert ok is False and word in text, text


# ------------------------------------------------------------------------ hints
def test_hints_fire_only_on_their_mistake():
    # the strict mask is not "local positions", nor an average: the generic hint
    ok, text = run("ch12.ring_worker", ring_strict_mask)
    assert not ok and "全局位置" not in text and "不能平均" not in text and "对照" in text
    # an output that keeps only the last block is neither an average nor a missing rescale
    ok, text = run("ch12.ring_worker", ring_last_block_only)
    assert not ok and "不能平均" not in text and "之前累积的输出" not in text
    # a scale folded into W_q_lat is not a transpose or head-split mistake
    ok, text = run("ch12.mla_absorb", absorb_scaled)
    assert not ok and "转置" not in text and "连续的一段" not in text


def test_build_marks_the_ring_worker():
    assert exercises.get("ch12.ring_worker").build
    assert not exercises.get("ch12.mla_absorb").build


# -------------------------------------------------------------- agreement with the library
@pytest.mark.parametrize("p,causal", [(2, False), (3, True), (4, True)])
def test_ring_worker_reference_is_one_rank_of_the_simulated_ring(p, causal):
    g = torch.Generator().manual_seed(p)
    t = 11
    q, k, v = (torch.randn(2, 2, t, 4, generator=g, dtype=torch.float64) for _ in range(3))
    whole = ring_attention_simulated(q, k, v, world_size=p, causal=causal)
    lengths = [t // p + (r < t % p) for r in range(p)]
    starts = [sum(lengths[:r]) for r in range(p)]
    solution = exercises.get("ch12.ring_worker").solution
    for r in range(p):
        order = [(r - s) % p for s in range(p)]
        sl = [slice(starts[o], starts[o] + lengths[o]) for o in order]
        out, _ = solution(q[:, :, sl[0]], starts[r], [k[:, :, s] for s in sl],
                          [v[:, :, s] for s in sl], [starts[o] for o in order], causal)
        torch.testing.assert_close(out, whole[:, :, sl[0]], rtol=1e-12, atol=1e-12)


def test_mla_absorb_reference_equals_the_module():
    m = MultiHeadLatentAttention(12, 3, 5, 2, d_head=4, dtype=torch.float64)
    w = exercises.get("ch12.mla_absorb").solution(m.up_k.weight.T, m.up_v.weight.T,
                                                  m.out_proj.weight.T, 3)
    for mine, lib in zip(w, m.absorbed_weights()):
        torch.testing.assert_close(mine, lib.detach(), rtol=0, atol=0)
