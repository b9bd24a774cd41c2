"""Tests for attnbook.multihead: MultiHeadAttention against nn.MultiheadAttention and itself."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.testing import CPU_BACKENDS, F64_TOL, rand

from attnbook import causal_mask, padding_mask
from attnbook.multihead import (
    MultiHeadAttention,
    MultiHeadOutput,
    mask_from_torch,
    merge_heads,
    repeat_kv,
    split_heads,
)

F64 = F64_TOL


def torch_mha(d, h, *, seed=0, bias=True, kdim=None, vdim=None, batch_first=True, random_bias=True):
    """An nn.MultiheadAttention in float64, eval mode, with non-zero biases (the default init zeroes them)."""
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(d, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first,
                                dtype=torch.float64).eval()
    if bias and random_bias:
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha


def both(mine: MultiHeadAttention, mha: nn.MultiheadAttention, q, k, v, *, attn_mask=None,
         key_padding_mask=None, need_weights=True):
    """Run both modules on batch-first inputs; torch's masks converted once, by mask_from_torch."""
    with torch.no_grad():
        if mha.batch_first:
            ref_out, ref_w = mha(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                 need_weights=need_weights, average_attn_weights=False)
        else:
            ref_out, ref_w = mha(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                 attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                 need_weights=need_weights, average_attn_weights=False)
            ref_out = ref_out.transpose(0, 1)
        mask = mask_from_torch(attn_mask, key_padding_mask, n_heads=mha.num_heads)
        res = mine(q, k, v, mask=mask, need_weights=need_weights)
    return res, ref_out, ref_w


# ------------------------------------------------------------------------------------ heads

def test_split_and_merge_heads_are_column_blocks():
    x = rand(2, 5, 12)
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    for i in range(3):
        assert torch.equal(heads[:, i], x[..., 4 * i:4 * (i + 1)])
    assert torch.equal(merge_heads(heads), x)
    assert torch.equal(merge_heads(heads), torch.cat([heads[:, i] for i in range(3)], dim=-1))


