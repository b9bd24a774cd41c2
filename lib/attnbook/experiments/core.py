"""The registry, runner and writer behind ``python -m attnbook.experiments`` (CHAPTER.md point 18).

An :class:`Experiment` is one empirical claim of the book: ``run(seed) -> {metric: float}``, a
predicate ``holds(metrics)`` that must be true on every seed (optionally ``overall(rows)`` over
all seeds together, e.g. a median in a range), a one-line Chinese statement, the chapter, and
the metrics the chapter's prose quotes. :func:`run_experiments` runs a selection over several
seeds (one ``run`` call per run function and seed, shared by the claims that use it);
:func:`summarize` gives per claim the seeds' values, min / median / max and whether the claim
holds on each seed; :func:`write_outputs` writes benchmarks/EXPERIMENTS.md, the raw rows as
benchmarks/EXPERIMENTS.json and the summary as the package module ``_committed.py`` (so that
:func:`where` and :func:`quote` work in Colab, which has no repository checkout).
"""
from __future__ import annotations

import json
import math
import pprint
import statistics
import time
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._checks import check_int
from .registry import REGISTRY, Experiment, register

__all__ = ["Experiment", "register", "get", "names", "select", "run_experiments", "summarize",
           "failures", "committed", "quote", "where", "write_outputs", "drift", "range_text",
           "DEFAULT_SEEDS"]

DEFAULT_SEEDS = (0, 1, 2, 3, 4)
_REGISTRY = REGISTRY


def _load_chapters() -> None:
    """Import every chapter module ``chNN`` of this package (importing one registers its claims)."""
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.name.startswith("ch") and info.name[2:].isdigit():
            importlib.import_module(f"{__package__}.{info.name}")


def get(name: str, registry: dict | None = None) -> Experiment:
    """The registered claim called ``name`` (e.g. ``"ch08.last_layer_gap"``)."""
    if registry is None:
        _load_chapters()
    reg = _REGISTRY if registry is None else registry
    if name not in reg:
        raise KeyError(f"get: `name` must be a registered claim, got {name!r}; known: {sorted(reg)}")
    return reg[name]


def names(registry: dict | None = None) -> list[str]:
    """Every registered claim, sorted."""
    if registry is None:
        _load_chapters()
    return sorted(_REGISTRY if registry is None else registry)


def select(only: Iterable[str] | None = None, registry: dict | None = None) -> list[Experiment]:
    """The claims matching ``only``: chapters ("ch08"), full names or name prefixes; all if None."""
    every = [get(n, registry) for n in names(registry)]
    if not only:
        return every
    chosen = []
    for pattern in only:
        exact = [e for e in every if e.name == pattern]
        hit = exact or [e for e in every if e.name.startswith(pattern.rstrip(".") + ".")]
        if not hit:
            raise ValueError(f"select: `only` must name a chapter (ch04) or a claim, got {pattern!r}")
        chosen += [e for e in hit if e not in chosen]
    return chosen


def _clean(metrics, fn_name: str) -> dict:
    if not isinstance(metrics, dict) or not metrics:
        raise TypeError(f"{fn_name}: run(seed) must return a non-empty dict of metrics, got {metrics!r}")
    out = {}
    for key, value in metrics.items():
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{fn_name}: metric `{key}` must be finite, got {value!r}")
        out[str(key)] = value
    return out


def run_experiments(experiments: Sequence[Experiment], seeds: Sequence[int] = DEFAULT_SEEDS, *,
                    progress: bool = True) -> list[dict]:
    """Run every claim on every seed; one row per (claim, seed): metrics, holds, seconds.

    Claims that share a run function share its call (the seconds go to the first claim).
    """
    seeds = [check_int("seed", s, fn="run_experiments", minimum=0) for s in seeds]
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"run_experiments: `seeds` must be distinct and non-empty, got {seeds}")
    cache: dict = {}
    tasks = [(e, s) for e in experiments for s in seeds]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(tasks), desc="experiments", unit="run")
    rows = []
    for exp, seed in tasks:
        if bar is not None:
            bar.set_postfix_str(f"{exp.name} seed {seed}")
        key = (exp.run, seed)
        seconds = 0.0
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = _clean(exp.run(seed), exp.name)
            seconds = time.perf_counter() - t0
        metrics = cache[key]
        rows.append(dict(claim=exp.name, seed=seed, metrics=metrics,
                         holds=bool(exp.holds(metrics)), seconds=round(seconds, 3)))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return rows


