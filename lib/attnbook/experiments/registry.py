"""The registry of the book's empirical claims: ``Experiment`` and ``register``.

The chapter modules (``ch04``, ``ch08``) import only this module and :mod:`.rules` to register
their claims, and ``core`` (runner, writer, ``where``) imports them lazily: so there is no import
circle. A claim's rule is data (:mod:`.rules`): its text, its check and its margin come from it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .rules import Aggregate, All, Rule

__all__ = ["Experiment", "register", "REGISTRY"]

REGISTRY: dict[str, "Experiment"] = {}


@dataclass(frozen=True)
class Experiment:
    """One registered claim: ``run(seed) -> metrics``, a per-run ``rule`` that must hold on every
    run, ``overall`` rules over all runs together (rates, medians), the metrics the prose quotes
    and the format of every quoted figure (e.g. ``".2f"``; a metric in ``counts`` is a whole number,
    quoted as one: ``2–2–2``, a median between two counts as ``38.5``)."""

    name: str
    chapter: str
    run: Callable[[int], dict]
    claim: str
    rule: Rule
    quoted: tuple[str, ...] = ()
    overall: tuple[Aggregate, ...] = ()
    fmt: str = ".2f"
    unit: str = "seed"          # what one seed means, e.g. "group of 8 model seeds"
    notes: str = ""
    counts: tuple[str, ...] = ()  # quoted metrics that are whole numbers (heads, positions)

    def text(self) -> str:
        """The rule in words: the per-run rule, then each rule over the runs."""
        parts = [f"on every run: {self.rule.text()}"] if getattr(self.rule, "parts", True) else []
        return "; ".join(parts + [a.text() for a in self.overall])

    def holds(self, metrics: dict) -> bool:
        """Whether the per-run rule holds on one run (the rules over all runs are not judged)."""
        return self.rule.holds(metrics)

    def holds_all(self, runs: Sequence[dict]) -> bool:
        """Whether the claim holds on these runs: the per-run rule on each, the rules over the runs
        on all of them together (one run: a rate is then 0 or 1)."""
        runs = list(runs)
        if not runs:
            raise ValueError(f"holds_all: `runs` must hold at least one run of {self.name}")
        return all(self.rule.holds(m) for m in runs) and all(a.evaluate(runs)["holds"]
                                                             for a in self.overall)

    def keys(self) -> set[str]:
        """Every metric the rules read."""
        return self.rule.keys().union(*(a.keys() for a in self.overall))


def register(name: str, *, chapter: str, run: Callable, claim: str, rule: Rule | None = None,
             quoted: Sequence[str] = (), overall: Sequence[Aggregate] = (), fmt: str = ".2f",
             unit: str = "seed", notes: str = "", counts: Sequence[str] = (),
             registry: dict | None = None) -> Experiment:
    """Add a claim to the registry (``registry`` defaults to the book's) and return it.

    ``rule`` (a :class:`~.rules.Rule`, default: no per-run condition) must hold on every run;
    each of ``overall`` (:class:`~.rules.Aggregate`: ``Rate``, ``Median``, ``Some`` ...) on the
    runs together. ``quoted``: a tuple of metric names (not one string); ``counts``: those of
    them that are whole numbers (quoted without decimals).
    """
    fn = "register"
    reg = REGISTRY if registry is None else registry
    if not isinstance(chapter, str) or not (len(chapter) == 2 and chapter.isdigit()):
        raise ValueError(f"{fn}: `chapter` must be two digits such as '04', got {chapter!r}")
    if not isinstance(name, str) or not name.startswith(f"ch{chapter}.") or name == f"ch{chapter}.":
        raise ValueError(f"{fn}: `name` must look like 'ch{chapter}.<claim>', got {name!r}")
    if name in reg:
        raise ValueError(f"{fn}: `name` must be unique, got {name!r} a second time")
    if not callable(run):
        raise TypeError(f"{fn}: `run` must be callable (seed -> metrics), got {run!r}")
    if not isinstance(claim, str) or not claim.strip():
        raise TypeError(f"{fn}: `claim` must be the statement in words (a non-empty str), got {claim!r}")
    rule = All() if rule is None else rule
    if not isinstance(rule, Rule):
        raise TypeError(f"{fn}: `rule` must be a rules.Rule (Gt, Lt, All ...), got {rule!r}")
    if isinstance(overall, (Aggregate, str)) or not isinstance(overall, Sequence):
        raise TypeError(f"{fn}: `overall` must be a tuple of rules.Aggregate (Rate, Median ...), "
                        f"got {overall!r}")
    for agg in overall:
        if not isinstance(agg, Aggregate):
            raise TypeError(f"{fn}: every item of `overall` must be a rules.Aggregate, got {agg!r}")
    if isinstance(quoted, str) or not isinstance(quoted, Sequence) \
            or not all(isinstance(q, str) and q for q in quoted):
        raise TypeError(f"{fn}: `quoted` must be a tuple of metric names (not one string), "
                        f"got {quoted!r}")
    if len(set(quoted)) != len(quoted):
        raise ValueError(f"{fn}: `quoted` names a metric twice: {quoted!r}")
    if isinstance(counts, str) or not isinstance(counts, Sequence) \
            or not all(isinstance(c, str) and c in quoted for c in counts):
        raise TypeError(f"{fn}: `counts` must be a tuple of quoted metric names (whole numbers), "
                        f"got {counts!r}")
    if not isinstance(fmt, str):
        raise TypeError(f"{fn}: `fmt` must be a format spec such as '.2f', got {fmt!r}")
    try:
        format(1.0, fmt)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}: `fmt` must be a format spec for numbers such as '.2f', "
                         f"got {fmt!r}") from None
    if not (rule.keys() or overall):
        raise ValueError(f"{fn}: {name} needs a `rule` or an `overall` rule (a claim checks something)")
    exp = Experiment(name, chapter, run, claim, rule, tuple(quoted), tuple(overall), fmt, unit, notes,
                     tuple(counts))
    reg[name] = exp
    return exp
