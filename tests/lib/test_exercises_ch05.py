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
