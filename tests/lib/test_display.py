"""Tests for attnbook.display.show_source."""
import pytest

from attnbook.reference import attention_ref
from attnbook.display import show_source, source_of


def test_source_of_names_the_repository_path():
    src, caption, first = source_of(attention_ref)
    assert caption == "lib/attnbook/reference.py"
    # the decorator line shows that arguments are checked before the mathematics below it
    assert src.startswith("@attention_kernel\ndef attention_ref(") and first > 1
    assert "check_attention_args" not in src  # the body is only the mathematics


def test_show_source_markdown_fence():
    md = show_source(attention_ref, display=False)
    text = md.data
    assert text.startswith("**`lib/attnbook/reference.py`**")
    assert "```python\n@attention_kernel\ndef attention_ref(" in text and text.rstrip().endswith("```")


def test_show_source_rejects_builtins():
    with pytest.raises(TypeError, match="cannot find the source"):
        show_source(len)
