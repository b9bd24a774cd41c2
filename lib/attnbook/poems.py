"""Baselines and measurements for the Tang-poem language model (chapter 11).

- :class:`NgramLM`: the unigram and the interpolated bigram model the GPT must beat, scored
  on the same targets (every poem character, the punctuation and EOS) as ``gpt.perplexity``.
- :func:`poem_form`: what a generated poem gets right -- four lines of equal length 5 or 7,
  punctuation in place, the even lines' final characters rhyming by a simple check.
- :func:`copied_ngrams`: the share of a poem's character n-grams found in the training poems.
- :func:`attention_to`: how much attention, per head, goes to a chosen kind of key position
  (the line start, the same slot of the previous line), averaged over many poems.

The rhyme check is deliberately simple, and it measures modern Mandarin, not Tang phonology:
a character's rhyme group is its modern final (pypinyin's ``FINALS``, stored in
``_data/finals.tsv``) folded into the 13 groups of the traditional 十三辙 (medials dropped: ``ian``,
``uan`` and ``an`` are one group). Lines 2 and 4 "rhyme" when their last characters fall in one
group. On the held-out poems this holds for about 85 % of them, against about 10 % for two
random line endings and for the unrhymed lines 1 and 3: the check separates rhyme from chance,
though Middle Chinese rhymes that modern Mandarin split or merged are misjudged, and a
character with several readings gets pypinyin's most common one (还 is hai, not huan).

A sampled poem may hold UNK (a character outside the vocabulary), which ``Vocab.decode`` writes
as the five characters ``<unk>``. Every check here counts it as one character: the text is
read through :func:`unk_as_one` first (``<unk>`` -> :data:`UNK_MARK`, one character), so a
7x4 poem with an UNK has the right lengths; and an UNK ending line 2 or 4 never rhymes (its
reading is unknown).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ._checks import check_choice, check_float, check_int, check_tensor, check_tokens, describe
from .data import BOS_ID, EOS_ID, PAD_ID
from .data.vocab import UNK

__all__ = ["FINAL_GROUPS", "NgramLM", "PoemForm", "UNK_MARK", "attention_to", "copied_ngrams",
           "poem_form", "rhyme_groups", "rhymes", "split_lines", "unk_as_one"]

PUNCT = "，。"
UNK_MARK = "□"        # one character for UNK; not in the corpus, not in the rhyme table


def unk_as_one(text: str) -> str:
    """``text`` with every ``<unk>`` (how ``Vocab.decode`` writes UNK) as one :data:`UNK_MARK`."""
    _check_str("text", text, "unk_as_one")
    return text.replace(UNK, UNK_MARK)


class NgramLM:
    """A unigram (``order=1``) or interpolated bigram (``order=2``) model of token ids.

        p_1(b) = (c(b) + 1) / (N + V)                       add-one unigram
        p_2(b | a) = lam c(a, b) / c(a) + (1 - lam) p_1(b)   (p_1 alone when c(a) = 0)

    Counted on the (previous, next) pairs of ``ids`` ``(N, T)`` whose next is not PAD, which
    are the targets ``gpt.lm_loss`` scores. ``ids``: a non-empty ``torch.long`` tensor with every
    id in ``[0, vocab_size)``.
    """

    def __init__(self, ids: torch.Tensor, vocab_size: int, *, order: int = 2, lam: float = 0.5):
        vocab_size = check_int("vocab_size", vocab_size, fn="NgramLM")
        check_tokens("ids", ids, vocab_size, fn="NgramLM")
        self.order = check_int("order", order, fn="NgramLM", minimum=1)
        if order > 2:
            raise ValueError(f"NgramLM: `order` must be 1 or 2, got {order}")
        self.lam = check_float("lam", lam, fn="NgramLM", minimum=0.0, maximum=1.0)
        v = self.vocab_size = check_int("vocab_size", vocab_size, fn="NgramLM")
        a, b = _pairs(ids)
        uni = torch.bincount(b, minlength=v).double() + 1.0
        self.unigram = uni / uni.sum()                                 # (V,)
        self.counts = torch.zeros(v, v, dtype=torch.float64)
        self.counts.index_put_((a, b), torch.ones(len(a), dtype=torch.float64), accumulate=True)

    def probs(self) -> torch.Tensor:
        """``(V, V)`` table: row a is p(next | a) (every row the unigram for order 1)."""
        if self.order == 1:
            return self.unigram.expand(self.vocab_size, -1)
        row = self.counts.sum(1, keepdim=True)
        p = self.lam * self.counts / row.clamp(min=1) + (1 - self.lam) * self.unigram
        return torch.where(row > 0, p, self.unigram.expand_as(p))

    def perplexity(self, ids: torch.Tensor) -> float:
        """exp of the mean negative log-likelihood of the non-PAD targets of ``ids`` ``(N, T)``.

        Raises ``ValueError`` when no target is left (all PAD), as ``gpt.perplexity`` does.
        """
        check_tokens("ids", ids, self.vocab_size, fn="NgramLM.perplexity")
        a, b = _pairs(ids)
        if not len(b):
            raise ValueError(f"NgramLM.perplexity: `ids` must hold at least one non-PAD target "
                             f"(ids[:, 1:] != {PAD_ID}), got shape {tuple(ids.shape)} with none")
        return math.exp(-float(self.probs()[a, b].log().mean()))

    def sample(self, n: int, *, max_len: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` sequences ``(n, 1 + max_len)`` starting at BOS, drawn token by token.

        ``n``, ``max_len``: ints >= 0; ``generator``: a ``torch.Generator``.
        """
        _check_sample(n, max_len, generator)
        p = self.probs().float()
        ids = torch.full((n, 1), BOS_ID, dtype=torch.long)
        for _ in range(max_len):
            nxt = torch.multinomial(p[ids[:, -1]], 1, generator=generator)   # (n, 1)
            ids = torch.cat([ids, nxt], 1)
        return ids


