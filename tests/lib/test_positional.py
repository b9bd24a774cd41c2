"""Tests for attnbook.positional: sinusoidal encoding, rotation matrices, RoPE, ALiBi (chapter 06).

Exact identities in float64 (~1e-12); every identity comes with a control showing that the
wrong variant (other sign, other layout, no permutation) is rejected by the same check.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnbook
from attnbook import attention
from attnbook.positional import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    frequencies,
    half_split_permutation,
    rotation_matrix,
    sinusoidal_encoding,
    t5_bucket,
)

f64 = torch.float64
from attnbook.testing import F64_TOL as TIGHT  # noqa: E402 (the one float64 tolerance)


def _max_err(a, b) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------- sinusoidal encoding

def test_sinusoidal_matches_the_formula_element_by_element():
    n, d, base = 7, 6, 10000.0
    pe = sinusoidal_encoding(n, d, dtype=f64)
    assert pe.shape == (n, d) and pe.dtype == f64
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / base ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-15)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-15)


def test_sinusoidal_layout_is_interleaved_not_concatenated():
    pe = sinusoidal_encoding(50, 8, dtype=f64)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 4, dtype=f64), rtol=0, atol=0)
    angle = torch.arange(50, dtype=f64)[:, None] * frequencies(8)
    halves = torch.cat([angle.sin(), angle.cos()], -1)              # tensor2tensor-style [sin | cos]
    assert _max_err(pe, halves) > 0.5                               # a different vector ...
    torch.testing.assert_close(pe[:, half_split_permutation(8)], halves, **TIGHT)  # ... up to a permutation


def test_frequencies_ladder_and_base():
    d = 128
    omega = frequencies(d)
    assert omega.dtype == f64 and omega.shape == (d // 2,)
    assert omega[0].item() == 1.0
    torch.testing.assert_close(omega[-1], torch.tensor(10000.0 ** (-(d - 2) / d), dtype=f64), **TIGHT)
    assert (omega[1:] < omega[:-1]).all()                           # strictly decreasing
    wavelengths = 2 * math.pi / omega
    assert wavelengths[0].item() == pytest.approx(2 * math.pi)
    assert wavelengths[-1].item() == pytest.approx(2 * math.pi * 10000 ** ((d - 2) / d))
    assert _max_err(sinusoidal_encoding(10, d, base=100.0, dtype=f64), sinusoidal_encoding(10, d, dtype=f64)) > 0.1


def test_sinusoidal_rows_are_distinct_and_nearest_neighbours_adjacent():
    pe = sinusoidal_encoding(2048, 128, dtype=f64)
    dist = torch.cdist(pe, pe)
    dist.fill_diagonal_(float("inf"))
    assert dist.min().item() > 0.5
    nearest = dist.argmin(-1)
    assert ((nearest - torch.arange(2048)).abs() == 1).all()


def test_sinusoidal_dtype_default_and_float32_accuracy():
    assert sinusoidal_encoding(4, 4).dtype == torch.get_default_dtype()
    exact = sinusoidal_encoding(2048, 128, dtype=f64)
    lib32 = sinusoidal_encoding(2048, 128, dtype=torch.float32)
    assert _max_err(lib32.double(), exact) < 1e-7                   # angles in float64, then rounded once
    # the naive float32 computation rounds p * omega first: errors of order p * 2**-24 ~ 1e-4
    p = torch.arange(2048, dtype=torch.float32)[:, None]
    naive = p * frequencies(128).float()
    naive_pe = torch.stack([naive.sin(), naive.cos()], -1).reshape(2048, 128)
    assert 2e-5 < _max_err(naive_pe.double(), exact) < 5e-4


# ------------------------------------------------------------------------- rotation matrices

@pytest.mark.parametrize("k", [1, 5, 50, 500])
def test_rotation_identity_float64(k):
    d, n = 128, 2048
    pe = sinusoidal_encoding(n + k, d, dtype=f64)
    m_k = rotation_matrix(k, d, dtype=f64)
    err = _max_err(pe[:n] @ m_k, pe[k:])                            # PE(p) M_k = PE(p + k), all p at once
    assert err < 1e-12, err
    # control: the seed's column-form matrix used on the wrong side (i.e. M_k^T) is rejected
    assert _max_err(pe[:n] @ m_k.T, pe[k:]) > 0.1


def test_rotation_matrix_structure():
    d = 16
    m3, m5 = rotation_matrix(3, d, dtype=f64), rotation_matrix(5, d, dtype=f64)
    torch.testing.assert_close(m3 @ m3.T, torch.eye(d, dtype=f64), **TIGHT)                 # orthogonal
    torch.testing.assert_close(m3 @ m5, rotation_matrix(8, d, dtype=f64), **TIGHT)         # M_j M_k = M_{j+k}
    torch.testing.assert_close(rotation_matrix(-3, d, dtype=f64), m3.T, **TIGHT)          # M_{-k} = M_k^T
    torch.testing.assert_close(rotation_matrix(0, d, dtype=f64), torch.eye(d, dtype=f64), rtol=0, atol=0)
    off_block = m3.clone()
    for i in range(d // 2):
        off_block[2 * i:2 * i + 2, 2 * i:2 * i + 2] = 0
    assert (off_block == 0).all()                                                        # block-diagonal
    w = frequencies(d)[1].item()
    expected = torch.tensor([[math.cos(3 * w), -math.sin(3 * w)], [math.sin(3 * w), math.cos(3 * w)]], dtype=f64)
    torch.testing.assert_close(m3[2:4, 2:4], expected, **TIGHT)


def test_relative_dot_product_depends_on_offset_only_and_is_symmetric():
    d, n = 64, 600
    pe = sinusoidal_encoding(n, d, dtype=f64)
    omega = frequencies(d)
    for k in (1, 7, 100):
        dots = (pe[: n - k] * pe[k:]).sum(-1)                       # PE(p) . PE(p + k) for every p
        expected = torch.cos(k * omega).sum()
        assert dots.max() - dots.min() < 1e-10
        torch.testing.assert_close(dots, expected.expand_as(dots), **TIGHT)
        ahead = (pe[k:n - k] * pe[2 * k:]).sum(-1)                  # PE(p) . PE(p + k)
        behind = (pe[k:n - k] * pe[: n - 2 * k]).sum(-1)            # PE(p) . PE(p - k), same p
        torch.testing.assert_close(behind, ahead, **TIGHT)           # symmetric in +-k
    # control: the dot product does change with the offset
    assert abs(torch.cos(1 * omega).sum() - torch.cos(7 * omega).sum()) > 0.1


# ------------------------------------------------------------------------- RoPE

def _rope_complex(x, positions, base=10000.0):
    """Independent oracle: RoFormer eq. 34 as complex multiplication of adjacent pairs."""
    omega = frequencies(x.shape[-1], base=base)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    rot = torch.polar(torch.ones_like(omega), positions.double()[..., None] * omega)
    return torch.view_as_real(z * rot).flatten(-2)


def _rotate_half_reference(x, positions, base=10000.0):
    """Independent oracle: the `rotate_half` formulation (GPT-NeoX, Hugging Face LLaMA)."""
    omega = frequencies(x.shape[-1], base=base)
    angle = positions.double()[..., None] * omega
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def test_rope_against_independent_oracles():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, 16, generator=g, dtype=f64)
    pos = torch.arange(11)
    torch.testing.assert_close(apply_rope(x), _rope_complex(x, pos), **TIGHT)
    torch.testing.assert_close(apply_rope(x, pairing="half"), _rotate_half_reference(x, pos), **TIGHT)
    # RoPE at position p multiplies by the sinusoid's rotation matrix of offset -p
    for p in (0, 3, 10):
        torch.testing.assert_close(apply_rope(x)[..., p, :], x[..., p, :] @ rotation_matrix(-p, 16, dtype=f64),
                                   **TIGHT)


def test_rope_position_zero_is_identity_and_norms_are_kept():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, 32, generator=g, dtype=f64)
    for pairing in ("interleaved", "half"):
        y = apply_rope(x, pairing=pairing)
        torch.testing.assert_close(y[:, 0], x[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), **TIGHT)
        assert _max_err(y[:, 1:], x[:, 1:]) > 0.1


def test_rope_relative_position_identity():
    """<R_m q, R_n k> = q R_{n-m}-rotated k: depends on (m, n) only through n - m."""
    g = torch.Generator().manual_seed(2)
    d = 16
    q, k = torch.randn(d, generator=g, dtype=f64), torch.randn(d, generator=g, dtype=f64)
    for m, n in [(0, 0), (3, 10), (10, 3), (250, 1000)]:
        qm = apply_rope(q[None], torch.tensor([m]))[0]
        kn = apply_rope(k[None], torch.tensor([n]))[0]
        rel = apply_rope(k[None], torch.tensor([n - m]))[0]          # rotate k by n - m only
        torch.testing.assert_close(qm @ kn, q @ rel, **TIGHT)
        # explicit form q R_m^T R_n k^T with R_p = rotation_matrix(-p): R_m^T R_n = R_{n-m}
        r = lambda p: rotation_matrix(-p, d, dtype=f64)  # noqa: E731
        torch.testing.assert_close(r(m).T @ r(n), r(n - m), **TIGHT)
    # control: without RoPE the score does not depend on positions at all; with it, it does
    s = [apply_rope(q[None], torch.tensor([0]))[0] @ apply_rope(k[None], torch.tensor([j]))[0] for j in range(5)]
    assert max(s) - min(s) > 0.1


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(-1000, 1000), pairing=st.sampled_from(["interleaved", "half"]))
def test_rope_scores_are_shift_invariant(shift, pairing):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 7, 8, generator=g, dtype=f64)
    k = torch.randn(2, 7, 8, generator=g, dtype=f64)
    pos = torch.tensor([0, 1, 2, 5, 9, 20, 40])
    s0 = apply_rope(q, pos, pairing=pairing) @ apply_rope(k, pos, pairing=pairing).transpose(-1, -2)
    s1 = apply_rope(q, pos + shift, pairing=pairing) @ apply_rope(k, pos + shift, pairing=pairing).transpose(-1, -2)
    torch.testing.assert_close(s1, s0, rtol=1e-10, atol=1e-10)


def test_rope_shift_control_absolute_encoding_is_not_shift_invariant():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 8, generator=g, dtype=f64)
    pe = sinusoidal_encoding(107, 8, dtype=f64)
    s0 = (x + pe[:7]) @ (x + pe[:7]).T
    s1 = (x + pe[100:107]) @ (x + pe[100:107]).T
    assert _max_err(s0, s1) > 0.1


def test_interleaved_and_half_agree_up_to_the_permutation():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 13, 24, generator=g, dtype=f64)
    perm = half_split_permutation(24)
    assert sorted(perm.tolist()) == list(range(24))
    inter = apply_rope(x, pairing="interleaved")
    half = apply_rope(x[..., perm], pairing="half")
    assert torch.equal(half, inter[..., perm])                      # exact: the same products
    assert _max_err(apply_rope(x, pairing="half"), inter) > 0.5     # control: unpermuted they differ
    # scores are the same whichever layout is used, as long as q and k use the same one
    q, k = x[:, :, :6], x[:, :, 6:12]
    s_inter = apply_rope(q) @ apply_rope(k).transpose(-1, -2)
    s_half = apply_rope(q[..., perm], pairing="half") @ apply_rope(k[..., perm], pairing="half").transpose(-1, -2)
    torch.testing.assert_close(s_half, s_inter, **TIGHT)


def test_rope_positions_broadcast_and_float_positions():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=f64)
    pos = torch.tensor([4, 0, 7, 7, 2])
    per_row = torch.stack([apply_rope(x[..., t:t + 1, :], pos[t:t + 1]) for t in range(5)], -2).squeeze(-3)
    torch.testing.assert_close(apply_rope(x, pos), per_row, **TIGHT)
    batch_pos = torch.stack([pos, pos + 3])[:, None, :]              # (B, 1, T)
    y = apply_rope(x, batch_pos)
    torch.testing.assert_close(y[0], apply_rope(x[0], pos), **TIGHT)
    torch.testing.assert_close(y[1], apply_rope(x[1], pos + 3), **TIGHT)
    torch.testing.assert_close(apply_rope(x, pos.double()), apply_rope(x, pos), rtol=0, atol=0)
    half_step = apply_rope(x, torch.full((5,), 0.5, dtype=f64))
    torch.testing.assert_close(apply_rope(half_step, torch.full((5,), 0.5, dtype=f64)),
                               apply_rope(x, torch.ones(5, dtype=f64)), **TIGHT)


def test_rope_dtypes_and_grad():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 6, 8, generator=g, dtype=f64, requires_grad=True)
    for dt in (torch.float32, torch.bfloat16):
        y = apply_rope(x.detach().to(dt))
        assert y.dtype == dt
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, pairing="half"), (x,))
    assert torch.autograd.gradcheck(lambda t: apply_rope(t), (x,))


# ------------------------------------------------------------------------- ALiBi

def _reference_get_slopes(n):
    """Verbatim logic of ofirpress/attention_with_linear_biases, fairseq/models/transformer.py (get_slopes)."""
    def get_slopes_power_of_2(n):
        start = (2**(-2**-(math.log2(n)-3)))
        ratio = start
        return [start*ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2**math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + _reference_get_slopes(2*closest_power_of_2)[0::2][:n-closest_power_of_2])


def test_alibi_slopes_eight_heads():
    s = alibi_slopes(8, dtype=f64)
    assert s.tolist() == [2.0 ** -i for i in range(1, 9)]            # 1/2, 1/4, ..., 1/256 exactly


@pytest.mark.parametrize("n", list(range(1, 41)) + [48, 64, 96, 100])
def test_alibi_slopes_match_reference_code(n):
    assert alibi_slopes(n, dtype=f64).tolist() == _reference_get_slopes(n)


def test_alibi_slopes_non_power_of_two_rule():
    s12 = alibi_slopes(12, dtype=f64).tolist()
    s8, s16 = alibi_slopes(8, dtype=f64).tolist(), alibi_slopes(16, dtype=f64).tolist()
    assert s12 == s8 + s16[0::2][:4]
    assert s12[8:] == pytest.approx([2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5], rel=1e-15)
    # control: "the geometric sequence with ratio 2^(-8/12)" is NOT what the reference does
    assert s12 != [2.0 ** (-8 * (i + 1) / 12) for i in range(12)]
    for n in (3, 5, 6, 7, 12, 20):
        s = alibi_slopes(n, dtype=f64)
        assert len(set(s.tolist())) == n and ((0 < s) & (s < 1)).all()


def test_alibi_bias_values_and_future_keys():
    h, t = 4, 6
    b = alibi_bias(h, t, dtype=f64)
    m = alibi_slopes(h, dtype=f64)
    assert b.shape == (h, t, t) and b.dtype == f64
    for hh in range(h):
        for i in range(t):
            for j in range(t):
                if j <= i:
                    assert b[hh, i, j].item() == -m[hh].item() * (i - j)
                else:
                    assert b[hh, i, j].item() == float("-inf")
    assert (b[:, torch.arange(t), torch.arange(t)] == 0).all()       # the diagonal is not penalised
    finite = torch.where(torch.isinf(b), 0.0, b)
    assert (finite <= 0).all()                                       # a penalty, never a bonus


def test_alibi_bias_symmetric_extension_and_rectangular():
    h = 3
    sym = alibi_bias(h, 5, 7, symmetric=True, dtype=f64)
    m = alibi_slopes(h, dtype=f64)[:, None, None]
    i, j = torch.arange(5)[:, None], torch.arange(7)[None, :]
    torch.testing.assert_close(sym, -m * (i - j).abs().double(), rtol=0, atol=0)
    rect = alibi_bias(h, 3, 5, dtype=f64)                            # top-left aligned like causal_mask
    torch.testing.assert_close(torch.isfinite(rect[0]), attnbook.causal_mask(3, 5), rtol=0, atol=0)
    assert alibi_bias(2, 4).dtype == torch.get_default_dtype()


def _alibi_manual(q, k, v, slopes):
    """softmax(q k^T / sqrt(d) - m (i - j)) v over j <= i, written out."""
    t, d = q.shape[-2], q.shape[-1]
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    s = q @ k.transpose(-1, -2) / math.sqrt(d) - slopes[:, None, None] * (i - j)
    s = s.masked_fill(j > i, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("t", [1, 7, 33])
def test_alibi_through_attention_backends(t):
    g = torch.Generator().manual_seed(8)
    b, h, d = 2, 4, 8
    q, k, v = (torch.randn(b, h, t, d, generator=g, dtype=f64) for _ in range(3))
    bias = alibi_bias(h, t, dtype=f64)
    expected = _alibi_manual(q, k, v, alibi_slopes(h, dtype=f64))
    for backend in ("ref", "tiled", "sdpa"):
        out = attention(q, k, v, mask=bias, backend=backend)
        torch.testing.assert_close(out, expected, **TIGHT)
        torch.testing.assert_close(attention(q, k, v, mask=bias, causal=True, backend=backend), out, **TIGHT)
    if t > 1:   # control: the seed's sign (+m|i-j|) gives a different answer
        seed_sign = torch.where(torch.isinf(bias), bias, -bias)     # +m(i-j) on j <= i
        assert _max_err(attention(q, k, v, mask=seed_sign, backend="ref"), expected) > 1e-2


def test_alibi_float32_backends_and_reference_code_form():
    g = torch.Generator().manual_seed(9)
    h, t, d = 8, 20, 16
    q, k, v = (torch.randn(1, h, t, d, generator=g) for _ in range(3))
    bias = alibi_bias(h, t)
    out_ref = attention(q, k, v, mask=bias, backend="ref")
    for backend in ("tiled", "sdpa"):
        torch.testing.assert_close(attention(q, k, v, mask=bias, backend=backend), out_ref)
    # the reference code adds +m*j (same row-wise up to a constant) together with the causal mask
    qd, kd, vd = q.double(), k.double(), v.double()
    m = alibi_slopes(h, dtype=f64)[:, None, None]
    plus_mj = m * torch.arange(t, dtype=f64)[None, None, :]          # (H, 1, Tk)
    exact = attention(qd, kd, vd, mask=alibi_bias(h, t, dtype=f64), backend="ref")
    torch.testing.assert_close(attention(qd, kd, vd, mask=plus_mj, causal=True, backend="ref"), exact, **TIGHT)
    # ... but not without the causal mask, against the symmetric extension
    sym = attention(qd, kd, vd, mask=alibi_bias(h, t, symmetric=True, dtype=f64), backend="ref")
    assert _max_err(attention(qd, kd, vd, mask=plus_mj.expand(h, t, t), backend="ref"), sym) > 1e-2


def test_alibi_zero_logits_weights_decay_with_distance():
    t = 10
    bias = alibi_bias(8, t, dtype=f64)
    w = torch.softmax(bias, -1)                                      # all-zero logits: bias alone
    row = w[0, t - 1]                                                # last query, steepest head (m = 1/2)
    assert (row[1:] > row[:-1]).all()                                # nearer keys get more weight
    seed = torch.softmax(torch.where(torch.isinf(bias), bias, -bias), -1)[0, t - 1]
    assert (seed[1:] < seed[:-1]).all()                              # the seed's +m|i-j|: farther wins


# ------------------------------------------------------------------------- validation

@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: sinusoidal_encoding(0, 8), ValueError, "n_positions"),
        (lambda: sinusoidal_encoding(4, 7), ValueError, "d_model.*even"),
        (lambda: sinusoidal_encoding(4, 8, base=0.0), ValueError, "base"),
        (lambda: sinusoidal_encoding(4.0, 8), TypeError, "n_positions"),
        (lambda: sinusoidal_encoding(4, 8, dtype=torch.int64), TypeError, "dtype"),
        (lambda: rotation_matrix(float("nan"), 8), ValueError, "`k`"),
        (lambda: rotation_matrix(1, 5), ValueError, "d_model"),
        (lambda: frequencies(0), ValueError, "d_model"),
        (lambda: half_split_permutation(3), ValueError, "d_model"),
        (lambda: apply_rope(torch.zeros(4, 8), pairing="neox"), ValueError, "pairing"),
        (lambda: apply_rope(torch.zeros(4, 7)), ValueError, "even"),
        (lambda: apply_rope(torch.zeros(4, 8, dtype=torch.int64)), TypeError, "floating"),
        (lambda: apply_rope(torch.zeros(8)), ValueError, "at least 2 dims"),
        (lambda: apply_rope(torch.zeros(4, 8), positions=torch.arange(5)), ValueError, "positions"),
        (lambda: apply_rope(torch.zeros(4, 8), positions=[0, 1, 2, 3]), TypeError, "positions"),
        (lambda: apply_rope(torch.zeros(4, 8), positions=torch.ones(4, dtype=torch.bool)), TypeError, "positions"),
        (lambda: apply_rope(torch.zeros(4, 8), base=-1.0), ValueError, "base"),
        (lambda: alibi_slopes(0), ValueError, "n_heads"),
        (lambda: alibi_slopes(True), TypeError, "n_heads"),
        (lambda: alibi_bias(4, 0), ValueError, "tq"),
        (lambda: alibi_bias(4, 3, 0), ValueError, "tk"),
        (lambda: alibi_bias(4, 3, symmetric=1), TypeError, "symmetric"),
    ],
)
def test_validation_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# --- T5's relative-position buckets -----------------------------------------------------------

def _t5_bucket_by_definition(n: int, bidirectional=True, num_buckets=32, max_distance=128) -> int:
    """One distance at a time, in plain Python floats (an independent reading of Raffel et al.)."""
    offset = 0
    if bidirectional:
        num_buckets //= 2
        offset = num_buckets if n > 0 else 0
        n = abs(n)
    else:
        n = max(-n, 0)
    exact = num_buckets // 2
    if n < exact:
        return offset + n
    far = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return offset + min(far, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (16, 64)])
def test_t5_bucket_matches_the_definition(bidirectional, num_buckets, max_distance):
    n = torch.arange(-300, 301)
    got = t5_bucket(n, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    want = [_t5_bucket_by_definition(v, bidirectional, num_buckets, max_distance) for v in n.tolist()]
    assert got.dtype == torch.int64 and got.tolist() == want
    assert int(got.min()) >= 0 and int(got.max()) == num_buckets - 1


def test_t5_bucket_landmarks():
    b = lambda v, **kw: int(t5_bucket(torch.tensor(v), **kw))  # noqa: E731
    assert [b(0), b(-1), b(-7), b(1), b(7)] == [0, 1, 7, 17, 23]   # exact below 8 per side
    assert b(-8) == 8 and b(-127) == 15 and b(-128) == 15 and b(-10**6) == 15
    assert b(5) != b(-5)                                           # direction is kept
    assert b(3, bidirectional=False) == 0 and b(-3, bidirectional=False) == 3
    far = t5_bucket(-torch.arange(8, 129))                          # log-spaced: widths grow
    widths = torch.bincount(far)[8:]
    assert (widths[1:-1] >= widths[:-2]).all() and widths[-2] > widths[0]


@pytest.mark.parametrize("call, exc, match", [
    (lambda: t5_bucket(torch.zeros(3)), TypeError, "integer tensor"),
    (lambda: t5_bucket([1, 2]), TypeError, "integer tensor"),
    (lambda: t5_bucket(torch.arange(3), num_buckets=7), ValueError, "even"),
    (lambda: t5_bucket(torch.arange(3), num_buckets=2), ValueError, "num_buckets"),
    (lambda: t5_bucket(torch.arange(3), max_distance=4), ValueError, "max_distance"),
    (lambda: t5_bucket(torch.arange(3), bidirectional=1), TypeError, "bidirectional"),
])
def test_t5_bucket_validation(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
