"""Decoding a conditional language model: greedy, beam search, exact MAP (chapter 02).

Sampling (temperature, top-k, top-p: ``filter_logits``, ``sample_next``) lives in
``attnbook.sampling`` and is re-exported here.

One protocol for every model in the book (chapter 02's toy LMs and GRU encoder-decoder,
chapter 10's Transformer). A model conditioned on ONE source sentence is a function

    step(prefixes: LongTensor (N, t)) -> (N, V) log-probabilities of the next token

Row n of ``prefixes`` is one hypothesis: BOS followed by the t - 1 tokens generated so far;
all rows of one call have the same length t. ``step`` closes over its source, so every
search below decodes one source; to decode a batch, call it once per source (batched beams
would add per-source bookkeeping that teaches nothing at this book's sizes).
``greedy_decode_batch`` is the one exception, for evaluating many sources at once: there
row n of ``prefixes`` is source n (e.g. ``Seq2Seq.batch_step_fn``).

What is searched (the same for all functions, so that their results are comparable):
- a complete output is y = (y_1, ..., y_T) with y_T = EOS and 1 <= T <= max_len; |y| = T
  counts the EOS; the returned ``tokens`` hold y without BOS, EOS included;
- at step max_len the only allowed token is EOS (its log-probability under the model is
  still counted, as in fairseq), so every search returns complete outputs;
- log P(y|x) = sum_t log P(y_t | y_<t, x) (the chain rule, chapter 02, eq-ch02-chain-eos);
- the search score is log P(y|x) / lp(|y|), lp(|y|) = ((5 + |y|) / 6) ** alpha (GNMT,
  Wu et al. 2016; chapter 02, eq-ch02-lp); alpha = 0 ranks by log P(y|x) itself.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._checks import check_float, check_int, check_tensor, describe
from .sampling import filter_logits, sample_next

__all__ = [
    "BeamStep",
    "Hypothesis",
    "beam_search",
    "enumerate_sequences",
    "exact_map",
    "filter_logits",
    "greedy_decode",
    "greedy_decode_batch",
    "length_penalty",
    "random_tree_lm",
    "sample_next",
    "score_sequence",
]

Step = Callable[[torch.Tensor], torch.Tensor]
MAX_ENUMERATED = 200_000  # exact_map refuses search spaces larger than this


class Hypothesis(NamedTuple):
    """One complete output: ``tokens`` (no BOS, ends with EOS), log P(y|x), search score."""

    tokens: tuple[int, ...]
    logprob: float
    score: float


class BeamStep(NamedTuple):
    """What beam search did at step ``t``: every expansion and whether it stayed in the beam."""

    t: int
    candidates: list[tuple[tuple[int, ...], float]]  # (tokens without BOS, log P)
    kept: list[bool]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(|y|) = ((5 + |y|) / 6) ** alpha (chapter 02, eq-ch02-lp).

    Wu et al. 2016, section 7; |y| counts the EOS, so the shortest output (EOS alone) has lp = 1.
    Args: length |y|, an int >= 0; alpha, a finite number >= 0 (as in ``beam_search``).
    """
    length, alpha = _check_length_penalty(length, alpha)
    return ((5 + length) / 6) ** alpha


def _check_length_penalty(length, alpha) -> tuple[int, float]:
    fn = "length_penalty"
    return check_int("length", length, fn=fn, minimum=0), check_float("alpha", alpha, fn=fn, minimum=0.0)


def _check_step(step, fn: str) -> None:
    if not callable(step):
        raise TypeError(f"{fn}: `step` must be callable (prefixes (N, t) -> (N, V) log-probs), "
                        f"got {type(step).__name__}")


