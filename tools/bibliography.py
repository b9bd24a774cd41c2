"""references.bib read with pybtex: author-year citations and reference lines as the HTML book
prints them (sphinxcontrib-bibtex, `bibtex_reference_style: author_year`), for the Colab edition."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def _latex_to_text(text: str) -> str:
    try:
        import codecs

        import latexcodec  # noqa: F401  (registers the "ulatex" codec; pybtex depends on it)
        text = codecs.decode(text, "ulatex")
    except Exception:  # noqa: BLE001 - a field latexcodec cannot decode stays as written
        pass
    return re.sub(r"[{}]", "", text).replace("--", "–").strip()


class Bibliography:
    """references.bib read with pybtex; author-year labels as the HTML book prints them."""

    def __init__(self, bib_path: str | Path):
        from pybtex.database import parse_file

        self.entries = parse_file(str(bib_path)).entries
        self._warned: set[str] = set()
        base = {key: (self._names(key), self._year(key)) for key in self.entries}
        groups: dict[tuple[str, str], list[str]] = {}
        for key, label in base.items():
            groups.setdefault(label, []).append(key)
        self.labels: dict[str, tuple[str, str]] = {}
        for (names, year), keys in groups.items():
            if len(keys) == 1:
                self.labels[keys[0]] = (names, year)
                continue
            keys.sort(key=lambda k: (self._sort_authors(k), _latex_to_text(self.entries[k].fields.get("title", ""))))
            for suffix, key in zip("abcdefghijklmnopqrstuvwxyz", keys):
                self.labels[key] = (names, year + suffix)

    def _persons(self, key: str):
        entry = self.entries[key]
        return entry.persons.get("author") or entry.persons.get("editor") or []

    def _sort_authors(self, key: str) -> str:
        return " ".join(_latex_to_text(" ".join(p.last_names + p.first_names)) for p in self._persons(key))

    def _names(self, key: str) -> str:
        last = [_latex_to_text(" ".join(p.prelast_names + p.last_names)) for p in self._persons(key)]
        if not last:
            return key
        if len(last) == 1:
            return last[0]
        if len(last) == 2:
            return f"{last[0]} and {last[1]}"
        return f"{last[0]} et al."

    def _year(self, key: str) -> str:
        return self.entries[key].fields.get("year", "n.d.")

    def label(self, key: str) -> tuple[str, str]:
        """(names, year) of a key; a key missing from references.bib shows as itself (the
        bibliography test in tests/book/test_notebooks.py reports it)."""
        if key not in self.labels:
            if key not in self._warned:
                self._warned.add(key)
                print(f"warning: citation key {key!r} is not in references.bib", file=sys.stderr)
            return key, ""
        return self.labels[key]

    def cite(self, keys: list[str], textual: bool) -> str:
        labels = [self.label(k) for k in keys]
        if textual:
            return ", ".join(f"{names} ({year})" if year else names for names, year in labels)
        return "(" + "; ".join(f"{names}, {year}" if year else names for names, year in labels) + ")"

    def reference(self, key: str) -> str:
        """One bibliography line in Markdown."""
        entry = self.entries[key]
        f = entry.fields
        authors = [
            _latex_to_text(" ".join(p.first_names + p.middle_names + p.prelast_names + p.last_names))
            for p in self._persons(key)
        ]
        authors = ["et al." if a == "others" else a for a in authors]
        names, year = self.labels[key]
        venue = f.get("journal") or f.get("booktitle") or f.get("publisher") or f.get("howpublished") or ""
        parts = [f"**{names} ({year})**. {', '.join(authors)}. *{_latex_to_text(f.get('title', key))}*."]
        if venue:
            parts.append(f"{_latex_to_text(venue)}.")
        eprint = f.get("eprint")
        if eprint and f.get("archiveprefix", f.get("archivePrefix", "arXiv")).lower() == "arxiv":
            parts.append(f"[arXiv:{eprint}](https://arxiv.org/abs/{eprint})")
        elif f.get("doi"):
            parts.append(f"[doi:{f['doi']}](https://doi.org/{f['doi']})")
        elif f.get("url"):
            parts.append(f"<{f['url']}>")
        return "- " + " ".join(parts)

    def sort_key(self, key: str):
        names, year = self.labels[key]
        return (names.lower(), year)
