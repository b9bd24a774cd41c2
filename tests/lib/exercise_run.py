"""``run(name, fn)``: the verdict of ``attnbook.exercises.check`` as a bool and the text it
printed, for the exercise tests (tests/lib/test_exercises_*.py import it; pytest puts this folder
on sys.path)."""
import contextlib
import io

from attnbook.exercises import check


def run(name, fn, seed=0, **kw):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check(name, fn, seed=seed, **kw)
    return bool(ok), buf.getvalue()
