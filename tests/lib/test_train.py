"""Tests for attnbook.train: fit (budget, seed, progress rule, validation), evaluate, eval_mode, the losses
(token_cross_entropy, label_smoothed_cross_entropy) and vaswani_lr."""
from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F

from attnbook import train
from attnbook.data import BOS_ID, EOS_ID, PAD_ID, reversal_task
from attnbook.testing import F64_TOL
from attnbook.train import (
    Accuracy,
    History,
    eval_mode,
    evaluate,
    fit,
    label_smoothed_cross_entropy,
    progress_mode,
    token_cross_entropy,
    vaswani_lr,
)

f64 = torch.float64


def regression(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3
    return x, y


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


def linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def test_fit_reduces_loss_linear_regression_and_counts_steps():
    model, batch = linear(), regression()
    h = fit(model, [batch], loss_fn=mse, steps=150, lr=0.05, seed=0, progress=False)
    assert isinstance(h, History) and h.steps == len(h.losses) == 150 and h.stopped_by == "steps"
    assert h.final_loss() < 1e-3 * h.initial_loss()
    assert h.seconds > 0 and h.steps_per_second == pytest.approx(150 / h.seconds)
    assert "150 steps" in h.summary()


def test_fit_classification_and_sgd_and_clip():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 2, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    h = fit(model, lambda: (x, y), loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
            steps=100, lr=0.5, seed=0, optimizer="sgd", clip=1.0, progress=False)
    assert h.final_loss() < 0.5 * h.initial_loss()
    assert (model(x).argmax(-1) == y).float().mean() > 0.9
    assert len(h.grad_norms) == 100 and all(n >= 0 for n in h.grad_norms)


def test_fit_deterministic_from_seed():
    def run():
        model = linear(3)
        drop = torch.nn.Dropout(0.3)  # uses torch's global generator, which fit seeds
        return fit(model, [regression()], loss_fn=lambda m, b: mse(lambda t: drop(m(t)), b),
                   steps=20, lr=0.01, seed=5, progress=False).losses
    assert run() == run()


def test_fit_respects_seconds_and_iterator_end():
    slow = lambda m, b: (time.sleep(0.01), mse(m, b))[1]  # noqa: E731
    fit(linear(), [regression()], loss_fn=mse, steps=1, lr=0.01, seed=0, progress=False)  # warm: the
    t0 = time.perf_counter()             # first optimizer of a process imports torch's compiler (~4 s)
    h = fit(linear(), [regression()], loss_fn=slow, seconds=0.15, lr=0.01, seed=0, progress=False)
    assert h.stopped_by == "seconds" and 1 <= h.steps <= 16 and time.perf_counter() - t0 < 1.0
    h = fit(linear(), [regression()], loss_fn=slow, steps=3, seconds=60, lr=0.01, seed=0, progress=False)
    assert h.stopped_by == "steps" and h.steps == 3
    h = fit(linear(), iter([regression()] * 4), loss_fn=mse, steps=10, lr=0.01, seed=0, progress=False)
    assert h.stopped_by == "data" and h.steps == 4
    h = fit(linear(), [regression(0), regression(1)], loss_fn=mse, steps=5, lr=0.01, seed=0, progress=False)
    assert h.steps == 5  # a list is cycled


def test_fit_task_batches_and_warmup():
    task = reversal_task(min_len=2, max_len=4)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(len(task.src_vocab), len(task.tgt_vocab))
    seen = []

    def loss(m, b):
        seen.append(b.pairs)
        return F.cross_entropy(m(b.src).reshape(-1, len(task.tgt_vocab)), b.src.reshape(-1))
    h = fit(emb, task.batches(8, seed=0), loss_fn=loss, steps=4, lr=0.1, seed=0, warmup=10, progress=False)
    assert h.steps == 4 and seen == [b.pairs for b in task.batches(8, seed=0, n_batches=4)]


def test_fit_stops_on_nonfinite_loss():
    h = fit(linear(), [regression()], loss_fn=lambda m, b: mse(m, b) * float("nan"), steps=5, lr=0.1,
            seed=0, progress=False)
    assert h.stopped_by == "nonfinite" and h.steps == 1


def test_fit_restores_training_mode():
    model = linear().eval()
    fit(model, [regression()], loss_fn=mse, steps=1, lr=0.1, seed=0, progress=False)
    assert not model.training


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(steps=None, seconds=None), ValueError, "`steps` or `seconds`"),
    (dict(steps=0), ValueError, "`steps`"),
    (dict(steps=2.5), TypeError, "`steps`"),
    (dict(seconds=0), ValueError, "`seconds`"),
    (dict(seconds="1"), TypeError, "`seconds`"),
    (dict(lr=0.0), ValueError, "`lr`"),
    (dict(lr=None), TypeError, "`lr`"),
    (dict(seed=-1), ValueError, "`seed`"),
    (dict(progress=1), TypeError, "`progress`"),
    (dict(optimizer="lbfgs"), ValueError, "`optimizer`"),
    (dict(clip=-1.0), ValueError, "`clip`"),
    (dict(warmup=-1), ValueError, "`warmup`"),
    (dict(log_every=0), ValueError, "`log_every`"),
    (dict(model="net"), TypeError, "`model`"),
    (dict(loss_fn=None), TypeError, "`loss_fn`"),
    (dict(batches=3), TypeError, "`batches`"),
    (dict(batches=[]), ValueError, "`batches`"),
    (dict(loss_fn=lambda m, b: 1.0), TypeError, "`loss_fn`"),
    (dict(model=torch.nn.ReLU()), ValueError, "`model`"),
])
def test_fit_bad_arguments(kwargs, exc, name):
    args = dict(model=linear(), batches=[regression()], loss_fn=mse, steps=2, lr=0.1, seed=0,
                progress=False)
    args.update(kwargs)
    model, batches = args.pop("model"), args.pop("batches")
    with pytest.raises(exc, match=name):
        fit(model, batches, **args)


