"""Generated toy tasks for the chapters that train (chapters 01-03, 05-08, 10): nothing is downloaded.

Sequence-to-sequence tasks are pairs of strings ``(source, target)``, e.g. ``("3141", "1413")``
for reversal or ``("3 March 2021", "2021-03-03")`` for date translation. A ``Task`` bundles a
generator with its two vocabularies; ``make_batch`` turns pairs into padded LongTensors.

- ``copy_task``, ``reversal_task``, ``sorting_task``: random strings over an alphabet.
- ``digit_word_task``: ``"314"`` -> ``"three one four"`` (variable target length, word tokens).
- ``date_task``: a date in one of several human formats -> ISO 8601 ``YYYY-MM-DD``.
- ``first_token_recall``, ``adding_problem``: tensor tasks for RNN gradient experiments.

Date convention (quoted by the book): in a numeric format where day and month are both numbers,
the **day comes first** (``03/04/21`` is 3 April 2021, dd/mm/yy as in British usage), except in
year-first formats, which follow ISO 8601 order (``2021/4/3`` is also 3 April 2021). A two-digit
year ``yy`` means ``19yy`` for ``yy >= 50`` and ``20yy`` otherwise, so dates must lie in
1950-2049 when a two-digit format is used (``format_date`` refuses others). Four-digit years are
zero-padded (``0999/1/3``), so every date of years 1-9999 reads back. See ``NUMERIC_DATE_ORDER``
and ``TWO_DIGIT_YEAR_PIVOT``.

Held-out splits never overlap: every example has a key (the source string; for dates the ISO
target, so a held-out *date* is never seen in training in any format), and ``split_of(key)``
assigns it to ``"train"``, ``"valid"`` or ``"test"`` by a fixed hash (CRC-32 mod 10: 0-7 train,
8 valid, 9 test). Sampling a split draws examples and keeps those whose key falls in it.

Randomness: every sampler takes ``seed`` (an int) or a ``torch.Generator`` (advanced in place, so
repeated calls with the same generator give fresh, reproducible draws).
"""
from __future__ import annotations

import datetime as _dt
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ._checks import check_choice, check_int

