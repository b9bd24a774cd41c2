"""attnbook.exercises: every reference passes, every gallery bug is rejected with its symptom named,
stubs say 还没有实现, the reader's exceptions are reported, and the verdict is a repeatable bool."""
import contextlib
import inspect
import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import _report, check

NAMES = ["ch01.clip_grad_norm", "ch04.attention", "ch04.masked_softmax", "ch05.split_heads",
         "ch06.sinusoidal", "ch08.layer_norm", "ch09.online_softmax"]

# (exercise, bug) -> words the hint must contain: the mistake's symptom, named
SYMPTOMS = {
    ("ch04.masked_softmax", "wrong_axis"): ["沿错了维度", "dim=-1"],
    ("ch04.masked_softmax", "fill_minus_1e9"): ["整行被遮住时应该输出 0", "均匀分布", "−1e9"],
    ("ch04.masked_softmax", "nan_on_fully_masked_row"): ["整行被遮住时应该输出 0，而不是 NaN"],
    ("ch04.masked_softmax", "mask_polarity_inverted"): ["掩码的含义反了", "True = 可以关注"],
    ("ch04.masked_softmax", "mask_not_broadcast"): ["广播"],
    ("ch04.masked_softmax", "no_max_subtraction"): ["溢出", "减去每行的最大值"],
    ("ch04.masked_softmax", "float16_unsafe_fill"): ["float16", "−1e9", "溢出"],
    ("ch04.attention", "wrong_axis"): ["沿错了维度", "dim=-1"],
    ("ch04.attention", "no_scaling"): ["没有缩放", "1/√d_k"],
    ("ch04.attention", "scale_by_d_k"): ["1/√d_k", "1/d_k"],
    ("ch04.attention", "scale_by_sqrt_d_v"): ["√d_v", "√d_k"],
    ("ch04.attention", "scale_by_sqrt_d_model"): ["√d_model", "每个头的 √d_k"],
    ("ch04.attention", "missing_transpose"): ["k.transpose(-2, -1)", "转置"],
    ("ch04.attention", "fill_minus_1e9"): ["整行被遮住时应该输出 0", "均匀分布", "−1e9"],
    ("ch04.attention", "nan_on_fully_masked_row"): ["整行被遮住时应该输出 0，而不是 NaN"],
    ("ch04.attention", "mask_polarity_inverted"): ["掩码的含义反了"],
    ("ch04.attention", "mask_not_broadcast"): ["广播"],
    ("ch04.attention", "float16_unsafe_fill"): ["float16", "−1e9", "溢出"],
    ("ch04.attention", "mask_none_not_handled"): ["mask is not None"],
    ("ch05.split_heads", "missing_transpose_before_head_reshape"): ["(B, T, H, d_k)", "transpose(1, 2)"],
    ("ch05.split_heads", "strided_heads"): ["连续的第 i 块特征"],
    ("ch05.split_heads", "transpose_of_wrong_dims"): ["最后两维反了"],
    ("ch06.sinusoidal", "sin_cos_swapped"): ["sin 和 cos 的位置反了"],
    ("ch06.sinusoidal", "halves_concatenated"): ["交错排列"],
    ("ch06.sinusoidal", "pair_frequencies_differ"): ["同一个频率"],
    ("ch06.sinusoidal", "positions_from_one"): ["位置从 0 开始"],
    ("ch08.layer_norm", "eps_outside_root"): ["ε 应加在根号里面"],
    ("ch08.layer_norm", "unbiased_variance"): ["有偏估计", "d − 1"],
    ("ch08.layer_norm", "normalized_over_wrong_axis"): ["沿最后一维"],
    ("ch08.layer_norm", "weight_and_bias_ignored"): ["weight（γ）", "bias（β）"],
    ("ch01.clip_grad_norm", "clipped_per_tensor"): ["全局范数", "逐个张量裁剪"],
    ("ch01.clip_grad_norm", "rescaled_below_threshold"): ["保持不变", "不会放大"],
    ("ch01.clip_grad_norm", "sum_of_norms"): ["不是各个范数之和"],
    ("ch01.clip_grad_norm", "returns_norm_after_clipping"): ["裁剪之前"],
    ("ch01.clip_grad_norm", "grad_none_not_skipped"): ["None", "跳过"],
    ("ch09.online_softmax", "sum_not_rescaled"): ["α = exp(m_i − m_new)", "l_i"],
    ("ch09.online_softmax", "rescaled_the_wrong_way"): ["方向反了"],
    ("ch09.online_softmax", "nan_when_a_block_is_all_minus_inf"): ["−inf", "NaN", "换成 0"],
    ("ch09.online_softmax", "last_partial_block_dropped"): ["最后一块", "range(0, N, block)"],
}
SEEDS = (0, 1)  # seeds 0-29 were run once by hand, all bugs rejected; two keep this fast


