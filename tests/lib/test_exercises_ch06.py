"""Chapter 06's hands-on exercises beyond ch06.sinusoidal (tests/lib/test_exercises.py covers that
one): ``ch06.rope`` — the reference passes, every gallery bug is rejected with its symptom named,
an independent correct answer (complex multiplication) passes, and a plausible wrong one fails."""
import contextlib
import io

import pytest
import torch

from attnbook import exercises

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
