"""The Tang-poem corpus shipped inside the package (chapter 11): nothing is downloaded."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._checks import check_int
from .task import SPLITS, split_of
from .vocab import BOS_ID, EOS_ID, Vocab, _pad

__all__ = ["PoemCorpus", "load_poems", "read_poems"]


@dataclass(frozen=True)
class PoemCorpus:
    """Tang quatrains split by poem, with a character vocabulary built on the training poems.

    ``train``/``valid``/``test``: lists of poems (``"A，B。C，D。"``); ``split_of(poem)`` decides
    each poem's split, so no poem is in two. ``vocab``: a char-level ``Vocab`` of the characters
    seen at least ``min_count`` times in ``train`` (the rest encode to UNK).
    """

    vocab: Vocab
    train: list[str]
    valid: list[str]
    test: list[str]

    def encode(self, poems: Sequence[str]) -> torch.Tensor:
        """``(N, T + 2)`` LongTensor: BOS, the poem's ids, EOS, then PAD up to the longest."""
        if isinstance(poems, str) or not isinstance(poems, Sequence) or not poems:
            raise TypeError(f"PoemCorpus.encode: `poems` must be a non-empty list of str, got {poems!r:.60}")
        rows = [[BOS_ID, *self.vocab.encode(p), EOS_ID] for p in poems]
        return _pad(rows)[0]


def read_poems() -> list[str]:
    """The 8,000 quatrains of ``attnbook/_data/tang_poems.txt`` in file order (README beside it)."""
    from importlib.resources import files
    text = files("attnbook").joinpath("_data", "tang_poems.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line]


def load_poems(*, min_count: int = 1, limit: int | None = None) -> PoemCorpus:
    """The shipped Tang quatrains as a ``PoemCorpus`` (chapter 11).

    Args:
        min_count: a character enters the vocabulary if it occurs at least this often in the
            training poems.
        limit: keep only the first ``limit`` poems of the file (before splitting), or all.
    """
    fn = "load_poems"
    min_count = check_int("min_count", min_count, fn=fn, minimum=1)
    poems = read_poems()
    if limit is not None:
        poems = poems[: check_int("limit", limit, fn=fn, minimum=1)]
    parts = {s: [p for p in poems if split_of(p) == s] for s in SPLITS}
    counts: dict[str, int] = {}
    for p in parts["train"]:
        for ch in p:
            counts[ch] = counts.get(ch, 0) + 1
    kept = sorted(ch for ch, c in counts.items() if c >= min_count)
    return PoemCorpus(Vocab(kept), parts["train"], parts["valid"], parts["test"])
