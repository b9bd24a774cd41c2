"""Chapter 12's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
    ("ch12.ring_worker", "outputs_averaged"): ["不能平均", "exp(lse_b − lse)"],
    ("ch12.ring_worker", "old_output_not_rescaled"): ["之前累积的输出", "exp(lse_old − lse_new)"],
    ("ch12.ring_worker", "local_positions"): ["全局位置", "k0 + j ≤ q0 + i"],
    ("ch12.ring_worker", "masked_block_lse_zero"): ["lse_b 应是 −inf", "不是 0"],
    ("ch12.ring_worker", "scale_forgotten"): ["1/√d"],
    ("ch12.ring_worker", "nan_when_a_row_has_seen_nothing"): ["−inf", "NaN", "换成 0"],
    ("ch12.mla_absorb", "heads_interleaved"): ["连续的一段", "(d_c, H, d_h)"],
    ("ch12.mla_absorb", "output_rows_interleaved"): ["连续的一段", "(H, d_h, d_model)"],
    ("ch12.mla_absorb", "one_matrix_for_all_heads"): ["每个头要有自己的", "(H, d_c, d_model)"],
    ("ch12.mla_absorb", "uk_not_transposed"): ["转置"],
    ("ch12.mla_absorb", "uk_used_for_values"): ["W^UV", "不是 W^UK"],
}
