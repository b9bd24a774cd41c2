"""Hands-on exercises with automatic feedback in Chinese (CHAPTER.md point 21).

The reader writes a function in a stub cell and calls ``check``::

    from attnbook.exercises import check

    def masked_softmax(scores, mask):
        ...  # 你的代码

    check("ch04.masked_softmax", masked_softmax)   # 还没有实现 / ✗ ... / ✓ ...

``check(name, fn)`` runs the exercise's hidden, randomized (seeded, so repeatable) cases
against the library's reference, in float64 where the maths is exact and by the library's
tolerance rule (``attnbook.tolerance``) for float32/float16 results. It returns a truthy
``Verdict`` after a one-line ✓ (IPython does not echo it), or a falsy one after explaining the
first failing case in plain Chinese: the inputs,
the position, expected vs got, and a hint that names the mistake's symptom. It never raises
on a wrong answer; an exception inside ``fn`` is reported. Right values are not enough: the
result keeps its inputs' dtype (float16 in, float16 out) and ``fn`` leaves its arguments as it
found them (no ``masked_fill_`` on the caller's scores, no ``q /= ...``). The method is the lesson:
an answer that calls what the exercise rules out (``_offlimits.OFF_LIMITS``: the library's own
implementation, torch's one-call equivalent, the exercise's own ``solution``) is rejected, naming
the call; ``ch09.attention_backward`` runs with autograd off. ``get(name)`` gives the
:class:`Exercise` with ``.solution`` (the reference, with the reader's signature) and ``.bugs``
(name -> function: the gallery of classic bugs, each of which ``check`` must reject);
``list()`` names every exercise. No extra install: only torch and the library.
"""
from ._core import Case, Exercise, check, get
from ._core import names as list  # noqa: A001  (``exercises.list()`` is the public name)

def _load_topics() -> None:
    """Import every topic module of this package (importing one registers its exercises)."""
    import importlib
    import pkgutil
    from pathlib import Path
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")


_load_topics()

__all__ = ["Case", "Exercise", "check", "get", "list"]
