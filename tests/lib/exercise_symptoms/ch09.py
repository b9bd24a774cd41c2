"""Chapter 09's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
}
