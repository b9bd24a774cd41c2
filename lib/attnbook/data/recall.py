"""Tensor tasks for the RNN gradient experiments of chapter 01: first-token recall, adding."""
from __future__ import annotations

import torch

from .._checks import check_int
from .task import _generator

__all__ = ["ADDING_BASELINE_MSE", "adding_problem", "first_token_recall"]

ADDING_BASELINE_MSE = 1 / 6  # MSE of always predicting 1 (Var of a sum of two U(0, 1))


def first_token_recall(n: int, length: int, *, vocab_size: int = 8, seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of random tokens whose label is the first token (a lag of ``length - 1`` steps).

    Returns: ``x`` LongTensor ``(n, length)`` with ids in ``[0, vocab_size)`` and ``y = x[:, 0]``
    ``(n,)``. Chance accuracy is ``1 / vocab_size``.
    """
    fn = "first_token_recall"
    n = check_int("n", n, fn=fn)
    length = check_int("length", length, fn=fn)
    vocab_size = check_int("vocab_size", vocab_size, fn=fn, minimum=2)
    x = torch.randint(vocab_size, (n, length), generator=_generator(seed, fn))
    return x, x[:, 0].clone()


def adding_problem(n: int, length: int, *, seed=0, dtype: torch.dtype = torch.float32
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The adding problem (Hochreiter & Schmidhuber 1997), in the form of Le et al. 2015.

    Each step holds a pair (value ~ U(0, 1), marker in {0, 1}); exactly two markers are 1, one at
    a uniform position in the first half and one in the second half. The target is the sum of the
    two marked values; always predicting 1 gives MSE ``ADDING_BASELINE_MSE = 1/6``.

    Returns: ``x (n, length, 2)`` (value, marker) and ``y (n,)``.
    """
    fn = "adding_problem"
    n = check_int("n", n, fn=fn)
    length = check_int("length", length, fn=fn, minimum=2)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: `dtype` must be a floating torch.dtype, got {dtype!r}")
    g = _generator(seed, fn)
    values = torch.rand(n, length, generator=g, dtype=torch.float64)
    half = length // 2
    first = torch.randint(half, (n,), generator=g)
    second = half + torch.randint(length - half, (n,), generator=g)
    markers = torch.zeros(n, length, dtype=torch.float64)
    rows = torch.arange(n)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    y = values[rows, first] + values[rows, second]
    return torch.stack([values, markers], dim=-1).to(dtype), y.to(dtype)
