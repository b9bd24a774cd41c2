"""Claims' rules as data: the text, the check and the margin come from one object (CHAPTER.md 18).

A *run rule* looks at one run's metrics (``{name: float}``): :class:`Gt`, :class:`Lt`, :class:`Ge`,
:class:`Le`, :class:`Between`, :class:`Near`, :class:`Decreasing`, :class:`All`, :class:`Any`.
``rule.margin(m)`` is the relative change of one metric that would flip the rule on that run (the
same measure as perturbing a committed value until the verdict changes): for ``a > b`` it is
``(a - b) / max(|a|, |b|)``; positive where the rule holds, negative where it fails. ``All`` takes
the smallest margin of its parts, ``Any`` the largest.

An *aggregate rule* looks at all runs of a claim together: :class:`Rate` ("holds on at least 60 %
of the runs", reported as ``k/n`` with a 95 % Clopper–Pearson interval), :class:`Median` (a run
rule applied to the per-metric medians), :class:`Some` (on at least one run) and
:class:`ArgmaxVaries` (the largest of several metrics is not always the same one).
"""
from __future__ import annotations

import abc
import math
import statistics
from collections.abc import Sequence

__all__ = ["Rule", "Gt", "Lt", "Ge", "Le", "Between", "Near", "Decreasing", "All", "Any",
           "Aggregate", "Rate", "Median", "Some", "ArgmaxVaries", "clopper_pearson"]


def _num(x) -> str:
    return format(x, "g")


def _rel(hi: float, lo: float) -> float:
    """``(hi - lo) / max(|hi|, |lo|)``: > 0 when hi > lo; 0 when both are 0."""
    scale = max(abs(hi), abs(lo))
    return 0.0 if scale == 0 else (hi - lo) / scale


def _value(metrics: dict, key: str, who: str) -> float:
    if not isinstance(metrics, dict):
        raise TypeError(f"{who}: `metrics` must be a dict of metric -> number, got "
                        f"{type(metrics).__name__}")
    if key not in metrics:
        raise ValueError(f"{who}: `metrics` has no {key!r} (the rule needs it); it has "
                         f"{sorted(metrics)}")
    value = metrics[key]
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)          # numpy / torch scalars
        except (TypeError, ValueError):
            raise TypeError(f"{who}: metric {key!r} must be a number, got {value!r}") from None
    return float(value)


class Rule(abc.ABC):
    """A rule about one run's metrics (every concrete rule defines keys, text and margin)."""

    @abc.abstractmethod
    def keys(self) -> set[str]: ...

    @abc.abstractmethod
    def text(self) -> str: ...

    @abc.abstractmethod
    def margin(self, metrics: dict) -> float: ...

    def holds(self, metrics: dict) -> bool:
        return self.margin(metrics) > 0 or (self._inclusive() and self.margin(metrics) == 0)

    def _inclusive(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text()!r})"


class _Bound:
    """A threshold: a number, or ``scale * metric + offset``."""

    def __init__(self, bound, scale: float = 1.0, offset: float = 0.0, who: str = "rule"):
        if isinstance(bound, bool) or not isinstance(bound, (int, float, str)):
            raise TypeError(f"{who}: the bound must be a number or a metric name, got {bound!r}")
        if isinstance(bound, (int, float)) and not math.isfinite(bound):
            raise ValueError(f"{who}: the bound must be finite, got {bound!r}")
        for arg, v in (("scale", scale), ("offset", offset)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"{who}: `{arg}` must be a finite number, got {v!r}")
        if isinstance(bound, str) and not bound:
            raise ValueError(f"{who}: a metric name must not be empty")
        self.bound, self.scale, self.offset = bound, float(scale), float(offset)

    def keys(self) -> set[str]:
        return {self.bound} if isinstance(self.bound, str) else set()

    def value(self, metrics: dict, who: str) -> float:
        if isinstance(self.bound, str):
            return self.scale * _value(metrics, self.bound, who) + self.offset
        return float(self.bound)

    def text(self) -> str:
        if not isinstance(self.bound, str):
            return _num(self.bound)
        out = self.bound if self.scale == 1 else f"{_num(self.scale)} x {self.bound}"
        if self.offset:
            out += f" {'+' if self.offset > 0 else '-'} {_num(abs(self.offset))}"
        return out


