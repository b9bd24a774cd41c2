"""Date translation (chapters 03 and 10): a date in a human format -> ISO 8601 ``YYYY-MM-DD``.

Convention (quoted by the book): in a numeric format where day and month are both numbers, the
**day comes first** (``03/04/21`` is 3 April 2021, dd/mm/yy as in British usage), except in
year-first formats, which follow ISO 8601 order (``2021/4/3`` is also 3 April 2021). A two-digit
year ``yy`` means ``19yy`` for ``yy >= 50`` and ``20yy`` otherwise, so dates must lie in
1950-2049 when a two-digit format is used (``format_date`` refuses others). Four-digit years are
zero-padded (``0999/1/3``), so every date of years 1-9999 reads back.
"""
from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Sequence

import torch

from .._checks import check_choice
from .strings import DIGITS
from .task import Task
from .vocab import Vocab

__all__ = ["DATE_FORMATS", "NUMERIC_DATE_ORDER", "TWO_DIGIT_YEAR_PIVOT", "date_task", "format_date",
           "parse_date"]

NUMERIC_DATE_ORDER = "DMY"   # all-numeric day/month formats put the day first (dd/mm/yy)
TWO_DIGIT_YEAR_PIVOT = 50    # yy >= 50 -> 19yy, yy < 50 -> 20yy

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")


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