def test_repeat_kv_maps_query_head_i_to_kv_head_i_div_group():
    kv = rand(2, 3, 5, 4)
    rep = repeat_kv(kv, 4)
    assert rep.shape == (2, 12, 5, 4)
    for i in range(12):
        assert torch.equal(rep[:, i], kv[:, i // 4])
    assert repeat_kv(kv, 1) is kv


# ------------------------------------------------------------------------------------ nn.MultiheadAttention

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_equals_torch(bias, batch_first, need_weights):
    mha = torch_mha(16, 4, bias=bias, batch_first=batch_first)
    mine = MultiHeadAttention.from_torch(mha)
    x = rand(3, 7, 16, seed=1)
    res, ref_out, ref_w = both(mine, mha, x, x, x, need_weights=need_weights)
    assert isinstance(res, MultiHeadOutput)
    torch.testing.assert_close(res.out, ref_out, **F64)
    if need_weights:
        assert res.weights.shape == ref_w.shape == (3, 4, 7, 7)
        torch.testing.assert_close(res.weights, ref_w, **F64)
    else:
        assert res.weights is None and ref_w is None


def test_weights_are_per_head_not_averaged():
    mha = torch_mha(16, 4)
    mine = MultiHeadAttention.from_torch(mha)
    x = rand(2, 6, 16, seed=1)
    with torch.no_grad():
        _, avg = mha(x, x, x, need_weights=True)                 # torch's default: averaged over heads
        w = mine(x, need_weights=True).weights
    torch.testing.assert_close(w.mean(1), avg, **F64)
    assert (w - w.mean(1, keepdim=True)).abs().max() > 1e-3   # heads really differ


@pytest.mark.parametrize("kdim, vdim", [(None, None), (10, 10), (10, 6), (16, 6)])
def test_cross_attention_with_kdim_vdim_equals_torch(kdim, vdim):
    mha = torch_mha(16, 2, kdim=kdim, vdim=vdim, seed=3)
    assert (mha.in_proj_weight is None) == (kdim not in (None, 16) or vdim not in (None, 16))
    mine = MultiHeadAttention.from_torch(mha)
    q = rand(2, 5, 16, seed=4)
    k = rand(2, 9, kdim or 16, seed=5)
    v = rand(2, 9, vdim or 16, seed=6)
    res, ref_out, ref_w = both(mine, mha, q, k, v)
    assert res.out.shape == (2, 5, 16) and res.weights.shape == (2, 2, 5, 9)
    torch.testing.assert_close(res.out, ref_out, **F64)
    torch.testing.assert_close(res.weights, ref_w, **F64)


def _torch_masks(b, h, tq, tk, seed):
    """Every mask form nn.MultiheadAttention accepts, with no fully masked query row."""
    g = torch.Generator().manual_seed(seed)
    blocked = torch.rand(tq, tk, generator=g) < 0.4
    blocked[:, 0] = False                                             # every row keeps key 0
    lengths = torch.randint(1, tk + 1, (b,), generator=g)
    lengths[0] = tk - 2
    kpm = torch.arange(tk) >= lengths[:, None]                        # (B, Tk) True = padding
    per_head = torch.rand(b * h, tq, tk, generator=g) < 0.5
    per_head[..., 0] = False
    float_mask = torch.randn(tq, tk, generator=g, dtype=torch.float64)
    float_mask[blocked] = float("-inf")
    float_kpm = torch.zeros(b, tk, dtype=torch.float64).masked_fill(kpm, float("-inf"))
    return {
        "bool attn_mask": dict(attn_mask=blocked),
        "causal attn_mask": dict(attn_mask=torch.ones(tq, tk, dtype=torch.bool).triu(1)),
        "bool key_padding_mask": dict(key_padding_mask=kpm),
        "bool both": dict(attn_mask=blocked, key_padding_mask=kpm),
        "3-D per-head bool": dict(attn_mask=per_head),
        "3-D per-head and padding": dict(attn_mask=per_head, key_padding_mask=kpm),
        "float attn_mask": dict(attn_mask=float_mask),
        "float both": dict(attn_mask=float_mask, key_padding_mask=float_kpm),
    }


MASK_CASES = list(_torch_masks(3, 4, 6, 6, 0))


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks_equal_torch(case, need_weights):
    mha = torch_mha(16, 4, seed=7)
    mine = MultiHeadAttention.from_torch(mha)
    x = rand(3, 6, 16, seed=8)
    masks = _torch_masks(3, 4, 6, 6, 0)[case]
    res, ref_out, ref_w = both(mine, mha, x, x, x, need_weights=need_weights, **masks)
    assert torch.isfinite(ref_out).all()
    torch.testing.assert_close(res.out, ref_out, **F64)
    if need_weights:
        torch.testing.assert_close(res.weights, ref_w, **F64)


def test_causal_flag_equals_torch_causal_mask_and_hides_the_future():
    mha = torch_mha(16, 4, seed=9)
    mine = MultiHeadAttention.from_torch(mha)
    x = rand(2, 7, 16, seed=10)
    blocked = torch.ones(7, 7, dtype=torch.bool).triu(1)               # torch: True = not allowed
    with torch.no_grad():
        ref_out, _ = mha(x, x, x, attn_mask=blocked, is_causal=True)
        res = mine(x, causal=True, need_weights=True)
        out_mask = mine(x, mask=causal_mask(7)).out
    torch.testing.assert_close(res.out, ref_out, **F64)
    torch.testing.assert_close(out_mask, res.out, **F64)
    assert torch.equal(res.weights == 0, ~causal_mask(7).expand(2, 4, 7, 7))
    x2 = x.clone()
    x2[:, 4:] += rand(2, 3, 16, seed=11)                                # perturb positions 4..6
    with torch.no_grad():
        out2 = mine(x2, causal=True).out
        out2_full = mine(x2).out
        out_full = mine(x).out
    torch.testing.assert_close(out2[:, :4], res.out[:, :4], **F64)    # the past is unchanged
    assert (out2[:, 4:] - res.out[:, 4:]).abs().amax() > 1e-2
    assert (out2_full[:, :4] - out_full[:, :4]).abs().amax() > 1e-2   # control: no mask, it leaks


def test_gradients_equal_torch():
    mha = torch_mha(12, 3, seed=12).train()       # dropout is 0: train mode computes the same thing
    mine = MultiHeadAttention.from_torch(mha, backend="tiled")
    x = rand(2, 5, 12, seed=13)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    ref_out, _ = mha(x, x, x, key_padding_mask=kpm, need_weights=False)
    out = mine(x, mask=mask_from_torch(key_padding_mask=kpm)).out
    target = rand(2, 5, 12, seed=14)
    ((ref_out - target) ** 2).sum().backward()
    ((out - target) ** 2).sum().backward()
    d = 12
    g_in = mha.in_proj_weight.grad
    for i, proj in enumerate((mine.q_proj, mine.k_proj, mine.v_proj)):
        torch.testing.assert_close(proj.weight.grad, g_in[i * d:(i + 1) * d], **F64)
        torch.testing.assert_close(proj.bias.grad, mha.in_proj_bias.grad[i * d:(i + 1) * d], **F64)
    torch.testing.assert_close(mine.out_proj.weight.grad, mha.out_proj.weight.grad, **F64)


def test_from_torch_copies_and_does_not_alias():
    mha = torch_mha(8, 2, seed=15)
    mine = MultiHeadAttention.from_torch(mha)
    W_Q = mine.q_proj.weight.T                                    # row-vector convention
    torch.testing.assert_close(W_Q, mha.in_proj_weight[:8].T, rtol=0, atol=0)
    x = rand(1, 3, 8, seed=16)
    torch.testing.assert_close(mine.q_proj(x), x @ W_Q + mha.in_proj_bias[:8], **F64)
    with torch.no_grad():
        mha.in_proj_weight.zero_()
    assert mine.q_proj.weight.abs().sum() > 0
    assert mine.q_proj.weight.dtype == torch.float64


@pytest.mark.parametrize("kwargs, match", [
    (dict(add_bias_kv=True), "add_bias_kv"),
    (dict(add_zero_attn=True), "add_zero_attn"),
])
def test_from_torch_rejects_what_it_cannot_represent(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, **kwargs))
    with pytest.raises(TypeError, match="nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), tq=st.integers(1, 6), tk=st.integers(1, 6), h=st.sampled_from([1, 2, 4]),
       d_k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_property_equals_torch_over_shapes(b, tq, tk, h, d_k, seed):
    d = h * d_k
    mha = torch_mha(d, h, seed=seed)
    mine = MultiHeadAttention.from_torch(mha)
    q, kv = rand(b, tq, d, seed=seed), rand(b, tk, d, seed=seed + 1)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, tk + 1, (b,), generator=g)
    kpm = torch.arange(tk) >= lengths[:, None]
    res, ref_out, ref_w = both(mine, mha, q, kv, kv, key_padding_mask=kpm)
    torch.testing.assert_close(res.out, ref_out, **F64)
    torch.testing.assert_close(res.weights, ref_w, **F64)


# ------------------------------------------------------------------------------------ mask polarity

def test_mask_from_torch_flips_bool_polarity():
    blocked = torch.tensor([[False, True], [False, False]])     # torch: query 0 may NOT see key 1
    allowed = mask_from_torch(blocked)
    assert allowed.dtype == torch.bool and torch.equal(allowed, torch.tensor([[True, False], [True, True]]))
    kpm = torch.tensor([[False, False, True]])                  # torch: key 2 of sequence 0 is padding
    m = mask_from_torch(key_padding_mask=kpm)
    assert m.shape == (1, 1, 1, 3) and torch.equal(m, padding_mask([2], 3))
    assert mask_from_torch() is None


def test_mask_from_torch_combines_like_torch():
    blocked = torch.tensor([[False, True, False]] * 2)
    kpm = torch.tensor([[False, False, True]])
    both_bool = mask_from_torch(blocked, kpm)
    assert torch.equal(both_bool, torch.tensor([[True, False, False]] * 2)[None, None])
    additive = torch.tensor([[0.5, -1.0, 2.0]] * 2, dtype=torch.float64)
    mixed = mask_from_torch(additive, kpm)                       # float + bool -> additive float
    expected = additive.clone()
    expected[:, 2] = float("-inf")
    assert mixed.dtype == torch.float64 and torch.equal(mixed, expected[None, None])
    assert torch.equal(mask_from_torch(additive), additive)      # float masks pass through


def test_mask_from_torch_per_head_layout():
    b, h = 2, 3
    per_head = torch.zeros(b * h, 4, 4, dtype=torch.bool)
    per_head[1 * h + 2, 0, 3] = True                            # batch 1, head 2 (torch index b*H + h)
    m = mask_from_torch(per_head, n_heads=h)
    assert m.shape == (b, h, 4, 4)
    assert (~m).nonzero().tolist() == [[1, 2, 0, 3]]
    with pytest.raises(ValueError, match="n_heads"):
        mask_from_torch(per_head)
    with pytest.raises(ValueError, match="B \\* n_heads"):
        mask_from_torch(per_head, n_heads=4)


def test_unconverted_torch_mask_is_wrong():
    """Control: passing torch's mask as is (no conversion) changes the result."""
    mha = torch_mha(8, 2, seed=17)
    mine = MultiHeadAttention.from_torch(mha)
    x = rand(1, 5, 8, seed=18)
    blocked = torch.ones(5, 5, dtype=torch.bool).triu(1)
    blocked[:, 0] = False
    with torch.no_grad():
        ref_out, _ = mha(x, x, x, attn_mask=blocked)
        right = mine(x, mask=mask_from_torch(blocked)).out
        wrong = mine(x, mask=blocked).out
    torch.testing.assert_close(right, ref_out, **F64)
    assert (wrong - ref_out).abs().amax() > 1e-2


# ------------------------------------------------------------------------------------ backends

@pytest.mark.parametrize("backend", [*CPU_BACKENDS, "auto"])
@pytest.mark.parametrize("causal", [False, True])
def test_backend_invariance(backend, causal):
    torch.manual_seed(19)
    ref = MultiHeadAttention(16, 4, backend="ref", dtype=torch.float64)
    x, mem = rand(2, 6, 16, seed=20), rand(2, 9, 16, seed=21)
    mask = padding_mask([9, 4], 9)
    mask_rows = rand(6, 9, seed=22) > -0.5
    mask_rows[3] = False                                         # one fully masked query row
    for key, m in ((None, None), (mem, mask), (mem, mask & mask_rows)):
        expected = ref(x, key, mask=m, causal=causal)
        ref.backend = backend
        got = ref(x, key, mask=m, causal=causal)
        ref.backend = "ref"
        torch.testing.assert_close(got.out, expected.out, **F64)
        with_w = ref(x, key, mask=m, causal=causal, need_weights=True)
        torch.testing.assert_close(with_w.out, expected.out, **F64)
        assert got.weights is None and expected.weights is None


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backend_gradients_agree(backend):
    torch.manual_seed(23)
    mine = MultiHeadAttention(8, 2, backend="ref", dtype=torch.float64)
    x = rand(2, 5, 8, seed=24)
    grads_ref = torch.autograd.grad(mine(x, causal=True).out.square().sum(), list(mine.parameters()))
    mine.backend = backend
    grads = torch.autograd.grad(mine(x, causal=True).out.square().sum(), list(mine.parameters()))
    for g, gr in zip(grads, grads_ref):
        torch.testing.assert_close(g, gr, rtol=1e-10, atol=1e-12)


def test_fully_masked_row_gives_zero_heads():
    torch.manual_seed(25)
    mine = MultiHeadAttention(8, 2, dtype=torch.float64)
    with torch.no_grad():
        mine.out_proj.bias.normal_()
    x = rand(1, 3, 8, seed=26)
    mask = torch.tensor([[True, True, True], [False, False, False], [True, False, True]])
    for need_weights in (False, True):
        res = mine(x, mask=mask, need_weights=need_weights)
        assert torch.isfinite(res.out).all()
        torch.testing.assert_close(res.out[0, 1], mine.out_proj.bias.detach(), **F64)
        if need_weights:
            assert (res.weights[0, :, 1] == 0).all()
            torch.testing.assert_close(res.weights[0, :, 0].sum(-1), torch.ones(2, dtype=torch.float64), **F64)


@pytest.mark.parametrize("backend", ["ref", "tiled", "auto"])
def test_padding_garbage_never_reaches_the_output(backend):
    """NaN in padded key/value positions: hidden by the mask, so out and weights stay clean.

    ("sdpa" keeps torch's own behaviour for hidden NaN; see attnbook.dispatch.)
    """
    torch.manual_seed(35)
    mine = MultiHeadAttention(8, 2, dtype=torch.float64, backend=backend)
    x, mem = rand(2, 3, 8), rand(2, 5, 8, seed=1)
    mask = padding_mask([5, 3], 5)
    clean = mine(x, mem, mask=mask)
    mem[1, 3:] = float("nan")
    for need_weights in (False, True):
        dirty = mine(x, mem, mask=mask, need_weights=need_weights)
        torch.testing.assert_close(dirty.out, clean.out, **F64)
        if need_weights:
            assert torch.isfinite(dirty.weights).all() and (dirty.weights[1, :, :, 3:] == 0).all()


def test_per_head_weights_are_the_heads_softmax():
    torch.manual_seed(27)
    mine = MultiHeadAttention(12, 3, dtype=torch.float64)
    x = rand(2, 4, 12, seed=28)
    w = mine(x, need_weights=True).weights
    W_Q, W_K = mine.q_proj.weight.T, mine.k_proj.weight.T                   # (d, d) each
    q, k = x @ W_Q + mine.q_proj.bias, x @ W_K + mine.k_proj.bias
    for i in range(3):
        cols = slice(4 * i, 4 * (i + 1))                                   # head i = column block i
        expected = torch.softmax(q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(4), -1)
        torch.testing.assert_close(w[:, i], expected, **F64)


# ------------------------------------------------------------------------------------ parameters, GQA

@pytest.mark.parametrize("d, h", [(64, 1), (64, 4), (64, 8), (512, 8)])
def test_parameter_count_is_4d2_plus_4d(d, h):
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(MultiHeadAttention(d, h)) == 4 * d * d + 4 * d == count(nn.MultiheadAttention(d, h))
    assert count(MultiHeadAttention(d, h, bias=False)) == 4 * d * d
    assert count(MultiHeadAttention(d, h, bias=False)) == count(nn.MultiheadAttention(d, h, bias=False))


def test_parameter_count_with_kdim_vdim_and_gqa():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    d, h = 32, 8
    assert count(MultiHeadAttention(d, h, kdim=10, vdim=6)) == d * d + d * 10 + d * 6 + d * d + 4 * d
    assert count(MultiHeadAttention(d, h, kdim=10, vdim=6)) == count(nn.MultiheadAttention(d, h, kdim=10, vdim=6))
    d_k = d // h
    for n_kv in (8, 4, 2, 1):
        expected = 2 * d * d + 2 * d * n_kv * d_k                  # W^Q, W^O full; W^K, W^V shrink
        assert count(MultiHeadAttention(d, h, n_kv_heads=n_kv, bias=False)) == expected


@pytest.mark.parametrize("n_kv", [1, 2])
def test_gqa_equals_mha_with_shared_kv_weights(n_kv):
    torch.manual_seed(29)
    d, h = 16, 4
    gqa = MultiHeadAttention(d, h, n_kv_heads=n_kv, dtype=torch.float64)
    full = MultiHeadAttention(d, h, dtype=torch.float64)
    group, d_k = h // n_kv, d // h
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(full, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src = getattr(gqa, name)
            w = src.weight.view(n_kv, 1, d_k, d).expand(n_kv, group, d_k, d).reshape(d, d)
            getattr(full, name).weight.copy_(w)                       # kv head j -> query heads of group j
            getattr(full, name).bias.copy_(src.bias.view(n_kv, 1, d_k).expand(n_kv, group, d_k).reshape(d))
    x = rand(2, 5, d, seed=30)
    a, b = gqa(x, causal=True, need_weights=True), full(x, causal=True, need_weights=True)
    torch.testing.assert_close(a.out, b.out, **F64)
    torch.testing.assert_close(a.weights, b.weights, **F64)
    # heads in one group share keys but not queries: their weights still differ
    assert (a.weights[:, 0] - a.weights[:, 1]).abs().amax() > 1e-3


# ------------------------------------------------------------------------------------ head mask

def test_head_mask_removes_exactly_that_head():
    torch.manual_seed(31)
    mine = MultiHeadAttention(12, 3, dtype=torch.float64)
    x = rand(2, 5, 12, seed=32)
    full = mine(x).out
    ones = mine(x, head_mask=torch.ones(3, dtype=torch.float64)).out
    torch.testing.assert_close(ones, full, **F64)
    W_O, d_k = mine.out_proj.weight.T, 4                          # (d, d): row block i belongs to head i
    parts = []
    for i in range(3):
        only_i = mine(x, head_mask=torch.nn.functional.one_hot(torch.tensor(i), 3).bool()).out
        parts.append(only_i - mine.out_proj.bias)                     # = head_i W^O_i
    torch.testing.assert_close(sum(parts) + mine.out_proj.bias, full, **F64)  # Concat W^O = sum_i
    without_1 = mine(x, head_mask=torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)).out
    torch.testing.assert_close(without_1, full - parts[1], **F64)
    assert parts[1].abs().amax() > 1e-2 and W_O.shape == (12, 12) and d_k * 3 == 12


# ------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(d_model=10, n_heads=3), ValueError, "must divide `d_model`"),
    (dict(d_model=8, n_heads=0), ValueError, "n_heads"),
    (dict(d_model=8.0, n_heads=2), TypeError, "d_model"),
    (dict(d_model=8, n_heads=4, n_kv_heads=3), ValueError, "n_kv_heads"),
    (dict(d_model=8, n_heads=2, backend="flash"), ValueError, "backend"),
    (dict(d_model=8, n_heads=2, bias=1), TypeError, "bias"),
    (dict(d_model=8, n_heads=2, kdim=0), ValueError, "kdim"),
])
def test_constructor_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MultiHeadAttention(**kwargs)