def _check_sample(n, max_len, generator) -> None:
    check_int("n", n, fn="NgramLM.sample", minimum=0)
    check_int("max_len", max_len, fn="NgramLM.sample", minimum=0)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"NgramLM.sample: `generator` must be a torch.Generator, got "
                        f"{type(generator).__name__}")


def _check_str(name, value, fn) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{fn}: `{name}` must be a str, got {type(value).__name__}")


def _pairs(ids):
    a, b = ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)
    keep = b != PAD_ID
    return a[keep], b[keep]


def split_lines(poem: str) -> list[str]:
    """The lines of a poem: the text between punctuation marks (``，``/``。``), marks dropped."""
    _check_str("poem", poem, "split_lines")
    lines, cur = [], ""
    for ch in poem:
        if ch in PUNCT:
            lines.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        lines.append(cur)
    return lines


class PoemForm(NamedTuple):
    """The form checks of one poem (see :func:`poem_form`)."""

    lengths_ok: bool     # exactly 4 lines, all 5 or all 7 characters
    punct_ok: bool       # "，" after lines 1 and 3, "。" after lines 2 and 4, nothing else
    rhyme_ok: bool       # lines 2 and 4 end in one rhyme group (False unless lengths_ok)

    @property
    def well_formed(self) -> bool:
        return self.lengths_ok and self.punct_ok


# modern finals -> the 13 rhyme groups of 十三辙 (medials i/u/ü dropped)
FINAL_GROUPS = {
    "a": "a", "ia": "a", "ua": "a", "o": "o", "uo": "o", "e": "o", "ie": "ie", "ve": "ie",
    "ai": "ai", "uai": "ai", "ei": "ei", "uei": "ei", "ao": "ao", "iao": "ao", "ou": "ou",
    "iou": "ou", "an": "an", "ian": "an", "uan": "an", "van": "an", "en": "en", "in": "en",
    "uen": "en", "vn": "en", "ang": "ang", "iang": "ang", "uang": "ang", "eng": "eng",
    "ing": "eng", "ong": "eng", "iong": "eng", "ueng": "eng", "i": "i", "v": "i", "er": "i",
    "u": "u",
}


@functools.lru_cache(maxsize=1)
def rhyme_groups() -> dict[str, str]:
    """Character -> rhyme group (module docstring), for every character of the corpus."""
    from importlib.resources import files
    text = files("attnbook").joinpath("_data", "finals.tsv").read_text(encoding="utf-8")
    return {ch: FINAL_GROUPS[f] for ch, f in (line.split("\t") for line in text.splitlines())}


def poem_form(poem: str, groups: dict[str, str] | None = None) -> PoemForm:
    """Check one poem's form: line lengths, punctuation, rhyme of lines 2 and 4 (module docstring).

    ``poem``: a str; ``groups``: character -> rhyme group (default :func:`rhyme_groups`).
    UNK (``<unk>`` or :data:`UNK_MARK`) counts as one character and never rhymes.
    """
    _check_str("poem", poem, "poem_form")
    if groups is not None and not isinstance(groups, dict):
        raise TypeError(f"poem_form: `groups` must be a dict or None, got {type(groups).__name__}")
    poem = unk_as_one(poem)
    lines = split_lines(poem)
    n = len(lines[0]) if lines else 0
    lengths_ok = len(lines) == 4 and n in (5, 7) and all(len(x) == n for x in lines)
    punct_ok = lengths_ok and poem == "".join(x + m for x, m in zip(lines, "，。，。"))
    groups = rhyme_groups() if groups is None else groups
    rhyme_ok = lengths_ok and rhymes(lines[1][-1], lines[3][-1], groups)
    return PoemForm(lengths_ok, punct_ok, rhyme_ok)


