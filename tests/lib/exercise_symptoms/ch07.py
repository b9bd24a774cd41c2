"""Chapter 07's exercises: (exercise, bug) -> words the hint must contain (the mistake's
symptom, named). test_exercises.py gathers every file here; an exercise registered without rows fails."""
SYMPTOMS = {
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
    ("ch07.swiglu", "silu_on_both_branches"): ["x @ w_up 不过激活", "两支都过 SiLU"],
    ("ch07.matched_swiglu", "hidden_is_d_ff"): ["隐藏宽度不是 d_ff", "2·d_ff/3"],
    ("ch07.matched_swiglu", "hidden_from_d_model"): ["8d/3", "d_ff = 4d", "2·d_ff/3"],
    ("ch07.matched_swiglu", "gate_and_up_slices_swapped"): ["前两段用反了"],
    ("ch07.matched_swiglu", "down_slice_first"): ["三段的顺序不对"],
    ("ch07.matched_swiglu", "column_layout"): ["按行展开", "view(d, h)"],
    ("ch07.matched_swiglu", "sigmoid_gate"): ["不是 σ(u)", "GLU"],
    ("ch07.matched_swiglu", "gate_ignored"): ["少了门"],
}
