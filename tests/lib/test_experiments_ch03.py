"""attnbook.experiments.ch03: the measurement helpers and the two registered predicates (fast: no
training here; the trained runs are the committed experiments)."""
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
