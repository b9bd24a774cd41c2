"""Chapter 06's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
    ("ch06.rope_attention", "only_q_rotated"): ["k 也要按它自己的位置旋转", "n − m"],
    ("ch06.rope_attention", "k_rotated_the_other_way"): ["同一个方向", "m + n"],
    ("ch06.rope_attention", "v_rotated_too"): ["不旋转 v"],
    ("ch06.rope_attention", "k_rotated_by_query_positions"): ["k 按 k_pos（"],
    ("ch06.rope_attention", "positions_ignored"): ["传入的 q_pos 和 k_pos"],
    ("ch06.rope_attention", "q_assumed_at_the_end"): ["按传入的 q_pos 旋转", "不一定排在键的末尾"],
    ("ch06.rope_attention", "no_scaling"): ["除以 √D"],
}
