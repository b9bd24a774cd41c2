"""attnbook.exercises: every reference passes, every gallery bug is rejected with its symptom named,
stubs say 还没有实现 (a body with code that returns None is told it forgot `return`), the reader's
exceptions are reported, a result must keep its inputs' dtype, a change to the inputs in place is
a failure, plausible wrong answers outside the gallery are rejected too, and the verdict is a
repeatable bool."""
import contextlib
import inspect
import io
import math
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnbook import exercises
from attnbook.exercises import _core, _report, check

NAMES = ["ch01.clip_grad_norm", "ch01.jacobian_product", "ch02.sequence_logprob", "ch02.token_cross_entropy",
         "ch03.additive_score", "ch03.context",
         "ch04.attention", "ch04.causal_attention", "ch04.masked_softmax", "ch05.merge_heads",
         "ch05.repeat_kv", "ch05.split_heads",
         "ch06.rope", "ch06.sinusoidal", "ch07.feed_forward", "ch07.swiglu",
         "ch08.layer_norm", "ch08.residual_block", "ch08.rms_norm", "ch09.attention_backward", "ch09.merge_partial",
         "ch09.online_softmax", "ch10.decoder_mask", "ch10.noam_lr", "ch10.smoothed_cross_entropy", "ch11.kv_step", "ch11.sampling_probs"]

