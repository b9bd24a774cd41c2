"""Chapter 09's hands-on exercises (attnbook.exercises.online, flashattn, tiled), beyond what
tests/lib/test_exercises.py checks for every exercise: the tiled forward is checked for its
method (one pass over the tiles, no Tq x Tk intermediate, the library's loops ruled out by
name), wrong answers outside the galleries are rejected over seeds 0-3, correct but unusual
answers pass, and the hints the reviews found misleading now name the real mistake."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import attention_ref, exercises
from attnbook.exercises import check
from exercise_run import run

SEEDS = (0, 1, 2, 3)
NEG_INF = float("-inf")


def hint(text):
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("提示："))
    return "".join("".join(lines[start:]).split())


# --------------------------------------------------------------------------- ch09.tiled_attention
def _gather(kv_tiles):
    ks, vs, keeps = [], [], []
    for k, v, keep in kv_tiles:
        ks.append(k)
        vs.append(v)
        keeps.append(keep)
    return ks, vs, keeps


def full_by_hand(q, kv_tiles):  # all tiles gathered, the whole score matrix at once
    ks, vs, keeps = _gather(kv_tiles)
    k, v = torch.cat(ks, -2), torch.cat(vs, -2)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if keeps[0] is not None:
        s = s.masked_fill(~torch.cat([m.expand(*s.shape[:-1], m.shape[-1]) for m in keeps], -1),
                          NEG_INF)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    return p @ v, lse


def via_attention_ref(q, kv_tiles):
    ks, vs, keeps = _gather(kv_tiles)
    mask = None
    if keeps[0] is not None:
        tq = q.shape[-2]
        mask = torch.cat([m.expand(*m.shape[:-2], tq, m.shape[-1]) for m in keeps], -1)
    res = attention_ref(q, torch.cat(ks, -2), torch.cat(vs, -2), mask=mask)
    return res.out, res.lse


def sdpa_per_tile(q, kv_tiles):  # torch's kernel on each tile, then merged: ruled out by name
    out = lse = None
    for k, v, keep in kv_tiles:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        lse_j = torch.zeros(q.shape[:-1], dtype=q.dtype)
        out, lse = (o, lse_j) if out is None else (out + o, lse)
    return out, lse


def two_passes(q, kv_tiles):  # iterates the stream twice: refused
    m = None
    for k, _, _ in kv_tiles:
        s = (q @ k.transpose(-2, -1)).amax(-1)
        m = s if m is None else torch.maximum(m, s)
    for k, v, _ in kv_tiles:
        pass
    return q, m


def _loop(q, kv_tiles, *, block_max_only=False, keep_ignored=False, lse_keepdim=False):
    c = 1.0 / math.sqrt(q.shape[-1])
    m = l_i = acc = None
    for k, v, keep in kv_tiles:
        s = q @ k.transpose(-2, -1) * c
        if keep is not None and not keep_ignored:
            s = s.masked_fill(~keep, NEG_INF)
        if m is None:
            m = torch.full(s.shape[:-1] + (1,), NEG_INF, dtype=s.dtype)
            l_i = torch.zeros_like(m)
            acc = torch.zeros(s.shape[:-1] + (v.shape[-1],), dtype=s.dtype)
        bmax = s.amax(-1, keepdim=True)
        m_new = bmax if block_max_only else torch.maximum(m, bmax)
        safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)
        alpha = torch.exp(m.masked_fill(torch.isneginf(m), 0.0) - safe) if block_max_only \
            else torch.exp(m - safe)
        p = torch.exp(s - safe)
        l_i = alpha * l_i + p.sum(-1, keepdim=True)
        acc = alpha * acc + p @ v
        m = m_new
    out = acc / l_i.masked_fill(l_i == 0, 1.0)
    lse = m + torch.log(l_i)
    return out, (lse if lse_keepdim else lse.squeeze(-1))


def block_max_only(q, kv_tiles):  # the reference point is this tile's max, not the running max
    return _loop(q, kv_tiles, block_max_only=True)


def mask_ignored(q, kv_tiles):
    return _loop(q, kv_tiles, keep_ignored=True)


def lse_keepdim(q, kv_tiles):  # lse returned as (..., Tq, 1)
    return _loop(q, kv_tiles, lse_keepdim=True)


def only_o(q, kv_tiles):
    return _loop(q, kv_tiles)[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [block_max_only, mask_ignored, lse_keepdim, only_o],
                         ids=lambda f: f.__name__)
def test_wrong_tiled_forwards_outside_the_gallery_are_rejected(fn, seed):
    ok, text = run("ch09.tiled_attention", fn, seed=seed)
    assert ok is False and "✗" in text, text


def test_the_whole_score_matrix_is_refused_and_named():
    ok, text = run("ch09.tiled_attention", full_by_hand)
    assert ok is False and "T_q × T_k" in text and "一块一块" in hint(text), text


@pytest.mark.parametrize("fn,word", [(via_attention_ref, "attention_ref"),
                                     (sdpa_per_tile, "scaled_dot_product_attention")])
def test_the_librarys_and_torchs_attention_are_ruled_out_by_name(fn, word):
    ok, text = run("ch09.tiled_attention", fn)
    assert ok is False and "不许" in text and word in text, text


def test_a_second_pass_over_the_tiles_is_refused():
    ok, text = run("ch09.tiled_attention", two_passes)
    assert ok is False and "只能遍历一次" in text and "只看一遍" in hint(text), text


# Ways around the tile stream that build no Tq x Tk tensor at once but keep what grows with T_k
# (review R3): refused on the long key stream, by memory, with the hint naming the lesson.
def kept_then_two_passes(q, kv_tiles):  # tiles stored in a list: max pass, then sum pass
    tiles = list(kv_tiles)
    c = 1 / math.sqrt(q.shape[-1])

    def scores(k, keep):
        s = q @ k.transpose(-2, -1) * c
        return s if keep is None else s.masked_fill(~keep, NEG_INF)
    m = None
    for k, _, keep in tiles:
        mj = scores(k, keep).amax(-1, keepdim=True)
        m = mj if m is None else torch.maximum(m, mj)
    safe = m.masked_fill(torch.isneginf(m), 0.0)
    l_i = acc = 0
    for k, v, keep in tiles:
        p = torch.exp(scores(k, keep) - safe)
        l_i, acc = l_i + p.sum(-1, keepdim=True), acc + p @ v
    return acc / l_i.masked_fill(l_i == 0, 1.0), (m + torch.log(l_i)).squeeze(-1)


def kept_scores(q, kv_tiles):  # every tile's scores stored, lse from them, then the output
    ss, vs = [], []
    for k, v, keep in kv_tiles:
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        ss.append(s if keep is None else s.masked_fill(~keep, NEG_INF))
        vs.append(v)
    lse = torch.logsumexp(torch.stack([torch.logsumexp(s, -1) for s in ss]), 0)
    safe = lse.masked_fill(torch.isneginf(lse), 0.0)[..., None]
    out = 0
    for s, v in zip(ss, vs):
        out = out + torch.exp(s - safe) @ v
    return out, lse


def row_by_row(q, kv_tiles):  # K, V gathered; each query's whole score row, one row at a time
    ks, vs, keeps = _gather(kv_tiles)
    k, v = torch.cat(ks, -2), torch.cat(vs, -2)
    outs, lses = [], []
    for i in range(q.shape[-2]):
        s = q[..., i:i + 1, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if keeps[0] is not None:
            keep = torch.cat([m.expand(*q.shape[:-1], m.shape[-1])[..., i:i + 1, :]
                              for m in keeps], -1)
            s = s.masked_fill(~keep, NEG_INF)
        lse = torch.logsumexp(s, -1)
        outs.append(torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None]) @ v)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def key_by_key(q, kv_tiles):  # one (Tq, 1) score column per key, kept, then two passes
    cols = []
    for k, v, keep in kv_tiles:
        for j in range(k.shape[-2]):
            s = q @ k[..., j:j + 1, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
            cols.append((s if keep is None else s.masked_fill(~keep[..., j:j + 1], NEG_INF),
                         v[..., j:j + 1, :]))
    m = cols[0][0]
    for s, _ in cols[1:]:
        m = torch.maximum(m, s)
    safe = m.masked_fill(torch.isneginf(m), 0.0)
    l_i = acc = 0
    for s, v in cols:
        p = torch.exp(s - safe)
        l_i, acc = l_i + p, acc + p @ v
    return acc / l_i.masked_fill(l_i == 0, 1.0), (m + torch.log(l_i)).squeeze(-1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [kept_then_two_passes, kept_scores, row_by_row, key_by_key],
                         ids=lambda f: f.__name__)
def test_keeping_the_tiles_for_later_is_refused(fn, seed):
    ok, text = run("ch09.tiled_attention", fn, seed=seed)
    assert ok is False and ("T_q × T_k" in text or "只看一遍" in hint(text)), text


def test_a_kept_stream_is_told_so():
    ok, text = run("ch09.tiled_attention", kept_then_two_passes)
    assert ok is False and "KeptTiles" in text and "和键的总数T_k无关" in hint(text), text


def _cloned(fn):  # the same answer on private copies of the tiles: only the memory bound sees it
    def answer(q, kv_tiles):
        return fn(q, [(k.clone(), v.clone(), m) for k, v, m in kv_tiles])
    answer.__name__ = fn.__name__ + "_on_copies"
    return answer


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [_cloned(kept_then_two_passes), _cloned(kept_scores),
                                _cloned(key_by_key)], ids=lambda f: f.__name__)
def test_copies_of_the_tiles_kept_for_later_are_refused_by_memory(fn, seed):
    ok, text = run("ch09.tiled_attention", fn, seed=seed)
    assert ok is False and "很长的键流" in text and "KeptTiles" in text, text


# The two-pass softmax (the whole row's max, then the sum) and its disguises (review R3): refused.
def _guard(m):
    return m.masked_fill(torch.isneginf(m), 0.0)


def softmax_two_pass(x, block):
    e = torch.exp(x - _guard(x.amax(-1, keepdim=True)))
    s = e.sum(-1, keepdim=True)
    return e / s.masked_fill(s == 0, 1.0)


def softmax_max_then_blocks(x, block):  # torch.max over the row, then the sum block by block
    m = _guard(torch.max(x, -1, keepdim=True).values)
    l_i = 0
    for j in range(0, x.shape[-1], block):
        l_i = l_i + torch.exp(x[..., j:j + block] - m).sum(-1, keepdim=True)
    return torch.exp(x - m) / l_i.masked_fill(l_i == 0, 1.0)


def softmax_sum_by_matmul(x, block):  # the row's sum as a product with a ones vector
    m = torch.full(x.shape[:-1] + (1,), NEG_INF, dtype=x.dtype)
    for j in range(0, x.shape[-1], block):
        m = torch.maximum(m, x[..., j:j + block].amax(-1, keepdim=True))
    e = torch.exp(x - _guard(m))
    s = e @ torch.ones(x.shape[-1], 1, dtype=x.dtype)
    return e / s.masked_fill(s == 0, 1.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [softmax_two_pass, softmax_max_then_blocks, softmax_sum_by_matmul],
                         ids=lambda f: f.__name__)
def test_a_whole_row_reduction_is_refused_in_the_online_softmax(fn, seed):
    ok, text = run("ch09.online_softmax", fn, seed=seed)
    assert ok is False and "WholeRow" in text and "两遍扫描" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_an_online_softmax_that_writes_its_output_in_blocks_passes(seed):
    def blocks_twice(x, block):  # the statistics in one pass, the output block by block
        m = torch.full(x.shape[:-1] + (1,), NEG_INF, dtype=x.dtype)
        l_i = torch.zeros_like(m)
        for j in range(0, x.shape[-1], block):
            xb = x[..., j:j + block]
            m_new = torch.maximum(m, xb.amax(-1, keepdim=True))
            l_i = torch.exp(m - _guard(m_new)) * l_i + torch.exp(xb - _guard(m_new)).sum(-1, True)
            m = m_new
        out = torch.cat([torch.exp(x[..., j:j + block] - _guard(m))
                         for j in range(0, x.shape[-1], block)], -1)
        return out / l_i.masked_fill(l_i == 0, 1.0)
    ok, text = run("ch09.online_softmax", blocks_twice, seed=seed)
    assert ok, text


def test_the_tiled_forward_is_the_chapters_build_exercise():
    assert exercises.get("ch09.tiled_attention").build


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_but_unusual_tiled_forwards_pass(seed):
    def lse_merge(q, kv_tiles):  # each tile's (O_j, lse_j), merged as in exercise 3
        out = lse = None
        for k, v, keep in kv_tiles:
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if keep is not None:
                s = s.masked_fill(~keep, NEG_INF)
            lse_j = torch.logsumexp(s, -1)
            p = torch.exp(s - lse_j.masked_fill(torch.isneginf(lse_j), 0.0)[..., None])
            o_j = p @ v
            if out is None:
                out, lse = o_j, lse_j
                continue
            new = torch.logaddexp(lse, lse_j)
            safe = new.masked_fill(torch.isneginf(new), 0.0)
            out = torch.exp(lse - safe)[..., None] * out + torch.exp(lse_j - safe)[..., None] * o_j
            lse = new
        return out, lse

    def flat_stats(q, kv_tiles):  # m, l as (..., Tq) with explicit [..., None]; where-guards
        qs = q / math.sqrt(q.shape[-1])
        m = l_i = acc = None
        for k, v, keep in kv_tiles:
            s = qs @ k.transpose(-2, -1)
            if keep is not None:
                s = torch.where(keep, s, torch.tensor(NEG_INF, dtype=s.dtype))
            if m is None:
                m = torch.full(s.shape[:-1], NEG_INF, dtype=s.dtype)
                l_i = torch.zeros_like(m)
                acc = torch.zeros(*s.shape[:-1], v.shape[-1], dtype=s.dtype)
            m_new = torch.maximum(m, s.amax(-1))
            ref = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - ref)
            p = torch.exp(s - ref[..., None])
            l_i = l_i * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("...qk,...kd->...qd", p, v)
            m = m_new
        denom = torch.where(l_i > 0, l_i, torch.ones_like(l_i))
        return acc / denom[..., None], m + torch.log(l_i)

    for fn in (lse_merge, flat_stats):
        ok, text = run("ch09.tiled_attention", fn, seed=seed)
        assert ok is True, text


def test_the_reference_equals_attention_ref_on_every_case():
    ex = exercises.get("ch09.tiled_attention")
    from attnbook.exercises.tiled import _OneShot
    for seed in SEEDS:
        for case in ex.cases(seed):
            q, tiles = case.args
            k, v, keep = tiles.full()
            want = attention_ref(q.double(), k.double(), v.double(), mask=keep)
            out, lse = ex.solution(q.double(), _OneShot(tiles, torch.float64))
            torch.testing.assert_close(out, want.out, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse, want.lse, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- ch09.online_softmax
def os_float32_state(x, block):  # float64 input, running state kept in float32
    m = torch.full(x.shape[:-1] + (1,), NEG_INF)
    l_i = torch.zeros_like(m)
    for j in range(0, x.shape[-1], block):
        xb = x[..., j:j + block].float()
        m_new = torch.maximum(m, xb.amax(-1, keepdim=True))
        safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)
        l_i = torch.exp(m - safe) * l_i + torch.exp(xb - safe).sum(-1, keepdim=True)
        m = m_new
    safe = m.masked_fill(torch.isneginf(m), 0.0).to(x.dtype)
    return torch.exp(x - safe) / l_i.masked_fill(l_i == 0, 1.0).to(x.dtype)


def os_minus_1e9(x, block):  # -inf replaced by -1e9: an all -inf row becomes uniform
    x = x.masked_fill(torch.isneginf(x), -1e9)
    m = torch.full(x.shape[:-1] + (1,), -1e9, dtype=x.dtype)
    l_i = torch.zeros_like(m)
    for j in range(0, x.shape[-1], block):
        xb = x[..., j:j + block]
        m_new = torch.maximum(m, xb.amax(-1, keepdim=True))
        l_i = torch.exp(m - m_new) * l_i + torch.exp(xb - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l_i


def test_a_float32_running_state_is_not_blamed_on_the_last_block():
    ok, text = run("ch09.online_softmax", os_float32_state)
    assert ok is False and "最后一块" not in hint(text), text


def test_minus_1e9_for_minus_inf_is_named():
    ok, text = run("ch09.online_softmax", os_minus_1e9)
    assert ok is False and "−1e9" in hint(text) and "均匀" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_softmax_with_nan_to_num_is_ruled_out(seed):
    ok, text = run("ch09.online_softmax", lambda x, block: torch.softmax(x, -1).nan_to_num(0.0),
                   seed=seed)
    assert ok is False and "torch.softmax" in text and "不许" in text, text


# --------------------------------------------------------------------------- ch09.merge_partial
def test_weights_without_the_last_axis_are_named():
    def flat(o1, lse1, o2, lse2):
        lse = torch.logaddexp(lse1, lse2)
        safe = lse.masked_fill(torch.isneginf(lse), 0.0)
        return torch.exp(lse1 - safe) * o1 + torch.exp(lse2 - safe) * o2, lse

    ok, text = run("ch09.merge_partial", flat)
    assert ok is False and "[...,None]" in hint(text), text


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_returning_lse_zero_for_empty_rows_is_rejected(seed):
    def lse_zero(o1, lse1, o2, lse2):
        lse = torch.logaddexp(lse1, lse2)
        safe = lse.masked_fill(torch.isneginf(lse), 0.0)
        return (torch.exp(lse1 - safe)[..., None] * o1 + torch.exp(lse2 - safe)[..., None] * o2,
                safe)

    ok, text = run("ch09.merge_partial", lse_zero, seed=seed)
    assert ok is False and "−inf" in hint(text), text


def test_the_loops_shown_in_the_chapter_do_not_pass_the_tiled_forward():
    # not ruled out by name (the chapter prints them above the exercise), but no help here:
    # tiled_loop takes no mask, attention_tiled needs a whole Tq x Tk mask (refused)
    from attnbook import attention_tiled
    from attnbook.flash_teaching import tiled_loop

    def via_tiled_loop(q, kv_tiles):
        ks, vs, _ = _gather(kv_tiles)
        k, v = torch.cat(ks, -2), torch.cat(vs, -2)
        return tiled_loop(q.reshape(-1, q.shape[-1]), k.reshape(-1, k.shape[-1]),
                          v.reshape(-1, v.shape[-1]), 4, 4)

    def via_attention_tiled(q, kv_tiles):
        ks, vs, keeps = _gather(kv_tiles)
        k, v = torch.cat(ks, -2), torch.cat(vs, -2)
        mask = None
        if keeps[0] is not None:
            mask = torch.cat([m.expand(*m.shape[:-2], q.shape[-2], m.shape[-1]) for m in keeps], -1)
        res = attention_tiled(q, k, v, mask=mask)
        return res.out, res.lse

    for fn in (via_tiled_loop, via_attention_tiled):
        for seed in SEEDS:
            ok, text = run("ch09.tiled_attention", fn, seed=seed)
            assert ok is False, text


# --------------------------------------------------------------------------- ch09.tiled_backward
def _bwd_full(q, out, lse, dout, kv_tiles):  # recomputation backward on the gathered tiles
    ks, vs, keeps = _gather(kv_tiles)
    k, v = torch.cat(ks, -2), torch.cat(vs, -2)
    c = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * c
    if keeps[0] is not None:
        s = s.masked_fill(~torch.cat([m.expand(*s.shape[:-1], m.shape[-1]) for m in keeps], -1),
                          NEG_INF)
    p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])
    ds = p * (dout @ v.transpose(-2, -1) - (dout * out).sum(-1, keepdim=True))
    return ds @ k * c, ds.transpose(-2, -1) @ q * c, p.transpose(-2, -1) @ dout


def _bwd_tiles(q, out, lse, dout, kv_tiles, *, d_from_p=False, dk_unscaled=False):
    c = 1.0 / math.sqrt(q.shape[-1])
    ref = lse.masked_fill(torch.isneginf(lse), 0.0)[..., None]
    d_rows = (dout * out).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), [], []
    for k, v, keep in kv_tiles:
        s = q @ k.transpose(-2, -1) * c
        if keep is not None:
            s = s.masked_fill(~keep, NEG_INF)
        p = torch.exp(s - ref)
        dp = dout @ v.transpose(-2, -1)
        ds = p * (dp - ((p * dp).sum(-1, keepdim=True) if d_from_p else d_rows))
        dv.append(p.transpose(-2, -1) @ dout)
        dk.append(ds.transpose(-2, -1) @ q * (1.0 if dk_unscaled else c))
        dq = dq + ds @ k * c
    return dq, torch.cat(dk, -2), torch.cat(dv, -2)


def bwd_d_from_tile_p(q, out, lse, dout, kv_tiles):  # D = rowsum(P_j dP_j) of this tile only
    return _bwd_tiles(q, out, lse, dout, kv_tiles, d_from_p=True)


def bwd_dk_unscaled(q, out, lse, dout, kv_tiles):
    return _bwd_tiles(q, out, lse, dout, kv_tiles, dk_unscaled=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fn", [bwd_d_from_tile_p, bwd_dk_unscaled], ids=lambda f: f.__name__)
def test_wrong_tiled_backwards_outside_the_gallery_are_rejected(fn, seed):
    ok, text = run("ch09.tiled_backward", fn, seed=seed)
    assert ok is False and "✗" in text, text


@pytest.mark.parametrize("seed", SEEDS)
def test_the_tiled_backward_passes_tiled_and_is_refused_whole(seed):
    ok, text = run("ch09.tiled_backward", _bwd_tiles, seed=seed)
    assert ok is True, text
    ok, text = run("ch09.tiled_backward", _bwd_full, seed=seed)
    assert ok is False and "T_q × T_k" in text and "dK_j" in hint(text), text


def backward_row_by_row(q, out, lse, dout, kv_tiles):  # K, V gathered; one query row at a time
    ks, vs, keeps = _gather(kv_tiles)
    k, v, c = torch.cat(ks, -2), torch.cat(vs, -2), 1 / math.sqrt(q.shape[-1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    d_rows = (dout * out).sum(-1, keepdim=True)
    for i in range(q.shape[-2]):
        qi, doi = q[..., i:i + 1, :], dout[..., i:i + 1, :]
        s = qi @ k.transpose(-2, -1) * c
        if keeps[0] is not None:
            s = s.masked_fill(~torch.cat([m.expand(*q.shape[:-1], m.shape[-1])[..., i:i + 1, :]
                                          for m in keeps], -1), NEG_INF)
        ref = lse[..., i:i + 1, None]
        p = torch.exp(s - ref.masked_fill(torch.isneginf(ref), 0.0))
        dv = dv + p.transpose(-2, -1) @ doi
        ds = p * (doi @ v.transpose(-2, -1) - d_rows[..., i:i + 1, :])
        dq[..., i:i + 1, :] = ds @ k * c
        dk = dk + ds.transpose(-2, -1) @ qi * c
    return dq, dk, dv


@pytest.mark.parametrize("seed", SEEDS)
def test_a_backward_over_gathered_tiles_is_refused(seed):  # review R3: it passed before
    ok, text = run("ch09.tiled_backward", backward_row_by_row, seed=seed)
    assert ok is False and "KeptTiles" in text and "dK_j" in hint(text), text


def test_the_tiled_backward_rules_out_autograd_and_the_library():
    from attnbook import flash

    def with_autograd(q, out, lse, dout, kv_tiles):
        ks, vs, _ = _gather(kv_tiles)
        k, v = torch.cat(ks, -2), torch.cat(vs, -2)
        q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
        o = (q_ @ k_.transpose(-2, -1)).softmax(-1) @ v_
        return torch.autograd.grad(o, (q_, k_, v_), dout)

    ok, text = run("ch09.tiled_backward", with_autograd)
    assert ok is False, text
    assert flash.tiled_backward in [e[0] for e in exercises.get("ch09.tiled_backward").forbidden]


def test_the_tiled_backward_equals_autograd_on_every_case():
    ex = exercises.get("ch09.tiled_backward")
    from attnbook.exercises.tiled import _OneShot
    for seed in SEEDS:
        for case in ex.cases(seed):
            q, out, lse, dout, tiles = (a.double() if isinstance(a, torch.Tensor) else a
                                        for a in case.args)
            k, v, keep = tiles.full()
            q_, k_, v_ = (t.double().clone().requires_grad_() for t in (q, k, v))
            want = torch.autograd.grad(attention_ref(q_, k_, v_, mask=keep).out, (q_, k_, v_),
                                       dout)
            got = ex.solution(q, out, lse, dout, _OneShot(tiles, torch.float64))
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