# ---------------------------------------------------------------------------------------------- progress
def test_progress_rule(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    assert progress_mode(False) == "off"
    monkeypatch.setattr(train, "_in_kernel", lambda: False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    assert progress_mode(True) == "line"      # a pipe or a log file
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    assert progress_mode(True) == "bar"       # a terminal
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    monkeypatch.setattr(train, "_in_kernel", lambda: True)
    assert progress_mode(True) == "bar"       # Jupyter / Colab
    monkeypatch.setenv("ATTNBOOK_STATIC", "0")
    assert progress_mode(True) == "bar"
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")  # the book build
    assert progress_mode(True) == "line"
    monkeypatch.delenv("ATTNBOOK_STATIC")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")  # nbval kernels inherit it
    assert progress_mode(True) == "line"


def test_progress_output_quiet_when_static(monkeypatch, capsys):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    fit(linear(), [regression()], loss_fn=mse, steps=30, lr=0.1, seed=0)
    out, err = capsys.readouterr()
    # one line, and no timings: in the built book they would describe the build machine
    assert out.count("\n") == 1 and out.startswith("fit: 30 steps, loss") and " s " not in out and err == ""
    monkeypatch.setenv("ATTNBOOK_STATIC", "0")  # under pytest/nbval the line keeps its steps/s
    fit(linear(), [regression()], loss_fn=mse, steps=30, lr=0.1, seed=0)
    assert "steps/s" in capsys.readouterr().out
    fit(linear(), [regression()], loss_fn=mse, steps=30, lr=0.1, seed=0, progress=False)
    assert capsys.readouterr() == ("", "")


def test_progress_bar_when_interactive(monkeypatch, capsys):
    monkeypatch.delenv("ATTNBOOK_STATIC", raising=False)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setattr(train, "_in_kernel", lambda: True)
    monkeypatch.setattr("tqdm.auto.tqdm", __import__("tqdm").tqdm)  # the text bar, not a widget
    fit(linear(), [regression()], loss_fn=mse, steps=30, lr=0.1, seed=0)
    out, err = capsys.readouterr()
    assert out == "" and "30/30" in err


# ---------------------------------------------------------------------------------------------- evaluate
def test_evaluate_lists_trimming_and_counts():
    pred = [[5, 6, 7, EOS_ID, 9], [5, 6], [BOS_ID, 5, 8, EOS_ID], [5, 6, 7, 7]]
    tgt = [[5, 6, 7, EOS_ID, PAD_ID], [5, 6, 7], [5, 6, EOS_ID], [5, 6, 7, EOS_ID]]
    acc = evaluate(pred, tgt)
    assert isinstance(acc, Accuracy) and acc.correct == [True, False, False, False]
    assert acc.exact_match == 0.25 and acc.n_sequences == 4 and acc.n_tokens == 3 + 3 + 2 + 3
    assert acc.token_accuracy == pytest.approx((3 + 2 + 1 + 3) / 11)
    assert "exact match 0.250" in str(acc)


def test_evaluate_logits_teacher_forced():
    task = reversal_task()
    b = task.batch(6, seed=0)
    v = len(task.tgt_vocab)
    perfect = F.one_hot(b.tgt_out, v).double() * 10  # (B, T, V): argmax == tgt_out
    assert evaluate(perfect, b.tgt_out).exact_match == 1.0
    wrong = b.tgt_out.clone()
    wrong[0, 0] = (wrong[0, 0] + 1 - 4) % 10 + 4  # another digit id
    wrong[wrong == PAD_ID] = 7  # garbage after EOS is ignored
    acc = evaluate(wrong, b.tgt_out)
    assert acc.correct == [False] + [True] * 5
    no_eos = b.tgt_out.clone()
    no_eos[no_eos == EOS_ID] = 5  # missing EOS: too long, so not an exact match
    assert evaluate(no_eos, b.tgt_out).exact_match == 0.0
    assert evaluate(no_eos, b.tgt_out).token_accuracy == 1.0


def test_evaluate_raw_ids_and_bad_arguments():
    acc = evaluate(torch.tensor([[0], [1], [2]]), [[0], [1], [1]], pad_id=None, bos_id=None, eos_id=None)
    assert acc.exact_match == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="as many"):
        evaluate([[1]], [[1], [2]])
    with pytest.raises(TypeError, match="`pred`"):
        evaluate("12", [[1]])
    with pytest.raises(ValueError, match="`pred`"):
        evaluate(torch.zeros(2, 3), [[1], [2]])
    with pytest.raises(ValueError, match="`target"):
        evaluate([[1]], [[-1]])
    with pytest.raises(TypeError, match="`eos_id`"):
        evaluate([[1]], [[1]], eos_id="2")


def test_token_cross_entropy_ignores_pad_and_equals_mean_nll():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=g, dtype=torch.float64)
    target = torch.tensor([[4, 5, EOS_ID, PAD_ID], [3, EOS_ID, PAD_ID, PAD_ID]])
    logp = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
    real = target != PAD_ID
    expected = -(logp * real).sum() / real.sum()
    assert torch.allclose(token_cross_entropy(logits, target), expected, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="disagree"):
        token_cross_entropy(logits, target[:, :3])
    with pytest.raises(TypeError, match="`target`"):
        token_cross_entropy(logits, target.double())


