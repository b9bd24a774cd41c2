"""A small training loop with a seed, a step or time budget and a quiet-when-built progress bar.

``fit`` runs ``loss_fn(model, batch)`` -> backward -> (clip) -> optimizer step until ``steps``
steps or ``seconds`` seconds, whichever comes first, and returns a ``History``. ``evaluate``
scores predicted token sequences against targets (exact match and token accuracy);
``eval_mode`` is the one way the library switches a model to evaluation for a while.

The losses and the schedule: ``token_cross_entropy`` is the teacher-forced loss with PAD ignored
(chapter 02); ``label_smoothed_cross_entropy`` and ``vaswani_lr`` are the training recipe of
Vaswani et al. 2017 (section 5, chapter 10). Both losses are means over the non-PAD target
tokens and follow ``F.cross_entropy(ignore_index=pad_id)`` everywhere, including a batch with
no real token at all: the mean over zero tokens is 0/0 = NaN (``fit`` then stops with
``stopped_by="nonfinite"``, which names such a batch instead of training on it silently). Any
``pad_id >= 0`` is legal, also one outside the vocabulary; every other target id must lie in
``[0, V)``.

Progress output (``progress=True``), decided by ``progress_mode()``:

- ``"bar"``: a ``tqdm.auto`` bar (a widget in Jupyter/Colab, text in a terminal) when the run is
  interactive: an IPython kernel or a terminal (``sys.stdout.isatty()``);
- ``"line"``: one summary line at the end (steps, seconds, steps/s, first and last loss) when the
  book is built (``ATTNBOOK_STATIC`` set to anything but ``""``/``"0"``), under pytest/nbval
  (``PYTEST_CURRENT_TEST`` is set, and nbval's kernel inherits it), or when stdout is neither a
  terminal nor a kernel (a log file, a pipe).

``progress=False`` prints nothing at all. So the HTML book shows one line per training run;
there (``ATTNBOOK_STATIC`` set) the line leaves out the timings, which describe the machine that
built the book, not the reader's (CHAPTER.md: no build noise in the reader's view).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ._checks import check_bool, check_choice, check_float, check_int, check_tensor, describe
from .data import BOS_ID, EOS_ID, PAD_ID

__all__ = ["Accuracy", "History", "eval_mode", "evaluate", "fit", "label_smoothed_cross_entropy",
           "progress_mode", "token_cross_entropy", "vaswani_lr"]

OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass
class History:
    """What ``fit`` measured: one loss per step, wall time, and why it stopped."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    stopped_by: str = ""  # "steps", "seconds", "data" (batches ran out) or "nonfinite" (loss nan/inf)
    grad_norms: list[float] = field(default_factory=list)  # pre-clip global norms, when clip is set

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")

    def initial_loss(self, window: int = 10) -> float:
        """Mean loss over the first ``window`` steps."""
        w = self.losses[: check_int("window", window, fn="History.initial_loss")]
        return sum(w) / len(w) if w else float("nan")

    def final_loss(self, window: int = 10) -> float:
        """Mean loss over the last ``window`` steps."""
        w = self.losses[-check_int("window", window, fn="History.final_loss"):]
        return sum(w) / len(w) if w else float("nan")

    def summary(self, *, timings: bool = True) -> str:
        """One line: steps, (seconds and steps/s,) first and last loss."""
        timing = f" in {self.seconds:.1f} s ({self.steps_per_second:.1f} steps/s)" if timings else ""
        return f"{self.steps} steps{timing}, loss {self.initial_loss():.4g} -> {self.final_loss():.4g}"


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def progress_mode(progress: bool = True) -> str:
    """``"bar"``, ``"line"`` or ``"off"``: how ``fit`` reports progress here (rule in the module docstring)."""
    if not check_bool("progress", progress, fn="progress_mode"):
        return "off"
    if os.environ.get("ATTNBOOK_STATIC", "") not in ("", "0") or "PYTEST_CURRENT_TEST" in os.environ:
        return "line"
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "bar" if tty or _in_kernel() else "line"


