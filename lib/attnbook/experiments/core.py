"""The runner, summaries, ``where`` and the writer behind ``python -m attnbook.experiments``.

An :class:`~.registry.Experiment` is one empirical claim of the book: ``run(seed) -> {metric:
float}``, a rule (data, :mod:`.rules`) that must hold on every run with a margin, rules over all
runs together (rates, medians), a one-line Chinese statement and the metrics the prose quotes.
:func:`run_experiments` runs a selection over seeds (one ``run`` call per run function and seed,
shared by the claims that use it); :func:`summarize` gives per claim every metric's values and
min / median / max over all runs (seeds x environments), the worst run's margin and the rates;
:func:`committed` summarizes the committed rows shipped in the package (:mod:`.store`).

In a notebook a training run is an illustration: :func:`where` shows where this run falls beside
the committed runs of the same seed and returns a :class:`Placement` (no verdict to assert);
:func:`check_live` compares a deterministic measurement with the committed rows of the same
seed, with a tolerance measured from those rows' own spread across environments.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .._checks import check_int
from . import store
from .registry import REGISTRY, Experiment, register

__all__ = ["Experiment", "register", "get", "names", "select", "run_experiments", "summarize",
           "failures", "committed", "committed_rows", "rows", "quote", "rate_text", "where",
           "Placement", "check_live", "live_tolerance", "range_text", "drift", "markdown",
           "DEFAULT_SEEDS", "SWEEP_SEEDS"]

DEFAULT_SEEDS = (0, 1, 2, 3, 4)
SWEEP_SEEDS = tuple(range(10))
THIN = 0.05                     # a worst-run margin below this is marked thin in EXPERIMENTS.md


def _load_chapters() -> None:
    """Import every chapter module ``chNN`` of this package (importing one registers its claims)."""
    import importlib
    import pkgutil
    from pathlib import Path
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.name.startswith("ch") and info.name[2:].isdigit():
            importlib.import_module(f"{__package__}.{info.name}")


def get(name: str, registry: dict | None = None) -> Experiment:
    """The registered claim called ``name`` (e.g. ``"ch08.last_layer_gap"``)."""
    if not isinstance(name, str):
        raise TypeError(f"get: `name` must be a claim name such as 'ch08.warmup', got {name!r}")
    if registry is None:
        _load_chapters()
    reg = REGISTRY if registry is None else registry
    if name not in reg:
        raise ValueError(f"get: `name` must be a registered claim, got {name!r}; known: {sorted(reg)}")
    return reg[name]


def names(registry: dict | None = None) -> list[str]:
    """Every registered claim, sorted."""
    if registry is None:
        _load_chapters()
    return sorted(REGISTRY if registry is None else registry)


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


def _clean(metrics, who: str) -> dict:
    if not isinstance(metrics, dict) or not metrics:
        raise TypeError(f"{who}: the metrics must be a non-empty dict, got {metrics!r}")
    out = {}
    for key, value in metrics.items():
        if value is None or isinstance(value, (str, bytes)):
            raise TypeError(f"{who}: metric `{key}` must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{who}: metric `{key}` must be finite, got {value!r}")
        out[str(key)] = value
    return out


def run_experiments(experiments: Sequence[Experiment], seeds: Sequence[int] = DEFAULT_SEEDS, *,
                    progress: bool = True, env: str = "here") -> list[dict]:
    """Run every claim on every seed; one row per (claim, seed): metrics, env, seconds.

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
    out = []
    for exp, seed in tasks:
        if bar is not None:
            bar.set_postfix_str(f"{exp.name} seed {seed}")
        key = (exp.run, seed)
        seconds = 0.0
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = _clean(exp.run(seed), exp.name)
            seconds = time.perf_counter() - t0
        out.append(dict(claim=exp.name, seed=seed, env=env, metrics=cache[key],
                        seconds=round(seconds, 3)))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return out


