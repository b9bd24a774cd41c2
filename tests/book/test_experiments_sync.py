"""The chapters quote benchmarks/EXPERIMENTS.md: every multi-seed figure in the prose is current.

A multi-seed figure is written ``min–median–max`` (three numbers joined by en dashes, e.g.
``2.59–2.76–2.91``). For every chapter with registered claims (attnbook.experiments):
- every such triple in its Markdown is one of the current quoted figures of its own claims (so
  a number left behind after `make.py experiments` changed it fails here);
- every quoted metric of every claim appears in its chapter at least once;
and benchmarks/EXPERIMENTS.md is the rendering of the committed rows shipped in the package
(lib/attnbook/experiments/data/chNN.json), and every claim holds on every committed run.
"""
import re
from pathlib import Path

import nbformat
import pytest

from attnbook import experiments
from attnbook.experiments import core

ROOT = Path(__file__).resolve().parents[2]
NUM = r"-?\d+(?:\.\d+)?"
TRIPLE = re.compile(rf"(?<![\d.–]){NUM}–{NUM}–{NUM}(?![\d–])")
# a min-median-max written another way (hyphens, em dashes, tildes, spaced en dashes): TRIPLE
# would not see it, so a stale figure written like this would escape the check below
DEC = r"\d+\.\d+"
SEP = r"(?:\s*[-—~～]\s*|\s+–\s*|\s*–\s+)"
LOOKALIKE = re.compile(rf"{DEC}{SEP}{DEC}{SEP}{DEC}")


def chapter_path(chapter):
    (path,) = sorted((ROOT / "chapters").glob(f"{chapter}_*.ipynb"))
    return path


def markdown(path):
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def fresh_summaries():
    """Summaries recomputed from the committed rows (package data) with today's rules."""
    return {n: core.summarize(experiments.get(n), experiments.committed_rows(experiments.get(n).chapter))
            for n in experiments.names()}


CHAPTERS = sorted({experiments.get(n).chapter for n in experiments.names()})


def test_the_triple_pattern_finds_figures_and_nothing_else():
    text = "比值 2.59–2.76–2.91，差值 -0.17–-0.08–0.13；区间 10%–26%、0.5–1.5、种子 0–39 不算"
    assert TRIPLE.findall(text) == ["2.59–2.76–2.91", "-0.17–-0.08–0.13"]


def test_the_lookalike_pattern_finds_other_dashes_only():
    text = "0.52-0.91-1.03，0.52 – 0.91 – 1.03，0.52—0.91—1.03，0.52~0.91~1.03；正确的 0.52–0.91–1.03，日期 2021-03-04"
    assert len(LOOKALIKE.findall(text)) == 4 and TRIPLE.findall(text) == ["0.52–0.91–1.03"]


@pytest.mark.parametrize("chapter", sorted({experiments.get(n).chapter for n in experiments.names()}))
def test_chapter_writes_every_range_with_en_dashes(chapter):
    path = chapter_path(chapter)
    odd = LOOKALIKE.findall(markdown(path))
    assert not odd, f"{path.name}: write min–median–max with en dashes and no spaces (so the sync check sees it): {odd}"


def test_committed_files_agree_and_every_claim_holds(tmp_path):
    fresh = fresh_summaries()
    for name, s in fresh.items():
        # CHAPTER.md point 18: >= 10 seeds, each under >= 2 CPU kernel paths
        assert len(s["seeds"]) >= 10, f"{name}: needs >= 10 seeds, has {s['seeds']}"
        per_seed = {seed: {p["env"] for p in s["per_run"] if p["seed"] == seed} for seed in s["seeds"]}
        assert sum(len(e) >= 2 for e in per_seed.values()) >= 10, \
            f"{name}: needs >= 10 seeds measured under >= 2 environments, has {per_seed}"
        assert s["holds"], f"{name}: {core.failures([s])}"
    from attnbook.experiments import __main__ as cli
    cli.render(tmp_path / "E.md")
    md = (ROOT / "benchmarks" / "EXPERIMENTS.md").read_text(encoding="utf-8")
    assert (tmp_path / "E.md").read_text(encoding="utf-8") == md, \
        "benchmarks/EXPERIMENTS.md is not the rendering of the committed rows; run " \
        "`python -m attnbook.experiments --render`"


def test_a_changed_row_changes_the_rendering(tmp_path):
    """Control for the check above: the rendering depends on the rows."""
    from attnbook.experiments import store
    name = "ch09.performer"
    data = store.load("09")
    data["rows"] = [dict(r, metrics=dict(r["metrics"], slope=-0.5)) if r["claim"] == name else r
                    for r in data["rows"]]
    exp = experiments.get(name)
    assert core.summarize(exp, data["rows"])["quotes"] != fresh_summaries()[name]["quotes"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_quotes_equal_experiments_md(chapter):
    fresh = {n: s for n, s in fresh_summaries().items() if s["chapter"] == chapter}
    path = chapter_path(chapter)
    text = markdown(path)
    current = {q for s in fresh.values() for q in s["quotes"].values()}
    stale = sorted(set(TRIPLE.findall(text)) - current)
    assert not stale, (f"{path.name} quotes {stale}, which benchmarks/EXPERIMENTS.md no longer has; "
                       f"copy the current min–median–max figures: {sorted(current)}")
    missing = [f"{n}:{m} ({q})" for n, s in fresh.items() for m, q in s["quotes"].items() if q not in text]
    assert not missing, f"{path.name} does not quote {missing} (from benchmarks/EXPERIMENTS.md)"


def test_a_drifted_number_is_caught(tmp_path):
    """The check above, on a copy of a chapter's text in which one quoted figure changed."""
    fresh = fresh_summaries()
    name = next(n for n in sorted(fresh) if fresh[n]["quotes"])
    quote = next(iter(fresh[name]["quotes"].values()))
    text = f"正文引用 {quote}。"            # independent of whether a chapter is re-quoted yet
    lo, mid, hi = re.findall(NUM, quote)
    drifted = text.replace(quote, f"{lo}–{mid}–{hi}9")
    current = {q for s in fresh.values() for q in s["quotes"].values()}
    assert set(TRIPLE.findall(drifted)) - current
