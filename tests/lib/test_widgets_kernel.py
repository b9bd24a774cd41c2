"""``widgets.explore`` in a real Jupyter kernel: an image reaches the front end at display time
and again after a slider moves, under the pinned ipywidgets (8.x) and under Colab's 7.7.1.

A front end is simulated with jupyter_client: the test executes the cell, then sends the
``comm_msg`` a browser sends when the slider is dragged, and reads every iopub message the kernel
publishes. Checking ``w.result`` (what the old test did) passed while readers saw an empty output.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

jupyter_client = pytest.importorskip("jupyter_client")

pytestmark = pytest.mark.slow   # real Jupyter kernels: the slow library stage

ROOT = Path(__file__).resolve().parents[2]
IPYWIDGETS_7 = ROOT / ".venv" / "ipywidgets-7.7.1"  # a cached --target install, outside git

CELL = """
import matplotlib.pyplot as plt
from attnbook.widgets import explore

def curve(n=3):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot(range(n))
    return fig

w = explore(curve, n=(1, 6), display=False)
display(w)
print("MODEL", w.children[0].model_id)
"""


def _has_png(msg) -> bool:
    return '"image/png"' in json.dumps(msg.get("content", {}), default=str)


def _collect(kc, parent_id, timeout=60):
    """iopub messages whose parent is ``parent_id``, until the kernel reports idle for it."""
    msgs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != parent_id:
            continue
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return msgs


CELL_TEXT = """
import matplotlib.pyplot as plt
from attnbook.widgets import explore

def word(text="unused"):
    if not text.isalpha():
        raise ValueError(f"cannot read {text!r}: letters only")
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.set_title(text)
    return fig

w = explore(word, text="hello", display=False)
display(w)
print("MODEL", w.children[0].model_id)
"""


def _run_cell(kc, cell: str, values):
    cell_id = kc.execute(cell)
    at_display = _collect(kc, cell_id)
    errors = [m["content"] for m in at_display if m["msg_type"] == "error"]
    assert not errors, errors
    text = "".join(m["content"].get("text", "") for m in at_display if m["msg_type"] == "stream")
    model_id = text.split("MODEL", 1)[1].split()[0]
    changes = []
    for value in values:
        # what a browser sends when the slider is dragged (or text is typed, then Enter)
        change = kc.session.msg("comm_msg", {"comm_id": model_id, "data": {
            "method": "update", "state": {"value": value}, "buffer_paths": []}})
        kc.shell_channel.send(change)
        changes.append(_collect(kc, change["header"]["msg_id"]))
    return at_display, *changes


_SESSIONS: dict = {}


def _drive(which: str):
    """One kernel per ipywidgets version runs both cells (a kernel start costs seconds):
    ``(version, slider messages, text-box messages)``, cached for the tests below."""
    if which in _SESSIONS:
        return _SESSIONS[which]
    extra_path = _ipywidgets_7() if which == "7.7.1" else None
    env = dict(os.environ)
    env.pop("ATTNBOOK_STATIC", None)  # a live kernel, as a reader's
    env["MPLBACKEND"] = "Agg"
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH", "")]))
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
    try:
        version_id = kc.execute("import ipywidgets; print('IPYW', ipywidgets.__version__)")
        version = "".join(m["content"].get("text", "") for m in _collect(kc, version_id))
        slider = _run_cell(kc, CELL, (5,))
        text_box = _run_cell(kc, CELL_TEXT, ("world", "no digits 42", "again"))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    _SESSIONS[which] = version, slider, text_box
    return _SESSIONS[which]


def _ipywidgets_7() -> Path:
    if not (IPYWIDGETS_7 / "ipywidgets" / "__init__.py").exists():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(IPYWIDGETS_7),
               "ipywidgets==7.7.1", "ipython_genutils==0.2.0"]
        if subprocess.call(cmd) != 0:
            pytest.skip("could not install ipywidgets 7.7.1 (Colab's version) from the package index")
    return IPYWIDGETS_7


@pytest.mark.parametrize("which", ["pinned", "7.7.1"])
def test_explore_sends_an_image_at_display_and_after_a_change(which):
    version, (at_display, after_change), _ = _drive(which)
    if which == "7.7.1":
        assert "IPYW 7.7.1" in version, version
    else:
        assert "IPYW 8." in version, version
    assert sum(map(_has_png, at_display)) == 1, "exactly one image when the widget is displayed"
    assert sum(map(_has_png, after_change)) == 1, "exactly one new image after the slider moved"


def _text_of(msgs) -> str:
    return json.dumps([m.get("content", {}) for m in msgs], default=str)


@pytest.mark.parametrize("which", ["pinned", "7.7.1"])
def test_text_box_redraws_and_bad_text_shows_a_message(which):
    version, _, (at_display, typed, bad, again) = _drive(which)
    assert ("IPYW 7.7.1" if which == "7.7.1" else "IPYW 8.") in version, version
    assert sum(map(_has_png, at_display)) == 1, "the default text drawn once"
    assert sum(map(_has_png, typed)) == 1, "one new image after typing a word"
    assert not any(m["msg_type"] == "error" for m in bad), "no traceback for bad text"
    assert sum(map(_has_png, bad)) == 0
    assert "cannot read 'no digits 42': letters only" in _text_of(bad)
    assert "Traceback" not in _text_of(bad)
    assert sum(map(_has_png, again)) == 1, "good text draws again"
