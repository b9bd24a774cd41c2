"""Chapter 01's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
    ("ch01.bptt", "tanh_derivative_forgotten"): ["少乘了 tanh 的导数", "1 − h_t²"],
    ("ch01.bptt", "derivative_of_z_not_h"): ["1 − h_t²", "不是 1 − z_t²"],
    ("ch01.bptt", "not_accumulated_over_time"): ["沿时间累加", "覆盖"],
    ("ch01.bptt", "h_t_instead_of_h_prev"): ["h_{t-1}", "不是 h_t"],
    ("ch01.bptt", "W_hh_not_transposed"): ["W_hhᵀ"],
    ("ch01.bptt", "gradient_not_carried_back"): ["传回来的梯度", "不能丢"],
    ("ch01.bptt", "only_last_step_loss"): ["只用了最后一步", "dh[:, t-1]"],
}
