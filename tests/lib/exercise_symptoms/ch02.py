"""Chapter 02's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
    ("ch02.beam_search", "eos_not_handled"): ["EOS", "移出束", "不再扩展"],
    ("ch02.beam_search", "probabilities_summed"): ["概率加了起来", "对数概率相加"],
    ("ch02.beam_search", "k_kept_per_parent"): ["每个前缀各留了 k 个", "只留对数概率最高的 k 个"],
    ("ch02.beam_search", "length_normalised"): ["长度归一化", "不除以长度"],
    ("ch02.beam_search", "sorted_ascending"): ["排序方向反了", "降序"],
    ("ch02.beam_search", "last_step_only"): ["只按最后一步", "整个前缀"],
    ("ch02.beam_search", "first_finished_returned"): ["最先完成", "对数概率最大"],
    ("ch02.beam_search", "stopped_at_k_finished"): ["凑够 k 个完成的输出就停了", "没有活前缀"],
}
