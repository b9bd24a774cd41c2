"""Chapter 05's experiments (attnbook.experiments.ch05): the task, the metrics and the predicates.

The full claims run on seed 0 in tests/lib/test_experiments.py (slow); here the pieces are
checked on hand-built inputs and short runs, and each predicate rejects the wrong finding."""
import pytest
import torch

from attnbook import experiments
from attnbook.experiments import ch05


def test_pair_copy_labels():
    x, y = ch05.pair_copy_batch(64, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (64, ch05.T_PC)
    assert (y[:, 0] == -100).all()
    i = torch.arange(1, ch05.T_PC)
    assert torch.equal(y[:, 1:], 10 * x[:, :1] + x[:, i - 1])
    x2, _ = ch05.pair_copy_batch(64, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)                                 # a seed reproduces the data


def test_head_roles_and_ablation_read_a_hand_built_model():
    torch.manual_seed(0)
    model = ch05.PairCopy(2).eval()
    x, _ = ch05.test_set(100)
    on_prev, on_first = ch05.head_roles(model, x)
    w = model(x, need_weights=True)[1]
    assert torch.allclose(on_first[1], w[:, 1, 2:, 0].mean())
    assert torch.allclose(on_prev[0], torch.stack([w[:, 0, i, i - 1] for i in range(2, 8)]).mean())
    # evaluate_pc: the labels themselves score 1, shifted labels score 0
    x, y = ch05.test_set(200)

    class Oracle(torch.nn.Module):
        def forward(self, x, head_mask=None):
            return torch.nn.functional.one_hot(y.clamp_min(0), 100).double(), None
    acc = ch05.evaluate_pc(Oracle(), x, y)
    assert acc == dict(label=1.0, x0=1.0, prev=1.0)


def test_a_short_run_trains_exactly_its_steps_and_fails_the_claims():
    model, untrained, hist = ch05.train_pair_copy(0, 2, steps=5)
    assert len(hist.losses) == 5 and untrained < 0.05
    m = ch05.two_head_metrics(model, untrained)
    assert not experiments.get("ch05.two_heads").holds(m)     # control: 5 steps learn nothing


GOOD2 = dict(label=1.0, untrained=0.01, distinct=1.0, own_weight=0.95, lost_digit=0.1,
             kept_digit=1.0, label_one_off=0.1)
GOOD1 = dict(label=1.0, untrained=0.01, on_prev=0.5, on_first=0.49, on_both=0.99)
GOOD4 = dict(label=1.0, n_prev=2, n_first=2, n_other=0, lean_min=0.8, free=0, max_cost=0.3,
             min_cost=0.05, greedy=0)


@pytest.mark.parametrize("name,good,wrong", [
    ("ch05.two_heads", GOOD2, dict(distinct=0.0)),            # both heads on one position
    ("ch05.two_heads", GOOD2, dict(lost_digit=0.9)),          # ablation loses nothing
    ("ch05.two_heads", GOOD2, dict(kept_digit=0.5)),          # ablation loses both digits
    ("ch05.one_head", GOOD1, dict(on_first=0.05)),            # one head picks one position
    ("ch05.one_head", GOOD1, dict(label=0.5)),                # one head fails the task
    ("ch05.four_heads", GOOD4, dict(n_other=1, lean_min=0.45)),   # a head without a role
    ("ch05.four_heads", GOOD4, dict(lean_min=0.5)),           # a head exactly on the line
    ("ch05.four_heads", GOOD4, dict(n_prev=0, n_first=4)),    # one role held by no head
    ("ch05.four_heads", GOOD4, dict(max_cost=0.02)),          # every head free to prune
])
def test_predicates_reject_the_wrong_finding(name, good, wrong):
    exp = experiments.get(name)
    assert exp.holds(good)
    assert not exp.holds({**good, **wrong})


def test_four_head_metrics_keep_every_heads_weights_and_cost():
    """The per-head figures are the lists' entries, lean_min is the least decided head's larger
    weight, and the role counts are the 0.5 line applied to them (on a 5-step run)."""
    model = ch05.train_pair_copy(1, 4, steps=5)[0]
    m = ch05.four_head_metrics(model)
    on_prev, on_first = ch05.head_roles(model, ch05.test_set()[0])
    for k in range(4):
        assert m[f"prev_h{k + 1}"] == m["on_prev"][k] == on_prev[k].item()
        assert m[f"first_h{k + 1}"] == m["on_first"][k] == on_first[k].item()
        assert m[f"cost_h{k + 1}"] == m["costs"][k]
    lean = [max(p, f) for p, f in zip(m["on_prev"], m["on_first"])]
    assert m["lean_min"] == min(lean)
    assert m["n_prev"] == sum(p > ch05.ROLE for p in m["on_prev"])
    assert m["n_first"] == sum(f > ch05.ROLE for f in m["on_first"])
    assert (m["n_other"] == 0) == (m["lean_min"] > ch05.ROLE)
    assert m["n_other"] == sum(v <= ch05.ROLE for v in lean)
    assert m["min_cost"] == min(m["costs"]) and m["max_cost"] == max(m["costs"])
    # the registered run keeps the scalars and drops the lists
    row = {k: v for k, v in m.items() if not isinstance(v, list)}
    assert {"lean_min", "prev_h4", "first_h4", "cost_h4"} <= set(row)
    assert experiments.get("ch05.four_heads").keys() <= set(row)
