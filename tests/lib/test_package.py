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


def test_exports_exist_and_the_registry_holds_the_four_backends():
    for name in attnbook.__all__:
        assert hasattr(attnbook, name), name
    assert list(attnbook.BACKENDS) == ["ref", "tiled", "triton", "sdpa"]  # "auto" is a choice, not a backend
    import attnbook.reference as reference  # the old module name no longer shadows the dispatcher

    assert reference.attention_ref is attnbook.attention_ref and callable(attnbook.attention)