def _batch_source(batches, fn: str) -> Callable[[], object]:
    """A no-argument function returning the next batch, or raising StopIteration at the end.

    A callable is called once per step; an iterator (a generator, ``Task.batches(...)``) is
    consumed once; any other iterable (a list of batches) is cycled, one pass per epoch.
    """
    if callable(batches) and not isinstance(batches, torch.nn.Module):
        return batches
    if not isinstance(batches, Iterable) or isinstance(batches, (str, torch.Tensor)):
        raise TypeError(f"{fn}: `batches` must be an iterable of batches or a callable returning one, "
                        f"got {type(batches).__name__}")
    if iter(batches) is batches:  # a one-shot iterator
        return lambda: next(batches)
    state = {"it": iter(batches), "fresh": True}

    def nxt():
        try:
            b = next(state["it"])
        except StopIteration:
            if state["fresh"]:
                raise ValueError(f"{fn}: `batches` is empty") from None
            state["it"], state["fresh"] = iter(batches), True
            b = next(state["it"])
        state["fresh"] = False
        return b

    return nxt


def fit(model: torch.nn.Module, batches, *, loss_fn: Callable, steps: int | None = None,
        seconds: float | None = None, lr: float, seed: int, progress: bool = True,
        optimizer: str = "adam", clip: float | None = None, warmup: int = 0,
        log_every: int = 10, on_step: Callable | None = None) -> History:
    """Train ``model`` on ``batches`` and return the loss of every step (chapters 01-03, 05-08, 10).

    Each step: ``loss = loss_fn(model, batch)``; ``loss.backward()``; clip the global gradient
    norm to ``clip`` (``torch.nn.utils.clip_grad_norm_``) if given; optimizer step. The learning
    rate ramps linearly from ``lr / warmup`` to ``lr`` over the first ``warmup`` steps.

    Args:
        model: the module to train (put in train mode during ``fit``; every submodule's own
            mode is restored after, so a frozen eval child stays in eval).
        batches: a callable returning a batch (called once per step), an iterator (consumed until
            it ends), or a re-iterable such as a list (cycled); an empty one is a ValueError.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` that depends on the parameters.
        steps, seconds: stop after this many steps / this much wall time; at least one is
            required, and the first reached wins (at least one step always runs). Only
            ``steps`` is reproducible: under ``seconds`` the step count depends on the machine.
        lr: learning rate; seed: passed to ``torch.manual_seed`` first (dropout, and batches
            drawn from torch's global generator); initialise the model before calling.
        progress: see the module docstring; optimizer: "adam", "adamw" or "sgd" (no momentum);
        clip: max global gradient norm or None; warmup: linear warm-up steps;
        log_every: steps between updates of the bar's loss (mean over those steps).
        on_step: None, or a hook ``on_step(step, loss, model)`` called after every completed
            optimizer step: ``step`` the number of steps done so far (1, 2, ...), ``loss`` that
            step's loss as a float (the value ``History.losses[step - 1]``), ``model`` the model
            being trained (in train mode, parameters already updated). Use it to keep
            checkpoints (``copy.deepcopy(model.state_dict())``) or evaluate on the way
            (``with eval_mode(model): ...`` restores the train mode). Its return value is
            ignored; an exception it raises stops ``fit`` and propagates (the model's modes are
            restored). It is not called for a step whose loss is not finite (no update ran).
    Returns: ``History`` (losses, steps, seconds, steps_per_second, stopped_by, grad_norms).
    A non-finite loss stops training (``stopped_by="nonfinite"``, the bad loss is the last entry).
    """
    fn = "fit"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{fn}: `model` must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"{fn}: `loss_fn` must be callable as loss_fn(model, batch), got {type(loss_fn).__name__}")
    if steps is None and seconds is None:
        raise ValueError(f"{fn}: give `steps` or `seconds` (or both), got neither")
    steps = None if steps is None else check_int("steps", steps, fn=fn, minimum=1)
    seconds = None if seconds is None else check_float("seconds", seconds, fn=fn, minimum=0, inclusive=False)
    lr = check_float("lr", lr, fn=fn, minimum=0, inclusive=False)
    seed = check_int("seed", seed, fn=fn, minimum=0)
    mode = progress_mode(progress)
    check_choice("optimizer", optimizer, OPTIMIZERS, fn=fn)
    clip = None if clip is None else check_float("clip", clip, fn=fn, minimum=0, inclusive=False)
    warmup = check_int("warmup", warmup, fn=fn, minimum=0)
    log_every = check_int("log_every", log_every, fn=fn, minimum=1)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"{fn}: `on_step` must be None or callable as on_step(step, loss, model), "
                        f"got {type(on_step).__name__}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{fn}: `model` has no parameters that require grad")
    next_batch = _batch_source(batches, fn)

    torch.manual_seed(seed)
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer](params, lr=lr)
    hist = History()
    bar = None
    if mode == "bar":
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc="fit", unit="step", mininterval=0.25, leave=True)
    modes = _modes(model)  # every submodule's own mode, restored after
    model.train()
    t0 = time.perf_counter()
    try:
        while True:
            if steps is not None and hist.steps >= steps:
                hist.stopped_by = "steps"
                break
            if seconds is not None and hist.steps > 0 and time.perf_counter() - t0 >= seconds:
                hist.stopped_by = "seconds"
                break
            try:
                batch = next_batch()
            except StopIteration:
                if not hist.steps:       # the docstring's promise: at least one step runs
                    raise ValueError(f"{fn}: `batches` is empty (it yielded no batch)") from None
                hist.stopped_by = "data"
                break
            if warmup:
                for group in opt.param_groups:
                    group["lr"] = lr * min(1.0, (hist.steps + 1) / warmup)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.dtype.is_floating_point:
                raise TypeError(f"{fn}: `loss_fn` must return a scalar floating tensor, got {loss!r:.80}")
            if not loss.requires_grad:
                raise ValueError(f"{fn}: `loss_fn` returned a loss that does not depend on the model's "
                                 f"parameters (requires_grad=False): {loss!r:.80}")
            value = loss.item()
            hist.losses.append(value)
            if not math.isfinite(value):
                hist.stopped_by = "nonfinite"
                break
            loss.backward()
            if clip is not None:
                hist.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
            opt.step()
            if on_step is not None:
                on_step(hist.steps, value, model)
            if bar is not None:
                bar.update(1)
                if hist.steps % log_every == 0:
                    bar.set_postfix(loss=f"{sum(hist.losses[-log_every:]) / log_every:.4g}", refresh=False)
    finally:
        hist.seconds = time.perf_counter() - t0
        _restore_modes(modes)
        if bar is not None:
            bar.close()
    if mode == "line":
        built = os.environ.get("ATTNBOOK_STATIC", "") not in ("", "0")
        print(f"fit: {hist.summary(timings=not built)}" + ("" if hist.stopped_by != "nonfinite" else " (stopped: loss not finite)"))
    return hist


