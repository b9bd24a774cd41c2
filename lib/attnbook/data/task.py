"""A seq2seq toy task (a seeded sampler of string pairs plus two vocabularies) and its splits.

Held-out splits never overlap: every example has a key (the source string; for dates the ISO
target), and ``split_of(key)`` assigns it to ``"train"``, ``"valid"`` or ``"test"`` by a fixed
hash (CRC-32 mod 10: 0-7 train, 8 valid, 9 test).
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .._checks import check_choice, check_int
from .vocab import Batch, Vocab, make_batch

__all__ = ["SPLITS", "Task", "split_of"]

SPLITS = ("train", "valid", "test")


def _generator(seed, fn: str) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    return torch.Generator().manual_seed(check_int("seed", seed, fn=fn, minimum=0))


def split_of(key: str) -> str:
    """The split of an example key: CRC-32 of its UTF-8 bytes mod 10 -> 0-7 train, 8 valid, 9 test."""
    if not isinstance(key, str):
        raise TypeError(f"split_of: `key` must be a str (a source string or an ISO date), got {key!r:.40} "
                        f"({type(key).__name__})")
    bucket = zlib.crc32(key.encode("utf-8")) % 10
    return "train" if bucket < 8 else ("valid" if bucket == 8 else "test")


@dataclass(frozen=True)
class Task:
    """A seq2seq toy task: a sampler of (source, target) string pairs plus both vocabularies.

    ``sample(n, generator)`` draws ``n`` pairs; ``key(pair)`` names the example for the split
    (see the module docstring). Use ``pairs``, ``batch`` and ``batches`` rather than ``sample``.
    """

    name: str
    src_vocab: Vocab
    tgt_vocab: Vocab
    sample: Callable[[int, torch.Generator], list[tuple[str, str]]] = field(repr=False)
    key: Callable[[tuple[str, str]], str] = field(default=lambda pair: pair[0], repr=False)

    def pairs(self, n: int, *, seed=0, split: str | None = "train") -> list[tuple[str, str]]:
        """``n`` pairs from ``split`` ("train", "valid", "test", or None for any), reproducibly."""
        fn = f"{self.name}.pairs"
        n = check_int("n", n, fn=fn, minimum=1)
        if split is not None:
            check_choice("split", split, SPLITS, fn=fn)
        g = _generator(seed, fn)
        out: list[tuple[str, str]] = []
        for _ in range(1000):
            for pair in self.sample(max(n - len(out), 16) if split else n - len(out), g):
                if split is None or split_of(self.key(pair)) == split:
                    out.append(pair)
                    if len(out) == n:
                        return out
        raise ValueError(f"{fn}: could not draw {n} examples of split {split!r}; the task's example "
                         f"space is too small for that split (got {len(out)})")

    def batch(self, n: int, *, seed=0, split: str | None = "train") -> Batch:
        """One padded ``Batch`` of ``n`` pairs (a fixed evaluation set when ``seed`` is fixed)."""
        return make_batch(self.pairs(n, seed=seed, split=split), self.src_vocab, self.tgt_vocab)

    def batches(self, batch_size: int, *, seed=0, split: str | None = "train",
                n_batches: int | None = None) -> Iterator[Batch]:
        """Batches of ``batch_size`` drawn from one generator seeded by ``seed``; endless if
        ``n_batches`` is None. The same seed gives the same sequence of batches."""
        fn = f"{self.name}.batches"
        batch_size = check_int("batch_size", batch_size, fn=fn, minimum=1)
        if n_batches is not None:
            n_batches = check_int("n_batches", n_batches, fn=fn, minimum=1)
        g = _generator(seed, fn)
        if split is not None:
            check_choice("split", split, SPLITS, fn=fn)

        def gen():
            i = 0
            while n_batches is None or i < n_batches:
                yield self.batch(batch_size, seed=g, split=split)
                i += 1

        return gen()