def test_forward_validation():
    mine = MultiHeadAttention(8, 2, kdim=6, vdim=6, dtype=torch.float64)
    x, mem = rand(2, 3, 8), rand(2, 5, 6)
    cases = [
        (dict(query=rand(3, 8)), ValueError, "`query` must be \\(B, T, 8\\)"),
        (dict(query=rand(2, 3, 7), key=mem), ValueError, "`query`"),
        (dict(query=x), ValueError, "`key` must be \\(B, T, 6\\)"),           # self-attention needs kdim = d
        (dict(query=x.float(), key=mem.float()), TypeError, "dtype"),
        (dict(query=x, key=rand(3, 5, 6)), ValueError, "share B"),
        (dict(query=x, key=mem, value=rand(2, 4, 6)), ValueError, "share Tk"),
        (dict(query=x, key=mem, mask=torch.ones(2, 5, dtype=torch.bool)), ValueError, "does not broadcast"),
        (dict(query=x, key=mem, mask=torch.ones(3, 5, dtype=torch.int64)), TypeError, "mask"),
        (dict(query=x, key=mem, causal=1), TypeError, "causal"),
        (dict(query=x, key=mem, need_weights="yes"), TypeError, "need_weights"),
        (dict(query=x, key=mem, head_mask=torch.ones(3)), ValueError, "head_mask"),
        (dict(query=x.long(), key=mem), TypeError, "floating"),
    ]
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            mine(**kwargs)
    with pytest.raises(ValueError, match="backend"):
        mine.backend = "cuda"
    assert mine.backend == "auto"


def test_value_defaults_to_key_and_key_to_query():
    torch.manual_seed(33)
    mine = MultiHeadAttention(8, 2, dtype=torch.float64)
    x, mem = rand(2, 3, 8), rand(2, 5, 8, seed=1)
    torch.testing.assert_close(mine(x).out, mine(x, x, x).out, rtol=0, atol=0)
    torch.testing.assert_close(mine(x, mem).out, mine(x, mem, mem).out, rtol=0, atol=0)


def test_split_heads_validation():
    with pytest.raises(ValueError, match="n_heads"):
        split_heads(rand(2, 3, 10), 3)
    with pytest.raises(ValueError, match="\\(B, H, T, d_v\\)"):
        merge_heads(rand(2, 3, 4, 5, 6))
    with pytest.raises(TypeError, match="n_rep"):
        repeat_kv(rand(1, 2, 3, 4), 1.5)


def test_float32_module_runs_and_matches_float64():
    torch.manual_seed(34)
    m64 = MultiHeadAttention(16, 4, dtype=torch.float64)
    m32 = MultiHeadAttention(16, 4)
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    x = rand(2, 6, 16)
    out32 = m32(x.float(), causal=True).out
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, m64(x, causal=True).out.float(), rtol=1e-4, atol=1e-5)
