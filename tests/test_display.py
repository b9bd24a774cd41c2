"""Tests for attnbook.display.show_source."""
import pytest

from attnbook.attention import attention_ref
from attnbook.display import show_source, source_of


def test_source_of_names_the_repository_path():
    src, caption, first = source_of(attention_ref)
    assert caption == "lib/attnbook/attention.py"
    assert src.startswith("def attention_ref(") and first > 1


def test_show_source_markdown_fence():
    md = show_source(attention_ref, display=False)
    text = md.data
    assert text.startswith("**`lib/attnbook/attention.py`**")
    assert "```python\ndef attention_ref(" in text and text.rstrip().endswith("```")


def test_show_source_rejects_builtins():
    with pytest.raises(TypeError, match="cannot find the source"):
        show_source(len)
