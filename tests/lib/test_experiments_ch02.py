"""attnbook.experiments.ch02: the chapter's evaluation by length, the step-budgeted training,
the metrics the claims quote, the toy's search rates (group 0 = the chapter's 200 models), and
the linear probe of the frozen context vector c (ch02.probe)."""
import pytest
import torch

from attnbook import experiments
from attnbook.data import reversal_task
from attnbook.decoding import exact_map, greedy_decode, random_tree_lm
from attnbook.experiments import ch02


def test_search_rates_of_group_0_are_the_chapters_counts_and_depend_on_temperature():
    t1 = ch02.search_rates(0, 1.0)
    assert t1["greedy_error"] == 103 / 200 and t1["empty_map"] == 125 / 200
    t025 = ch02.search_rates(0, 0.25)
    assert t025["greedy_error"] < t1["greedy_error"] / 2          # sharper toy: fewer errors
    assert abs(t025["empty_map"] - t1["empty_map"]) > 0.2


def test_search_rates_count_what_greedy_and_exact_map_return():
    kw = dict(bos=4, eos=0, max_len=5)
    err = empty = 0
    for s in range(40, 60):                                       # group 2 of 20 models
        lm = random_tree_lm(4, eos=0, seed=s, temperature=0.5, max_len=5)
        best = exact_map(lm, vocab_size=4, **kw).tokens
        err += greedy_decode(lm, **kw).tokens != best
        empty += best == (0,)
    r = ch02.search_rates(2, 0.5, n_models=20)
    assert (r["greedy_error"], r["empty_map"]) == (err / 20, empty / 20)
    assert 0 < r["p_empty"] < 1


def test_teacher_forced_accuracy_is_per_position_over_the_real_tokens():
    model = ch02.new_model(0)
    sets = {m: reversal_task(min_len=m, max_len=m).batch(6, seed=m, split="test")
            for m in (3, 5)}
    rows = ch02.accuracy_by_length(model, sets)
    for m, tb in sets.items():
        with torch.no_grad():
            pred = model(tb.src, tb.src_mask, tb.tgt_in).logits.argmax(-1)
        want = ((pred == tb.tgt_out) & tb.tgt_mask).sum() / tb.tgt_mask.sum()
        assert rows[m][2] == pytest.approx(want.item(), abs=1e-12)
    assert model.training                                          # mode restored


def test_training_is_a_step_budget():
    model = ch02.new_model(1, d_hidden=8)
    history = ch02.train_bottleneck(model, seed=1, steps=3)
    assert len(history.losses) == 3 and history.stopped_by == "steps"


def test_bottleneck_metrics_and_the_registered_claims():
    rows = {n: (1.0 - n / 20, 1.0 - n / 30, 1.0 - n / 40) for n in range(3, 13)}
    m = ch02.bottleneck_metrics(rows, "long_")
    assert m["long_tf_drop"] == pytest.approx(rows[3][2] - rows[12][2])
    assert m["long_em_8"] == rows[8][0] and m["long_greedy_12"] == rows[12][1]
    names = [n for n in experiments.names() if n.startswith("ch02.")]
    assert names == ["ch02.bottleneck", "ch02.bottleneck_controls", "ch02.probe",
                     "ch02.search_rates"]
    base = experiments.get("ch02.bottleneck")
    good = dict(em_3=1.0, em_12=0.0, tf_drop=0.33, tf_12=0.66, greedy_12=0.4)
    assert base.holds(good)
    assert not base.holds(good | {"em_12": 0.5})                  # no decline: rejected
    assert not base.holds(good | {"greedy_12": 0.65})             # no cost of feeding back


def test_the_controls_claim_needs_both_controls_to_improve_length_8():
    ctl = experiments.get("ch02.bottleneck_controls")
    good = dict(em_8=0.19, tf_12=0.66)
    for p in ("long_", "wide_"):
        good |= {f"{p}em_3": 1.0, f"{p}em_12": 0.0, f"{p}tf_drop": 0.25, f"{p}em_8": 0.4}
    good["long_tf_12"] = 0.75
    assert ctl.holds(good)
    assert not ctl.holds(good | {"wide_em_8": 0.19})     # the wider model no better at m = 8
    assert not ctl.holds(good | {"long_em_8": 0.19})     # nor the longer run
    assert not ctl.holds(good | {"wide_tf_drop": 0.05})  # the decline gone in a control


# ---------------------------------------------------------------- the linear probe of c
def _planted(n, gen, n_pos=4, n_classes=10, d=64, noise=0.0):
    """Features that hold the labels linearly: x = sum_p E_p[y_p] (+ noise)."""
    emb = torch.randn(n_pos, n_classes, d, generator=torch.Generator().manual_seed(99),
                      dtype=torch.float64)
    y = torch.randint(n_classes, (n, n_pos), generator=gen)
    x = sum(emb[p][y[:, p]] for p in range(n_pos))
    return x + noise * torch.randn(x.shape, generator=gen, dtype=torch.float64), y


def test_the_probe_reads_a_planted_linear_code_exactly():
    g = torch.Generator().manual_seed(0)
    (xtr, ytr), (xte, yte) = _planted(600, g), _planted(300, g)
    acc = ch02.linear_probe(xtr, ytr, xte, yte, n_classes=10)
    assert acc.shape == (4,) and acc.dtype == torch.float64
    assert torch.equal(acc, torch.ones(4, dtype=torch.float64))
    # float32 features, one position: the same read-out
    one = ch02.linear_probe(xtr.float(), ytr[:, :1], xte.float(), yte[:, :1], n_classes=10)
    assert one.tolist() == [1.0]