# ------------------------------------------------------------------------------ the recipe of chapter 10

@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_label_smoothing_matches_torch(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=f64)
    target = torch.randint(1, 7, (3, 5), generator=g)
    target[0, 3:] = 0                                                       # padding
    got = label_smoothed_cross_entropy(logits, target, smoothing=eps)
    expected = F.cross_entropy(logits.reshape(-1, 7), target.reshape(-1), ignore_index=0,
                               label_smoothing=eps)
    torch.testing.assert_close(got, expected, **F64_TOL)
    if eps:   # control: spreading eps over the V - 1 wrong classes only is another loss
        logp = F.log_softmax(logits, -1)
        q = torch.full_like(logp, eps / 6).scatter(-1, target[..., None], 1 - eps)
        other = -(q * logp).sum(-1)[target != 0].mean()
        assert abs(other - got) > 1e-4


def test_vaswani_lr():
    d, warm = 512, 4000
    lrs = [vaswani_lr(s, d_model=d, warmup=warm) for s in range(1, 20001)]
    peak = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak == warm
    assert math.isclose(lrs[warm - 1], (d * warm) ** -0.5, rel_tol=1e-12)
    assert math.isclose(lrs[99] / lrs[49], 2.0, rel_tol=1e-12)                # linear rise
    assert math.isclose(lrs[15999] / lrs[3999], 0.5, rel_tol=1e-12)           # 1/sqrt(step) decay



def test_label_smoothing_and_lr_validation():
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), smoothing=1.5)
    with pytest.raises(ValueError, match="target"):
        label_smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long), smoothing=0.1)
    with pytest.raises(ValueError, match="step"):
        vaswani_lr(0, d_model=8)