def _next_logprobs(step: Step, prefixes: torch.Tensor, *, eos: int, fn: str,
                   vocab_size: int | None = None) -> torch.Tensor:
    """Call ``step`` and check that it returned (N, V) log-probabilities; return them in float64."""
    out = step(prefixes)
    n = prefixes.shape[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{fn}: `step` must return a torch.Tensor, got {type(out).__name__}")
    if out.ndim != 2 or out.shape[0] != n or not out.dtype.is_floating_point:
        raise ValueError(f"{fn}: `step` must return (N, V) floating log-probabilities for "
                         f"N = {n} prefixes, got {describe(out)}")
    if vocab_size is not None and out.shape[1] != vocab_size:
        raise ValueError(f"{fn}: `step` returned V = {out.shape[1]} columns but "
                         f"`vocab_size` is {vocab_size}")
    if not eos < out.shape[1]:
        raise ValueError(f"{fn}: `eos` must be < V = {out.shape[1]} (the step's vocabulary), got {eos}")
    tol = max(1e-4, 32 * torch.finfo(out.dtype).eps)       # float32: 1e-4, bfloat16: 0.25
    out = out.detach().double()
    if torch.isnan(out).any() or (out == math.inf).any():
        raise ValueError(f"{fn}: `step` returned NaN or +inf log-probabilities")
    lse = torch.logsumexp(out, -1)
    if (lse.abs() > tol).any():
        worst = lse[lse.abs().argmax()].item()
        raise ValueError(f"{fn}: `step` must return log-probabilities (each row's logsumexp 0), "
                         f"got a row with logsumexp {worst:.4g}; apply log_softmax to the logits")
    return out


def _token_list(tokens, fn: str) -> list[int]:
    """``tokens`` (a sequence of ints or a 1-D integer tensor) as a list of ints >= 0."""
    if isinstance(tokens, torch.Tensor):
        if tokens.ndim != 1 or tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"{fn}: `tokens` must be a 1-D integer tensor or a sequence of ints, got {describe(tokens)}")
        tokens = tokens.tolist()
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (list, tuple, range)):
        raise TypeError(f"{fn}: `tokens` must be a sequence of token ids (ints), got {type(tokens).__name__}")
    return [check_int(f"tokens[{i}]", tok, fn=fn, minimum=0) for i, tok in enumerate(tokens)]


def _start(bos: int, n: int = 1) -> torch.Tensor:
    return torch.full((n, 1), bos, dtype=torch.long)


def score_sequence(step: Step, tokens, *, bos: int) -> float:
    """log P(y|x) = sum_t log P(y_t | BOS y_<t) by teacher forcing (chapter 02, eq-ch02-chain-eos).

    Feeds the gold prefixes BOS, BOS y_1, ... one call per token.
    Args: step (the protocol above); tokens: ids (a sequence of ints or a 1-D integer tensor); bos.
    """
    fn = "score_sequence"
    _check_step(step, fn)
    check_int("bos", bos, fn=fn, minimum=0)
    tokens = _token_list(tokens, fn)
    prefix = [bos]
    total = 0.0
    for tok in tokens:
        logp = _next_logprobs(step, torch.tensor([prefix]), eos=0, fn=fn)
        if tok >= logp.shape[1]:
            raise ValueError(f"{fn}: token {tok} is outside the step's vocabulary V = {logp.shape[1]}")
        total += logp[0, tok].item()
        prefix.append(tok)
    return total


def _check_common(step, bos, eos, max_len, fn):
    _check_step(step, fn)
    check_int("bos", bos, fn=fn, minimum=0)
    check_int("eos", eos, fn=fn, minimum=0)
    check_int("max_len", max_len, fn=fn, minimum=1)


def greedy_decode(step: Step, *, bos: int, eos: int, max_len: int) -> Hypothesis:
    """Greedy decoding: y_t = argmax_v P(v | y_<t, x) until EOS.

    EOS is forced at step max_len.
    """
    _check_common(step, bos, eos, max_len, "greedy_decode")
    prefix, logprob = _start(bos), 0.0
    for t in range(1, max_len + 1):
        logp = _next_logprobs(step, prefix, eos=eos, fn="greedy_decode")[0]   # (V,)
        tok = int(logp.argmax()) if t < max_len else eos  # ties: lowest id
        logprob += logp[tok].item()
        prefix = torch.cat([prefix, torch.tensor([[tok]])], 1)
        if tok == eos:
            break
    return Hypothesis(tuple(prefix[0, 1:].tolist()), logprob, logprob)