def rhymes(a: str, b: str, groups: dict[str, str]) -> bool:
    """Whether characters ``a`` and ``b`` fall in one rhyme group of ``groups``; False when
    either is UNK (:data:`UNK_MARK`) or has no group. ``a``, ``b``: str; ``groups``: a dict."""
    _check_str("a", a, "rhymes")
    _check_str("b", b, "rhymes")
    if not isinstance(groups, dict):
        raise TypeError(f"rhymes: `groups` must be a dict, got {type(groups).__name__}")
    if UNK_MARK in (a, b) or a not in groups:
        return False
    return groups.get(b) == groups[a]


def copied_ngrams(poem: str, train_ngrams: set[str], n: int = 4) -> float:
    """Share of the poem's character n-grams (inside lines) that occur in ``train_ngrams``.

    ``n`` >= 1; UNK counts as one character (:func:`unk_as_one`). A poem with no line of n
    characters has no n-gram: the share is 0.0.
    """
    _check_str("poem", poem, "copied_ngrams")
    if not isinstance(train_ngrams, (set, frozenset)):
        raise TypeError(f"copied_ngrams: `train_ngrams` must be a set of str (see ngram_set), "
                        f"got {type(train_ngrams).__name__}")
    n = check_int("n", n, fn="copied_ngrams")
    grams = [x[i:i + n] for x in split_lines(unk_as_one(poem)) for i in range(len(x) - n + 1)]
    return sum(g in train_ngrams for g in grams) / len(grams) if grams else 0.0


def ngram_set(poems: list[str], n: int = 4) -> set[str]:
    """Every character n-gram inside a line of ``poems`` (``n`` >= 1)."""
    if isinstance(poems, str) or not all(isinstance(p, str) for p in poems):
        raise TypeError("ngram_set: `poems` must be a list of str")
    n = check_int("n", n, fn="ngram_set")
    return {x[i:i + n] for p in poems for x in split_lines(p) for i in range(len(x) - n + 1)}


def attention_to(weights: torch.Tensor, ids: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean attention per head from poem characters to one kind of key (chapter 11).

    ``weights`` ``(B, H, T, T)`` of one block on ``ids`` ``(B, T)`` (BOS, poem, EOS);
    ``kind``: ``"bos"`` (position 0), ``"line_start"`` (the first character of the query's
    own line), ``"prev_line_same"`` (the same slot of the previous line; only queries from
    line 2 on), ``"previous"`` (the key just before the query), ``"rhyme_slot"`` (line 2's last
    character, seen from the one query that predicts line 4's last character: the second-last
    character of line 4). Queries: the poem characters that are not punctuation, in the rows
    that hold a quatrain (24 or 32 tokens between BOS and EOS/PAD); other rows are skipped.
    Returns ``(H,)``: the mean, over those queries, of the weight on that key. Raises
    ``ValueError`` when no row holds a quatrain (a mean over nothing is not zero attention).
    """
    kind = _check_attention_to(weights, ids, kind)
    b, h, t, _ = weights.shape
    out = torch.zeros(h, dtype=torch.float64)
    count = 0
    for r in range(b):
        row = ids[r].tolist()
        n = next((i for i, tok in enumerate(row[1:], 1) if tok in (EOS_ID, PAD_ID)), t)
        period = _line_period(row, n)
        if period is None:
            continue
        for q in range(1, n):
            slot = (q - 1) % period
            if slot == period - 1:                                     # a punctuation mark
                continue
            key = {"bos": 0, "line_start": q - slot, "previous": q - 1,
                   "prev_line_same": q - period, "rhyme_slot": 2 * period - 1}[kind]
            if kind == "rhyme_slot" and q != 4 * period - 2:       # predicts line 4's end
                continue
            if key < 1 and kind == "prev_line_same":
                continue
            out += weights[r, :, q, key].double()
            count += 1
    if not count:
        raise ValueError(f"attention_to: no row of `ids` {tuple(ids.shape)} holds a quatrain "
                         f"(BOS, then 24 or 32 tokens before EOS/PAD): nothing to average")
    return out / count


ATTENTION_KINDS = ("bos", "line_start", "previous", "prev_line_same", "rhyme_slot")


def _check_attention_to(weights, ids, kind) -> str:
    fn = "attention_to"
    kind = check_choice("kind", kind, ATTENTION_KINDS, fn=fn)
    check_tensor("weights", weights, fn=fn, min_ndim=4)
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.long:
        got = describe(ids) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"{fn}: `ids` must be a (B, T) torch.long tensor, got {got}")
    b, t = ids.shape
    if weights.ndim != 4 or weights.shape[0] != b or weights.shape[2:] != (t, t):
        raise ValueError(f"{fn}: `weights` must be (B, H, T, T) for `ids` (B, T) = {(b, t)}, "
                         f"got {describe(weights)}")
    return kind


def _line_period(row: list[int], n: int) -> int | None:
    """6 or 8 (line length + its mark) for a poem row of n tokens (BOS + 24 or 32), else None."""
    return {25: 6, 33: 8}.get(n)
