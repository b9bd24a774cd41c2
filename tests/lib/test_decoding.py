"""Tests for attnbook.decoding: greedy, beam search and exact MAP under one step protocol."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.decoding import (
    BeamStep,
    Hypothesis,
    beam_search,
    enumerate_sequences,
    exact_map,
    greedy_decode,
    greedy_decode_batch,
    length_penalty,
    random_tree_lm,
    score_sequence,
)

F64 = torch.float64
EOS = 0


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


# ----------------------------------------------------------------------------- toy models

def bigram_lm(v, seed, temperature=1.0, bos=None):
    """Next-token log-probs depend on the last token only: a (V + 1, V) table (row V = BOS)."""
    g = torch.Generator().manual_seed(seed)
    table = F.log_softmax(torch.randn(v + 1, v, generator=g, dtype=F64) / temperature, -1)
    return lambda prefixes: table[prefixes[:, -1]]


def gru_lm(v, seed, hidden=8):
    """A tiny random GRU language model (shared parameters, the whole prefix matters)."""
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(v + 1, hidden).double()
    gru = torch.nn.GRU(hidden, hidden, batch_first=True).double()
    out = torch.nn.Linear(hidden, v).double()
    for p in out.parameters():
        p.data *= 3.0                                  # sharper than the default init

    @torch.no_grad()
    def step(prefixes):
        h, _ = gru(emb(prefixes))                      # (N, t, hidden)
        return F.log_softmax(out(h[:, -1]), -1)        # (N, V)

    return step


def table_lm(table, v):
    """A hand-written model: {prefix without BOS: probabilities}; other prefixes end (EOS)."""
    logs = {k: torch.tensor(p, dtype=F64).log() for k, p in table.items()}
    ended = F.one_hot(torch.tensor(EOS), v).to(F64).log()

    def step(prefixes):
        return torch.stack([logs.get(tuple(p[1:]), ended) for p in prefixes.tolist()])

    return step


def count_outputs(v, max_len):
    return sum((v - 1) ** t for t in range(max_len))


def models(n, v=4, temperature=1.0):
    """n random models of three kinds: tree (prefix-indexed), bigram, GRU."""
    for seed in range(n):
        kind = seed % 3
        if kind == 0:
            yield f"tree{seed}", random_tree_lm(v, eos=EOS, seed=seed, temperature=temperature)
        elif kind == 1:
            yield f"bigram{seed}", bigram_lm(v, seed, temperature)
        else:
            yield f"gru{seed}", gru_lm(v, seed)


BOS = 4  # outside the output vocabulary of the V = 4 models (never generated)


# ----------------------------------------------------------------------------- greedy and beam

@pytest.mark.parametrize("max_len", [1, 3, 6])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_size_one_is_greedy(max_len, alpha):
    for name, step in models(60):
        greedy = greedy_decode(step, bos=BOS, eos=EOS, max_len=max_len)
        beam = beam_search(step, bos=BOS, eos=EOS, beam_size=1, max_len=max_len, alpha=alpha)
        assert len(beam) == 1, name
        assert beam[0].tokens == greedy.tokens, name
        assert beam[0].logprob == pytest.approx(greedy.logprob, rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
def test_unpruned_beam_is_exact_map(alpha):
    v, max_len = 4, 5
    k = v**max_len                               # >= every step's number of candidates
    wrong_greedy = differs_from_raw_map = 0
    for name, step in models(90):
        exact = exact_map(step, bos=BOS, eos=EOS, vocab_size=v, max_len=max_len, alpha=alpha)
        beam = beam_search(step, bos=BOS, eos=EOS, beam_size=k, max_len=max_len, alpha=alpha)
        assert beam[0].tokens == exact.tokens, name
        assert beam[0].score == pytest.approx(exact.score, rel=1e-12, abs=1e-12), name
        greedy = greedy_decode(step, bos=BOS, eos=EOS, max_len=max_len)
        wrong_greedy += greedy.tokens != exact.tokens
        raw = exact_map(step, bos=BOS, eos=EOS, vocab_size=v, max_len=max_len)
        differs_from_raw_map += raw.tokens != exact.tokens
    # controls: the equality above is not vacuous (greedy often misses the MAP), and alpha
    # changes which output is best, so a beam that ignored alpha would fail the assert
    assert wrong_greedy >= 10
    if alpha >= 1.0:
        assert differs_from_raw_map >= 10


def test_beam_results_never_beat_the_exact_map():
    v, max_len = 4, 5
    for name, step in models(30):
        exact = exact_map(step, bos=BOS, eos=EOS, vocab_size=v, max_len=max_len)
        for k in (1, 2, 3, 5, 8):
            best = beam_search(step, bos=BOS, eos=EOS, beam_size=k, max_len=max_len)[0]
            assert best.logprob <= exact.logprob + 1e-12, (name, k)


@settings(max_examples=60, deadline=None)
@given(v=st.integers(2, 5), max_len=st.integers(1, 5), seed=st.integers(0, 10**6),
       k=st.integers(1, 6), alpha=st.sampled_from([0.0, 0.5, 1.3]),
       temperature=st.sampled_from([0.3, 1.0, 3.0]))
def test_beam_properties(v, max_len, seed, k, alpha, temperature):
    step = random_tree_lm(v, eos=EOS, seed=seed, temperature=temperature)
    hyps = beam_search(step, bos=v, eos=EOS, beam_size=k, max_len=max_len, alpha=alpha)
    exact = exact_map(step, bos=v, eos=EOS, vocab_size=v, max_len=max_len, alpha=alpha)
    assert 1 <= len(hyps) <= k
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert hyps[0].score <= exact.score + 1e-12
    for h in hyps:
        assert 1 <= len(h.tokens) <= max_len and h.tokens[-1] == EOS and EOS not in h.tokens[:-1]
        assert h.logprob == pytest.approx(score_sequence(step, h.tokens, bos=v), abs=1e-12)
        assert h.score == pytest.approx(h.logprob / length_penalty(len(h.tokens), alpha), abs=1e-12)
    full = beam_search(step, bos=v, eos=EOS, beam_size=v**max_len, max_len=max_len, alpha=alpha)
    assert full[0].tokens == exact.tokens


def test_gru_lm_unpruned_beam_and_greedy_agree_with_enumeration():
    v, max_len = 5, 4
    for seed in range(5):
        step = gru_lm(v, seed)
        exact = exact_map(step, bos=v, eos=EOS, vocab_size=v, max_len=max_len)
        beam = beam_search(step, bos=v, eos=EOS, beam_size=v**max_len, max_len=max_len)
        assert beam[0].tokens == exact.tokens
        seqs, logprobs = enumerate_sequences(step, bos=v, eos=EOS, vocab_size=v, max_len=max_len)
        assert exact.logprob == pytest.approx(logprobs.max().item(), abs=0)
        greedy = greedy_decode(step, bos=v, eos=EOS, max_len=max_len)
        assert greedy.logprob == pytest.approx(logprobs[seqs.index(greedy.tokens)].item(), abs=1e-12)


# ----------------------------------------------------------------------------- hand-built model

A, B, X, Y, Z = 1, 2, 3, 4, 5
V6 = 6
HAND = table_lm({
    (): [0.1, 0.5, 0.4, 0, 0, 0],               # step 1: EOS .1, A .5, B .4
    (A,): [0, 0, 0, 0.4, 0.3, 0.3],             # after A: x .4, y .3, z .3
    (B,): [0, 0, 0, 0.9, 0.05, 0.05],           # after B: x .9, y .05, z .05
    **{(a, b): [1, 0, 0, 0, 0, 0] for a in (A, B) for b in (X, Y, Z)},   # then EOS
}, V6)


def test_hand_built_model_greedy_is_not_map():
    greedy = greedy_decode(HAND, bos=V6, eos=EOS, max_len=3)
    assert greedy.tokens == (A, X, EOS)
    assert math.exp(greedy.logprob) == pytest.approx(0.20, abs=1e-12)
    beam2 = beam_search(HAND, bos=V6, eos=EOS, beam_size=2, max_len=3)
    exact = exact_map(HAND, bos=V6, eos=EOS, vocab_size=V6, max_len=3)
    assert beam2[0].tokens == exact.tokens == (B, X, EOS)
    assert math.exp(exact.logprob) == pytest.approx(0.36, abs=1e-12)
    assert math.exp(beam2[0].logprob) == pytest.approx(0.36, abs=1e-12)
    assert beam_search(HAND, bos=V6, eos=EOS, beam_size=1, max_len=3)[0].tokens == greedy.tokens


def test_a_finished_hypothesis_is_kept_after_it_leaves_the_beam():
    # The empty output (p = .45) is the best, but the live A (.55) beats it after step 1, so
    # the search goes on and refills the beam with (A, x), (A, y) (.275 each). A search that
    # returned its final beam, or kept extending finished outputs, would not answer (EOS,).
    step = table_lm({(): [0.45, 0.55, 0, 0, 0, 0], (A,): [0, 0, 0, 0.5, 0.5, 0]}, V6)
    trace = []
    hyps = beam_search(step, bos=V6, eos=EOS, beam_size=2, max_len=3, trace=trace)
    assert hyps[0].tokens == (EOS,) and math.exp(hyps[0].logprob) == pytest.approx(0.45)
    assert len(trace) == 2
    last_beam = {tokens for (tokens, _), k in zip(trace[-1].candidates, trace[-1].kept) if k}
    assert last_beam == {(A, X), (A, Y)}                                 # (EOS,) left the beam
    assert all(tokens[0] != EOS for tokens, _ in trace[-1].candidates)  # and was not extended


def test_early_stop_only_when_no_live_prefix_can_win():
    calls = []

    def counting(prefixes):
        calls.append(prefixes.shape[1])
        return HAND(prefixes)

    # alpha = 0: after step 1 the finished empty output (.1) is worse than the live A (.5), so
    # the search goes on; once (B, x, EOS) = .36 finishes nothing live can beat it.
    beam_search(counting, bos=V6, eos=EOS, beam_size=2, max_len=10)
    assert max(calls) == 3
    # a model that never favours EOS: the search must run to max_len
    calls.clear()
    never = table_lm({p: [0.01, 0.99, 0, 0, 0, 0] for p in [(A,) * t for t in range(8)]}, V6)
    hyps = beam_search(lambda p: (calls.append(p.shape[1]), never(p))[1], bos=V6, eos=EOS,
                       beam_size=2, max_len=8)
    assert max(calls) == 8 and hyps[0].tokens == (EOS,)


def reference_beam(step, *, bos, eos, beam_size, max_len, alpha):
    """Beam search written plainly, WITHOUT early stopping: runs until no prefix is live.

    Returns (best (tokens, log P, score), number of steps run)."""
    beam, finished, steps = [((), 0.0)], [], 0
    for t in range(1, max_len + 1):
        if not beam:
            break
        steps = t
        logp = step(torch.tensor([[bos, *p] for p, _ in beam])).double()
        cands = [(p + (v,), lp + row[v].item()) for (p, lp), row in zip(beam, logp)
                 for v in (range(len(row)) if t < max_len else [eos])]
        kept = sorted(cands, key=lambda c: -c[1])[:beam_size]     # stable, as the library
        finished += [(p, lp, lp / length_penalty(t, alpha)) for p, lp in kept if p[-1] == eos]
        beam = [(p, lp) for p, lp in kept if p[-1] != eos]
    return max(finished, key=lambda h: h[2]), steps


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5, 3.0])
def test_early_stop_never_changes_the_result(alpha):
    # the bound log P(prefix) / lp(max_len) must never stop a search that a longer run
    # would have won (alpha = 3 catches a bound that used lp(t), stopping at the first
    # finished output fails at every alpha); the control counts searches really cut short
    stopped_early = 0
    for name, step in models(45):
        for k in (1, 2, 3):
            calls = []
            counting = lambda p, step=step: (calls.append(p.shape[1]), step(p))[1]  # noqa: E731
            got = beam_search(counting, bos=BOS, eos=EOS, beam_size=k, max_len=6, alpha=alpha)[0]
            (tokens, _, score), steps = reference_beam(step, bos=BOS, eos=EOS, beam_size=k,
                                                       max_len=6, alpha=alpha)
            assert got.tokens == tokens, (name, k)
            assert got.score == pytest.approx(score, rel=1e-12, abs=1e-12), (name, k)
            stopped_early += max(calls) < steps                 # the bound cut the search
    assert stopped_early >= 10


# ----------------------------------------------------------------------------- EOS, max_len, scores

def test_eos_is_forced_at_max_len_and_its_logprob_counted():
    p1, p2 = 1e-6, 1e-3                         # P(EOS) at step 1, then at every later step
    rare_eos = table_lm({(A,) * t: [p, 1 - p, 0, 0, 0, 0]
                         for t, p in enumerate([p1] + [p2] * 6)}, V6)
    forced = math.log(1 - p1) + 2 * math.log(1 - p2) + math.log(p2)   # A A A, then EOS forced
    greedy = greedy_decode(rare_eos, bos=V6, eos=EOS, max_len=4)
    assert greedy.tokens == (A, A, A, EOS)
    assert greedy.logprob == pytest.approx(forced, abs=1e-12)
    # beam: the MAP is the shorter (A, EOS); a strong length reward (alpha = 5) picks the
    # forced output, whose score still counts log P(EOS) at the forced step
    beam = beam_search(rare_eos, bos=V6, eos=EOS, beam_size=3, max_len=4)[0]
    assert beam.tokens == (A, EOS)
    long = beam_search(rare_eos, bos=V6, eos=EOS, beam_size=3, max_len=4, alpha=5.0)[0]
    assert long.tokens == (A, A, A, EOS)
    assert long.logprob == pytest.approx(forced, abs=1e-12)
    for fn in (greedy_decode, lambda s, **kw: beam_search(s, beam_size=3, **kw)[0]):
        one = fn(rare_eos, bos=V6, eos=EOS, max_len=1)
        assert one.tokens == (EOS,) and one.logprob == pytest.approx(math.log(p1), abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_returned_scores_are_the_summed_logprobs(alpha):
    for name, step in models(12):
        hyps = beam_search(step, bos=BOS, eos=EOS, beam_size=4, max_len=6, alpha=alpha)
        hyps.append(greedy_decode(step, bos=BOS, eos=EOS, max_len=6))
        hyps.append(exact_map(step, bos=BOS, eos=EOS, vocab_size=4, max_len=4, alpha=alpha))
        for h in hyps:
            assert h.logprob == pytest.approx(score_sequence(step, h.tokens, bos=BOS), abs=1e-12)
    # control: score_sequence tells a sequence from its neighbour
    step = random_tree_lm(4, eos=EOS, seed=3)
    assert abs(score_sequence(step, (1, 2, EOS), bos=BOS) - score_sequence(step, (2, 1, EOS), bos=BOS)) > 1e-3


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(1, 1.0) == 1.0 and length_penalty(7, 1.0) == 2.0
    assert length_penalty(13, 0.5) == pytest.approx(math.sqrt(3.0), rel=1e-15)


# ----------------------------------------------------------------------------- enumeration

def test_enumeration_sums_to_one_only_when_the_model_ends_outputs():
    v, max_len = 4, 5
    step = random_tree_lm(v, eos=EOS, seed=0, max_len=max_len)
    seqs, logprobs = enumerate_sequences(step, bos=BOS, eos=EOS, vocab_size=v, max_len=max_len)
    assert len(seqs) == len(set(seqs)) == count_outputs(v, max_len) == 121
    assert abs(logprobs.exp().sum().item() - 1) < 1e-12
    # control: a model that does not end outputs by max_len leaves mass on longer outputs
    open_ended = random_tree_lm(v, eos=EOS, seed=0)
    _, lp = enumerate_sequences(open_ended, bos=BOS, eos=EOS, vocab_size=v, max_len=max_len)
    assert lp.exp().sum().item() < 0.99
    # ... and enumerating longer outputs of the ending model adds nothing
    _, lp_long = enumerate_sequences(step, bos=BOS, eos=EOS, vocab_size=v, max_len=7)
    assert abs(lp_long.exp().sum().item() - 1) < 1e-12


def test_enumeration_agrees_with_score_sequence_and_handles_zero_probabilities():
    seqs, logprobs = enumerate_sequences(HAND, bos=V6, eos=EOS, vocab_size=V6, max_len=3)
    assert len(seqs) == count_outputs(V6, 3)
    for s, lp in zip(seqs, logprobs.tolist()):
        assert lp == score_sequence(HAND, s, bos=V6)
    probs = {s: math.exp(lp) for s, lp in zip(seqs, logprobs.tolist()) if lp > -math.inf}
    assert probs[(B, X, EOS)] == pytest.approx(0.36) and abs(sum(probs.values()) - 1) < 1e-12


# ----------------------------------------------------------------------------- batched greedy

def test_greedy_batch_equals_greedy_per_source():
    sources = [random_tree_lm(5, eos=EOS, seed=s, temperature=0.5) for s in range(7)]

    def batched(prefixes):                   # row n belongs to source n
        return torch.cat([sources[n](prefixes[n:n + 1]) for n in range(len(sources))])

    hyps = greedy_decode_batch(batched, batch_size=len(sources), bos=5, eos=EOS, max_len=6)
    singles = [greedy_decode(s, bos=5, eos=EOS, max_len=6) for s in sources]
    assert [h.tokens for h in hyps] == [h.tokens for h in singles]
    for h, s in zip(hyps, singles):
        assert h.logprob == pytest.approx(s.logprob, abs=1e-12)
    assert len({len(h.tokens) for h in hyps}) > 1            # rows really end at different steps


# ----------------------------------------------------------------------------- trace and toy LM

def test_trace_records_every_candidate_and_the_beam():
    trace = []
    hyps = beam_search(HAND, bos=V6, eos=EOS, beam_size=2, max_len=3, trace=trace)
    assert [s.t for s in trace] == [1, 2, 3] and all(isinstance(s, BeamStep) for s in trace)
    assert len(trace[0].candidates) == V6 and sum(trace[0].kept) == 2
    kept1 = {c for c, k in zip(trace[0].candidates, trace[0].kept) if k}
    assert {tokens for tokens, _ in kept1} == {(A,), (B,)}
    for step_ in trace:
        for (tokens, lp), _ in zip(step_.candidates, step_.kept):
            prefix_lp = sum(HAND(torch.tensor([[V6, *tokens[:i]]]))[0, tokens[i]].item()
                            for i in range(len(tokens)))
            assert lp == pytest.approx(prefix_lp, abs=1e-12)
    last = {c for s in trace for c, k in zip(s.candidates, s.kept) if k}
    assert (hyps[0].tokens, hyps[0].logprob) in last


def test_random_tree_lm_is_a_fixed_function_of_the_prefix():
    step = random_tree_lm(5, eos=EOS, seed=9)
    again = random_tree_lm(5, eos=EOS, seed=9)
    prefixes = torch.tensor([[5, 1, 2], [5, 2, 1], [5, 1, 2]])
    out = step(prefixes)
    assert torch.equal(out, again(prefixes.flip(0)).flip(0))     # batch order does not matter
    assert torch.equal(out[0], out[2]) and not torch.equal(out[0], out[1])
    assert not torch.equal(out, random_tree_lm(5, eos=EOS, seed=10)(prefixes))
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(3, dtype=F64), rtol=0, atol=1e-12)
    cold = random_tree_lm(5, eos=EOS, seed=9, temperature=0.05)(prefixes)
    assert cold.exp().max(-1).values.min() > 0.99                # low temperature: near one-hot
    ends = random_tree_lm(5, eos=EOS, seed=9, max_len=3)(prefixes)
    assert torch.equal(ends[:, EOS], torch.zeros(3, dtype=F64))  # 2 tokens generated: EOS next


def test_float32_and_bfloat16_steps_are_accepted():
    for dtype in (torch.float32, torch.bfloat16):
        step = bigram_lm(4, 0)
        low = lambda p, step=step, dtype=dtype: step(p).to(dtype)   # noqa: E731
        assert greedy_decode(low, bos=BOS, eos=EOS, max_len=5).tokens[-1] == EOS
        assert beam_search(low, bos=BOS, eos=EOS, beam_size=3, max_len=5)


# ----------------------------------------------------------------------------- validation

def test_validation_errors():
    step = bigram_lm(4, 0)
    kw = dict(bos=BOS, eos=EOS, max_len=3)
    with pytest.raises(TypeError, match="greedy_decode: `step` must be callable"):
        greedy_decode("model", **kw)
    with pytest.raises(ValueError, match="`max_len` must be an int >= 1"):
        greedy_decode(step, bos=BOS, eos=EOS, max_len=0)
    with pytest.raises(TypeError, match="`eos` must be an int"):
        greedy_decode(step, bos=BOS, eos=0.0, max_len=3)
    with pytest.raises(ValueError, match="`bos` must be an int >= 0"):
        beam_search(step, bos=-1, eos=EOS, beam_size=2, max_len=3)
    with pytest.raises(ValueError, match="`eos` must be < V = 4"):
        greedy_decode(step, bos=BOS, eos=4, max_len=3)
    with pytest.raises(ValueError, match="`beam_size` must be an int >= 1"):
        beam_search(step, beam_size=0, **kw)
    with pytest.raises(ValueError, match="`alpha` must lie in"):
        beam_search(step, beam_size=2, alpha=-0.5, **kw)
    with pytest.raises(TypeError, match="`alpha` must be a finite number"):
        beam_search(step, beam_size=2, alpha=True, **kw)
    with pytest.raises(TypeError, match="`trace` must be a list"):
        beam_search(step, beam_size=2, trace=(), **kw)
    logits = lambda p: torch.randn(p.shape[0], 4, dtype=F64) + 3.0   # noqa: E731
    with pytest.raises(ValueError, match="apply log_softmax"):
        greedy_decode(logits, **kw)
    with pytest.raises(ValueError, match=r"\(N, V\) floating log-probabilities for N = 1"):
        greedy_decode(lambda p: step(p)[0], **kw)
    with pytest.raises(TypeError, match="must return a torch.Tensor"):
        greedy_decode(lambda p: step(p).tolist(), **kw)
    with pytest.raises(ValueError, match="NaN"):
        greedy_decode(lambda p: step(p) * math.nan, **kw)
    with pytest.raises(ValueError, match="`vocab_size` is 5"):
        exact_map(step, vocab_size=5, **kw)
    with pytest.raises(ValueError, match="enumeration is for tiny models"):
        exact_map(step, bos=BOS, eos=EOS, vocab_size=4, max_len=14)
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1"):
        greedy_decode_batch(step, batch_size=0, **kw)
    with pytest.raises(ValueError, match="`temperature` must lie in"):
        random_tree_lm(4, eos=EOS, seed=0, temperature=0.0)
    with pytest.raises(ValueError, match="outside the step's vocabulary"):
        score_sequence(step, (7, EOS), bos=BOS)


def test_hypothesis_is_a_named_tuple():
    h = Hypothesis((1, EOS), -1.0, -0.9)
    assert h.tokens == (1, EOS) and h.logprob == -1.0 and h.score == -0.9
