"""The Tang-poem corpus shipped inside the package (chapter 11): nothing is downloaded."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._checks import check_int
from .task import SPLITS, split_of
from .vocab import BOS_ID, EOS_ID, Vocab, _pad

__all__ = ["PoemCorpus", "load_poems", "read_poems", "shared_line_pairs"]


@dataclass(frozen=True)
class PoemCorpus:
    """Tang quatrains split by poem, with a character vocabulary built on the training poems.

    ``train``/``valid``/``test``: lists of poems (``"A，B。C，D。"``) in file order. Poems that
    share two or more lines (variant texts of one poem, e.g. 揜涕/揜泪) form a group, and the
    whole group goes to the split ``split_of`` gives its first poem, so no two poems sharing two
    or more lines are in different splits (see :func:`load_poems`). ``vocab``: a char-level ``Vocab`` of the characters
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


_MARKS = re.compile("[，。]")


def _lines(poem: str) -> frozenset[str]:
    """The set of a poem's non-empty lines, the text between ``，``/``。``: the lines of
    ``attnbook.poems.split_lines`` (a test pins the equality; ``poems`` imports this package,
    so it is not imported here)."""
    return frozenset(line for line in _MARKS.split(poem) if line)


def shared_line_pairs(poems: Sequence[str], others: Sequence[str] | None = None, *,
                      min_shared: int = 2) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of poems that share at least ``min_shared`` distinct lines (chapter 11).

    With ``others``: every ``i`` of ``poems`` and ``j`` of ``others``; without: pairs inside
    ``poems`` with ``i < j``. Lines are :func:`attnbook.poems.split_lines` of each poem. Sorted.
    """
    fn = "shared_line_pairs"
    min_shared = check_int("min_shared", min_shared, fn=fn, minimum=1)
    for name, seq in (("poems", poems), ("others", others)):
        if seq is None and name == "others":
            continue
        if isinstance(seq, str) or not isinstance(seq, Sequence) or not all(isinstance(p, str) for p in seq):
            raise TypeError(f"{fn}: `{name}` must be a list of str (poems), got {seq!r:.60}")
    a = [_lines(p) for p in poems]
    b = a if others is None else [_lines(p) for p in others]
    where: dict[str, list[int]] = {}
    for j, lines in enumerate(b):
        for line in lines:
            where.setdefault(line, []).append(j)
    pairs = []
    for i, lines in enumerate(a):
        hits: dict[int, int] = {}
        for line in lines:
            for j in where.get(line, ()):
                hits[j] = hits.get(j, 0) + 1
        pairs += [(i, j) for j, n in hits.items() if n >= min_shared and (others is not None or j > i)]
    return sorted(pairs)


def _group_first(poems: Sequence[str]) -> list[int]:
    """For each poem, the index of the first poem (file order) of its group: poems joined,
    transitively (union-find), when they share two or more lines."""
    parent = list(range(len(poems)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in shared_line_pairs(poems):
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)    # the root is always the group's first poem
    return [root(i) for i in range(len(poems))]


def load_poems(*, min_count: int = 1, limit: int | None = None) -> PoemCorpus:
    """The shipped Tang quatrains as a ``PoemCorpus`` (chapter 11).

    Args:
        min_count: a character enters the vocabulary if it occurs at least this often in the
            training poems.
        limit: keep only the first ``limit`` poems of the file (before splitting and
            grouping), or all.

    The split is by poem, deduplicated by line overlap: poems sharing two or more lines (as
    :func:`attnbook.poems.split_lines` cuts them; transitively, so a group can hold three
    variants) all get the split ``split_of`` gives the group's first poem in file order. Without
    this, variant texts of one poem (揜涕/揜泪, 鴈/雁) landed in training and held-out splits.
    Of the 8,000 shipped poems, 410 fall in 203 such groups and 68 change split.
    """
    fn = "load_poems"
    min_count = check_int("min_count", min_count, fn=fn, minimum=1)
    poems = read_poems()
    if limit is not None:
        poems = poems[: check_int("limit", limit, fn=fn, minimum=1)]
    first = _group_first(poems)
    split = [split_of(poems[f]) for f in first]
    parts = {s: [p for p, sp in zip(poems, split) if sp == s] for s in SPLITS}
    counts: dict[str, int] = {}
    for p in parts["train"]:
        for ch in p:
            counts[ch] = counts.get(ch, 0) + 1
    kept = sorted(ch for ch, c in counts.items() if c >= min_count)
    return PoemCorpus(Vocab(kept), parts["train"], parts["valid"], parts["test"])