def greedy_decode_batch(step: Step, *, batch_size: int, bos: int, eos: int,
                        max_len: int) -> list[Hypothesis]:
    """Greedy decoding of ``batch_size`` sources at once: here row n of ``prefixes`` is source n.

    Equal, source by source, to ``greedy_decode`` with that source's step. A row that has
    emitted EOS keeps being fed EOS (its outputs are ignored) until every row has finished.
    """
    fn = "greedy_decode_batch"
    _check_common(step, bos, eos, max_len, fn)
    b = check_int("batch_size", batch_size, fn=fn)
    prefixes = _start(bos, b)
    logprob = torch.zeros(b, dtype=torch.float64)
    done = torch.zeros(b, dtype=torch.bool)
    lengths = torch.full((b,), max_len)
    for t in range(1, max_len + 1):
        logp = _next_logprobs(step, prefixes, eos=eos, fn=fn)                  # (B, V)
        tok = logp.argmax(-1) if t < max_len else torch.full((b,), eos)
        tok = torch.where(done, eos, tok)
        logprob += torch.where(done, 0.0, logp.gather(1, tok[:, None])[:, 0])
        prefixes = torch.cat([prefixes, tok[:, None]], 1)                      # (B, t + 1)
        lengths = torch.where(~done & (tok == eos), t, lengths)
        done |= tok == eos
        if done.all():
            break
    return [Hypothesis(tuple(prefixes[i, 1:1 + lengths[i]].tolist()), lp, lp)
            for i, lp in enumerate(logprob.tolist())]


def beam_search(step: Step, *, bos: int, eos: int, beam_size: int, max_len: int,
                alpha: float = 0.0, trace: list | None = None) -> list[Hypothesis]:
    """Beam search (chapter 02): keep the ``beam_size`` best prefixes at every step.

    At step t every live prefix is expanded by every token (by EOS only at t = max_len);
    the ``beam_size`` candidates with the highest log P stay (all have length t, so this
    is also their rank by score). A kept candidate that ends in EOS is finished: it
    leaves the beam and is never extended again, and the next step refills the beam to
    ``beam_size``. The search stops when no prefix is live, or when no live prefix can
    still beat the best finished one (log P only falls as a prefix grows, so log P /
    lp(max_len) bounds the score of any completion). ``beam_size = 1`` is greedy
    decoding; a beam as large as the number of candidates prunes nothing and returns the
    exact MAP (``exact_map``).

    Args:
        step: prefixes (N, t) -> (N, V) log-probabilities (see the module docstring).
        bos, eos: token ids; ``bos`` need not be in the output vocabulary.
        beam_size: prefixes kept per step (>= 1). max_len: longest output, EOS included.
        alpha: length-penalty exponent (>= 0); the finished outputs are ranked by
            log P / ((5 + |y|) / 6) ** alpha.
        trace: a list to which one ``BeamStep`` per step is appended (for drawing the
            tree).
    Returns:
        Up to ``beam_size`` finished ``Hypothesis`` objects, best score first.
    """
    k, alpha = _check_beam_search(step, bos, eos, beam_size, max_len, alpha, trace)
    prefixes = _start(bos)  # (N, t): the live hypotheses
    live_lp = torch.zeros(1, dtype=torch.float64)           # (N,): their log P
    finished: list[Hypothesis] = []
    for t in range(1, max_len + 1):
        logp = _next_logprobs(step, prefixes, eos=eos, fn="beam_search")      # (N, V)
        tokens = torch.arange(logp.shape[1]) if t < max_len else torch.tensor([eos])
        cand = live_lp[:, None] + logp[:, tokens]  # (N, V'): log P of every expansion
        order = torch.sort(cand.flatten(), descending=True, stable=True).indices
        keep = order[:k]
        rows, toks = keep // len(tokens), tokens[keep % len(tokens)]
        if trace is not None:
            kept = torch.zeros(cand.numel(), dtype=torch.bool)
            kept[keep] = True
            trace.append(BeamStep(t, [
                (tuple(prefixes[r, 1:].tolist()) + (int(tokens[c]),), cand[r, c].item())
                for r in range(cand.shape[0]) for c in range(cand.shape[1])
            ], kept.tolist()))
        lp_kept = cand.flatten()[keep]
        ends = toks == eos
        for r, lp in zip(rows[ends].tolist(), lp_kept[ends].tolist()):
            finished.append(Hypothesis(tuple(prefixes[r, 1:].tolist()) + (eos,), lp,
                                       lp / length_penalty(t, alpha)))
        # (N', t + 1)
        prefixes = torch.cat([prefixes[rows[~ends]], toks[~ends][:, None]], 1)
        live_lp = lp_kept[~ends]
        if not len(live_lp):
            break
        if finished:
            best = max(h.score for h in finished)
            bound = live_lp.max().item() / length_penalty(max_len, alpha)
            if best >= bound:
                break
    finished.sort(key=lambda h: -h.score)  # stable: ties keep search order
    return finished[:k]