def token_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *,
                        pad_id: int = PAD_ID) -> torch.Tensor:
    """Teacher-forced loss: mean cross-entropy over non-PAD target tokens (chapter 02).

    Equals the summed negative log-likelihood of the real tokens divided by their count
    (NaN when there is none, as ``F.cross_entropy(ignore_index=pad_id)``; module
    docstring). Args: logits ``(B, T, V)``; target ``(B, T)`` long ids. Returns a scalar
    tensor.
    """
    _check_loss("token_cross_entropy", logits, target, pad_id, min_ndim=3)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id)


def label_smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *,
                                 smoothing: float, pad_id: int = 0) -> torch.Tensor:
    """Cross-entropy against a smoothed target (1 - eps) onehot(y) + eps/V (chapter 10).

    loss = mean over non-PAD positions of
           (1 - eps) (-log p_y) + (eps / V) sum_c (-log p_c),
    the definition of Szegedy et al. 2016 and of
    ``F.cross_entropy(label_smoothing=eps)``: every one of the V classes, the true one
    and PAD included, gets eps / V. ``eps = 0`` is :func:`token_cross_entropy` (NaN for
    a target with no real token, as both).

    Args: logits ``(..., V)``; target ``logits.shape[:-1]`` long; smoothing eps in
    [0, 1]; pad_id. Returns a scalar tensor in the logits' dtype (the sum over tokens is
    accumulated in float32 for float16/bfloat16 logits, as ``F.cross_entropy`` does).
    """
    eps = _check_smoothed(logits, target, smoothing, pad_id)
    logp = F.log_softmax(logits, dim=-1)                           # (..., V)
    real = target != pad_id
    y = target.masked_fill(~real, 0)  # any id < V where PAD sits
    nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)            # -log p_y
    uniform = -logp.mean(-1)  # (1/V) sum_c -log p_c
    # eps = 0: no -inf logit counts
    loss = (1 - eps) * nll + (eps * uniform if eps else 0.0)
    # summed in float32 at least (an fp16 sum over ~9,000 tokens overflows), cast back
    total = loss[real].sum(dtype=_acc(loss.dtype))
    return (total / real.sum()).to(loss.dtype)  # 0/0 = NaN without real tokens


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of a sum: float32 for float16/bfloat16, else the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def vaswani_lr(step: int, *, d_model: int, warmup: int = 4000) -> float:
    """The learning rate of Vaswani et al. 2017, section 5.3 (chapter 10, eq-ch10-lr).

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): a linear rise for ``warmup``
    steps, then decay as 1/sqrt(step); the peak, at step = warmup, is (d_model * warmup)^-0.5.
    Steps count from 1.
    """
    fn = "vaswani_lr"
    step = check_int("step", step, fn=fn)
    d_model = check_int("d_model", d_model, fn=fn)
    warmup = check_int("warmup", warmup, fn=fn)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``with eval_mode(model):`` evaluation mode inside (no dropout), the previous modes after.

    Records the ``training`` flag of every submodule (the root included), puts them all in
    evaluation mode, and restores each one's own flag on exit, even when the body raises: a
    Dropout child left training under an eval root is switched off inside, and a frozen (eval)
    child of a training model stays in eval after.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"eval_mode: `module` must be a torch.nn.Module, got {type(module).__name__}")
    saved = _modes(module)
    module.eval()
    try:
        yield module
    finally:
        _restore_modes(saved)


