"""Chapter 08's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
}