def _check_beam_search(step, bos, eos, beam_size, max_len, alpha, trace) -> tuple[int, float]:
    fn = "beam_search"
    _check_common(step, bos, eos, max_len, fn)
    if trace is not None and not isinstance(trace, list):
        raise TypeError(f"{fn}: `trace` must be a list or None, got {type(trace).__name__}")
    return check_int("beam_size", beam_size, fn=fn), check_float("alpha", alpha, fn=fn, minimum=0.0)


def enumerate_sequences(step: Step, *, bos: int, eos: int, vocab_size: int,
                        max_len: int) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """Every complete output of at most ``max_len`` tokens and its log P(y|x) (float64).

    There are sum_{T < max_len} (V - 1)^T of them: T non-EOS tokens, then EOS (forced at
    step max_len, as in the searches). They sum to probability 1 only if the model
    itself ends every output by max_len (chapter 02 checks this by enumeration).
    """
    v = _check_enumerate(step, bos, eos, vocab_size, max_len)
    others = torch.tensor([tok for tok in range(v) if tok != eos])
    prefixes, live_lp = _start(bos), torch.zeros(1, dtype=torch.float64)
    sequences, logprobs = [], []
    for t in range(1, max_len + 1):
        logp = _next_logprobs(step, prefixes, eos=eos, fn="enumerate_sequences",
                              vocab_size=v)  # (N, V)
        sequences += [tuple(p) + (eos,) for p in prefixes[:, 1:].tolist()]
        logprobs.append(live_lp + logp[:, eos])
        if t == max_len:
            break
        n = prefixes.shape[0]
        live_lp = (live_lp[:, None] + logp[:, others]).flatten()  # (N * (V - 1),)
        prefixes = torch.cat([prefixes.repeat_interleave(len(others), 0),
                              others.repeat(n)[:, None]], 1)
    return sequences, torch.cat(logprobs)


def _check_enumerate(step, bos, eos, vocab_size, max_len) -> int:
    """The checks of ``enumerate_sequences``; returns V. Refuses more than MAX_ENUMERATED outputs."""
    fn = "enumerate_sequences"
    _check_common(step, bos, eos, max_len, fn)
    v = check_int("vocab_size", vocab_size, fn=fn, minimum=2)
    if not eos < v:
        raise ValueError(f"{fn}: `eos` must be < vocab_size = {v}, got {eos}")
    count, term = 0, 1
    for _ in range(max_len):  # sum_{T < max_len} (V - 1)^T, stopping as soon as it is too many
        count, term = count + term, term * (v - 1)
        if count > MAX_ENUMERATED:
            raise ValueError(f"{fn}: more than {MAX_ENUMERATED:,d} outputs for vocab_size={v}, "
                             f"max_len={max_len}; enumeration is for tiny models")
    return v


