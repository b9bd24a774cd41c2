"""Token vocabularies and padded batches of (source, target) pairs (chapters 02, 03, 10, 11)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._checks import check_choice

__all__ = ["BOS", "BOS_ID", "EOS", "EOS_ID", "PAD", "PAD_ID", "UNK", "UNK_ID", "Batch", "Vocab",
           "make_batch"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # the same in every Vocab; PAD = 0 suits ignore_index


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