def run(name, fn, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, **kw)
    return ok, buf.getvalue()


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
    with pytest.raises(ValueError, match="known: ch01.clip_grad_norm"):
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
    ref = exercises.get("ch04.masked_softmax").solution

    def forgets_return_sometimes(scores, mask):
        if scores.ndim == 2:
            return ref(scores, mask)

    ok, text = run("ch04.masked_softmax", forgets_return_sometimes)
    assert ok is False and "还没有实现" not in text and "第 3 个隐藏测试" in text
    assert has(hint_of(text), "忘了 `return`")


def test_clip_stub_versus_missing_return():
    ref = exercises.get("ch01.clip_grad_norm").solution

    def clips_but_returns_nothing(parameters, max_norm):
        ref(parameters, max_norm)

    ok, text = run("ch01.clip_grad_norm", clips_but_returns_nothing)
    assert ok is False and "还没有实现" not in text and "返回的范数" in text


def test_an_exception_inside_fn_is_reported_with_its_case():
    def boom(scores, mask):
        raise ValueError("boom at work")

    ok, text = run("ch04.masked_softmax", boom)
    assert ok is False and "ValueError: boom at work" in text and "第 1 个隐藏测试" in text

    ref = exercises.get("ch04.attention").solution

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
    def softmax_where(scores, mask):  # float32 throughout, another guard
        s = torch.where(mask, scores.float(), torch.tensor(-math.inf))
        return torch.softmax(s, -1).nan_to_num(0.0)

    def sdpa(q, k, v, mask=None):  # PyTorch's own kernel (zeros on fully masked rows, torch >= 2.5)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def in_place(scores, mask):  # changes its input: the checker's expected values must not move
        scores.masked_fill_(~mask, -math.inf)
        m = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
        e = (scores - m).exp()
        return e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)

    def pe32(n_positions, d_model):
        p = torch.arange(n_positions, dtype=torch.float32)[:, None]
        w = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
        out = torch.zeros(n_positions, d_model)
        out[:, 0::2], out[:, 1::2] = torch.sin(p * w), torch.cos(p * w)
        return out

    answers = {
        "ch04.masked_softmax": [softmax_where, in_place],
        "ch04.attention": [sdpa],
        "ch05.split_heads": [lambda x, h: x.unflatten(-1, (h, -1)).transpose(1, 2)],
        "ch06.sinusoidal": [pe32],
        "ch08.layer_norm": [lambda x, w, b, eps=1e-5: F.layer_norm(x, x.shape[-1:], w, b, eps)],
        "ch01.clip_grad_norm": [torch.nn.utils.clip_grad_norm_],
        "ch09.online_softmax": [lambda x, block: torch.softmax(x, -1).nan_to_num(0.0)],
    }
    for name, fns in answers.items():
        for fn in fns:
            ok, text = run(name, fn)
            assert ok is True, text


def test_float32_is_judged_by_the_library_rule_not_float64():
    ref = exercises.get("ch04.masked_softmax").solution

    def off_by_1e_4(scores, mask):  # ~1000x float32 rounding: must fail in float32 too
        return (ref(scores.float(), mask) * (1 + 1e-4)).float()

    ok, text = run("ch04.masked_softmax", off_by_1e_4)
    assert ok is False and "第 1 个隐藏测试" in text


def test_float64_inputs_need_float64_work_and_low_precision_inputs_set_the_rule():
    ref = exercises.get("ch04.masked_softmax").solution

    def via_float32(scores, mask):  # float64 in, float64 out, float32 inside
        return ref(scores.float(), mask).double()

    ok, text = run("ch04.masked_softmax", via_float32)
    assert ok is False and "第 1 个隐藏测试" in text and has(hint_of(text), "float32")

    def upcast(scores, mask):  # computed in the input's dtype, returned as float64: float32 and
        return ref(scores, mask).double()  # float16 inputs are judged by the rule, not by F64_TOL

    ok, text = run("ch04.masked_softmax", upcast)
    assert ok is True, text


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