def exact_map(step: Step, *, bos: int, eos: int, vocab_size: int, max_len: int,
              alpha: float = 0.0) -> Hypothesis:
    """The exact MAP output argmax_y log P(y|x) / lp(|y|) by enumeration (chapter 02, eq-ch02-map).

    Only for tiny vocabularies: the search space grows like (V - 1)^max_len, which is why
    real decoders use greedy or beam search (chapter 02). Ties go to the output listed first
    by ``enumerate_sequences`` (shorter first).
    """
    alpha = check_float("alpha", alpha, fn="exact_map", minimum=0.0)
    sequences, logprobs = enumerate_sequences(step, bos=bos, eos=eos, vocab_size=vocab_size,
                                              max_len=max_len)
    scores = logprobs / torch.tensor([length_penalty(len(s), alpha) for s in sequences], dtype=torch.float64)
    best = int(scores.argmax())
    return Hypothesis(sequences[best], logprobs[best].item(), scores[best].item())


def _prefix_seed(seed: int, prefix: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(repr((seed, prefix)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def random_tree_lm(vocab_size: int, *, eos: int, seed: int, temperature: float = 1.0,
                   max_len: int | None = None) -> Step:
    """A random toy LM (chapter 02): every prefix gets its own next-token distribution.

    The logits after prefix p are i.i.d. N(0, 1) / temperature, drawn from a generator
    seeded by (seed, p), so the model is a fixed function of the prefix (no shared
    parameters, unlike an RNN). With ``max_len``, the model itself puts probability 1 on
    EOS once a prefix holds max_len - 1 generated tokens, so every output ends by length
    max_len.
    """
    v, temperature = _check_random_tree_lm(vocab_size, eos, seed, temperature, max_len)
    ended = torch.full((v,), -math.inf, dtype=torch.float64)
    ended[eos] = 0.0
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def step(prefixes: torch.Tensor) -> torch.Tensor:
        _check_prefixes(prefixes, "random_tree_lm step")
        rows = []
        for p in prefixes.tolist():
            key = tuple(p)
            if key not in cache:
                # BOS + max_len - 1 tokens
                if max_len is not None and len(key) >= max_len:
                    cache[key] = ended
                else:
                    g = torch.Generator().manual_seed(_prefix_seed(seed, key))
                    z = torch.randn(v, generator=g, dtype=torch.float64)
                    cache[key] = F.log_softmax(z / temperature, -1)
            rows.append(cache[key])
        return torch.stack(rows)                                          # (N, V)

    return step


def _check_random_tree_lm(vocab_size, eos, seed, temperature, max_len) -> tuple[int, float]:
    fn = "random_tree_lm"
    v = check_int("vocab_size", vocab_size, fn=fn, minimum=2)
    check_int("eos", eos, fn=fn, minimum=0)
    if not eos < v:
        raise ValueError(f"{fn}: `eos` must be < vocab_size = {v}, got {eos}")
    check_int("seed", seed, fn=fn, minimum=0)
    if max_len is not None:
        check_int("max_len", max_len, fn=fn, minimum=1)
    return v, check_float("temperature", temperature, fn=fn, minimum=0.0, inclusive=False)


def _check_prefixes(prefixes, fn: str) -> None:
    """What every ``step`` receives: a 2-D integer tensor ``(N, t)``, t >= 1 (BOS first)."""
    check_tensor("prefixes", prefixes, fn=fn, min_ndim=2, floating=False)
    if prefixes.ndim != 2 or prefixes.dtype.is_floating_point or prefixes.dtype.is_complex \
            or prefixes.dtype == torch.bool or prefixes.shape[1] == 0:
        raise ValueError(f"{fn}: `prefixes` must be an integer (N, t) tensor with t >= 1, got {describe(prefixes)}")
