"""Fixtures shared by every test folder (tests/lib: the library; tests/book: the book, its tools
and the environment). Helper functions live in ``attnbook.testing`` (tensors, tolerances) and
``tests/book/_tools.py`` (loading tools/), not here: pytest advises against importing conftest.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for every test (the default since issue 30), the count restored after.

    The tensors are tiny: threads only add synchronisation, and on a busy 2-core machine the
    gradient checks ran several times slower with torch's default count. A test that needs more
    threads sets them itself (this fixture restores the count it found). Files that still ask
    for it with ``pytestmark = pytest.mark.usefixtures("one_thread")`` get the same fixture.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