# ------------------------------------------------------------------------------ bad input, edge cases

def test_all_pad_target_is_nan_in_both_losses_like_torch():
    logits = torch.randn(2, 3, 5, dtype=f64)
    target = torch.zeros(2, 3, dtype=torch.long)                             # every position is PAD
    torch_loss = F.cross_entropy(logits.reshape(-1, 5), target.reshape(-1), ignore_index=0)
    assert torch.isnan(torch_loss)                                           # PyTorch's convention
    assert torch.isnan(token_cross_entropy(logits, target, pad_id=0))
    for eps in (0.0, 0.1):
        assert torch.isnan(label_smoothed_cross_entropy(logits, target, smoothing=eps, pad_id=0))
    h = fit(linear(), [regression()], loss_fn=lambda m, b: token_cross_entropy(
        m(b[0])[None].expand(1, -1, 3), torch.zeros(1, 64, dtype=torch.long)),
        steps=3, lr=0.1, seed=0, progress=False)
    assert h.stopped_by == "nonfinite" and h.steps == 1                      # fit names such a batch


@pytest.mark.parametrize("pad_id", [0, 4, 5, 9])
def test_losses_agree_at_smoothing_zero_and_accept_pad_outside_the_vocabulary(pad_id):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 5, generator=g, dtype=f64)
    target = torch.randint(0, 5, (3, 4), generator=g)
    target[target == pad_id] = (pad_id + 1) % 5
    target[1, 2:] = pad_id                                                   # PAD, maybe >= V
    expected = F.cross_entropy(logits.reshape(-1, 5), target.reshape(-1), ignore_index=pad_id)
    tce = token_cross_entropy(logits, target, pad_id=pad_id)
    lsce = label_smoothed_cross_entropy(logits, target, smoothing=0.0, pad_id=pad_id)
    torch.testing.assert_close(tce, expected, **F64_TOL)
    torch.testing.assert_close(lsce, expected, **F64_TOL)
    smoothed = F.cross_entropy(logits.reshape(-1, 5), target.reshape(-1), ignore_index=pad_id,
                               label_smoothing=0.2)
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, target, smoothing=0.2, pad_id=pad_id),
                               smoothed, **F64_TOL)


@pytest.mark.parametrize("loss", [token_cross_entropy,
                                  lambda lg, t, **kw: label_smoothed_cross_entropy(lg, t, smoothing=0.1, **kw)])
def test_losses_reject_target_ids_outside_the_vocabulary(loss):
    logits = torch.zeros(1, 3, 5)
    for bad in (5, 7, -1):
        target = torch.tensor([[1, bad, 0]])
        with pytest.raises(ValueError, match=r"`target` ids other than pad_id=0 must lie in \[0, 5\)"):
            loss(logits, target)
    with pytest.raises(TypeError, match="`logits` must be a torch.Tensor"):
        loss([[0.0]], torch.tensor([[1]]))
    with pytest.raises(ValueError, match="`pad_id`"):
        loss(logits, torch.tensor([[1, 2, 3]]), pad_id=-1)


def test_fit_rejects_an_empty_iterator_like_an_empty_list():
    def exhausted():
        raise StopIteration

    for empty in ([], iter([]), (b for b in []), exhausted):
        with pytest.raises(ValueError, match="`batches` is empty"):
            fit(linear(), empty, loss_fn=mse, steps=3, lr=0.1, seed=0, progress=False)
    h = fit(linear(), iter([regression()]), loss_fn=mse, steps=3, lr=0.1, seed=0, progress=False)
    assert h.stopped_by == "data" and h.steps == 1                           # ran out later: fine


def test_fit_rejects_a_loss_that_does_not_depend_on_the_parameters():
    with pytest.raises(ValueError, match="`loss_fn` returned a loss that does not depend"):
        fit(linear(), [regression()], loss_fn=lambda m, b: torch.tensor(1.0), steps=2, lr=0.1, seed=0,
            progress=False)


def test_evaluate_rejects_negative_ids_in_a_tensor_like_in_a_list():
    good = torch.tensor([[3, 4, EOS_ID]])
    for bad in (torch.tensor([[3, -1, EOS_ID]]), [[3, -1, EOS_ID]]):
        with pytest.raises(ValueError, match=r"evaluate: `pred(\[i\]\[j\])?` must .*>= 0"):
            evaluate(bad, good)
        with pytest.raises(ValueError, match=r"evaluate: `target(\[i\]\[j\])?` must .*>= 0"):
            evaluate(good, bad)


