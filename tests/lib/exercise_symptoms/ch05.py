"""Chapter 05's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
    ("ch05.multi_head_attention", "strided_heads"): ["连续的第 i 块特征"],
    ("ch05.multi_head_attention", "scaled_by_sqrt_d_model"): ["√d_k", "不是 √d_model"],
    ("ch05.multi_head_attention", "merge_without_transpose"): ["transpose(1, 2)", "混在一起"],
    ("ch05.multi_head_attention", "output_projection_forgotten"): ["少了输出投影", "W_o"],
    ("ch05.multi_head_attention", "one_softmax_over_all_heads"): ["每个头各做自己的 softmax"],
    ("ch05.multi_head_attention", "softmax_over_queries"): ["沿错了维度", "dim=-1"],
    ("ch05.multi_head_attention", "mask_without_head_axis"): ["头这一维", "mask[:, None]"],
    ("ch05.multi_head_attention", "memory_ignored"): ["键和值来自 memory"],
}
