"""attnbook.sampling: the filtered distributions against their definitions, and the draws.

The definitions are checked by brute force on small vocabularies: top-p's kept set is the
shortest prefix of the tokens sorted by probability whose mass reaches p, found here by
trying every prefix length; the draws are compared with the exact filtered distribution
within a stated bound (seeded, so the test is repeatable).
"""
import itertools
import math

import pytest
import torch

from attnbook import decoding, sampling
from attnbook.sampling import filter_logits, sample_next

INF = float("-inf")


def kept_set(filtered):
    return {i for i, x in enumerate(filtered.tolist()) if x != INF}


def brute_top_p(probs, p):
    """Smallest k such that the k most probable tokens reach p; then ties of the k-th kept."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    for k in range(1, len(probs) + 1):
        if sum(probs[i] for i in order[:k]) >= p or k == len(probs):
            last = probs[order[k - 1]]
            return {i for i in range(len(probs)) if probs[i] >= last}
    raise AssertionError


def brute_top_k(logits, k):
    kth = sorted(logits, reverse=True)[min(k, len(logits)) - 1]
    return {i for i, x in enumerate(logits) if x >= kth}


def test_re_exported_from_decoding():
    assert decoding.filter_logits is sampling.filter_logits
    assert decoding.sample_next is sampling.sample_next


@pytest.mark.parametrize("seed", range(40))
def test_top_k_and_top_p_sets_match_their_definitions(seed):
    g = torch.Generator().manual_seed(seed)
    v = 2 + seed % 7
    logits = torch.randn(v, generator=g, dtype=torch.float64) * 2
    probs = torch.softmax(logits, -1).tolist()
    for k in range(1, v + 2):
        assert kept_set(filter_logits(logits, top_k=k)) == brute_top_k(logits.tolist(), k)
    for p in (0.05, 0.3, 0.5, 0.77, 0.9, 0.999):
        out = filter_logits(logits, top_p=p)
        s = kept_set(out)
        assert s == brute_top_p(probs, p)
        assert sum(probs[i] for i in s) >= p - 1e-12          # reaches p ...
        smaller = sorted(s, key=lambda i: -probs[i])[:-1]      # ... and one token fewer does not
        assert sum(probs[i] for i in smaller) < p
        # the filtered distribution is the original one renormalised on the kept set
        got = torch.softmax(out, -1)
        z = sum(probs[i] for i in s)
        want = torch.tensor([probs[i] / z if i in s else 0.0 for i in range(v)], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_top_p_keeps_the_token_that_crosses_p_and_at_least_one():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    assert kept_set(filter_logits(logits, top_p=0.6)) == {0, 1}     # 0.5 < 0.6: 0.3 crosses it
    assert kept_set(filter_logits(logits, top_p=0.5 - 1e-9)) == {0}
    assert kept_set(filter_logits(logits, top_p=1e-9)) == {0}       # never empty


def test_ties_are_kept_together_whatever_the_order():
    logits = torch.tensor([1.0, 2.0, 2.0, 0.0])
    assert kept_set(filter_logits(logits, top_k=1)) == {1, 2}
    assert kept_set(filter_logits(logits.flip(0), top_k=1)) == {1, 2}
    assert kept_set(filter_logits(logits, top_p=0.3)) == {1, 2}


def test_p_one_keeps_every_allowed_token_even_when_rounding_would_drop_it():
    logits = torch.tensor([0.0, -30.0, -60.0, INF])   # exp(-60) vanishes next to 1 in float32
    assert kept_set(filter_logits(logits, top_p=1.0)) == {0, 1, 2}
    assert kept_set(filter_logits(logits, top_k=10)) == {0, 1, 2}


def test_top_k_then_top_p_on_the_renormalised_survivors():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    logits = probs.log()
    # after top-2 the survivors are 0.4/0.7 = 0.571 and 0.429: top-p = 0.6 needs both,
    # top-p = 0.55 only the first; top-p = 0.55 alone (0.4 < 0.55) keeps two
    assert kept_set(filter_logits(logits, top_k=2, top_p=0.6)) == {0, 1}
    assert kept_set(filter_logits(logits, top_k=2, top_p=0.55)) == {0}
    assert kept_set(filter_logits(logits, top_p=0.55)) == {0, 1}


def test_shape_dtype_batch_and_no_mutation():
    logits = torch.randn(2, 3, 11, dtype=torch.float16)
    before = logits.clone()
    out = filter_logits(logits, top_k=3, top_p=0.8)
    assert out.shape == logits.shape and out.dtype == torch.float16
    assert torch.equal(logits, before)
    for idx in itertools.product(range(2), range(3)):
        row = out[idx]
        assert row.eq(filter_logits(logits[idx], top_k=3, top_p=0.8)).logical_or(row == INF).all()
        assert 1 <= kept_set(row).__len__() <= 3


def test_no_filter_is_a_copy():
    logits = torch.randn(5)
    out = filter_logits(logits)
    assert torch.equal(out, logits) and out.data_ptr() != logits.data_ptr()


@pytest.mark.parametrize("kw", [dict(), dict(top_k=3), dict(top_p=0.7), dict(temperature=0.5, top_p=0.9),
                                dict(temperature=2.0, top_k=4)])
def test_draw_frequencies_match_the_exact_distribution(kw):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(6, generator=g, dtype=torch.float64)
    t = kw.get("temperature", 1.0)
    exact = torch.softmax(filter_logits(logits / t, top_k=kw.get("top_k"), top_p=kw.get("top_p")), -1)
    n = 40_000
    draws = sample_next(logits.expand(n, 6), generator=torch.Generator().manual_seed(1), **kw)
    assert draws.shape == (n,) and draws.dtype == torch.int64
    freq = torch.bincount(draws, minlength=6).double() / n
    # 5 standard errors per token: a false failure has probability < 1e-5 per token
    bound = 5 * torch.sqrt(exact * (1 - exact) / n) + 1e-12
    assert ((freq - exact).abs() <= bound).all(), (freq, exact)
    assert (freq[exact == 0] == 0).all()                      # a filtered token is never drawn


def test_temperature_zero_is_greedy_and_small_temperature_tends_to_it():
    logits = torch.randn(50, 9, generator=torch.Generator().manual_seed(3))
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next(logits, temperature=0.0), greedy)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits, temperature=1e-6, generator=g), greedy)
    assert torch.equal(sample_next(logits, temperature=1e-300, generator=g), greedy)  # no overflow
    # and a high temperature does not always pick the argmax (the test above could not pass by luck)
    hot = sample_next(logits, temperature=5.0, generator=g)
    assert not torch.equal(hot, greedy)


def test_same_generator_seed_same_draws():
    logits = torch.randn(4, 20)
    a = sample_next(logits, top_p=0.9, generator=torch.Generator().manual_seed(5))
    b = sample_next(logits, top_p=0.9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_forbidden_tokens_are_never_drawn():
    logits = torch.tensor([[0.0, INF, 0.0, INF]]).expand(2000, 4)
    draws = sample_next(logits, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 2}


@pytest.mark.parametrize("call, match", [
    (lambda: filter_logits([1.0, 2.0]), "filter_logits: `logits`"),
    (lambda: filter_logits(torch.tensor([1, 2])), "filter_logits: `logits`"),
    (lambda: filter_logits(torch.zeros(3, 0)), "at least one token"),
    (lambda: filter_logits(torch.tensor([0.0, math.nan])), "NaN"),
    (lambda: filter_logits(torch.tensor([0.0, math.inf])), r"\+inf"),
    (lambda: filter_logits(torch.tensor([[0.0, 1.0], [INF, INF]])), "all -inf"),
    (lambda: filter_logits(torch.zeros(3), top_k=0), "`top_k` must be an int >= 1"),
    (lambda: filter_logits(torch.zeros(3), top_k=2.0), "`top_k` must be an int"),
    (lambda: filter_logits(torch.zeros(3), top_p=0.0), r"`top_p` must lie in \(0, 1\]"),
    (lambda: filter_logits(torch.zeros(3), top_p=1.5), "`top_p` must lie in"),
    (lambda: filter_logits(torch.zeros(3), top_p=math.nan), "`top_p` must be a finite number"),
    (lambda: sample_next(torch.zeros(3), temperature=-1.0), "sample_next: `temperature`"),
    (lambda: sample_next(torch.zeros(3), generator=0), "`generator` must be a torch.Generator"),
    (lambda: sample_next(torch.zeros(3), top_k=-2), "sample_next: `top_k`"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()
