"""attnbook.experiments.ch06: the toy task, the model's positional variants and the test-time knobs
(window, interpolation, NTK base) do what the chapter says; the fast RoPE path equals apply_rope."""
import math

import pytest
import torch

from attnbook.experiments import ch06
from attnbook.positional import apply_rope, frequencies


def test_lag_batch_targets():
    g = torch.Generator().manual_seed(0)
    for lag in (1, 2):
        x, y = ch06.lag_batch(4, 10, g, lag)
        assert (y[:, :lag] == -100).all() and torch.equal(y[:, lag:], x[:, :-lag])
        assert int(x.min()) >= 0 and int(x.max()) < ch06.V


def test_fast_rope_path_equals_apply_rope():
    x = torch.randn(3, 4, 16, ch06.D_MODEL // ch06.N_HEADS, generator=torch.Generator().manual_seed(1))
    for pos in (torch.arange(16), torch.arange(16) + 37, torch.arange(16) / 4.0):
        cos, sin = ch06.rope_tables(pos)
        torch.testing.assert_close(ch06._rotate(x, cos, sin), apply_rope(x, pos), rtol=1e-6, atol=1e-6)
    cos, sin = ch06.rope_tables(torch.arange(16), base=5e4)
    assert (ch06._rotate(x, cos, sin) - apply_rope(x)).abs().max() > 1e-3   # the base matters


def test_learned_positions_cannot_run_past_the_table():
    model = ch06.TinyLM("learned")
    assert model(torch.zeros(2, ch06.T_TRAIN, dtype=torch.long)).shape == (2, ch06.T_TRAIN, ch06.V)
    with pytest.raises(ValueError, match="TinyLM: a learned position table has 16 rows"):
        model(torch.zeros(1, ch06.T_TRAIN + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="TinyLM: `pe`"):
        ch06.TinyLM("t5")


def test_window_masks_far_keys_only():
    torch.manual_seed(0)
    model = ch06.TinyLM("rope").eval()
    x = torch.randint(ch06.V, (2, 40))
    with torch.no_grad():
        full, wide, narrow = model(x), model(x, window=40), model(x, window=4)
        w = model.blocks[0].weights
    torch.testing.assert_close(wide, full)
    assert (narrow - full).abs().max() > 1e-3
    dist = torch.arange(40)[:, None] - torch.arange(40)[None, :]
    assert w[..., dist >= 4].abs().max() == 0 and w[..., dist < 0].abs().max() == 0


def test_ntk_base_keeps_the_fastest_pair_and_stretches_the_slowest():
    for scale, d in ((4.0, 8), (2.0, 64)):
        base = ch06.ntk_base(scale, d)
        ratio = frequencies(d, base=base) / frequencies(d)
        assert abs(ratio[0].item() - 1) < 1e-12 and abs(ratio[-1].item() - 1 / scale) < 1e-12
    assert ch06.ntk_base(4.0, 8) == pytest.approx(1e4 * 4 ** (8 / 6))


def test_interpolation_divides_rope_positions():
    torch.manual_seed(0)
    model = ch06.TinyLM("rope").eval()
    x = torch.randint(ch06.V, (2, 12))
    with torch.no_grad():
        assert (model(x, scale=4.0) - model(x)).abs().max() > 1e-4      # positions change
        torch.testing.assert_close(model(x, scale=1.0), model(x))
    torch.manual_seed(0)
    alibi = ch06.TinyLM("alibi").eval()
    with torch.no_grad():                                              # no effect without RoPE
        torch.testing.assert_close(alibi(x, scale=4.0, base=5e4), alibi(x))


def test_untrained_models_are_at_chance_and_buckets_are_means():
    x, y = ch06.test_set(0)
    torch.manual_seed(0)
    acc = ch06.accuracy_by_position(ch06.TinyLM("alibi").eval(), x, y)
    b = ch06.bucket_means(acc)
    assert acc.shape == (ch06.T_TEST,) and acc[0] == 0                 # position 0 has no target
    assert all(v < 2 / ch06.V for v in b.values())
    assert b["far"] == pytest.approx(acc[32:].mean().item())
    assert ch06.first_below(torch.ones(64)) == 64 and ch06.first_below(torch.zeros(64)) == 16


@pytest.mark.slow
def test_a_trained_alibi_model_holds_at_four_times_the_length():
    m = ch06.length_metrics({"alibi": ch06.train_lm("alibi", 0)}, 0)
    assert m["alibi_seen"] > 0.95 and m["alibi_far"] > 0.9
    assert not math.isnan(m["alibi_mid"])
