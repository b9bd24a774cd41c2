"""Chapter 03's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
}
