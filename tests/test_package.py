"""Tests for lib/attnbook/__init__.py: what the package exports, and that importing it does nothing else."""
import subprocess
import sys

import attnbook

PROBE = r"""
import contextlib, io, sys
buf = io.StringIO()
with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
    import attnbook
heavy = sorted(m for m in sys.modules
               if m.split(".")[0] in ("matplotlib", "triton", "IPython", "ipywidgets"))
print(repr(buf.getvalue()), heavy)
"""


def test_import_has_no_side_effects():
    """No printing, no pyplot / IPython / ipywidgets / triton import: a fresh interpreter checks."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "'' []", proc.stdout


def test_exports_exist_and_the_entry_point_is_the_dispatcher():
    for name in attnbook.__all__:
        assert hasattr(attnbook, name), name
    from attnbook.dispatch import attention

    assert attnbook.attention is attention and attnbook.BACKENDS[0] == "auto"