def _width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (CJK characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def summarize(exp: Experiment, rows: Sequence[dict]) -> dict:
    """Per claim: every metric's values and min/median/max over all runs, the per-run rule's
    verdict and margin on each run, the worst margin, the rules over the runs (rates with their
    95 % interval), and whether the claim holds."""
    fn = "summarize"
    if not isinstance(exp, Experiment):
        raise TypeError(f"{fn}: `exp` must be a registered Experiment, got {exp!r}")
    mine = sorted((r for r in rows if r["claim"] == exp.name), key=lambda r: (r["seed"], r["env"]))
    if not mine:
        raise ValueError(f"{fn}: `rows` must contain rows of {exp.name!r}, got none")
    keys = set(mine[0]["metrics"])
    for r in mine[1:]:
        if set(r["metrics"]) != keys:
            raise ValueError(f"{fn}: the runs of {exp.name} return different metrics: seed "
                             f"{mine[0]['seed']} ({mine[0]['env']}) has {sorted(keys)}, seed "
                             f"{r['seed']} ({r['env']}) has {sorted(r['metrics'])}")
    missing = exp.keys() - keys
    if missing:
        raise ValueError(f"{fn}: the rows of {exp.name} lack metrics its rules read: {sorted(missing)}")
    metrics = {}
    for key in mine[0]["metrics"]:
        vals = [r["metrics"][key] for r in mine]
        metrics[key] = dict(values=vals, min=min(vals), median=statistics.median(vals),
                            max=max(vals))
    per_run = [dict(seed=r["seed"], env=r["env"], holds=exp.rule.holds(r["metrics"]),
                    margin=exp.rule.margin(r["metrics"])) for r in mine]
    worst = min(per_run, key=lambda p: p["margin"])
    weakest = exp.rule.weakest(mine[per_run.index(worst)]["metrics"]) \
        if hasattr(exp.rule, "weakest") else exp.rule
    runs = [r["metrics"] for r in mine]
    overall = [dict(rule=a.text(), **a.evaluate(runs)) for a in exp.overall]
    margins = ([worst["margin"]] if exp.rule.keys() else []) + [o["margin"] for o in overall]
    holds = all(p["holds"] for p in per_run) and all(o["holds"] for o in overall)
    quotes = {m: range_text(metrics[m], COUNT if m in exp.counts else exp.fmt) for m in exp.quoted}
    rates = {o["rule"]: {k: o[k] for k in ("k", "n", "lo", "hi")} for o in overall if "k" in o}
    return dict(claim=exp.name, chapter=exp.chapter, statement=exp.claim, rule=exp.text(),
                unit=exp.unit, seeds=sorted({r["seed"] for r in mine}),
                envs=sorted({r["env"] for r in mine}), runs=len(mine), metrics=metrics,
                per_run=per_run, holds_per_run=[p["holds"] for p in per_run],
                margin=min(margins) if margins else math.inf,
                worst=dict(seed=worst["seed"], env=worst["env"],
                           clause=weakest.text() if weakest is not None else ""),
                overall=overall, rates=rates, holds=holds, quoted=list(exp.quoted),
                quotes=quotes, fmt=exp.fmt, notes=exp.notes)


def _worst_where(s: dict) -> str:
    """Where a summary's worst margin is: one run's clause, or a rule over the runs when that
    is lower (the per-run label would otherwise name a clause that is far from its edge)."""
    rates = [o for o in s["overall"] if o["margin"] == s["margin"]]
    per_run = min((p["margin"] for p in s["per_run"]), default=math.inf)
    if rates and s["margin"] < per_run:
        return f"over the runs: `{rates[0]['rule']}`"
    return f"seed {s['worst']['seed']}, {s['worst']['env']}: `{s['worst']['clause']}`"


def _check_range_text(stats, fmt) -> None:
    if not isinstance(stats, dict) or not all(k in stats for k in ("min", "median", "max")):
        raise TypeError(f"range_text: `stats` must be a dict with 'min', 'median' and 'max' (one "
                        f"metric of summarize's 'metrics'), got {stats!r}")
    try:
        _number(1.0, fmt)
    except (TypeError, ValueError):
        raise ValueError(f"range_text: `fmt` must be a format spec for numbers such as '.2f', "
                         f"got {fmt!r}") from None


COUNT = "count"  # the format of a whole-number metric: 2, and 38.5 for a median between two counts


def _number(value, fmt: str) -> str:
    if fmt == COUNT:
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return format(value, fmt)


def range_text(stats: dict, fmt: str) -> str:
    """The figure the prose quotes: ``min–median–max`` (en dashes), e.g. ``2.56–2.71–2.91``;
    ``fmt=COUNT`` for whole numbers (``38–39–41``)."""
    _check_range_text(stats, fmt)
    return "–".join(_number(stats[k], fmt) for k in ("min", "median", "max"))


def failures(summaries: Sequence[dict]) -> list[str]:
    """One line per claim that does not hold, naming the claim, the failing runs and rules."""
    out = []
    for s in summaries:
        if s["holds"]:
            continue
        bad = [f"seed {p['seed']} ({p['env']})" for p in s["per_run"] if not p["holds"]]
        why = [f"fails on {', '.join(bad)}"] if bad else []
        why += [f"fails '{o['rule']}'" for o in s["overall"] if not o["holds"]]
        out.append(f"{s['claim']}: {'; '.join(why)} (rule: {s['rule']})")
    return out


# ---------------------------------------------------------------- the committed rows

def committed_rows(chapter: str | None = None) -> list[dict]:
    """The committed rows (of one chapter, e.g. ``"08"``, or of all), from the package data."""
    chapters = [chapter] if chapter is not None else sorted({get(n).chapter for n in names()})
    return [r for c in chapters for r in store.load(c)["rows"]]


@functools.lru_cache(maxsize=None)
def _committed_cached() -> dict:
    out = {}
    by_chapter: dict = {}
    for n in names():
        exp = get(n)
        if exp.chapter not in by_chapter:
            by_chapter[exp.chapter] = store.load(exp.chapter)["rows"]
        if any(r["claim"] == n for r in by_chapter[exp.chapter]):
            out[n] = summarize(exp, by_chapter[exp.chapter])
    return out


def committed() -> dict:
    """The committed summaries, ``{claim: summarize(...)}``, from the rows shipped in the package.

    Each has ``holds``, ``seeds``, ``runs``, ``envs``, ``margin``, ``quotes``, ``metrics``
    (per metric ``values``, ``min``, ``median``, ``max``) and ``rates``.
    """
    return _committed_cached()


def environments(chapter: str) -> dict:
    """The environment records of one chapter's committed rows, ``{label: record}``."""
    return store.load(chapter)["envs"]


def rows(name: str, *, seed: int | None = None, env: str | None = None) -> list[dict]:
    """The committed rows of claim ``name`` (optionally of one seed / one environment label):
    ``[{"claim", "seed", "env", "metrics", "seconds"}]``."""
    exp = get(name)
    return [r for r in store.load(exp.chapter)["rows"] if r["claim"] == name
            and (seed is None or r["seed"] == seed) and (env is None or r["env"] == env)]


def _summary(name: str, summaries: dict | None, who: str) -> dict:
    summaries = committed() if summaries is None else summaries
    if not isinstance(name, str):
        raise TypeError(f"{who}: `name` must be a claim name such as 'ch08.warmup', got {name!r}")
    if name not in summaries:
        raise ValueError(f"{who}: `name` must be a claim with committed rows, got {name!r}; "
                         "run `python3 make.py experiments`")
    return summaries[name]


def quote(name: str, metric: str, summaries: dict | None = None) -> str:
    """The committed ``min–median–max`` text of one quoted metric of claim ``name``."""
    quotes = _summary(name, summaries, "quote")["quotes"]
    if metric not in quotes:
        raise ValueError(f"quote: `metric` must be one of {sorted(quotes)} for {name}, got {metric!r}")
    return quotes[metric]


def rate_text(name: str, index: int = 0, summaries: dict | None = None) -> str:
    """One rate of claim ``name`` as the prose quotes it: ``k/n（95 % 区间 lo–hi）``."""
    s = _summary(name, summaries, "rate_text")
    rates = [o for o in s["overall"] if "k" in o]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(rates):
        raise ValueError(f"rate_text: `index` must be in 0..{len(rates) - 1} for {name} "
                         f"({len(rates)} rates), got {index!r}")
    o = rates[index]
    return f"{o['k']}/{o['n']}（95 % 区间 {o['lo']:.2f}–{o['hi']:.2f}）"


# ---------------------------------------------------------------- a live run beside them

OUTSIDE_NOTE = ("本次运行有数值落在已提交的范围之外：另一种 CPU 的舍入会给出另一条训练轨迹，"
                "单次运行只是示例；结论以 EXPERIMENTS.md 里多个种子、多种 CPU 内核路径的结果为准。")


@dataclass(frozen=True)
class Placement:
    """Where one live run falls among the committed runs (what :func:`where` returns).

    ``rows``: per quoted metric ``{"this", "same_seed" {env: value}, "min", "median", "max",
    "inside"}``; ``outside``: the metrics outside the committed range. There is deliberately no
    verdict on the claim: a live training run is an illustration (CHAPTER.md point 18), so this
    object is not subscriptable and ``where(...)["holds"]`` fails with an explanation.
    """

    name: str
    seed: int
    rows: dict = field(repr=False)
    outside: tuple
    text: str = field(repr=False)

    def __getitem__(self, key):
        raise TypeError(f"where() returns a Placement, not a verdict (asked for {key!r}): a live "
                        "training run is an illustration (CHAPTER.md point 18); assert that the run "
                        "is sane, and read the claim from experiments.committed()")

    def _ipython_display_(self):         # the table was printed already
        return None

    def __str__(self):
        return self.text


def _fmt(value, fmt):
    return _number(value, fmt)


def where(name: str, metrics: dict, *, seed: int = 0, summaries: dict | None = None,
          display: bool = True) -> Placement:
    """Show where this run's quoted metrics fall beside the committed runs.

    Prints one table: per quoted metric, this run's value, the committed value of the same seed in
    each recorded environment, and ``最小 · 中位 · 最大`` over all committed runs; where this run
    falls outside that range, one more line says that another CPU's rounding gives another
    trajectory. Returns a :class:`Placement` (no verdict: nothing here to assert on a live run).
    """
    fn = "where"
    exp = get(name) if isinstance(name, str) else get(name)
    if metrics is None or not isinstance(metrics, dict):
        raise TypeError(f"{fn}: `metrics` must be the dict of metrics of one run of {name}, "
                        f"got {type(metrics).__name__}")
    seed = check_int("seed", seed, fn=fn, minimum=0)
    entry = _summary(name, summaries, fn)
    quoted = exp.quoted or tuple(sorted(exp.keys()))
    missing = [m for m in quoted if m not in metrics]
    if missing:
        raise ValueError(f"{fn}: `metrics` must contain {missing} (quoted by {name}); it has "
                         f"{sorted(metrics)}")
    this = _clean({m: metrics[m] for m in quoted}, fn)
    same = {r["env"]: r["metrics"] for r in rows(name, seed=seed)} if summaries is None else {}
    grouped = exp.unit.startswith("group")
    tag = f"第 {seed} 组" if grouped else f"seed {seed}"
    envs = sorted(same)
    n, ne = entry["runs"], len(entry["envs"])
    head = [f"本次 ({tag})"] + [f"{tag} @ {e}" for e in envs] + [f"{n} 次运行：最小 · 中位 · 最大"]
    width = max(len(m) for m in quoted)
    out, lines = {}, []
    cols = [max(_width(h), 8) for h in head[:-1]]
    lines.append(f"{'':{width}s}  " + "  ".join(f"{h:>{c - _width(h) + len(h)}s}"
                                               for h, c in zip(head[:-1], cols)) + "  " + head[-1])
    for m in quoted:
        st, f = entry["metrics"][m], COUNT if m in exp.counts else exp.fmt
        value = this[m]
        inside = st["min"] <= value <= st["max"]
        out[m] = dict(this=value, same_seed={e: same[e][m] for e in envs if m in same[e]},
                      min=st["min"], median=st["median"], max=st["max"], inside=inside)
        cells = [_fmt(value, f)] + [_fmt(same[e][m], f) if m in same[e] else "-" for e in envs]
        lines.append(f"{m:{width}s}  " + "  ".join(f"{c:>{w}s}" for c, w in zip(cells, cols))
                     + "  " + " · ".join(_fmt(st[k], f) for k in ("min", "median", "max")))
    lines.append(f"（{n} 次运行 = {len(entry['seeds'])} 个种子 × {ne} 种环境：{', '.join(entry['envs'])}）")
    outside = tuple(m for m in quoted if not out[m]["inside"])
    if outside:
        lines.append(OUTSIDE_NOTE)
    text = "\n".join(lines)
    if display:
        print(text)
    return Placement(name, seed, out, outside, text)


def live_tolerance(name: str, metric: str, *, factor: float = 10.0) -> float:
    """How far a rerun of ``metric`` may fall from the committed value of its seed: ``factor``
    times the largest spread of that metric across environments over the committed seeds (at
    least 8 float32 ulps of its size). Needs rows of one seed in two or more environments."""
    by_seed: dict = {}
    for r in rows(name):
        by_seed.setdefault(r["seed"], []).append(r["metrics"][metric])
    spreads = [max(v) - min(v) for v in by_seed.values() if len(v) >= 2]
    if not spreads:
        raise ValueError(f"live_tolerance: {name} has no seed with committed rows in two "
                         "environments, so no measured spread to set a tolerance from")
    scale = max(abs(x) for v in by_seed.values() for x in v)
    return factor * max(spreads) + 8 * 2.0 ** -23 * scale


def check_live(name: str, metrics: dict, *, seed: int = 0, keys: Sequence[str] | None = None,
               factor: float = 10.0) -> dict:
    """Assert that a live *measurement* (no training) equals the committed rows of its seed.

    Each metric must lie within :func:`live_tolerance` (a tolerance measured from the committed
    rows' own spread across CPU kernel paths, never a fixed rtol) of the committed values of
    the same seed. Raises AssertionError naming the metric; returns ``{metric: (live, committed
    values, tolerance)}``. Not for training outcomes: those are shown with :func:`where`.
    """
    fn = "check_live"
    if not isinstance(metrics, dict):
        raise TypeError(f"{fn}: `metrics` must be a dict of metrics, got {type(metrics).__name__}")
    same = {r["env"]: r["metrics"] for r in rows(name, seed=seed)}
    if not same:
        raise ValueError(f"{fn}: {name} has no committed rows for seed {seed}")
    keys = list(metrics) if keys is None else list(keys)
    out = {}
    for k in keys:
        if k not in metrics:
            raise ValueError(f"{fn}: `metrics` has no {k!r}")
        live = float(metrics[k])
        ref = [v[k] for v in same.values() if k in v]
        if not ref:
            raise ValueError(f"{fn}: the committed rows of {name} have no metric {k!r}")
        tol = live_tolerance(name, k, factor=factor)
        lo, hi = min(ref) - tol, max(ref) + tol
        if not lo <= live <= hi:
            raise AssertionError(f"{fn}: {name} {k} (seed {seed}) = {live!r} is outside the "
                                 f"committed values {ref} +- {tol:.3g} (the tolerance is {factor:g}x "
                                 "the spread across CPU kernel paths)")
        out[k] = (live, ref, tol)
    return out


# ---------------------------------------------------------------- drift and EXPERIMENTS.md

def drift(fresh: Sequence[dict], old_rows: Sequence[dict], rtol: float) -> list[str]:
    """Metrics of ``fresh`` rows that differ by more than ``rtol`` from the committed row of the
    same claim, seed AND environment label (rows of other environments are not compared)."""
    old = {(r["claim"], r["seed"], r["env"]): r["metrics"] for r in old_rows}
    out = []
    for r in fresh:
        prev = old.get((r["claim"], r["seed"], r["env"]))
        if prev is None:
            continue
        for key, value in r["metrics"].items():
            ref = prev.get(key)
            if ref is None or abs(value - ref) > rtol * max(abs(ref), 1e-12):
                out.append(f"{r['claim']} seed {r['seed']} ({r['env']}) {key}: committed {ref}, "
                           f"now {value}")
    return out


def _pct(x: float) -> str:
    return "∞" if math.isinf(x) else f"{100 * x:.1f} %"


def markdown(summaries: Sequence[dict], envs: dict, *, target_seeds: int = len(SWEEP_SEEDS)) -> str:
    """benchmarks/EXPERIMENTS.md: per claim the runs, environments, worst margin and rates."""
    lines = ["# Experiments over seeds and CPU kernel paths", "",
             "Generated by `python3 make.py experiments` (`python -m attnbook.experiments`) from the",
             "committed rows in `lib/attnbook/experiments/data/chNN.json`; do not edit. Every claim",
             "is checked on every committed run (seeds x environments); *margin* is the worst run's",
             "relative change of one metric that would flip the rule (`rules.py`). A claim is fully",
             f"measured with >= {target_seeds} seeds under >= 2 CPU kernel paths (CHAPTER.md point 18);",
             "the `runs` column says where that is not yet so.", "",
             "## Environments", "", "| label | CPU | kernel path (asked) | BLAS | threads | torch | python | OS |",
             "|---|---|---|---|---|---|---|---|"]
    for label, e in sorted(envs.items()):
        lines.append(f"| {label} | {e.get('cpu', '?')} | {e.get('capability') or 'not recorded'}"
                     f" ({e.get('requested') or 'native'}) | {e.get('blas', '?')} | "
                     f"{e.get('threads', '?')} | {e.get('torch', '?')} | {e.get('python', '?')} | "
                     f"{e.get('os', '?')} |")
    lines += ["", "## Claims", "", "| claim | holds | runs (seeds x envs) | worst margin | rates |",
              "|---|---|---|---|---|"]
    for s in summaries:
        full = len(s["seeds"]) >= target_seeds and len(s["envs"]) >= 2
        runs = f"{s['runs']} ({len(s['seeds'])} x {len(s['envs'])})" + ("" if full else " **partial**")
        thin = " (thin)" if s["margin"] < THIN else ""
        rates = "; ".join(f"{r['k']}/{r['n']}" for r in s["rates"].values())
        lines.append(f"| `{s['claim']}` | {'yes' if s['holds'] else '**NO**'} | {runs} | "
                     f"{_pct(s['margin'])}{thin} | {rates} |")
    for s in summaries:
        lines += ["", f"## {s['claim']}", "", f"Claim (chapter {s['chapter']}): {s['statement']}", "",
                  f"Rule: {s['rule']}", "", f"One seed = {s['unit']}. Runs: {s['runs']} "
                  f"(seeds {', '.join(map(str, s['seeds']))}; environments {', '.join(s['envs'])}).",
                  "", f"Worst margin: {_pct(s['margin'])} ({_worst_where(s)})."]
        for o in s["overall"]:
            extra = (f": {o['k']}/{o['n']} runs, 95 % interval {o['lo']:.2f}–{o['hi']:.2f}"
                     if "k" in o else "")
            lines.append(f"Over the runs: {o['rule']}{extra} — "
                         f"{'holds' if o['holds'] else '**fails**'}, margin {_pct(o['margin'])}.")
        if s.get("notes"):
            lines += ["", f"Note: {s['notes']}"]
        bad = [p for p in s["per_run"] if not p["holds"]]
        if bad:
            lines += ["", "Failing runs: " + ", ".join(f"seed {p['seed']} ({p['env']})" for p in bad)]
        lines += ["", "| metric | min | median | max |", "|---|---|---|---|"]
        for key, st in s["metrics"].items():
            star = " (quoted)" if key in s["quoted"] else ""
            lines.append(f"| `{key}`{star} | " + " | ".join(format(st[k], ".4g")
                                                          for k in ("min", "median", "max")) + " |")
        if s["quotes"]:
            lines += ["", "Quoted (min–median–max): "
                      + "; ".join(f"`{k}` {v}" for k, v in s["quotes"].items())]
    return "\n".join(lines) + "\n"