def test_eval_mode_switches_and_restores_even_on_error():
    m = torch.nn.Sequential(torch.nn.Dropout(0.5)).train()
    with eval_mode(m) as same:
        assert same is m and not m.training and not m[0].training
    assert m.training and m[0].training
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(m):
            raise RuntimeError("boom")
    assert m.training
    m.eval()
    with eval_mode(m):
        assert not m.training
    assert not m.training                                                    # was eval: stays eval
    with pytest.raises(TypeError, match="`module`"):
        with eval_mode("model"):
            pass


# ---------------------------------------------------------------------------------------------- on_step
def test_fit_on_step_sees_every_step_its_loss_and_the_updated_model():
    """The hook the experiments use to keep checkpoints without module-level caches."""
    model, seen = linear(), []

    def hook(step, loss, m):
        assert m is model and m.training
        seen.append((step, loss, m.weight.detach().clone()))

    h = fit(model, [regression()], loss_fn=mse, steps=5, lr=0.1, seed=0, progress=False, on_step=hook)
    assert [s for s, _, _ in seen] == [1, 2, 3, 4, 5]
    assert [loss for _, loss, _ in seen] == h.losses
    torch.testing.assert_close(seen[-1][2], model.weight.detach(), rtol=0, atol=0)  # after the update
    assert not torch.equal(seen[0][2], seen[1][2])                                  # a fresh one each step


def test_fit_on_step_not_called_for_a_nonfinite_step_and_its_exception_propagates():
    calls = []
    fit(linear(), [regression()], loss_fn=lambda m, b: mse(m, b) * float("nan"), steps=3, lr=0.1,
        seed=0, progress=False, on_step=lambda *a: calls.append(a))
    assert calls == []
    model = linear().eval()

    def stop(step, loss, m):
        if step == 2:
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        fit(model, [regression()], loss_fn=mse, steps=5, lr=0.1, seed=0, progress=False, on_step=stop)
    assert not model.training                                                        # mode restored


def test_fit_on_step_must_be_callable():
    with pytest.raises(TypeError, match="fit: `on_step`"):
        fit(linear(), [regression()], loss_fn=mse, steps=1, lr=0.1, seed=0, progress=False, on_step=3)


# ------------------------------------------------------------------ issue 30
def test_label_smoothing_fp16_over_9000_tokens_is_finite_and_right():
    g = torch.Generator().manual_seed(0)
    logits = 6 * torch.randn(1, 9000, 7, generator=g)  # per-token losses ~10: the sum > 65504
    target = torch.randint(1, 7, (1, 9000), generator=g)
    want = label_smoothed_cross_entropy(logits.double(), target, smoothing=0.1)
    got = label_smoothed_cross_entropy(logits.half(), target, smoothing=0.1)
    assert got.dtype == torch.float16 and torch.isfinite(got)
    assert abs(float(got) - float(want)) < 1e-2 * float(want)
    # control: the per-token losses summed in fp16 overflow (what the loss did before)
    per_token = F.cross_entropy(logits.half().reshape(-1, 7), target.reshape(-1), reduction="none",
                                label_smoothing=0.1)
    assert torch.isinf(per_token.sum())


def test_eval_mode_switches_and_restores_every_submodule():
    drop, frozen = torch.nn.Dropout(0.5), torch.nn.Dropout(0.5)
    m = torch.nn.Sequential(drop, frozen)
    m.eval()
    drop.train()                                   # a Dropout child left training under an eval root
    with eval_mode(m):
        assert not drop.training and not m.training
        x = torch.ones(1000)
        assert torch.equal(m(x), x)                # no dropout inside
    assert drop.training and not m.training and not frozen.training
    m.train()
    frozen.eval()                                  # a frozen child of a training model
    with eval_mode(m):
        assert not any(sub.training for sub in m.modules())
    assert m.training and drop.training and not frozen.training


def test_fit_restores_every_submodule_mode():
    model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Dropout(0.0))
    model[1].eval()
    fit(model, [regression()], loss_fn=mse, steps=1, lr=0.1, seed=0, progress=False)
    assert model.training and model[0].training and not model[1].training