def _width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (CJK characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _fmt(value: float, fmt: str) -> str:
    return format(value, fmt)


def summarize(exp: Experiment, rows: Sequence[dict]) -> dict:
    """Per claim: seeds, every metric's values and min/median/max, holds per seed and overall."""
    mine = sorted((r for r in rows if r["claim"] == exp.name), key=lambda r: r["seed"])
    if not mine:
        raise ValueError(f"summarize: `rows` must contain rows of {exp.name!r}, got none")
    metrics = {}
    for key in mine[0]["metrics"]:
        vals = [r["metrics"][key] for r in mine]
        metrics[key] = dict(values=vals, min=min(vals), median=statistics.median(vals), max=max(vals))
    per_seed = [bool(r["holds"]) for r in mine]
    whole = True if exp.overall is None else bool(exp.overall([r["metrics"] for r in mine]))
    quotes = {m: range_text(metrics[m], exp.fmt) for m in exp.quoted}
    return dict(claim=exp.name, chapter=exp.chapter, statement=exp.claim, rule=exp.rule, unit=exp.unit,
                seeds=[r["seed"] for r in mine], metrics=metrics, holds_per_seed=per_seed,
                overall=whole, holds=all(per_seed) and whole, quoted=list(exp.quoted), quotes=quotes,
                fmt=exp.fmt, notes=exp.notes)


def _check_range_text(stats, fmt) -> None:
    if not isinstance(stats, dict) or not all(k in stats for k in ("min", "median", "max")):
        raise TypeError(f"range_text: `stats` must be a dict with 'min', 'median' and 'max' (one "
                        f"metric of summarize's 'metrics'), got {stats!r}")
    try:
        format(1.0, fmt)
    except (TypeError, ValueError):
        raise ValueError(f"range_text: `fmt` must be a format spec for numbers such as '.2f', "
                         f"got {fmt!r}") from None


def range_text(stats: dict, fmt: str) -> str:
    """The figure the prose quotes: ``min–median–max`` (en dashes), e.g. ``2.56–2.71–2.91``."""
    _check_range_text(stats, fmt)
    return "–".join(_fmt(stats[k], fmt) for k in ("min", "median", "max"))


def failures(summaries: Sequence[dict]) -> list[str]:
    """One line per claim that does not hold, naming the claim and the failing seeds."""
    out = []
    for s in summaries:
        if not s["holds"]:
            bad = [seed for seed, ok in zip(s["seeds"], s["holds_per_seed"]) if not ok]
            why = f"fails on seed(s) {bad}" if bad else "fails the all-seeds condition"
            out.append(f"{s['claim']}: {why} (claim: {s['rule']})")
    return out


def committed() -> dict:
    """The committed summaries (claim -> summary), from the generated module ``_committed``."""
    from . import _committed
    return _committed.SUMMARIES


def quote(name: str, metric: str, summaries: dict | None = None) -> str:
    """The committed ``min–median–max`` text of one quoted metric of claim ``name``."""
    summaries = committed() if summaries is None else summaries
    if name not in summaries:
        raise KeyError(f"quote: `name` must be a claim in EXPERIMENTS.md, got {name!r}")
    quotes = summaries[name]["quotes"]
    if metric not in quotes:
        raise KeyError(f"quote: `metric` must be one of {sorted(quotes)} for {name}, got {metric!r}")
    return quotes[metric]


def where(name: str, metrics: dict, *, seed: int = 0, summaries: dict | None = None,
          display: bool = True) -> dict:
    """Show where this run's quoted metrics fall in the committed multi-seed range.

    Prints a small table: per quoted metric, this run's value and the committed
    ``最小 · 中位 · 最大`` over the seeds, e.g. ``net   0.52   0.52 · 0.91 · 1.03``; returns
    ``{metric: True if inside [min, max]}`` plus ``"holds"``: the claim's predicate on this run.
    """
    exp = get(name)
    summaries = committed() if summaries is None else summaries
    if name not in summaries:
        raise KeyError(f"where: `name` must be a claim in EXPERIMENTS.md, got {name!r}; "
                       "run `python3 make.py experiments`")
    entry, out = summaries[name], {}
    n = len(entry["seeds"])
    grouped = exp.unit.startswith("group")       # one "seed" = a group of model seeds
    this = f"第 {seed} 组" if grouped else f"seed {seed}"
    many = f"{n} 组种子" if grouped else f"{n} 个种子"
    width = max(len(m) for m in exp.quoted)
    col = _width(f"本次 ({this})")
    lines = [f"{'':{width}s}  本次 ({this})  {many}：最小 · 中位 · 最大"]
    for m in exp.quoted:
        if m not in metrics:
            raise KeyError(f"where: `metrics` must contain {m!r} (quoted by {name}), got {sorted(metrics)}")
        st, value, f = entry["metrics"][m], float(metrics[m]), exp.fmt
        out[m] = st["min"] <= value <= st["max"]
        lines.append(f"{m:{width}s}  {_fmt(value, f):>{col}s}  "
                     + " · ".join(_fmt(st[k], f) for k in ("min", "median", "max")))
    out["holds"] = bool(exp.holds(_clean(metrics, name)))
    if display:
        print("\n".join(lines))
    return out


def _markdown(summaries: Sequence[dict], meta: dict) -> str:
    lines = ["# Experiments over seeds", "",
             "Generated by `python3 make.py experiments` (`python -m attnbook.experiments`); do not edit.",
             "Every empirical claim of the book, run on every seed; the chapters quote the",
             "min–median–max figures below, and `tests/book/test_experiments_sync.py` keeps them equal.", "",
             f"Date: {meta['date']}", f"Machine: {meta['machine']}", f"Command: `{meta['command']}`",
             f"Seeds: {', '.join(map(str, meta['seeds']))}", f"Time: {meta['seconds']:.0f} s", "",
             "| claim | holds | seeds |", "|---|---|---|"]
    for s in summaries:
        lines.append(f"| `{s['claim']}` | {'yes' if s['holds'] else '**NO**'} | "
                     f"{sum(s['holds_per_seed'])}/{len(s['seeds'])} |")
    for s in summaries:
        lines += ["", f"## {s['claim']}", "", f"Claim (chapter {s['chapter']}): {s['statement']}", "",
                  f"Predicate: {s['rule']}" + ("" if s["overall"] else " **(all-seeds condition fails)**"),
                  "", f"One seed = {s['unit']}.", ""]
        if s.get("notes"):
            lines += [f"Note: {s['notes']}", ""]
        lines.append("| metric | " + " | ".join(f"seed {x}" for x in s["seeds"]) + " | min | median | max |")
        lines.append("|---" * (len(s["seeds"]) + 4) + "|")
        for key, st in s["metrics"].items():
            star = " (quoted)" if key in s["quoted"] else ""
            cells = [format(v, ".4g") for v in st["values"]] + [format(st[k], ".4g") for k in ("min", "median", "max")]
            lines.append(f"| `{key}`{star} | " + " | ".join(cells) + " |")
        lines.append("| holds | " + " | ".join("yes" if h else "**no**" for h in s["holds_per_seed"])
                     + " | | | |")
        if s["quotes"]:
            lines += ["", "Quoted (min–median–max): "
                      + "; ".join(f"`{k}` {v}" for k, v in s["quotes"].items())]
    return "\n".join(lines) + "\n"


def write_outputs(rows: Sequence[dict], summaries: Sequence[dict], meta: dict, *, md: Path,
                  raw: Path, module: Path | None) -> None:
    """Write EXPERIMENTS.md, EXPERIMENTS.json (meta + raw rows) and the ``_committed`` module."""
    md.write_text(_markdown(summaries, meta), encoding="utf-8")
    raw.write_text(json.dumps(dict(meta=meta, rows=list(rows)), indent=1, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    if module is not None:
        data = {s["claim"]: dict(chapter=s["chapter"], seeds=s["seeds"], holds=s["holds"], quotes=s["quotes"],
                                 metrics={m: {k: s["metrics"][m][k] for k in ("min", "median", "max")}
                                          for m in s["quoted"]})
                for s in summaries}
        module.write_text('"""Generated by `python -m attnbook.experiments`: the committed summaries '
                          '(see benchmarks/EXPERIMENTS.md). Do not edit."""\n\nSUMMARIES = '
                          + pprint.pformat(data, width=100, sort_dicts=True) + "\n", encoding="utf-8")


def drift(fresh: Sequence[dict], old_rows: Sequence[dict], rtol: float) -> list[str]:
    """Metrics of ``fresh`` rows that differ from the committed rows by more than ``rtol``."""
    old = {(r["claim"], r["seed"]): r["metrics"] for r in old_rows}
    out = []
    for r in fresh:
        prev = old.get((r["claim"], r["seed"]))
        if prev is None:
            out.append(f"{r['claim']} seed {r['seed']}: not in the committed JSON")
            continue
        for key, value in r["metrics"].items():
            ref = prev.get(key)
            if ref is None or abs(value - ref) > rtol * max(abs(ref), 1e-12):
                out.append(f"{r['claim']} seed {r['seed']} {key}: committed {ref}, now {value}")
    return out

