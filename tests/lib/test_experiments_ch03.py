"""attnbook.experiments.ch03: the measurement helpers and the two registered predicates (fast: no
training here; the trained runs are the committed experiments)."""
import pytest
import torch

from attnbook import experiments
from attnbook.data import reversal_task
from attnbook.experiments import ch03
from attnbook.seq2seq import AttentionSeq2Seq


def test_dot_variance_is_the_variance_over_real_pairs():
    task = reversal_task(min_len=3, max_len=6)
    batch = task.batch(8, seed=0, split="valid")
    torch.manual_seed(0)
    model = AttentionSeq2Seq(len(task.src_vocab), len(task.tgt_vocab), d_emb=4, d_hidden=8,
                             score="dot", flow="luong")
    v = ch03.dot_variance(model, batch)
    with torch.no_grad():
        enc = model.encode(batch.src, batch.src_mask)
        states = model.decode(batch.tgt_in, enc).states[:, 1:]
    vals = [states[b, t] @ enc.memory[b, i] for b in range(len(batch))
            for t in range(states.shape[1]) if batch.tgt_mask[b, t]
            for i in range(enc.memory.shape[1]) if batch.src_mask[b, i]]
    ref = torch.stack(vals).double().var().item()
    assert abs(v["var"] - ref) < 1e-9 * max(1.0, ref) and abs(v["var_over_d"] - ref / 8) < 1e-9
    padded = torch.stack([states[b, t] @ enc.memory[b, i] for b in range(len(batch))
                          for t in range(states.shape[1]) for i in range(enc.memory.shape[1])])
    assert abs(padded.double().var().item() - ref) > 1e-6      # padding would change it
    assert 0 < v["comp_h"] < 1 and 0 < v["comp_s"] < 1


def test_length_metrics():
    plain = [1.0, 0.9] + [0.5] * 5 + [0.0, 0.1, 0.2]
    attn = [1.0] * 7 + [0.9, 0.8, 0.7]
    m = ch03.length_metrics(plain, attn)
    assert m["plain_short"] == 0.95 and abs(m["plain_long"] - 0.1) < 1e-12
    assert abs(m["attn_long"] - 0.8) < 1e-12 and abs(m["gap_long"] - 0.7) < 1e-12


def test_predicates_accept_the_claim_and_reject_its_negation():
    length = experiments.get("ch03.length")
    good = dict(params_plain=57230, params_attn=54350, plain_short=0.95, attn_short=1.0,
                plain_long=0.0, attn_long=0.97, gap_long=0.97)
    assert length.holds(good)
    assert not length.holds({**good, "params_attn": 60000})          # not size-matched
    assert not length.holds({**good, "plain_long": 0.5, "gap_long": 0.47})
    var = experiments.get("ch03.trained_variance")
    ok = {}
    for d, init, trained in ((32, 0.05, 30.0), (64, 0.03, 90.0), (128, 0.02, 190.0)):
        ok.update({f"init_var_{d}": init, f"init_var_over_d_{d}": init / d,
                   f"init_comp_{d}": 0.05, f"trained_var_{d}": trained,
                   f"trained_var_over_d_{d}": trained / d, f"trained_comp_{d}": 0.3,
                   f"loss_{d}": 0.1})
    assert var.holds(ok)
    assert not var.holds({**ok, "trained_var_128": 40.0})            # does not grow with d
    assert not var.holds({**ok, "trained_comp_64": 0.9})             # premise would hold
    assert not var.holds({**ok, "init_var_over_d_32": 0.5})          # init not far below d


# --- interventions on alpha and one learning rate per model ------------------------------

def _reversal_batch(lengths=(3, 5, 4)):
    rows = [reversal_task(min_len=n, max_len=n).batch(1, seed=n, split="test") for n in lengths]
    s = max(lengths)
    src = torch.zeros(len(lengths), s, dtype=torch.long)
    for i, b in enumerate(rows):
        src[i, :lengths[i]] = b.src[0]
    return src, torch.arange(s)[None] < torch.tensor(lengths)[:, None]


