"""attnbook.exercises: every reference passes, every gallery bug is rejected with its symptom named,
stubs say 还没有实现 (a body with code that returns None is told it forgot `return`), the reader's
exceptions are reported, a result must keep its inputs' dtype, a change to the inputs in place is
a failure, plausible wrong answers outside the gallery are rejected too, and the verdict is a
repeatable bool."""
import contextlib
import inspect
import io
import math
import runpy
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import _core, _report, check

# (exercise, bug) -> words the hint must contain: the mistake's symptom, named. One file per chapter
# in exercise_symptoms/ (chNN.py with a SYMPTOMS dict), gathered here.
SYMPTOMS = {}
for _f in sorted((Path(__file__).resolve().parent / "exercise_symptoms").glob("ch*.py")):
    SYMPTOMS.update(runpy.run_path(str(_f))["SYMPTOMS"])
NAMES = sorted({name for name, _ in SYMPTOMS})
SEEDS = (0, 1)  # seeds 0-29 were run once by hand, all bugs rejected; two keep this fast


def run(name, fn, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, **kw)
    assert isinstance(ok, _core.Verdict) and repr(ok) == repr(bool(ok))
    return bool(ok), buf.getvalue()


def unguarded(fn):
    """A copy of ``fn`` (another code object) that ``check``'s off-limits rule does not know: the
    tests build wrong answers from the reference without being told they call the solution."""
    code = fn.__code__
    code = code.replace(co_name=code.co_name + "_copy", co_firstlineno=code.co_firstlineno + 100000)
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def hint_of(text):
    """The hint (the report's last paragraph, wrapped lines joined), without white space."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("提示：")]
    assert len(starts) == 1, text
    return "".join("".join(lines[starts[0]:]).split())


def has(hint, word):
    return "".join(word.split()) in hint


def test_wrap_keeps_words_and_the_width():
    line = "  提示：" + "分数应是 q @ k.transpose(-2, -1)，形状 (Tq, Tk)：" * 4
    pieces = _report.wrap(line, width=40)
    assert len(pieces) > 3 and all(_report._cols(p) <= 40 for p in pieces)
    assert all(p.startswith("    ") for p in pieces[1:])  # hanging indent
    assert "k.transpose(-2," in "".join(pieces)  # an ASCII word is never split
    assert not any(p.strip()[0] in "，。：）" for p in pieces[1:])  # no line starts with a closing mark
    assert "".join("".join(pieces).split()) == "".join(line.split())
    for width in range(20, 44):  # a closing mark after a word, an opening one, maths signs
        text = "  提示：缩放应是 √d_k（q、k 的最后一维，4）。exp(−inf − (−inf)) = NaN（float16）。" * 2
        pieces = _report.wrap(text, width=width)
        assert not any(p.strip()[0] in "，。）" for p in pieces[1:]), pieces
        assert not any(p.rstrip().endswith("（") for p in pieces), pieces
        for word in ("√d_k", "−inf", "exp(−inf"):  # a maths sign stays with its word
            assert sum(p.count(word) for p in pieces) == text.count(word), (word, pieces)


def test_registry_names_every_exercise_and_its_gallery():
    assert exercises.list() == NAMES
    assert sorted(SYMPTOMS) == sorted((n, b) for n in NAMES for b in exercises.get(n).bugs)
    for name in NAMES:
        ex = exercises.get(name)
        assert ex.name == name and callable(ex.solution) and len(ex.bugs) >= 3
    required = {"wrong_axis", "fill_minus_1e9", "nan_on_fully_masked_row", "mask_polarity_inverted",
                "mask_not_broadcast", "float16_unsafe_fill"}
    assert required <= set(exercises.get("ch04.masked_softmax").bugs)
    assert required | {"no_scaling", "scale_by_d_k", "scale_by_sqrt_d_model", "missing_transpose"} \
        <= set(exercises.get("ch04.attention").bugs)


def test_reader_signatures():
    sig = inspect.signature(exercises.get("ch04.masked_softmax").solution)
    assert list(sig.parameters) == ["scores", "mask"]
    sig = inspect.signature(exercises.get("ch04.attention").solution)
    assert list(sig.parameters) == ["q", "k", "v", "mask"] and sig.parameters["mask"].default is None


def test_unknown_name_and_bad_fn_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown exercise 'ch04\.nope'.*ch04\.masked_softmax"):
        check("ch04.nope", lambda s, m: s)
    with pytest.raises(ValueError, match=r"known: ch01\.\w+.*ch01\.clip_grad_norm"):
        exercises.get("nope")
    with pytest.raises(TypeError, match="check: `fn` must be a function"):
        check("ch04.masked_softmax", torch.zeros(2))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", NAMES)
def test_every_reference_solution_passes_quietly(name, seed):
    ok, text = run(name, exercises.get(name).solution, seed=seed)
    assert ok is True
    assert text.startswith("✓ " + name) and text.count("\n") == 1, text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,bug", sorted(SYMPTOMS))
def test_every_gallery_bug_is_rejected_with_its_symptom_named(name, bug, seed):
    ok, text = run(name, exercises.get(name).bugs[bug], seed=seed)
    assert ok is False, f"the checker accepted the classic bug {name}:{bug}"
    assert text.startswith("✗ " + name) and "输入：" in text, text
    hint = hint_of(text)
    for word in SYMPTOMS[name, bug]:
        assert has(hint, word), f"{name}:{bug}: the hint does not name {word!r}:\n{text}"
    too_wide = [line for line in text.splitlines() if _report._cols(line) > _report.WIDTH]
    assert not too_wide, too_wide


def test_messages_are_concrete():
    _, text = run("ch04.masked_softmax", exercises.get("ch04.masked_softmax").bugs["nan_on_fully_masked_row"])
    assert "形状 (4, 6)" in text and "NaN" in text and "期望 [0.0000" in text and "得到 [nan" in text
    ok, text = run("ch08.layer_norm", exercises.get("ch08.layer_norm").bugs["eps_outside_root"])
    line = next(line for line in text.splitlines() if "不对：期望" in line)
    exp, got = line.split("期望 ")[1].split("，得到 ")
    assert exp != got.rstrip("。"), line  # enough decimals to show the (small) difference


def _stubs():
    def ellipsis(*args, **kwargs):
        ...

    def passing(*args, **kwargs):
        pass

    def not_implemented(*args, **kwargs):
        raise NotImplementedError

    def returns_none(*args, **kwargs):
        return None

    def returns_notimplemented(*args, **kwargs):
        return NotImplemented
    return [ellipsis, passing, not_implemented, returns_none, returns_notimplemented]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stub", _stubs(), ids=lambda f: f.__name__)
def test_a_stub_says_not_yet_implemented(name, stub):
    ok, text = run(name, stub)
    assert ok is False and "还没有实现" in text and text.count("\n") <= 2, text
    assert all(_report._cols(line) <= _report.WIDTH for line in text.splitlines())


def test_returning_none_after_the_first_case_is_a_failure_not_a_stub():
    ref = unguarded(exercises.get("ch04.masked_softmax").solution)

    def forgets_return_sometimes(scores, mask):
        if scores.ndim == 2:
            return ref(scores, mask)

    ok, text = run("ch04.masked_softmax", forgets_return_sometimes)
    assert ok is False and "还没有实现" not in text and "第 3 个隐藏测试" in text
    assert has(hint_of(text), "忘了 `return`")


def test_clip_stub_versus_missing_return():
    ref = unguarded(exercises.get("ch01.clip_grad_norm").solution)

    def clips_but_returns_nothing(parameters, max_norm):
        ref(parameters, max_norm)

    ok, text = run("ch01.clip_grad_norm", clips_but_returns_nothing)
    assert ok is False and "还没有实现" not in text and "返回的范数" in text


def test_an_exception_inside_fn_is_reported_with_its_case():
    def boom(scores, mask):
        raise ValueError("boom at work")

    ok, text = run("ch04.masked_softmax", boom)
    assert ok is False and "ValueError: boom at work" in text and "第 1 个隐藏测试" in text

    ref = unguarded(exercises.get("ch04.attention").solution)

    def breaks_on_heads(q, k, v, mask=None):
        if q.ndim == 4:
            raise RuntimeError("no heads here")
        return ref(q, k, v, mask)

    ok, text = run("ch04.attention", breaks_on_heads)
    assert ok is False and "RuntimeError: no heads here" in text
    assert "第 4 个隐藏测试（共 6 个）" in text and "批和多头" in text


@pytest.mark.parametrize("result,words", [
    (lambda s, m: s.transpose(-2, -1), ["形状应是 (3, 5)", "得到的是 (5, 3)", "转置"]),
    (lambda s, m: m, ["浮点张量", "bool"]),
    (lambda s, m: s.numpy(), ["torch.Tensor", "ndarray"]),
    (lambda s, m: torch.softmax(s, -1).masked_fill(~m, math.inf), ["inf"]),
    (lambda s, m: torch.softmax(s, -1).masked_fill(~m, math.nan), ["NaN"]),
])
def test_wrong_type_shape_dtype_nan_inf_are_explained(result, words):
    ok, text = run("ch04.masked_softmax", result)
    assert ok is False
    for word in words:
        assert word in text, text


def test_independent_correct_answers_pass_in_float32_and_float64():
    def softmax_where(scores, mask):  # torch.where with a 0-dim -inf, NaN turned into 0
        s = torch.where(mask, scores, torch.tensor(-math.inf))
        return torch.softmax(s, -1).nan_to_num(0.0)

    def sdpa(q, k, v, mask=None):  # PyTorch's own kernel (zeros on fully masked rows, torch >= 2.5)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def online_by_logsumexp(x_blocks):  # each block's logsumexp, merged: right numbers, off limits
        m = lse = None
        for x_j in x_blocks:
            m = x_j.amax(-1) if m is None else torch.maximum(m, x_j.amax(-1))
            lse_j = torch.logsumexp(x_j, -1)
            lse = lse_j if lse is None else torch.logaddexp(lse, lse_j)
        return m, torch.exp(lse - m.masked_fill(torch.isinf(m), 0.0))

    def any_guard(scores, mask):  # another guard: where the row has an allowed key
        w = torch.softmax(scores.masked_fill(~mask, -math.inf), -1)
        return torch.where(mask.any(-1, keepdim=True), w, 0.0)

    def log_mask(scores, mask):  # an additive mask log(1) = 0, log(0) = -inf
        return torch.softmax(scores + torch.log(mask.to(scores.dtype)), -1).nan_to_num(0.0)

    def in_float32(scores, mask):  # float16 computed in float32, cast back: the input's dtype
        s = scores.float().masked_fill(~mask, -math.inf) if scores.dtype == torch.float16 \
            else scores.masked_fill(~mask, -math.inf)
        return torch.softmax(s, -1).nan_to_num(0.0).to(scores.dtype)

    def einsum_attention(q, k, v, mask=None):  # scaled q first, einsum, mask broadcast
        s = torch.einsum("...qd,...kd->...qk", q / math.sqrt(q.shape[-1]), k)
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        return torch.einsum("...qk,...kd->...qd", torch.softmax(s, -1).nan_to_num(0.0), v)

    def clip_rebind_grad(parameters, max_norm):  # p.grad = a new tensor; the norm as a float32
        ps = [p for p in parameters if p.grad is not None]  # 0-dim tensor (a number: any dtype)
        total = float(torch.cat([p.grad.flatten() for p in ps]).norm())
        for p in ps:
            p.grad = p.grad * min(1.0, max_norm / total)
        return torch.tensor(total)

    def pe32(n_positions, d_model):
        p = torch.arange(n_positions, dtype=torch.float32)[:, None]
        w = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
        out = torch.zeros(n_positions, d_model)
        out[:, 0::2], out[:, 1::2] = torch.sin(p * w), torch.cos(p * w)
        return out

    answers = {
        "ch04.masked_softmax": [softmax_where, any_guard, log_mask, in_float32],
        "ch04.attention": [einsum_attention],
        "ch05.split_heads": [lambda x, h: x.unflatten(-1, (h, -1)).transpose(1, 2)],
        "ch08.layer_norm": [lambda x, w, b, eps=1e-5: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(
            x.var(-1, unbiased=False, keepdim=True) + eps) * w + b],
        "ch08.residual_block": [
            lambda x, w1, w2, nf: (x + F.relu(F.layer_norm(x, x.shape[-1:]) @ w1) @ w2 if nf
                                   else F.layer_norm(x + F.relu(x @ w1) @ w2, x.shape[-1:]))],
        "ch08.rms_norm": [lambda x, w, eps=1e-6: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w],
        "ch01.clip_grad_norm": [clip_rebind_grad],
    }
    for name, fns in answers.items():
        for fn in fns:
            ok, text = run(name, fn)
            assert ok is True, text
    # control: the same kind of answer, one mistake in it, is rejected
    ok, _ = run("ch04.masked_softmax", lambda s, m: torch.softmax(s.masked_fill(~m, -math.inf), -1))
    assert ok is False
    # right numbers by a call the exercise rules out (torch's one-call equivalent): rejected
    shortcuts = {
        "ch04.attention": (sdpa, "F.scaled_dot_product_attention"),
        "ch08.layer_norm": (lambda x, w, b, eps=1e-5: F.layer_norm(x, x.shape[-1:], w, b, eps),
                            "F.layer_norm"),
        "ch08.rms_norm": (lambda x, w, eps=1e-6: F.rms_norm(x, x.shape[-1:], w, eps), "F.rms_norm"),
        "ch01.clip_grad_norm": (torch.nn.utils.clip_grad_norm_, "torch.nn.utils"),
        "ch09.online_softmax": (online_by_logsumexp, "torch.logsumexp"),
    }
    ok, text = run("ch06.sinusoidal", pe32)  # the prompt asks for a float64 table
    assert ok is False and "float64" in hint_of(text), text
    for name, (fn, word) in shortcuts.items():
        ok, text = run(name, fn)
        assert ok is False and word in text and "不许" in text, text


def test_float32_is_judged_by_the_library_rule_not_float64():
    ref = unguarded(exercises.get("ch04.masked_softmax").solution)

    def off_by_1e_4(scores, mask):  # ~1000x float32 rounding: must fail in float32 too
        return (ref(scores.float(), mask) * (1 + 1e-4)).float()

    ok, text = run("ch04.masked_softmax", off_by_1e_4)
    assert ok is False and "第 1 个隐藏测试" in text


def test_float64_inputs_need_float64_work_and_low_precision_inputs_set_the_rule():
    ref = unguarded(exercises.get("ch04.masked_softmax").solution)

    def via_float32(scores, mask):  # float64 in, float64 out, float32 inside
        return ref(scores.float(), mask).double()

    ok, text = run("ch04.masked_softmax", via_float32)
    assert ok is False and "第 1 个隐藏测试" in text and has(hint_of(text), "float32")

    def upcast(scores, mask):  # float32 / float16 inputs answered in float64: the wrong dtype
        return ref(scores, mask).double()  # (the next `@ v` would fail)

    ok, text = run("ch04.masked_softmax", upcast)
    assert ok is False and "第 4 个隐藏测试" in text  # cases 1-3 are float64: passed
    assert "dtype 应和输入一样是 float32，得到的是 float64" in text
    ok, text = run("ch06.sinusoidal", lambda n, d: unguarded(exercises.get("ch06.sinusoidal").solution)(n, d).half())
    assert ok is False and "dtype 应是 float64" in text  # no floating input: the prompt says float64


def test_deterministic_and_randomized_per_seed():
    bug = exercises.get("ch04.attention").bugs["no_scaling"]
    assert run("ch04.attention", bug) == run("ch04.attention", bug)
    assert run("ch04.attention", bug, seed=1)[1] != run("ch04.attention", bug)[1]
    ex = exercises.get("ch04.masked_softmax")
    same, other = ex.cases(0), ex.cases(1)
    assert all(torch.equal(a.args[0], b.args[0]) for a, b in zip(same, ex.cases(0)))
    assert not torch.equal(same[0].args[0], other[0].args[0])


def test_check_leaves_the_global_rng_and_the_inputs_alone():
    state = torch.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    for name in NAMES:
        run(name, exercises.get(name).solution)
    assert torch.equal(state, torch.get_rng_state())
    assert np.array_equal(np_state, np.random.get_state()[1])


def test_forgetting_return_on_the_first_case_is_not_a_stub():
    ref = unguarded(exercises.get("ch04.attention").solution)

    def forgets_return(q, k, v, mask=None):
        out = ref(q, k, v, mask)  # noqa: F841

    ok, text = run("ch04.attention", forgets_return)
    assert ok is False and "还没有实现" not in text and "第 1 个隐藏测试" in text
    assert has(hint_of(text), "忘了 `return`")
    assert _core.empty_body(_stubs()[0]) and _core.empty_body(_stubs()[3])
    assert _core.empty_body(forgets_return) is False and _core.empty_body(torch.softmax) is None
    # the source-based fallback (another Python's bytecode) answers the same
    assert _core._empty_source(_stubs()[1]) is True and _core._empty_source(forgets_return) is False


def test_a_change_to_the_inputs_in_place_is_reported_and_the_cases_stay_intact():
    ref = unguarded(exercises.get("ch04.masked_softmax").solution)

    def flips_the_mask(scores, mask):
        out = ref(scores, mask)
        mask.logical_not_()  # the caller's mask is now inverted
        return out

    ok, text = run("ch04.masked_softmax", flips_the_mask)
    assert ok is False and "第 1 个隐藏测试" in text
    assert "返回值是对的，但你的函数原地修改了输入 `mask`" in text and "调用后是" in text
    assert has(hint_of(text), "不要改动传入的张量 `mask`") and has(hint_of(text), "每一层、每个头")
    ok, _ = run("ch01.clip_grad_norm", exercises.get("ch01.clip_grad_norm").solution)
    assert ok is True  # clipping changes the gradients in place: that is the task


def _wrong_answers():
    """Plausible wrong answers that are not in the galleries -> words their hint must contain."""
    def sm_dim1(scores, mask):
        return torch.softmax(scores.masked_fill(~mask, -math.inf), 1).nan_to_num(0.0)

    def at_dim1(q, k, v, mask=None):
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
        s = s if mask is None else s.masked_fill(~mask, -math.inf)
        return torch.softmax(s, 1).nan_to_num(0.0) @ v

    def one_argument(scores):
        return torch.softmax(scores, -1)

    def with_weights(scores, mask):
        return unguarded(exercises.get("ch04.masked_softmax").solution)(scores, mask), mask

    def squared_norm(parameters, max_norm):
        grads = [p.grad for p in parameters if p.grad is not None]
        total = sum(float(g.pow(2).sum()) for g in grads)
        for g in grads:
            g.mul_(min(1.0, max_norm / total))
        return total

    def base_1e5(n_positions, d_model):
        p = torch.arange(n_positions, dtype=torch.float64)[:, None]
        w = 1e5 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        return torch.stack([torch.sin(p * w), torch.cos(p * w)], -1).flatten(-2)

    def whole_tensor(x, weight, bias, eps=1e-5):
        return (x - x.mean()) / (x.var(unbiased=False) + eps).sqrt() * weight + bias

    return [
        ("ch04.masked_softmax", sm_dim1, ["dim=1 是头这一维"]),
        ("ch04.attention", at_dim1, ["dim=1 是头这一维"]),
        ("ch04.masked_softmax", one_argument, ["masked_softmax(scores, mask)"]),
        ("ch04.masked_softmax", with_weights, ["不要返回元组"]),
        ("ch01.clip_grad_norm", squared_norm, ["开平方"]),
        ("ch06.sinusoidal", base_1e5, ["底数应是 10000", "100000"]),
        ("ch08.layer_norm", whole_tensor, ["不是整个张量一起"]),
    ]


@pytest.mark.parametrize("name,fn,words", _wrong_answers(), ids=lambda x: getattr(x, "__name__", ""))
def test_plausible_wrong_answers_outside_the_gallery_are_rejected_and_named(name, fn, words):
    ok, text = run(name, fn)
    assert ok is False, f"{name} accepted {fn.__name__}"
    for word in words:
        assert has(hint_of(text), word), text
