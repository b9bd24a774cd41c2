"""String tasks over an alphabet: copy, reversal, sorting, digits spelled out (chapters 02-03)."""
from __future__ import annotations

import torch

from .._checks import check_int
from .task import Task
from .vocab import Vocab

__all__ = ["DIGITS", "DIGIT_WORDS", "copy_task", "digit_word_task", "reversal_task", "sorting_task"]

DIGITS = "0123456789"
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _check_lengths(fn: str, min_len, max_len) -> tuple[int, int]:
    min_len = check_int("min_len", min_len, fn=fn, minimum=1)
    max_len = check_int("max_len", max_len, fn=fn, minimum=1)
    if max_len < min_len:
        raise ValueError(f"{fn}: `max_len` must be >= `min_len`, got min_len={min_len}, max_len={max_len}")
    return min_len, max_len


def _check_alphabet(fn: str, alphabet) -> str:
    if not isinstance(alphabet, str) or len(alphabet) < 1:
        raise TypeError(f"{fn}: `alphabet` must be a non-empty str, got {alphabet!r}")
    if len(set(alphabet)) != len(alphabet) or any(c.isspace() for c in alphabet):
        raise ValueError(f"{fn}: `alphabet` must hold distinct non-space characters, got {alphabet!r}")
    return alphabet


def _random_strings(n: int, g: torch.Generator, alphabet: str, min_len: int, max_len: int) -> list[str]:
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    symbols = torch.randint(len(alphabet), (n, max_len), generator=g).tolist()
    return ["".join(alphabet[i] for i in row[:length]) for row, length in zip(symbols, lengths)]


def _string_task(name: str, transform, min_len, max_len, alphabet) -> Task:
    fn = name
    min_len, max_len = _check_lengths(fn, min_len, max_len)
    alphabet = _check_alphabet(fn, alphabet)
    vocab = Vocab(alphabet)

    def sample(n, g):
        return [(s, transform(s)) for s in _random_strings(n, g, alphabet, min_len, max_len)]

    return Task(name, vocab, vocab, sample)


def copy_task(*, min_len: int = 3, max_len: int = 10, alphabet: str = DIGITS) -> Task:
    """Copy a random string: ``"3141"`` -> ``"3141"`` (lengths uniform in [min_len, max_len])."""
    return _string_task("copy_task", lambda s: s, min_len, max_len, alphabet)


def reversal_task(*, min_len: int = 3, max_len: int = 10, alphabet: str = DIGITS) -> Task:
    """Reverse a random string: ``"3141"`` -> ``"1413"`` (anti-diagonal alignment)."""
    return _string_task("reversal_task", lambda s: s[::-1], min_len, max_len, alphabet)


def sorting_task(*, min_len: int = 3, max_len: int = 10, alphabet: str = DIGITS) -> Task:
    """Sort a random string by the alphabet's order: ``"3141"`` -> ``"1134"`` (content-based)."""
    rank = {c: i for i, c in enumerate(alphabet)} if isinstance(alphabet, str) else {}
    return _string_task("sorting_task", lambda s: "".join(sorted(s, key=rank.__getitem__)),
                        min_len, max_len, alphabet)


def digit_word_task(*, min_len: int = 1, max_len: int = 8) -> Task:
    """Spell out a digit string: ``"314"`` -> ``"three one four"`` (char source, word target)."""
    min_len, max_len = _check_lengths("digit_word_task", min_len, max_len)

    def sample(n, g):
        srcs = _random_strings(n, g, DIGITS, min_len, max_len)
        return [(s, " ".join(DIGIT_WORDS[int(c)] for c in s)) for s in srcs]

    return Task("digit_word_task", Vocab(DIGITS), Vocab(list(DIGIT_WORDS), level="word"), sample)
