"""Tests for attnbook.widgets.explore_text (chapter 11's poem widget) in its static form."""
from __future__ import annotations

import pytest

from attnbook.widgets import STATIC_NOTE, explore_text


def test_static_gallery_lists_every_setting(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")

    def fn(start="春", temperature=1.0):
        return f"{start}|{temperature:.1f}"

    md = explore_text(fn, start="春", temperature=(0.1, 2.0), display=False,
                      static=[{"start": "明月"}, {"temperature": 0.5}])
    text = md.data
    assert "明月|1.0" in text and "春|0.5" in text and STATIC_NOTE in text
    assert text.count("```text") == 2


def test_fn_must_return_text(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_STATIC", "1")
    with pytest.raises(TypeError, match="explore_text: `fn` must return a str"):
        explore_text(lambda start="a": 1, start="a", display=False)
    with pytest.raises(TypeError, match="not a parameter"):
        explore_text(lambda start="a": "x", other=(0, 1), display=False)
