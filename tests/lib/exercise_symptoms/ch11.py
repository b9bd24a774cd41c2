"""Chapter 11's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
    ("ch11.sampling_probs", "not_renormalised"): ["概率之和不是 1", "重新归一化"],
    ("ch11.sampling_probs", "drops_token_crossing_p"): ["少留了一个", "越过 p 的那个词元"],
    ("ch11.sampling_probs", "cumsum_off_by_one"): ["多留了一个", "累积和错了一位"],
    ("ch11.sampling_probs", "top_k_keeps_k_minus_1"): ["少留了一个", ">="],
    ("ch11.sampling_probs", "top_p_on_unfiltered_probs"): ["top-k 留下并重新归一化的分布"],
    ("ch11.sampling_probs", "cumsum_in_vocab_order"): ["从大到小排序", "词表顺序"],
    ("ch11.kv_step", "attends_before_appending"): ["先把新的键和值追加进缓存"],
    ("ch11.kv_step", "no_causal_mask_among_new"): ["因果掩码", "t+i"],
    ("ch11.kv_step", "cache_thrown_away"): ["要包含缓存里的", "torch.cat"],
    ("ch11.kv_step", "values_appended_in_front"): ["v_all 的顺序要和 k_all 一致"],
    ("ch11.kv_step", "no_scale"): ["√d_k"],
    ("ch11.kv_step", "top_left_causal_mask"): ["左上角对齐", "is_causal=True", "tril(diagonal=t)"],
}
SYMPTOMS.update({
    ("ch11.kv_step", "scale_one_over_d_k"): ["除以了 d_k", "1/√d_k"],
    ("ch11.lm_loss", "no_shift"): ["没有错开一位", "logits[:, :-1]", "ids[:, 1:]"],
    ("ch11.lm_loss", "shifted_the_wrong_way"): ["方向反了", "logits[:, :-1]", "ids[:, 1:]"],
    ("ch11.lm_loss", "pad_targets_counted"): ["PAD 目标也算进了平均"],
    ("ch11.lm_loss", "pad_mask_from_the_inputs"): ["输入 ids[:, :-1]", "目标 ids[:, 1:]"],
    ("ch11.lm_loss", "mean_of_sequence_means"): ["每首取平均", "全部非 PAD 目标"],
    ("ch11.lm_loss", "pad_id_hard_coded_0"): ["写死成了 0", "pad_id"],
    ("ch11.lm_loss", "log_of_softmax"): ["log_softmax", "下溢"],
    ("ch11.lm_loss", "sum_not_mean"): ["总和", "平均"],
})
SYMPTOMS[("ch11.sampling_probs", "mass_summed_over_logits")] = ["不是 logits", "概率之和"]