def _modes(module: torch.nn.Module) -> list[tuple[torch.nn.Module, bool]]:
    """Every submodule (the root included) with its ``training`` flag."""
    return [(m, m.training) for m in module.modules()]


def _restore_modes(saved) -> None:
    for m, training in saved:
        m.training = training


@dataclass
class Accuracy:
    """Exact-match and token accuracy of predicted sequences (see ``evaluate``)."""

    exact_match: float      # fraction of sequences predicted exactly (same tokens, same length)
    token_accuracy: float   # fraction of target tokens predicted at their position
    n_sequences: int
    n_tokens: int
    correct: list[bool] = field(default_factory=list)  # exact match of each sequence

    def __str__(self) -> str:
        return (f"exact match {self.exact_match:.3f}, token accuracy {self.token_accuracy:.3f} "
                f"({self.n_sequences} sequences, {self.n_tokens} tokens)")


def _rows(x, name: str, fn: str) -> list[list[int]]:
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point:
            if x.ndim != 3:
                raise ValueError(f"{fn}: floating `{name}` must be logits (B, T, V), got shape {tuple(x.shape)}")
            x = x.argmax(-1)
        if x.ndim != 2 or x.dtype == torch.bool or x.is_complex():
            raise ValueError(f"{fn}: `{name}` must be ids (B, T) or logits (B, T, V), got {x.dtype} {tuple(x.shape)}")
        if x.numel() and int(x.min()) < 0:
            raise ValueError(f"{fn}: `{name}` must hold ids >= 0, got min {int(x.min())}")
        return x.tolist()
    if not isinstance(x, Sequence) or isinstance(x, str):
        raise TypeError(f"{fn}: `{name}` must be a tensor or a list of id lists, got {type(x).__name__}")
    rows = []
    for r in x:
        r = r.tolist() if isinstance(r, torch.Tensor) else r
        if not isinstance(r, Sequence) or isinstance(r, str):
            raise TypeError(f"{fn}: `{name}` must hold sequences of ids, got {r!r:.60}")
        rows.append([check_int(f"{name}[i][j]", i, fn=fn, minimum=0) for i in r])
    return rows


