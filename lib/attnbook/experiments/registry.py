"""The registry of the book's empirical claims: ``Experiment`` and ``register``.

The chapter modules (``ch04``, ``ch08``) import only this module to register their claims, and
``core`` (runner, writer, ``where``) imports them lazily: so there is no import circle.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Experiment", "register", "REGISTRY"]

REGISTRY: dict[str, "Experiment"] = {}


@dataclass(frozen=True)
class Experiment:
    """One registered claim. ``fmt`` formats every quoted figure (e.g. ``".2f"``)."""

    name: str
    chapter: str
    run: Callable[[int], dict]
    claim: str
    rule: str
    holds: Callable[[dict], bool]
    quoted: tuple[str, ...] = ()
    overall: Callable[[list], bool] | None = None
    fmt: str = ".2f"
    unit: str = "seed"          # what one seed means, e.g. "group of 8 model seeds"
    notes: str = ""


def register(name: str, *, chapter: str, run: Callable, claim: str, rule: str, holds: Callable,
             quoted: Sequence[str] = (), overall: Callable | None = None, fmt: str = ".2f",
             unit: str = "seed", notes: str = "", registry: dict | None = None) -> Experiment:
    """Add a claim to the registry (``registry`` defaults to the book's) and return it."""
    reg = REGISTRY if registry is None else registry
    if not isinstance(name, str) or not name.startswith(f"ch{chapter}."):
        raise ValueError(f"register: `name` must look like 'ch{chapter}.<claim>', got {name!r}")
    if name in reg:
        raise ValueError(f"register: `name` must be unique, got {name!r} a second time")
    for arg, fn in (("run", run), ("holds", holds)):
        if not callable(fn):
            raise TypeError(f"register: `{arg}` must be callable, got {fn!r}")
    format(1.0, fmt)            # a bad format string fails here, not when writing
    exp = Experiment(name, chapter, run, claim, rule, holds, tuple(quoted), overall, fmt, unit, notes)
    reg[name] = exp
    return exp
