"""Sampling the next token: temperature, top-k and top-p (chapters 02 and 11).

``attnbook.decoding`` re-exports both functions; they work on the logits of any model, one
distribution per row (the last dimension is the vocabulary):

- ``filter_logits(logits, top_k=..., top_p=...)`` keeps a subset of each row's tokens and sets
  the others to -inf, so that ``softmax`` of the result is the filtered distribution,
  renormalised: p'(v) = p(v) / sum_{u in S} p(u) for v in S, else 0;
- ``sample_next(logits, temperature=..., top_k=..., top_p=...)`` divides by the temperature,
  filters, and draws one token id per row; ``temperature=0`` is greedy (the argmax).

The kept set S, for one row with probabilities p = softmax(logits):
- top-k (Fan et al. 2018): the k most probable tokens. A token tied with the k-th largest
  logit is kept too, so that S does not depend on how a sort orders equal values; k larger
  than the vocabulary keeps every token.
- top-p, nucleus sampling (Holtzman et al. 2020): sort p in decreasing order and keep the
  shortest prefix whose total reaches p (the token that crosses p is kept, so S is never
  empty); tokens tied with the last kept one are kept too, for the same reason. top_p = 1
  keeps every allowed token (no rounding in a cumulative sum can drop one).
- both: top-k first, then top-p on the renormalised survivors (the order of Hugging Face's
  ``generate``); temperature is applied before either.
Probabilities are summed in float64, so a row's cut does not depend on its dtype's rounding.
"""
from __future__ import annotations

import torch

from ._checks import check_float, check_int, check_tensor, describe

__all__ = ["filter_logits", "sample_next"]


def _check_logits(logits, fn: str) -> None:
    check_tensor("logits", logits, fn=fn, min_ndim=1)
    if logits.shape[-1] == 0:
        raise ValueError(f"{fn}: `logits` must have at least one token in its last dimension, "
                         f"got {describe(logits)}")
    if torch.isnan(logits).any() or (logits == float("inf")).any():
        raise ValueError(f"{fn}: `logits` must not contain NaN or +inf (-inf marks a "
                         f"forbidden token), got {describe(logits)}")
    if (logits == float("-inf")).all(-1).any():
        raise ValueError(f"{fn}: every row of `logits` must allow at least one token; a row is "
                         f"all -inf, got {describe(logits)}")


def _check_filters(top_k, top_p, fn: str) -> tuple[int | None, float | None]:
    if top_k is not None:
        top_k = check_int("top_k", top_k, fn=fn, minimum=1)
    if top_p is not None:
        top_p = check_float("top_p", top_p, fn=fn, minimum=0.0, maximum=1.0)
        if top_p == 0.0:
            raise ValueError(f"{fn}: `top_p` must lie in (0, 1] (top_p = 0 would keep no "
                             f"token; use temperature=0 for greedy), got {top_p!r}")
    return top_k, top_p


def _keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The boolean mask of the kept tokens: logit >= the row's k-th largest logit."""
    if k >= logits.shape[-1]:
        return torch.ones_like(logits, dtype=torch.bool)
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits >= kth


def _keep_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """The boolean mask of the kept tokens: the shortest prefix by probability reaching p."""
    allowed = logits > float("-inf")
    if p == 1.0:
        return allowed
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_p, _ = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p              # the mass ranked above each token
    n_keep = (before < p).sum(-1, keepdim=True)           # >= 1: the first token has 0 above it
    smallest_kept = sorted_p.gather(-1, n_keep - 1)
    return (probs >= smallest_kept) & allowed


def filter_logits(logits: torch.Tensor, *, top_k: int | None = None,
                  top_p: float | None = None) -> torch.Tensor:
    """``logits`` with every token outside the top-k / top-p set replaced by -inf.

    Shape and dtype are kept; the input is not modified. With neither filter the result is a
    copy. See the module docstring for the kept set (ties, p = 1, the order of the filters).
    """
    _check_filter_logits(logits, top_k, top_p)
    keep = torch.ones_like(logits, dtype=torch.bool)
    out = logits.clone()
    if top_k is not None:
        keep = _keep_top_k(out, top_k)
        out = out.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        keep = _keep_top_p(out, float(top_p))
        out = out.masked_fill(~keep, float("-inf"))
    return out


def _check_filter_logits(logits, top_k, top_p) -> None:
    _check_logits(logits, "filter_logits")
    _check_filters(top_k, top_p, "filter_logits")


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row of ``logits`` (shape ``logits.shape[:-1]``, dtype int64).

    Draws from softmax(filter_logits(logits / temperature, top_k=..., top_p=...)).
    ``temperature=0`` returns the argmax (the first one if several tie), which is also the
    limit of sampling as temperature -> 0 when the maximum is unique. ``generator`` makes
    the draw repeatable.
    """
    t = _check_sample_next(logits, temperature, top_k, top_p, generator)
    if t == 0.0:
        return logits.argmax(-1)
    z = logits.double()
    z = (z - z.max(-1, keepdim=True).values) / t        # <= 0: no overflow however small t is
    filtered = filter_logits(z, top_k=top_k, top_p=top_p)
    probs = torch.softmax(filtered, dim=-1).reshape(-1, logits.shape[-1])
    ids = torch.multinomial(probs, 1, generator=generator)
    return ids.reshape(logits.shape[:-1])


def _check_sample_next(logits, temperature, top_k, top_p, generator) -> float:
    fn = "sample_next"
    _check_logits(logits, fn)
    _check_filters(top_k, top_p, fn)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{fn}: `generator` must be a torch.Generator or None, "
                        f"got {type(generator).__name__}")
    return check_float("temperature", temperature, fn=fn, minimum=0.0)