def _trim(row: list[int], pad_id, bos_id, eos_id) -> list[int]:
    """Drop one leading BOS; cut at the first EOS or PAD (both end a sequence)."""
    if bos_id is not None and row and row[0] == bos_id:
        row = row[1:]
    for i, tok in enumerate(row):
        if tok == eos_id or tok == pad_id:
            return row[:i]
    return row


def evaluate(pred, target, *, pad_id: int | None = PAD_ID, bos_id: int | None = BOS_ID,
             eos_id: int | None = EOS_ID) -> Accuracy:
    """Exact-match and token accuracy of predicted vs target sequences (chapters 02, 03, 10).

    Each sequence is first trimmed: a leading ``bos_id`` is dropped, and it ends at its first
    ``eos_id`` or ``pad_id`` (pass None to disable any of them, e.g. for raw class ids).
    Exact match: trimmed prediction == trimmed target. Token accuracy: the fraction of target
    tokens (over all sequences) equal to the prediction at the same position; a prediction that
    is too long or too short is penalised by exact match only.

    Args: pred: ids ``(B, T)``, logits ``(B, T, V)`` (argmax taken), or a list of id lists;
    target: ids ``(B, T)`` (e.g. ``Batch.tgt_out``) or a list of id lists, same B.
    Returns: ``Accuracy(exact_match, token_accuracy, n_sequences, n_tokens, correct)``.
    """
    fn = "evaluate"
    for name, v in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
        if v is not None:
            check_int(name, v, fn=fn, minimum=0)
    p_rows, t_rows = _rows(pred, "pred", fn), _rows(target, "target", fn)
    if len(p_rows) != len(t_rows):
        raise ValueError(f"{fn}: `pred` and `target` must hold as many sequences, got {len(p_rows)} and {len(t_rows)}")
    if not t_rows:
        raise ValueError(f"{fn}: `target` holds no sequences")
    correct, hits, n_tokens = [], 0, 0
    for p, t in zip(p_rows, t_rows):
        p, t = _trim(p, pad_id, bos_id, eos_id), _trim(t, pad_id, bos_id, eos_id)
        correct.append(p == t)
        hits += sum(a == b for a, b in zip(p, t))
        n_tokens += len(t)
    return Accuracy(exact_match=sum(correct) / len(correct),
                    token_accuracy=hits / n_tokens if n_tokens else float("nan"),
                    n_sequences=len(correct), n_tokens=n_tokens, correct=correct)


# ---------------------------------------------------------------------------------------------
# Argument checks (kept out of the functions the book shows)
# ---------------------------------------------------------------------------------------------

def _check_loss(fn, logits, target, pad_id, *, min_ndim=2) -> None:
    """logits ``(..., V)`` floating; target ``logits.shape[:-1]`` long with ids in [0, V) except
    ``pad_id`` (any int >= 0)."""
    check_tensor("logits", logits, fn=fn, min_ndim=min_ndim)
    check_tensor("target", target, fn=fn, min_ndim=min_ndim - 1, floating=False)
    if target.dtype != torch.long:
        raise TypeError(f"{fn}: `target` must hold token ids (torch.long), got {describe(target)}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"{fn}: `logits` and `target` disagree: `target` must have the shape of "
                         f"`logits` without its last dim {tuple(logits.shape[:-1])}, got {tuple(target.shape)}")
    pad_id = check_int("pad_id", pad_id, fn=fn, minimum=0)
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError(f"{fn}: `logits` must have a vocabulary dim V = logits.shape[-1] >= 1, "
                         f"got {describe(logits)}")
    real = target[target != pad_id]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab):
        raise ValueError(f"{fn}: `target` ids other than pad_id={pad_id} must lie in [0, {vocab}) "
                         f"(V = logits.shape[-1]), got min {int(real.min())}, max {int(real.max())}")


def _check_smoothed(logits, target, smoothing, pad_id) -> float:
    """The arguments of ``label_smoothed_cross_entropy``; returns ``smoothing`` (in [0, 1])."""
    fn = "label_smoothed_cross_entropy"
    _check_loss(fn, logits, target, pad_id)
    return check_float("smoothing", smoothing, fn=fn, minimum=0.0, maximum=1.0)