def test_the_probe_is_at_chance_on_noise_and_on_shuffled_labels():
    g = torch.Generator().manual_seed(1)
    (xtr, ytr), (xte, yte) = _planted(1000, g), _planted(2000, g)
    noise_tr = torch.randn(xtr.shape, generator=g, dtype=torch.float64)
    noise_te = torch.randn(xte.shape, generator=g, dtype=torch.float64)
    acc = ch02.linear_probe(noise_tr, ytr, noise_te, yte, n_classes=10)
    assert ((acc - 0.1).abs() < 0.04).all(), acc                   # chance: 1 in 10
    shuffled = ytr[torch.randperm(len(ytr), generator=g)]
    acc = ch02.linear_probe(xtr, shuffled, xte, yte, n_classes=10)  # the code is there, the labels not
    assert ((acc - 0.1).abs() < 0.04).all(), acc


def test_the_probe_reads_a_partial_code_partly():
    g = torch.Generator().manual_seed(2)
    (xtr, ytr), (xte, yte) = _planted(1000, g, noise=4.0), _planted(1000, g, noise=4.0)
    acc = ch02.linear_probe(xtr, ytr, xte, yte, n_classes=10)
    assert ((acc > 0.2) & (acc < 0.95)).all(), acc                 # between chance and exact
    # the default 50 L-BFGS iterations have converged on such an overlapping code: ten times
    # as many read the same (an under-fitted probe would understate what c holds)
    longer = ch02.linear_probe(xtr, ytr, xte, yte, n_classes=10, steps=500)
    assert (acc - longer).abs().max() <= 0.005, (acc, longer)


def test_the_probe_names_a_bad_argument():
    g = torch.Generator().manual_seed(3)
    (x, y) = _planted(20, g)
    ok = dict(n_classes=10)
    with pytest.raises(ValueError, match="train_y"):
        ch02.linear_probe(x, y + 10, x, y, **ok)                    # ids out of range
    with pytest.raises(ValueError, match="test_y"):
        ch02.linear_probe(x, y, x, y[:5], **ok)                     # not one row per row
    with pytest.raises(ValueError, match="train_x"):
        ch02.linear_probe(x.clone().fill_(float("nan")), y, x, y, **ok)
    with pytest.raises(ValueError, match="test_x"):
        ch02.linear_probe(x, y, x[:, :3], y, **ok)                  # another width
    with pytest.raises(TypeError, match="train_y"):
        ch02.linear_probe(x, y.float(), x, y, **ok)
    with pytest.raises(ValueError, match="n_classes"):
        ch02.linear_probe(x, y, x, y, n_classes=1)
    with pytest.raises(ValueError, match="steps"):
        ch02.linear_probe(x, y, x, y, n_classes=10, steps=0)
    with pytest.raises(ValueError, match="l2"):
        ch02.linear_probe(x, y, x, y, n_classes=10, l2=-1.0)


def test_context_vectors_and_per_position_accuracy_of_the_frozen_model():
    model = ch02.new_model(0)
    tb = reversal_task(min_len=5, max_len=5).batch(8, seed=3, split="test")
    c = ch02.context_vectors(model, tb)
    model.eval()
    with torch.no_grad():
        want = model.encode(tb.src, tb.src_mask).summary
        pred = model(tb.src, tb.src_mask, tb.tgt_in).logits.argmax(-1)
    model.train()
    assert torch.equal(c, want) and c.shape == (8, 64)
    acc = ch02.per_position_accuracy(model, tb)
    assert acc.shape == (5,) and model.training                     # mode restored
    for j in range(1, 6):                                           # x_j is emitted at step 6 - j
        step = 5 - j                                                # 0-based output step
        assert tb.tgt_out[0, step] == tb.src[0, j - 1]              # a reversal
        assert acc[j - 1] == (pred[:, step] == tb.src[:, j - 1]).double().mean()


def test_probe_metrics_keys_and_controls_on_a_small_set():
    task = reversal_task(min_len=12, max_len=12)
    sets = (task.batch(300, seed=5, split="valid"), task.batch(200, seed=6, split="test"))
    m = ch02.probe_metrics(ch02.new_model(0), ch02.new_model(1), sets)
    for name in ("probe", "dec", "rand"):
        assert all(f"{name}_{j}" in m for j in range(1, 13))
        assert m[f"{name}_early"] == pytest.approx(sum(m[f"{name}_{j}"] for j in ch02.EARLY) / 4)
    assert "shuf_1" not in m and m["shuf_early"] < 0.25
    # an untrained GRU keeps its last tokens readable: the probe reads them, and the shuffled
    # labels do not (so the control does shuffle)
    assert m["shuf_late"] < 0.25 < m["probe_late"] and m["probe_12"] > 0.8


def test_the_probe_claims_rule():
    exp = experiments.get("ch02.probe")
    good = dict(shuf_early=0.1, shuf_late=0.1, probe_early=0.36, rand_early=0.12, probe_12=0.97,
                dec_early=0.56, probe_late=0.51, dec_late=0.77)
    assert exp.holds(good)
    assert not exp.holds(good | {"probe_early": 0.62})      # the probe reads more than the decoder
    assert not exp.holds(good | {"shuf_early": 0.3})        # the chance control above chance
    assert not exp.holds(good | {"rand_early": 0.3})        # no better than an untrained encoder
    assert not exp.holds(good | {"probe_12": 0.5})          # cannot read even the last token