class _Compare(Rule):
    op = ">"

    def __init__(self, key: str, bound, *, scale: float = 1.0, offset: float = 0.0):
        who = type(self).__name__
        if not isinstance(key, str) or not key:
            raise TypeError(f"{who}: `key` must be a metric name (a non-empty str), got {key!r}")
        self.key, self.bound = key, _Bound(bound, scale, offset, who)

    def keys(self):
        return {self.key} | self.bound.keys()

    def text(self):
        return f"{self.key} {self.op} {self.bound.text()}"

    def margin(self, metrics):
        who = type(self).__name__
        a, b = _value(metrics, self.key, who), self.bound.value(metrics, who)
        return _rel(a, b) if self.op in (">", ">=") else _rel(b, a)


class Gt(_Compare):
    """``key > bound`` (bound: a number, or ``scale * other_metric + offset``)."""
    op = ">"


class Lt(_Compare):
    """``key < bound``."""
    op = "<"


class Ge(_Compare):
    """``key >= bound`` (holds at margin 0)."""
    op = ">="

    def _inclusive(self):
        return True


class Le(_Compare):
    """``key <= bound`` (holds at margin 0)."""
    op = "<="

    def _inclusive(self):
        return True


class All(Rule):
    """Every part holds; margin = the smallest part's margin."""

    def __init__(self, *parts: Rule):
        for p in parts:
            if not isinstance(p, Rule):
                raise TypeError(f"{type(self).__name__}: every part must be a Rule, got {p!r}")
        self.parts = tuple(parts)

    def keys(self):
        return set().union(*(p.keys() for p in self.parts))

    def text(self):
        return "; ".join(p.text() for p in self.parts) if self.parts else "(no per-run condition)"

    def _margins(self, metrics):
        return [(p.margin(metrics), p) for p in self.parts]

    def margin(self, metrics):
        if not self.parts:
            return math.inf
        return min(m for m, _ in self._margins(metrics))

    def holds(self, metrics):
        return all(p.holds(metrics) for p in self.parts)

    def weakest(self, metrics) -> Rule | None:
        """The part with the smallest margin on this run."""
        if not self.parts:
            return None
        return min(self._margins(metrics), key=lambda t: t[0])[1]


class Any(All):
    """At least one part holds; margin = the largest part's margin."""

    def text(self):
        return "(" + " or ".join(p.text() for p in self.parts) + ")"

    def margin(self, metrics):
        return max(m for m, _ in self._margins(metrics))

    def holds(self, metrics):
        return any(p.holds(metrics) for p in self.parts)

    def weakest(self, metrics) -> Rule | None:
        """The part that decides this run: the one with the largest margin (Any's own margin);
        the smallest would name a part that is irrelevant while another holds."""
        if not self.parts:
            return None
        return max(self._margins(metrics), key=lambda t: t[0])[1]


class Between(All):
    """``lo < key < hi`` (lo, hi: numbers or metric names)."""

    def __init__(self, key: str, lo, hi):
        super().__init__(Gt(key, lo), Lt(key, hi))
        self.key, self.lo, self.hi = key, lo, hi

    def text(self):
        return f"{self.parts[0].bound.text()} < {self.key} < {self.parts[1].bound.text()}"


class Near(Between):
    """``|key - value| < tol``."""

    def __init__(self, key: str, value: float, tol: float):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
            raise ValueError(f"Near: `tol` must be a positive number, got {tol!r}")
        super().__init__(key, value - tol, value + tol)
        self.value, self.tol = value, tol

    def text(self):
        return f"|{self.key} - {_num(self.value)}| < {_num(self.tol)}"


class Decreasing(All):
    """``k1 > k2 > ... > kn`` (each metric strictly above the next)."""

    def __init__(self, *keys: str):
        if len(keys) < 2:
            raise ValueError(f"Decreasing: needs at least two metrics, got {keys!r}")
        super().__init__(*(Gt(a, b) for a, b in zip(keys, keys[1:])))
        self.names = keys

    def text(self):
        return " > ".join(self.names)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval for a rate of ``k`` successes in ``n`` runs."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"clopper_pearson: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    level_tail = (1 - level) / 2

    def tail_ge(p):                       # P(X >= k) for X ~ Binomial(n, p)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def solve(f, target):                 # f increasing in p on [0, 1]: f(p) = target
        a, b = 0.0, 1.0
        for _ in range(60):
            mid = (a + b) / 2
            a, b = (mid, b) if f(mid) < target else (a, mid)
        return (a + b) / 2

    lo = 0.0 if k == 0 else solve(tail_ge, level_tail)
    # upper: P(X <= k) = tail  <=>  1 - P(X >= k + 1) = tail
    hi = 1.0 if k == n else solve(lambda p: 1 - sum(
        math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1)), 1 - level_tail)
    return lo, hi