def test_alpha_interventions_are_distributions_over_the_real_positions():
    src, mask = _reversal_batch()
    n, steps = mask.sum(1), 7
    hooks = ch03.alpha_interventions(mask, steps, seed=0)
    alpha = torch.softmax(torch.randn(3, 1, mask.shape[1], dtype=torch.float64), -1)
    alpha = alpha.masked_fill(~mask[:, None], 0.0)
    alpha = alpha / alpha.sum(-1, keepdim=True)
    for t in range(steps):
        p = hooks["permuted"](alpha, t)
        assert torch.equal(p.sort(-1).values, alpha.sort(-1).values)     # same weights, moved
        assert bool((p[~mask[:, None].expand_as(p)] == 0).all())
        u = hooks["uniform"](alpha, t)
        torch.testing.assert_close(u.sum(-1), torch.ones(3, 1, dtype=torch.float64))
        assert torch.equal(u[:, 0] > 0, mask)
        h = hooks["mirror"](alpha, t)
        for i, ni in enumerate(n.tolist()):
            if t < ni:                                                   # one-hot on n-1-t
                assert h[i, 0].argmax().item() == ni - 1 - t and h[i, 0].sum().item() == 1.0
                assert h[i, 0].max().item() == 1.0
            else:                                                        # EOS step: the model's own
                assert torch.equal(h[i, 0], alpha[i, 0])
    # the permutations are a fixed function of (seed, sentence, step): decoding a prefix twice
    # sees the same weights; another seed draws others
    again = ch03.alpha_interventions(mask, steps, seed=0)["permuted"]
    other = ch03.alpha_interventions(mask, steps, seed=1)["permuted"]
    many = alpha.expand(3, steps, -1).contiguous()
    assert torch.equal(hooks["permuted"](many, 0), again(many, 0))
    assert not torch.equal(hooks["permuted"](many, 0), other(many, 0))


def test_alpha_interventions_run_inside_the_model_and_reject_bad_input():
    src, mask = _reversal_batch()
    task = reversal_task(min_len=3, max_len=5)
    torch.manual_seed(0)
    model = AttentionSeq2Seq(len(task.src_vocab), len(task.tgt_vocab), d_emb=4, d_hidden=8,
                             score="additive", flow="bahdanau").eval()
    tgt_in = torch.full((3, 6), 1, dtype=torch.long)
    hooks = ch03.alpha_interventions(mask, 6)
    with torch.no_grad():
        out = model(src, mask, tgt_in, alpha_fn=hooks["mirror"])
    assert out.weights[0, 0].argmax().item() == 2 and out.weights[1, 0].argmax().item() == 4
    with pytest.raises(ValueError, match="built for 3 sentences"):
        model(src, mask, torch.full((3, 8), 1, dtype=torch.long), alpha_fn=hooks["permuted"])
    with pytest.raises(ValueError, match="right-padded"):
        ch03.alpha_interventions(torch.tensor([[True, False, True]]), 4)
    with pytest.raises(ValueError, match="bool"):
        ch03.alpha_interventions(mask.long(), 4)
    with pytest.raises(ValueError, match="`steps`"):
        ch03.alpha_interventions(mask, 0)


def test_digit_accuracy_ignores_eos_and_pad():
    tgt = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    logits = torch.nn.functional.one_hot(torch.tensor([[5, 9, 2, 2], [7, 7, 7, 7]]), 12).float()
    assert ch03._digit_accuracy(logits, tgt) == 2 / 3


def test_intervention_and_per_model_lr_predicates():
    iv = experiments.get("ch03.intervention")
    good = dict(own_token=0.99, permuted_token=0.2, mirror_token=0.98, uniform_token=0.25,
                own_exact=0.9, permuted_exact=0.0, mirror_exact=0.9, uniform_exact=0.0)
    assert iv.holds(good)
    assert not iv.holds({**good, "permuted_token": 0.9})       # alpha's positions did not matter
    assert not iv.holds({**good, "mirror_token": 0.5})         # the mirror is not what it uses
    lr = experiments.get("ch03.per_model_lr")
    assert lr.holds(dict(best_gap_long=0.5, best_plain_long=0.1, best_attn_long=0.6))
    assert not lr.holds(dict(best_gap_long=0.1, best_plain_long=0.5, best_attn_long=0.6))
    assert iv.run is lr.run is ch03.run_compare                # one training run for both
    assert ch03.RECIPE["lr"] in ch03.LR_GRID
