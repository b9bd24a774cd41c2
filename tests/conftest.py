"""Fixtures shared by every test folder (tests/lib: the library; tests/book: the book, its tools
and the environment). Helper functions live in ``attnbook.testing`` (tensors, tolerances) and
``tests/book/_tools.py`` (loading tools/), not here: pytest advises against importing conftest.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: intra-op threads only add synchronisation on a busy 2-core machine; restored after.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