class Aggregate(abc.ABC):
    """A rule about all runs of a claim together (concrete ones define keys, text, evaluate)."""

    @abc.abstractmethod
    def keys(self) -> set[str]: ...

    @abc.abstractmethod
    def text(self) -> str: ...

    @abc.abstractmethod
    def evaluate(self, runs: Sequence[dict]) -> dict:
        """``{"holds": bool, "margin": float, ...}`` over the runs' metrics."""

    def __repr__(self):
        return f"{type(self).__name__}({self.text()!r})"


def _check_rule(rule, who):
    if not isinstance(rule, Rule):
        raise TypeError(f"{who}: `rule` must be a Rule (Gt, Lt, All ...), got {rule!r}")


class Rate(Aggregate):
    """``rule`` holds on at least ``at_least`` (and at most ``at_most``) of the runs (fractions).

    Reported as ``k/n`` with a 95 % Clopper–Pearson interval; the margin is the relative distance of
    the observed rate from the nearer bound.
    """

    def __init__(self, rule: Rule, *, at_least: float | None = None, at_most: float | None = None):
        _check_rule(rule, "Rate")
        for arg, v in (("at_least", at_least), ("at_most", at_most)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not 0 <= v <= 1):
                raise ValueError(f"Rate: `{arg}` must be a fraction in [0, 1], got {v!r}")
        if at_least is None and at_most is None:
            raise ValueError("Rate: give `at_least` or `at_most` (a fraction of the runs)")
        self.rule, self.at_least, self.at_most = rule, at_least, at_most

    def keys(self):
        return self.rule.keys()

    def text(self):
        bounds = []
        if self.at_least is not None:
            bounds.append(f"at least {self.at_least:.0%}")
        if self.at_most is not None:
            bounds.append(f"at most {self.at_most:.0%}")
        return f"{self.rule.text()} on {' and '.join(bounds)} of the runs"

    def evaluate(self, runs):
        n = len(runs)
        k = sum(self.rule.holds(m) for m in runs)
        rate = k / n
        margins = []
        if self.at_least is not None:
            margins.append(_rel(rate, self.at_least) if rate != self.at_least else 0.0)
        if self.at_most is not None:
            margins.append(_rel(self.at_most, rate) if rate != self.at_most else 0.0)
        ok = ((self.at_least is None or rate >= self.at_least)
              and (self.at_most is None or rate <= self.at_most))
        lo, hi = clopper_pearson(k, n)
        return dict(holds=ok, margin=min(margins), k=k, n=n, lo=lo, hi=hi)


class Some(Rate):
    """``rule`` holds on at least one run."""

    def __init__(self, rule: Rule):
        super().__init__(rule, at_least=0.0)

    def text(self):
        return f"{self.rule.text()} on at least one run"

    def evaluate(self, runs):
        out = super().evaluate(runs)
        out["holds"] = out["k"] >= 1
        out["margin"] = max(self.rule.margin(m) for m in runs)
        return out


class Median(Aggregate):
    """``rule`` applied to the median (over the runs) of every metric it reads."""

    def __init__(self, rule: Rule):
        _check_rule(rule, "Median")
        self.rule = rule

    def keys(self):
        return self.rule.keys()

    def text(self):
        return f"median over the runs: {self.rule.text()}"

    def evaluate(self, runs):
        med = {k: statistics.median(_value(m, k, "Median") for m in runs) for k in self.rule.keys()}
        return dict(holds=self.rule.holds(med), margin=self.rule.margin(med))


class ArgmaxVaries(Aggregate):
    """Over the runs, the largest of ``keys`` is not always the same metric."""

    def __init__(self, *keys: str):
        if len(keys) < 2 or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"ArgmaxVaries: needs two or more metric names, got {keys!r}")
        self.names = keys

    def keys(self):
        return set(self.names)

    def text(self):
        return f"the largest of {', '.join(self.names)} is not the same metric on every run"

    def evaluate(self, runs):
        winners = {max(self.names, key=lambda k: _value(m, k, "ArgmaxVaries")) for m in runs}
        ok = len(winners) >= 2
        return dict(holds=ok, margin=1.0 if ok else -1.0, winners=sorted(winners))