# (exercise, bug) -> words the hint must contain: the mistake's symptom, named
SYMPTOMS = {
    ("ch04.masked_softmax", "wrong_axis"): ["沿错了维度", "dim=-1"],
    ("ch04.masked_softmax", "fill_minus_1e9"): ["整行被屏蔽时应该输出 0", "均匀分布", "−1e9"],
    ("ch04.masked_softmax", "nan_on_fully_masked_row"): ["整行被屏蔽时应该输出 0，而不是 NaN"],
    ("ch04.masked_softmax", "mask_polarity_inverted"): ["掩码的含义反了", "True = 可以关注"],
    ("ch04.masked_softmax", "mask_not_broadcast"): ["广播"],
    ("ch04.masked_softmax", "no_max_subtraction"): ["溢出", "减去每行的最大值"],
    ("ch04.masked_softmax", "float16_unsafe_fill"): ["float16", "−1e9", "溢出"],
    ("ch04.masked_softmax", "max_over_wrong_axis"): ["每一行自己的最大值", "amax(-1, keepdim=True)"],
    ("ch04.masked_softmax", "mask_multiplies_scores"): ["乘以掩码", "并不能屏蔽", "−inf"],
    ("ch04.masked_softmax", "masked_after_softmax"): ["先 softmax 再乘以掩码", "不再是 1"],
    ("ch04.masked_softmax", "epsilon_in_denominator"): ["略小于 1", "分母加了一个小常数"],
    ("ch04.masked_softmax", "scores_modified_in_place"): ["不要改动传入的张量 `scores`", ".clone()"],
    ("ch04.masked_softmax", "float32_result"): ["全程用 float64", ".float()"],
    ("ch04.attention", "wrong_axis"): ["沿错了维度", "dim=-1"],
    ("ch04.attention", "no_scaling"): ["没有缩放", "1/√d_k"],
    ("ch04.attention", "scale_by_d_k"): ["1/√d_k", "1/d_k"],
    ("ch04.attention", "scale_by_sqrt_d_v"): ["√d_v", "√d_k"],
    ("ch04.attention", "scale_by_sqrt_d_model"): ["√d_model", "每个头的 √d_k"],
    ("ch04.attention", "missing_transpose"): ["k.transpose(-2, -1)", "转置"],
    ("ch04.attention", "fill_minus_1e9"): ["整行被屏蔽时应该输出 0", "均匀分布", "−1e9"],
    ("ch04.attention", "nan_on_fully_masked_row"): ["整行被屏蔽时应该输出 0，而不是 NaN"],
    ("ch04.attention", "mask_polarity_inverted"): ["掩码的含义反了"],
    ("ch04.attention", "mask_not_broadcast"): ["广播"],
    ("ch04.attention", "float16_unsafe_fill"): ["float16", "−1e9", "溢出"],
    ("ch04.attention", "mask_none_not_handled"): ["mask is not None"],
    ("ch04.attention", "v_transposed"): ["weights @ v", "v 不用转置"],
    ("ch04.attention", "scale_by_sqrt_T_k"): ["√T_k", "√d_k"],
    ("ch04.attention", "mask_multiplies_scores"): ["乘以掩码", "并不能屏蔽"],
    ("ch04.attention", "masked_after_softmax"): ["先 softmax 再乘以掩码"],
    ("ch04.attention", "q_scaled_in_place"): ["不要改动传入的张量 `q`", ".clone()"],
    ("ch04.causal_attention", "top_left_aligned"): ["左上角对齐", "j ≤ i + (Tk − Tq)"],
    ("ch04.causal_attention", "sdpa_is_causal"): ["左上角对齐", "is_causal=True"],
    ("ch04.causal_attention", "sees_one_future_key"): ["多看到了一个未来的键"],
    ("ch04.causal_attention", "misses_its_own_key"): ["看不到它自己所在位置的键", "含等号"],
    ("ch04.causal_attention", "offset_sign_flipped"): ["符号反了", "tril(Tk − Tq)"],
    ("ch04.causal_attention", "triangle_inverted"): ["三角反了", "下三角"],
    ("ch04.causal_attention", "nan_on_rows_without_keys"): ["Tq > Tk", "应输出 0 而不是 NaN"],
    ("ch04.causal_attention", "last_rows_of_a_square_mask"): ["也要有 Tq 行", "偏移可以是负的"],
    ("ch03.additive_score", "no_tanh"): ["少了 tanh"],
    ("ch03.additive_score", "tanh_after_v"): ["tanh 放错了位置"],
    ("ch03.additive_score", "v_ignored"): ["按 v 加权"],
    ("ch03.additive_score", "weight_matrices_swapped"): ["用反了"],
    ("ch03.additive_score", "returns_softmax_weights"): ["softmax 是第 2 步"],
    ("ch03.context", "softmax_over_queries"): ["沿错了维度", "dim=-1"],
    ("ch03.context", "padding_attended"): ["填充位置也分到了权重", "−inf"],
    ("ch03.context", "mask_after_softmax"): ["之和就不再是 1"],
    ("ch03.context", "not_normalised"): ["除以每行的和"],
    ("ch03.context", "scores_used_as_weights"): ["不能直接当权重"],
    ("ch03.context", "no_max_subtraction"): ["溢出", "减去每行的最大值"],
    ("ch05.split_heads", "missing_transpose_before_head_reshape"): ["(B, T, H, d_k)", "transpose(1, 2)"],
    ("ch05.split_heads", "strided_heads"): ["连续的第 i 块特征"],
    ("ch05.split_heads", "transpose_of_wrong_dims"): ["最后两维反了"],
    ("ch05.merge_heads", "reshape_without_transpose"): ["transpose(1, 2)", "混在一起"],
    ("ch05.merge_heads", "interleaved_features"): ["连续的第 i 块特征"],
    ("ch05.merge_heads", "sum_instead_of_concat"): ["不是拼接", "W^O"],
    ("ch05.merge_heads", "concat_along_time"): ["沿错了维度", "最后一维"],
    ("ch05.repeat_kv", "tiled_heads"): ["i % H_kv", "i // n_rep"],
    ("ch05.repeat_kv", "tiled_by_expand_on_wrong_axis"): ["i % H_kv", "i // n_rep"],
    ("ch05.repeat_kv", "repeated_along_time"): ["时间维", "头这一维"],
    ("ch05.repeat_kv", "repeated_along_features"): ["特征维", "头这一维"],
    ("ch06.sinusoidal", "sin_cos_swapped"): ["sin 和 cos 的位置反了"],
    ("ch06.sinusoidal", "halves_concatenated"): ["交错排列"],
    ("ch06.sinusoidal", "pair_frequencies_differ"): ["同一个频率"],
    ("ch06.sinusoidal", "positions_from_one"): ["位置从 0 开始"],
    ("ch06.sinusoidal", "base_1000"): ["底数应是 10000", "像是用了 1000。"],
    ("ch06.rope", "wrong_direction"): ["转反了"],
    ("ch06.rope", "rotate_half_pairs"): ["相邻的两维", "rotate_half"],
    ("ch06.rope", "per_column_frequency"): ["同一个角度", "不是按列号"],
    ("ch06.rope", "positions_ignored"): ["传入的 positions"],
    ("ch06.rope", "exponent_missing_2"): ["2i/D", "不是 i/D"],
    ("ch07.feed_forward", "no_relu"): ["少了 ReLU", "仿射"],
    ("ch07.feed_forward", "relu_on_output"): ["输出不过 ReLU"],
    ("ch07.feed_forward", "b1_added_after_relu"): ["b1 要加在 ReLU 之前"],
    ("ch07.feed_forward", "gelu_instead_of_relu"): ["max(0, ·)", "不是 GELU"],
    ("ch07.feed_forward", "b2_forgotten"): ["输出偏置 b2"],
    ("ch07.swiglu", "silu_on_the_up_branch"): ["两支用反了"],
    ("ch07.swiglu", "sigmoid_gate"): ["不是 σ(u)", "GLU"],
    ("ch07.swiglu", "relu_gate"): ["不是 ReLU", "ReGLU"],
    ("ch07.swiglu", "gate_ignored"): ["少了门"],
    ("ch07.swiglu", "branches_added"): ["逐元素相乘", "不是相加"],
    ("ch07.swiglu", "silu_after_product"): ["在相乘之前"],
    ("ch08.layer_norm", "eps_outside_root"): ["ε 应加在根号里面"],
    ("ch08.layer_norm", "unbiased_variance"): ["有偏估计", "d − 1"],
    ("ch08.layer_norm", "normalized_over_wrong_axis"): ["沿最后一维"],
    ("ch08.layer_norm", "weight_and_bias_ignored"): ["weight（γ）", "bias（β）"],
    ("ch08.layer_norm", "divides_by_variance"): ["标准差", "不是方差"],
    ("ch08.residual_block", "orders_swapped"): ["两种顺序用反了"],
    ("ch08.residual_block", "pre_ln_adds_normalised_input"): ["加的是原来的 x", "不是 LN(x)"],
    ("ch08.residual_block", "pre_ln_output_normalised"): ["输出不再过 LayerNorm"],
    ("ch08.residual_block", "post_ln_residual_dropped"): ["少了残差"],
    ("ch08.residual_block", "post_ln_normalises_before_sum"): ["先相加再归一化"],
    ("ch08.rms_norm", "mean_subtracted"): ["不减均值", "LayerNorm"],
    ("ch08.rms_norm", "eps_outside_root"): ["ε 应加在根号里面"],
    ("ch08.rms_norm", "l2_norm_not_rms"): ["均方根", "L2 范数", "√d"],
    ("ch08.rms_norm", "weight_ignored"): ["weight（γ）"],
    ("ch08.rms_norm", "normalized_over_wrong_axis"): ["沿最后一维"],
    ("ch01.clip_grad_norm", "clipped_per_tensor"): ["全局范数", "逐个张量裁剪"],
    ("ch01.clip_grad_norm", "rescaled_below_threshold"): ["保持不变", "不会放大"],
    ("ch01.clip_grad_norm", "sum_of_norms"): ["不是各个范数之和"],
    ("ch01.clip_grad_norm", "returns_norm_after_clipping"): ["裁剪之前"],
    ("ch01.clip_grad_norm", "grad_none_not_skipped"): ["None", "跳过"],
    ("ch01.clip_grad_norm", "grads_not_written_back"): ["原地写回", "局部变量"],
    ("ch01.jacobian_product", "earliest_step_on_the_left"): ["顺序反了", "最新的一步在最左边"],
    ("ch01.jacobian_product", "factors_transposed"): ["转置", "分母布局"],
    ("ch01.jacobian_product", "index_shifted_by_one"): ["错开了一步", "factors[:, j-1]"],
    ("ch01.jacobian_product", "no_identity_when_t_equals_k"): ["单位矩阵"],
    ("ch01.jacobian_product", "elementwise_product"): ["逐元素", "@"],
    ("ch09.merge_partial", "outputs_averaged"): ["不能平均", "exp(lse_k − lse)"],
    ("ch09.merge_partial", "lse_is_the_max"): ["合并后的总 lse", "不是最大值"],
    ("ch09.merge_partial", "weights_from_the_wrong_lse"): ["合并后的总 lse", "某一半的 lse"],
    ("ch09.merge_partial", "log_of_exp_overflows"): ["溢出", "torch.logaddexp"],
    ("ch09.merge_partial", "nan_when_both_parts_are_masked"): ["−inf", "NaN", "换成 0"],
    ("ch09.attention_backward", "D_dropped"): ["少了 D"],
    ("ch09.attention_backward", "D_is_rowsum_of_dP"): ["dO_i · O_i", "带上 P"],
    ("ch09.attention_backward", "scale_forgotten"): ["1/√d"],
    ("ch09.attention_backward", "P_not_normalised"): ["exp(S − lse)", "除以 ℓ"],
    ("ch09.attention_backward", "mask_ignored_in_recompute"): ["−inf", "被屏蔽的位置"],
    ("ch09.attention_backward", "nan_in_a_fully_masked_row"): ["lse = −inf", "NaN", "换成 0"],
    ("ch09.online_softmax", "sum_not_rescaled"): ["α = exp(m_i − m_new)", "l_i"],
    ("ch09.online_softmax", "rescaled_the_wrong_way"): ["方向反了"],
    ("ch09.online_softmax", "nan_when_a_block_is_all_minus_inf"): ["−inf", "NaN", "换成 0"],
    ("ch09.online_softmax", "last_partial_block_dropped"): ["最后一块", "range(0, N, block)"],
    ("ch09.online_softmax", "outputs_not_rescaled"): ["前面的块写下的", "α = exp(m_i − m_new)"],
    ("ch02.sequence_logprob", "raw_logits_summed"): ["logit 不是对数概率", "log_softmax"],
    ("ch02.sequence_logprob", "product_underflows"): ["下溢", "−inf", "对数空间"],
    ("ch02.sequence_logprob", "exp_without_max"): ["上溢", "NaN", "log_softmax"],
    ("ch02.sequence_logprob", "logits_shifted_by_one"): ["错开了一位"],
    ("ch02.sequence_logprob", "eos_term_dropped"): ["EOS", "少了最后一项"],
    ("ch02.sequence_logprob", "mean_not_sum"): ["平均", "各项之和"],
    ("ch02.sequence_logprob", "softmax_over_wrong_axis"): ["沿错了维度", "dim=-1"],
    ("ch02.token_cross_entropy", "pad_counted"): ["PAD", "ignore_index"],
    ("ch02.token_cross_entropy", "mean_of_sentence_means"): ["先在每个句子内平均", "词元总数"],
    ("ch02.token_cross_entropy", "summed_not_averaged"): ["总和", "N_tok"],
    ("ch02.token_cross_entropy", "divided_by_batch_size"): ["句子数", "N_tok"],
    ("ch02.token_cross_entropy", "pad_id_hardcoded_zero"): ["写死成了 0", "pad_id"],
    ("ch11.sampling_probs", "not_renormalised"): ["概率之和不是 1", "重新归一化"],
    ("ch11.sampling_probs", "drops_token_crossing_p"): ["少留了一个", "越过 p 的那个词元"],
    ("ch11.sampling_probs", "cumsum_off_by_one"): ["多留了一个", "累积和错了一位"],
    ("ch11.sampling_probs", "top_k_keeps_k_minus_1"): ["少留了一个", ">="],
    ("ch11.sampling_probs", "top_p_on_unfiltered_probs"): ["top-k 留下并重新归一化的分布"],
    ("ch11.sampling_probs", "cumsum_in_vocab_order"): ["从大到小排序", "词表顺序"],
    ("ch11.kv_step", "attends_before_appending"): ["先把新的键和值追加进缓存"],
    ("ch11.kv_step", "no_causal_mask_among_new"): ["因果掩码", "t+i"],
    ("ch10.smoothed_cross_entropy", "eps_over_V_minus_1"): ["V − 1", "ε/V"],
    ("ch10.smoothed_cross_entropy", "target_misses_its_eps_over_V"): ["1 − ε + ε/V", "不是一个分布"],
    ("ch10.smoothed_cross_entropy", "pad_column_not_smoothed"): ["PAD 这一列也要分到 ε/V"],
    ("ch10.smoothed_cross_entropy", "pad_positions_counted"): ["PAD 位置也算进了平均"],
    ("ch10.smoothed_cross_entropy", "divided_by_all_positions"): ["分母", "真实词元"],
    ("ch10.smoothed_cross_entropy", "pad_id_hard_coded_0"): ["写死成了 0", "pad_id"],
    ("ch10.smoothed_cross_entropy", "log_of_softmax"): ["log_softmax", "下溢"],
    ("ch10.smoothed_cross_entropy", "sum_not_mean"): ["总和", "平均"],
    ("ch10.decoder_mask", "causal_only"): ["少了键填充"],
    ("ch10.decoder_mask", "padding_only"): ["少了因果掩码", "tril"],
    ("ch10.decoder_mask", "pad_hides_queries_not_keys"): ["查询（行）", "键（列）"],
    ("ch10.decoder_mask", "diagonal_hidden"): ["对角线", "tril(-1)"],
    ("ch10.decoder_mask", "sees_the_future"): ["上三角", "triu()"],
    ("ch10.decoder_mask", "polarity_inverted"): ["含义反了", "True = 可以关注"],
    ("ch10.decoder_mask", "no_head_axis"): ["(B, 1, T, T)", "广播"],
    ("ch10.noam_lr", "max_not_min"): ["用了 max", "torch.minimum"],
    ("ch10.noam_lr", "no_d_model_factor"): ["d_model^-0.5"],
    ("ch10.noam_lr", "warmup_to_the_minus_1"): ["step/warmup", "warmup^-1.5"],
    ("ch10.noam_lr", "warmup_to_the_minus_half"): ["warmup^-0.5", "warmup^-1.5"],
    ("ch10.noam_lr", "steps_counted_from_0"): ["从 0 数了", "变成了 0"],
    ("ch10.noam_lr", "steps_shifted_by_one"): ["多加了 1"],
    ("ch11.kv_step", "cache_thrown_away"): ["要包含缓存里的", "torch.cat"],
    ("ch11.kv_step", "values_appended_in_front"): ["v_all 的顺序要和 k_all 一致"],
    ("ch11.kv_step", "no_scale"): ["√d_k"],
    ("ch11.kv_step", "top_left_causal_mask"): ["左上角对齐", "is_causal=True", "tril(diagonal=t)"],
}
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
        "ch09.online_softmax": (lambda x, block: torch.softmax(x, -1).nan_to_num(0.0),
                                "torch.softmax"),
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
