"""Chapter 10's ablation exercise reuses its own run's first steps as the recipe arm.

``experiments.ch10.keeping_weights`` copies the weights ``fit`` has after ``s`` steps of a
longer run; they must equal, bit for bit, a run of ``train_transformer`` that stops at ``s``
(same seed, batches and warm-up; ``fit``'s schedule does not depend on the total steps).
"""
import pytest
import torch

from attnbook.data import date_task
from attnbook.experiments import ch10
from attnbook.train import fit, label_smoothed_cross_entropy
from attnbook.transformer import Transformer


def _chapter_loss(model, batch):                      # chapter 10's transformer_loss
    logits = model(batch.src, batch.tgt_in, src_pad=batch.src_mask, tgt_pad=batch.tgt_mask)
    return label_smoothed_cross_entropy(logits, batch.tgt_out, smoothing=0.1)


def _chapter_run(task, steps, at, warmup=50):
    torch.manual_seed(0)
    model = Transformer(len(task.src_vocab), len(task.tgt_vocab), **ch10.CONFIG, backend="ref")
    kept = {}
    hist = fit(model, task.batches(ch10.BATCH, seed=1), steps=steps, lr=3e-3, warmup=warmup,
               seed=0, progress=False,
               loss_fn=ch10.keeping_weights(_chapter_loss, at, kept))
    return model, kept, hist


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_kept_weights_are_a_shorter_run_bit_for_bit():
    task = date_task()
    model, kept, _ = _chapter_run(task, steps=8, at=(2, 4))
    assert sorted(kept) == [2, 4]
    for s in (2, 4):
        assert _equal(kept[s], ch10.train_transformer(task, 0, steps=s).state_dict())
    assert not _equal(kept[2], kept[4])                               # control: they moved
    assert not _equal(kept[4], model.state_dict())                    # the run went on
    # control: a shorter run with another warm-up is not the same prefix
    assert not _equal(kept[4], ch10.train_transformer(task, 0, steps=4, warmup=8).state_dict())


def test_keeping_weights_changes_nothing_in_the_training():
    task = date_task()
    plain_model, _, plain = _chapter_run(task, steps=3, at=(10,))    # never reached: no copy
    model, kept, hist = _chapter_run(task, steps=3, at=(1,))
    assert list(kept) == [1] and hist.losses == plain.losses
    assert _equal(model.state_dict(), plain_model.state_dict())


@pytest.mark.parametrize("args, err, words", [
    (("not callable", (1,), {}), TypeError, "`loss_fn`"),
    ((_chapter_loss, (), {}), ValueError, "`at`"),
    ((_chapter_loss, (0,), {}), ValueError, "`at`"),
    ((_chapter_loss, (1.5,), {}), ValueError, "`at`"),
    ((_chapter_loss, (1,), []), TypeError, "`store`"),
])
def test_keeping_weights_rejects_bad_arguments(args, err, words):
    with pytest.raises(err, match=f"keeping_weights: {words}"):
        ch10.keeping_weights(*args)