__all__ = [
    "BOS", "BOS_ID", "DATE_FORMATS", "DIGITS", "DIGIT_WORDS", "EOS", "EOS_ID", "NUMERIC_DATE_ORDER",
    "PAD", "PAD_ID", "SPLITS", "TWO_DIGIT_YEAR_PIVOT", "UNK", "UNK_ID", "ADDING_BASELINE_MSE",
    "Batch", "Task", "Vocab", "adding_problem", "copy_task", "date_task", "digit_word_task",
    "first_token_recall", "format_date", "make_batch", "parse_date", "reversal_task",
    "sorting_task", "split_of", "PoemCorpus", "load_poems", "read_poems",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # the same in every Vocab; PAD = 0 suits ignore_index
DIGITS = "0123456789"
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPLITS = ("train", "valid", "test")

NUMERIC_DATE_ORDER = "DMY"   # all-numeric day/month formats put the day first (dd/mm/yy)
TWO_DIGIT_YEAR_PIVOT = 50    # yy >= 50 -> 19yy, yy < 50 -> 20yy
ADDING_BASELINE_MSE = 1 / 6  # MSE of always predicting 1 (Var of a sum of two U(0, 1))

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")


# ----------------------------------------------------------------------------------------------
# Vocabulary and batching
# ----------------------------------------------------------------------------------------------
class Vocab:
    """Token <-> id map with the special tokens PAD=0, BOS=1, EOS=2, UNK=3 first.

    ``level="char"`` splits a string into characters, ``level="word"`` on whitespace; a list of
    tokens is taken as is. Unknown tokens encode to UNK.
    """

    def __init__(self, tokens: Iterable[str], *, level: str = "char"):
        self.level = check_choice("level", level, ("char", "word"), fn="Vocab")
        if not isinstance(tokens, (str, Iterable)) or isinstance(tokens, (bytes, torch.Tensor)):
            raise TypeError(f"Vocab: `tokens` must be a str or an iterable of str tokens, got {type(tokens).__name__}")
        if isinstance(tokens, str):
            tokens = list(tokens) if level == "char" else tokens.split()
        specials = (PAD, BOS, EOS, UNK)
        self.itos: list[str] = list(specials)
        for tok in tokens:
            if not isinstance(tok, str) or tok == "":
                raise TypeError(f"Vocab: `tokens` must be non-empty strings, got {tok!r}")
            if tok not in self.itos:
                self.itos.append(tok)
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        tokens = self.itos[4:]
        shown = " ".join(tokens[:12]) + (" ..." if len(tokens) > 12 else "")
        return f"Vocab(level={self.level!r}, size={len(self)}, tokens after the 4 specials: {shown!r})"

    def tokenize(self, text: str) -> list[str]:
        """Split a string into tokens (characters, or whitespace-separated words)."""
        if not isinstance(text, str):
            raise TypeError(f"Vocab.tokenize: `text` must be a str, got {type(text).__name__}")
        return list(text) if self.level == "char" else text.split()

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Ids of a string (tokenized by ``level``) or of a list of tokens; no BOS/EOS added."""
        if isinstance(text, str):
            text = self.tokenize(text)
        elif not isinstance(text, Sequence):
            raise TypeError(f"Vocab.encode: `text` must be a str or a list of tokens, got {type(text).__name__}")
        for tok in text:
            if not isinstance(tok, str):
                raise TypeError(f"Vocab.encode: `text` must hold str tokens, got {tok!r} ({type(tok).__name__})")
        return [self.stoi.get(t, UNK_ID) for t in text]

    def decode(self, ids) -> str:
        """String of a list of ids (or a 1-D tensor): stops at EOS, skips PAD and BOS."""
        ids = _id_list(ids, "Vocab.decode", "ids")
        out = []
        for i in ids:
            if i >= len(self):
                raise ValueError(f"Vocab.decode: `ids` holds id {i}, out of range for a vocabulary of size {len(self)}")
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(self.itos[i])
        return ("" if self.level == "char" else " ").join(out)


@dataclass
class Batch:
    """A padded batch of (source, target) pairs; masks are bool with True = real token.

    ``tgt_in`` = BOS + target (the decoder's teacher-forced input), ``tgt_out`` = target + EOS
    (what it must predict), so ``tgt_len = len(target) + 1`` for both. Padding is ``PAD_ID = 0``.
    For attention over source keys use ``src_mask[:, None, None, :]`` (shape ``(B, 1, 1, S)``).
    """

    src: torch.Tensor       # (B, S) long
    src_len: torch.Tensor   # (B,) long
    tgt_in: torch.Tensor    # (B, T) long
    tgt_out: torch.Tensor   # (B, T) long
    tgt_len: torch.Tensor   # (B,) long
    pairs: list = field(default_factory=list)  # the raw (source, target) pairs, if any

    @property
    def src_mask(self) -> torch.Tensor:
        """(B, S) bool, True where ``src`` holds a real token."""
        return torch.arange(self.src.shape[1], device=self.src.device) < self.src_len[:, None]

    @property
    def tgt_mask(self) -> torch.Tensor:
        """(B, T) bool, True where ``tgt_in`` / ``tgt_out`` hold a real token."""
        return torch.arange(self.tgt_in.shape[1], device=self.tgt_in.device) < self.tgt_len[:, None]

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device) -> "Batch":
        """A copy with every tensor on ``device``."""
        return Batch(self.src.to(device), self.src_len.to(device), self.tgt_in.to(device),
                     self.tgt_out.to(device), self.tgt_len.to(device), self.pairs)


def _id_list(ids, fn: str, name: str) -> list[int]:
    """Token ids given as a list/tuple of ints (numpy ints too) or a 1-D integer tensor/array, as a list."""
    if isinstance(ids, torch.Tensor) or hasattr(ids, "__array__") and hasattr(ids, "ndim"):
        if ids.ndim != 1:
            raise ValueError(f"{fn}: `{name}` must be 1-D, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple, range)):
        raise TypeError(f"{fn}: `{name}` must give token ids as a list of ints >= 0 or a 1-D integer tensor, "
                        f"got {type(ids).__name__} {ids!r:.40}")
    for i in ids:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{fn}: `{name}` must hold token ids (ints >= 0), got {i!r} in {ids!r:.40}")
        if i < 0:
            raise ValueError(f"{fn}: `{name}` must hold token ids >= 0, got {i} in {ids!r:.40}")
    return [int(i) for i in ids]


def _pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), max(1, int(lengths.max()))), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out, lengths


def make_batch(pairs, src_vocab: Vocab | None = None, tgt_vocab: Vocab | None = None) -> Batch:
    """Pad a list of (source, target) pairs into a ``Batch``.

    Args: pairs: (source, target) with strings / token lists (encoded with the vocabularies) or,
    when a vocabulary is None, lists of ids. Returns: ``Batch`` with ``src (B, S)``,
    ``tgt_in (B, T)`` = BOS + target, ``tgt_out (B, T)`` = target + EOS, lengths ``(B,)``.
    """
    fn = "make_batch"
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise TypeError(f"{fn}: `pairs` must be a list of (source, target) pairs, got {type(pairs).__name__}")
    pairs = list(pairs)
    if not pairs:
        raise ValueError(f"{fn}: `pairs` must hold at least one (source, target) pair, got none")
    for name, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if vocab is not None and not isinstance(vocab, Vocab):
            raise TypeError(f"{fn}: `{name}` must be a Vocab or None, got {type(vocab).__name__}")
    srcs, tgts = [], []
    for p in pairs:
        if not (isinstance(p, (tuple, list)) and len(p) == 2):
            raise TypeError(f"{fn}: `pairs` must hold (source, target) pairs, got {p!r:.60}")
        for seq, vocab, out in ((p[0], src_vocab, srcs), (p[1], tgt_vocab, tgts)):
            out.append(vocab.encode(seq) if vocab is not None else _id_list(seq, fn, "pairs"))
    src, src_len = _pad(srcs)
    tgt_in, tgt_len = _pad([[BOS_ID] + t for t in tgts])
    tgt_out, _ = _pad([t + [EOS_ID] for t in tgts])
    return Batch(src, src_len, tgt_in, tgt_out, tgt_len, pairs)


# ----------------------------------------------------------------------------------------------
# Seeds, splits, tasks
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Dates
# ----------------------------------------------------------------------------------------------
def _yy(year: int) -> int:
    if not 1900 + TWO_DIGIT_YEAR_PIVOT <= year <= 1999 + TWO_DIGIT_YEAR_PIVOT:
        raise ValueError(f"format_date: a two-digit year names only {1900 + TWO_DIGIT_YEAR_PIVOT}-"
                         f"{1999 + TWO_DIGIT_YEAR_PIVOT} (see TWO_DIGIT_YEAR_PIVOT), got the year {year}")
    return year % 100


def _year_of_yy(yy: int) -> int:
    return (1900 if yy >= TWO_DIGIT_YEAR_PIVOT else 2000) + yy


_MON = "|".join(m[:3] for m in _MONTHS)
_MONTH = "|".join(_MONTHS)
# name -> (formatter, regex whose groups are named d, m (number), mon (name), y (4-digit), yy)
_FORMATS: dict[str, tuple[Callable[[_dt.date], str], str]] = {
    "D MMMM YYYY": (lambda d: f"{d.day} {_MONTHS[d.month - 1]} {d.year:04d}",
                    rf"(?P<d>\d{{1,2}}) (?P<mon>{_MONTH}) (?P<y>\d{{4}})"),
    "DD/MM/YY": (lambda d: f"{d.day:02d}/{d.month:02d}/{_yy(d.year):02d}",
                 r"(?P<d>\d{2})/(?P<m>\d{2})/(?P<yy>\d{2})"),
    "MMMM D, YYYY": (lambda d: f"{_MONTHS[d.month - 1]} {d.day}, {d.year:04d}",
                     rf"(?P<mon>{_MONTH}) (?P<d>\d{{1,2}}), (?P<y>\d{{4}})"),
    "YYYY/M/D": (lambda d: f"{d.year:04d}/{d.month}/{d.day}",
                 r"(?P<y>\d{4})/(?P<m>\d{1,2})/(?P<d>\d{1,2})"),
    "MMM D YYYY": (lambda d: f"{_MONTHS[d.month - 1][:3]} {d.day} {d.year:04d}",
                   rf"(?P<mon>{_MON}) (?P<d>\d{{1,2}}) (?P<y>\d{{4}})"),
    "D MMM YY": (lambda d: f"{d.day} {_MONTHS[d.month - 1][:3]} {_yy(d.year):02d}",
                 rf"(?P<d>\d{{1,2}}) (?P<mon>{_MON}) (?P<yy>\d{{2}})"),
    "DD.MM.YYYY": (lambda d: f"{d.day:02d}.{d.month:02d}.{d.year:04d}",
                   r"(?P<d>\d{2})\.(?P<m>\d{2})\.(?P<y>\d{4})"),
}
DATE_FORMATS: tuple[str, ...] = tuple(_FORMATS)
"""Input formats of ``date_task``; e.g. 3 March 2021 is ``3 March 2021``, ``03/03/21``,
``March 3, 2021``, ``2021/3/3``, ``Mar 3 2021``, ``3 Mar 21``, ``03.03.2021``."""


def format_date(date: _dt.date, fmt: str) -> str:
    """Write ``date`` in one of ``DATE_FORMATS`` (English month names, locale-independent).

    Years have four digits (zero-padded: ``0999/1/3``), or two in the ``YY`` formats, which only
    name 1950-2049 (a ValueError for other years), so ``parse_date`` always reads the text back.
    """
    if not isinstance(date, _dt.date):
        raise TypeError(f"format_date: `date` must be a datetime.date, got {type(date).__name__}")
    check_choice("fmt", fmt, DATE_FORMATS, fn="format_date")
    return _FORMATS[fmt][0](date)


def parse_date(text: str, fmt: str | None = None) -> _dt.date:
    """Read a date written in one of ``DATE_FORMATS`` (``fmt`` None: try each); the inverse of
    ``format_date`` under the day-first and two-digit-year conventions of the module docstring."""
    if not isinstance(text, str):
        raise TypeError(f"parse_date: `text` must be a str, got {type(text).__name__}")
    names = DATE_FORMATS if fmt is None else (check_choice("fmt", fmt, DATE_FORMATS, fn="parse_date"),)
    for name in names:
        m = re.fullmatch(_FORMATS[name][1], text)
        if m is None:
            continue
        g = m.groupdict()
        year = int(g["y"]) if g.get("y") else _year_of_yy(int(g["yy"]))
        month = int(g["m"]) if g.get("m") else 1 + [x[: len(g["mon"])] for x in _MONTHS].index(g["mon"])
        try:
            return _dt.date(year, month, int(g["d"]))
        except ValueError as err:  # e.g. 31/02/21: the format matches but no such day exists
            raise ValueError(f"parse_date: `text` {text!r} (format {name!r}) names no calendar day: "
                             f"year {year}, month {month}, day {int(g['d'])} ({err})") from None
    raise ValueError(f"parse_date: {text!r} matches none of the formats {names}")


def date_task(*, formats: Sequence[str] = DATE_FORMATS, start: _dt.date = _dt.date(1950, 1, 1),
              end: _dt.date = _dt.date(2049, 12, 31)) -> Task:
    """Translate a date in a random format from ``formats`` to ISO ``YYYY-MM-DD``.

    Dates are uniform over the calendar days in ``[start, end]``; each pair's key is the ISO date,
    so a held-out date never appears in training in any format.
    """
    fn = "date_task"
    if isinstance(formats, str) or not isinstance(formats, Sequence) or not formats:
        raise TypeError(f"{fn}: `formats` must be a non-empty sequence of names from DATE_FORMATS, got {formats!r}")
    formats = tuple(check_choice("formats[i]", f, DATE_FORMATS, fn=fn) for f in formats)
    for name, d in (("start", start), ("end", end)):
        if not isinstance(d, _dt.date) or isinstance(d, _dt.datetime):
            raise TypeError(f"{fn}: `{name}` must be a datetime.date, got {d!r}")
    if end < start:
        raise ValueError(f"{fn}: `end` must not precede `start`, got start={start}, end={end}")
    lo, hi = 1900 + TWO_DIGIT_YEAR_PIVOT, 1999 + TWO_DIGIT_YEAR_PIVOT  # what yy can name
    if any("YYYY" not in f for f in formats) and not (lo <= start.year and end.year <= hi):
        raise ValueError(f"{fn}: a two-digit-year format needs dates in {lo}-{hi}, got start={start}, end={end}")
    first, n_days = start.toordinal(), end.toordinal() - start.toordinal() + 1
    src_chars = sorted(set(DIGITS + " ,/." + "".join(_MONTHS)))

    def sample(n, g):
        days = torch.randint(n_days, (n,), generator=g).tolist()
        which = torch.randint(len(formats), (n,), generator=g).tolist()
        out = []
        for day, f in zip(days, which):
            d = _dt.date.fromordinal(first + day)
            out.append((format_date(d, formats[f]), d.isoformat()))
        return out

    return Task(fn, Vocab(src_chars), Vocab(DIGITS + "-"), sample, key=lambda pair: pair[1])


# ----------------------------------------------------------------------------------------------
# Tensor tasks for RNN experiments (chapter 01)
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Tang poems (chapter 11): a corpus shipped inside the package, nothing downloaded
# ----------------------------------------------------------------------------------------------
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
