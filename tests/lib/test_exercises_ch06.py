"""Chapter 06's hands-on exercises beyond ch06.sinusoidal (tests/lib/test_exercises.py covers that
one): ``ch06.rope`` — the reference passes, every gallery bug is rejected with its symptom named,
an independent correct answer (complex multiplication) passes, and a plausible wrong one fails."""
import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.positional import apply_rope

SYMPTOMS = {
    "wrong_direction": ["转反了"],
    "rotate_half_pairs": ["相邻的两维", "rotate_half"],
    "per_column_frequency": ["同一个角度", "不是按列号"],
    "positions_ignored": ["传入的 positions"],
    "exponent_missing_2": ["2i/D", "不是 i/D"],
}


def run(name, fn, seed=0):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = exercises.check(name, fn, seed=seed)
    return bool(ok), buf.getvalue()


def test_the_gallery_is_the_one_tested_here():
    assert "ch06.rope" in exercises.list()
    assert sorted(exercises.get("ch06.rope").bugs) == sorted(SYMPTOMS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    ok, text = run("ch06.rope", exercises.get("ch06.rope").solution, seed)
    assert ok is True and text.startswith("✓ ch06.rope"), text


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("bug", sorted(SYMPTOMS))
def test_every_bug_is_rejected_with_its_symptom(bug, seed):
    ok, text = run("ch06.rope", exercises.get("ch06.rope").bugs[bug], seed)
    assert ok is False and text.startswith("✗ ch06.rope"), text
    flat = text.replace("\n", "").replace(" ", "")
    for word in SYMPTOMS[bug]:
        assert word.replace(" ", "") in flat, f"{bug}: hint lacks {word!r}:\n{text}"


def complex_rope(x, positions):
    """RoFormer section 3.4.2 / Meta's LLaMA: pairs as complex numbers times e^{i m theta}."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                      positions.double()[:, None] * theta)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


def test_an_independent_answer_passes_and_a_near_miss_fails():
    assert run("ch06.rope", complex_rope)[0] is True
    conj = lambda x, p: complex_rope(x, -p)  # noqa: E731  (e^{-i m theta}: the wrong way round)
    assert run("ch06.rope", conj)[0] is False


# ----------------------------------------------------------------------------- hints (issue 29)
def test_float32_angles_are_told_float32_not_positions_or_rotate_half():
    def rope32(x, positions):  # right formula, angles computed in float32
        d = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = positions.float()[:, None] * theta
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    for seed in range(4):
        ok, text = run("ch06.rope", rope32, seed)
        assert ok is False and "float32" in text, text
        assert "positions" not in text.split("提示")[-1] and "rotate_half" not in text, text


def _t2t(n, d):
    half = d // 2
    p = torch.arange(n, dtype=torch.float64)[:, None]
    a = p * torch.exp(-math.log(1e4) * torch.arange(half, dtype=torch.float64) / (half - 1))
    return torch.stack([a.sin(), a.cos()], -1).flatten(-2)


def _paper(n, d):
    ang = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.stack([ang.sin(), ang.cos()], -1).flatten(-2)


def test_sinusoidal_names_tensor2tensor_spacing_and_requires_float64():
    ok, text = run("ch06.sinusoidal", _t2t)
    assert ok is False and "tensor2tensor" in text and "像是用了" not in text, text
    # the right table in float32 (as most tutorials build it): rejected by its dtype
    ok, text = run("ch06.sinusoidal", lambda n, d: _paper(n, d).float())
    assert ok is False and "float64" in text, text


# ----------------------------------------------------------------------------- the build exercise
def _rot(x, p):
    d = x.shape[-1]
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(len(p), d // 2, dtype=torch.float64), p.double()[:, None] * theta)
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


def _rope_attn(q, k, v, q_pos, k_pos):  # an independent right answer: complex rotation, einsum
    s = torch.einsum("...qd,...kd->...qk", _rot(q, q_pos), _rot(k, k_pos)) / math.sqrt(q.shape[-1])
    return torch.einsum("...qk,...kd->...qd", torch.softmax(s, -1), v)


def test_rope_attention_unusual_right_answers_pass():
    ok, text = run("ch06.rope_attention", _rope_attn)
    assert ok, text

    def relative(q, k, v, q_pos, k_pos):  # rotate only k, by n - m per query (R_m^T R_n = R_{n-m})
        rows = []
        for i in range(q.shape[-2]):
            kr = _rot(k, k_pos - q_pos[i])
            s = (q[..., i:i + 1, :] @ kr.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            rows.append(torch.softmax(s, -1) @ v)
        return torch.cat(rows, -2)
    ok, text = run("ch06.rope_attention", relative)
    assert ok, text


@pytest.mark.parametrize("seed", range(4))
def test_rope_attention_wrong_answers_outside_the_gallery(seed):
    wrong = {
        "absolute positions added": lambda q, k, v, qp, kp: _rope_attn(q, k, v, qp * 0, kp * 0),
        "rotate_half pairing": lambda q, k, v, qp, kp: torch.softmax(
            apply_rope(q, qp, pairing="half") @ apply_rope(k, kp, pairing="half").transpose(-2, -1)
            / math.sqrt(q.shape[-1]), -1) @ v,
        "softmax over queries": lambda q, k, v, qp, kp: torch.softmax(
            _rot(q, qp) @ _rot(k, kp).transpose(-2, -1) / math.sqrt(q.shape[-1]), -2) @ v,
        "positions from 1": lambda q, k, v, qp, kp: _rope_attn(q, k, v, qp + 1, kp),
        # q_pos ignored: the queries taken to be the last keys (true of every case but the last)
        "q by the last key positions": lambda q, k, v, qp, kp: _rope_attn(
            q, k, v, kp[-q.shape[-2]:], kp),
        "causal mask by positions": lambda q, k, v, qp, kp: torch.softmax(
            (_rot(q, qp) @ _rot(k, kp).transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
                kp[None, :] > qp[:, None], float("-inf")), -1) @ v,
        "scaled by sqrt(Tk)": lambda q, k, v, qp, kp: torch.softmax(
            _rot(q, qp) @ _rot(k, kp).transpose(-2, -1) / math.sqrt(k.shape[-2]), -1) @ v,
    }
    for why, fn in wrong.items():
        ok, text = run("ch06.rope_attention", fn, seed)
        assert ok is False and "✗" in text, (why, text)


@pytest.mark.parametrize("seed", range(4))
def test_rope_attention_queries_in_the_middle_are_named(seed):
    fn = lambda q, k, v, qp, kp: _rope_attn(q, k, v, kp[-q.shape[-2]:], kp)  # noqa: E731
    ok, text = run("ch06.rope_attention", fn, seed)
    flat = text.replace("\n", "").replace(" ", "")
    assert ok is False and "按传入的q_pos旋转" in flat and "不一定排在键的末尾" in flat, text
    case = exercises.get("ch06.rope_attention").cases(seed)[-1]
    assert "middle" in case.tags and case.args[3][-1] < case.args[4][-1] - 1


def test_rope_attention_scores_depend_on_n_minus_m_in_the_cases():
    ex = exercises.get("ch06.rope_attention")
    for seed in range(4):
        first, shifted = ex.cases(seed)[:2]
        assert "shifted" in shifted.tags
        torch.testing.assert_close(ex.solution(*shifted.args), ex.solution(*first.args),
                                   rtol=1e-9, atol=1e-11)
        # control: rotating only q does depend on the absolute positions
        only_q = ex.bugs["only_q_rotated"]
        assert not torch.allclose(only_q(*shifted.args), only_q(*first.args))


def test_rope_attention_shortcuts_are_rejected_by_name():
    from attnbook import attention_ref
    ok, text = run("ch06.rope_attention", lambda q, k, v, qp, kp: attention_ref(
        apply_rope(q, qp), apply_rope(k, kp), v).out)
    assert ok is False and "attention_ref" in text and "不许" in text, text
    ok, text = run("ch06.rope_attention", lambda q, k, v, qp, kp: F.scaled_dot_product_attention(
        apply_rope(q, qp), apply_rope(k, kp), v))
    assert ok is False and "scaled_dot_product_attention" in text, text
    # the reader's own rotation (or the library's apply_rope, shown in the chapter) is allowed
    ok, text = run("ch06.rope_attention", lambda q, k, v, qp, kp: torch.softmax(
        apply_rope(q, qp) @ apply_rope(k, kp).transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v)
    assert ok, text


@pytest.mark.parametrize("name", ["ch06.sinusoidal", "ch06.rope", "ch06.rope_attention"])
def test_the_seed_varies_the_shapes(name):
    ex = exercises.get(name)

    def shapes(seed):
        return [tuple(tuple(a.shape) if hasattr(a, "shape") else a for a in c.args)
                for c in ex.cases(seed)]
    assert len({tuple(shapes(s)) for s in range(4)}) > 1
