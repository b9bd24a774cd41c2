"""Generated toy tasks for the chapters that train (chapters 01-03, 05-08, 10): nothing is downloaded.

Sequence-to-sequence tasks are pairs of strings ``(source, target)``, e.g. ``("3141", "1413")``
for reversal or ``("3 March 2021", "2021-03-03")`` for date translation. A ``Task`` bundles a
generator with its two vocabularies; ``make_batch`` turns pairs into padded LongTensors.

- ``copy_task``, ``reversal_task``, ``sorting_task``: random strings over an alphabet.
- ``digit_word_task``: ``"314"`` -> ``"three one four"`` (variable target length, word tokens).
- ``date_task``: a date in one of several human formats -> ISO 8601 ``YYYY-MM-DD``.
- ``first_token_recall``, ``adding_problem``: tensor tasks for RNN gradient experiments.

One concept per submodule; every name is re-exported here, so ``from attnbook.data import X``
works for all of them: ``vocab`` (``Vocab``, ``Batch``, ``make_batch``, the special ids),
``task`` (``Task``, ``split_of``), ``strings`` (copy, reversal, sorting, digit words),
``dates`` (the date grammar and ``date_task``), ``recall`` (first-token recall, the adding
problem) and ``poem_corpus`` (the shipped Tang quatrains of chapter 11).

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
The Tang poems of chapter 11 are split the same way, after grouping the poems that share two or
more lines (variant texts): a group takes the split of its first poem (``load_poems``).

Randomness: every sampler takes ``seed`` (an int) or a ``torch.Generator`` (advanced in place, so
repeated calls with the same generator give fresh, reproducible draws).
"""
from __future__ import annotations

from .dates import (DATE_FORMATS, NUMERIC_DATE_ORDER, TWO_DIGIT_YEAR_PIVOT, date_task, format_date,
                    parse_date)
from .poem_corpus import PoemCorpus, load_poems, read_poems, shared_line_pairs
from .recall import ADDING_BASELINE_MSE, adding_problem, first_token_recall
from .strings import DIGIT_WORDS, DIGITS, copy_task, digit_word_task, reversal_task, sorting_task
from .task import SPLITS, Task, split_of
from .vocab import (BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID, Batch, Vocab, make_batch)

__all__ = [
    "BOS", "BOS_ID", "DATE_FORMATS", "DIGITS", "DIGIT_WORDS", "EOS", "EOS_ID", "NUMERIC_DATE_ORDER",
    "PAD", "PAD_ID", "SPLITS", "TWO_DIGIT_YEAR_PIVOT", "UNK", "UNK_ID", "ADDING_BASELINE_MSE",
    "Batch", "Task", "Vocab", "adding_problem", "copy_task", "date_task", "digit_word_task",
    "first_token_recall", "format_date", "make_batch", "parse_date", "reversal_task",
    "sorting_task", "split_of", "PoemCorpus", "load_poems", "read_poems", "shared_line_pairs",
]
