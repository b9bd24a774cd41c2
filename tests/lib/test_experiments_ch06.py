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


# ---------------------------------------------------------------- ch06.extrapolation's task

def test_recall_batch_has_one_key_and_both_targets():
    g = torch.Generator().manual_seed(3)
    x, y_local, y_recall, p = ch06.recall_batch(200, 16, g)
    assert x.shape == y_local.shape == y_recall.shape == (200, 16) and p.shape == (200,)
    is_key = x >= ch06.V
    assert (is_key.sum(1) == 1).all() and int(x.max()) < 2 * ch06.V and int(x.min()) >= 0
    assert torch.equal(is_key.int().argmax(1), p) and int(p.min()) >= 0 and int(p.max()) <= 14
    assert (y_local[:, 0] == -100).all() and torch.equal(y_local[:, 1:], x[:, :-1])
    v = x[torch.arange(200), p] - ch06.V
    for row in range(200):
        k = int(p[row])
        assert (y_recall[row, :k + 1] == -100).all()             # no target at or before the key
        assert (y_recall[row, k + 1:] == v[row]).all() and k + 1 < 16   # >= 1 target per row
    # every key position 0..14 and every value occurs (uniform draws)
    assert set(p.tolist()) == set(range(15)) and set(v.tolist()) == set(range(ch06.V))


def test_recall_batch_rejects_bad_arguments():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="recall_batch: `t`"):
        ch06.recall_batch(4, 1, g)
    with pytest.raises(ValueError, match="recall_batch: `n_seq`"):
        ch06.recall_batch(0, 16, g)
    with pytest.raises(TypeError, match="recall_batch: `g`"):
        ch06.recall_batch(4, 16, 0)


def test_training_distances_stay_below_the_test_buckets():
    """Training (length 16) never asks for a key more than 14 back; the test set's mid and far
    buckets are farther than that, and the near_late bucket is near but late."""
    x, _, y_recall, p = ch06.recall_batch(500, ch06.T_TRAIN, torch.Generator().manual_seed(1))
    masks = ch06.recall_masks(y_recall, p)
    assert masks["seen"].sum() == (y_recall != -100).sum()           # all of training is "seen"
    assert not masks["mid"].any() and not masks["far"].any() and not masks["near_late"].any()
    x, _, y_recall, p = ch06.recall_test_set(0)
    assert x.shape == (256, ch06.T_TEST)
    masks = ch06.recall_masks(y_recall, p)
    dist = torch.arange(ch06.T_TEST)[None, :] - p[:, None]
    pos = torch.arange(ch06.T_TEST).expand_as(dist)
    assert int(dist[masks["far"]].min()) == 32 and int(dist[masks["mid"]].min()) == 16
    assert int(dist[masks["mid"]].max()) == 31 and int(dist[masks["near_late"]].max()) <= 15
    assert int(pos[masks["near_late"]].min()) >= 32 and int(pos[masks["seen"]].max()) <= 15
    assert all(int(m.sum()) > 500 for m in masks.values())             # enough scored positions
    total = sum(m.int() for m in masks.values())
    assert int(total.max()) == 1                                       # the buckets are disjoint


class _Oracle(torch.nn.Module):
    """Logits that put +1 on the right answer of both questions (or on wrong ones)."""

    def __init__(self, y_local, y_recall, wrong=False):
        super().__init__()
        self.y_local, self.y_recall, self.wrong = y_local, y_recall, wrong

    def forward(self, x):
        out = torch.zeros(*x.shape, 3 * ch06.V)
        loc = self.y_local.clamp(min=0) + (1 if self.wrong else 0)
        rec = self.y_recall.clamp(min=0) + (1 if self.wrong else 0)
        out.scatter_(-1, (loc % (2 * ch06.V))[..., None], 1.0)
        out.scatter_(-1, (2 * ch06.V + rec % ch06.V)[..., None], 1.0)
        return out


def test_recall_metrics_score_both_questions():
    test = ch06.recall_test_set(0)
    right = ch06.recall_metrics(_Oracle(test[1], test[2]), *test)
    wrong = ch06.recall_metrics(_Oracle(test[1], test[2], wrong=True), *test)
    assert set(right) == {"local_seen", "local_mid", "local_far", "recall_seen", "recall_near_late",
                          "recall_mid", "recall_far"}
    assert all(v == 1.0 for v in right.values()) and all(v == 0.0 for v in wrong.values())
    with pytest.raises(ValueError, match="recall_metrics: no scored position"):
        short = ch06.recall_batch(8, ch06.T_TRAIN, torch.Generator().manual_seed(0))
        ch06.recall_metrics(_Oracle(short[1], short[2]), *short)


def test_recall_model_shapes_and_the_lag_model_unchanged():
    torch.manual_seed(0)
    model = ch06.recall_model("alibi").eval()
    x = ch06.recall_test_set(0)[0][:2]
    assert model(x).shape == (2, ch06.T_TEST, 3 * ch06.V)
    lag = ch06.TinyLM("rope")
    assert lag.embed.num_embeddings == ch06.V and lag.readout.out_features == ch06.V
    with pytest.raises(ValueError, match="TinyLM: `vocab`"):
        ch06.TinyLM("rope", vocab=0)
    batch = ch06.recall_batch(4, ch06.T_TRAIN, torch.Generator().manual_seed(0))
    loss = ch06.recall_loss(model.train(), batch)
    assert loss.ndim == 0 and math.isfinite(loss.item())
    # untrained: two cross-entropies near log(2V) + log(V)
    assert abs(loss.item() - math.log(2 * ch06.V) - math.log(ch06.V)) < 1.5
