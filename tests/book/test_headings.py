"""No chapter skips a heading level (H2 -> H4): MyST warns about it and the -W book build fails.

Checked here, in the hygiene stage, so the failure shows in seconds rather than after the build.
"""
import json

import pytest

from tests.book._tools import ROOT

NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "colab").glob("*.ipynb"))


def heading_jumps(cells):
    """``(cell id, level before, level, text)`` for every heading deeper than its predecessor + 1."""
    jumps, prev = [], None
    for c in cells:
        if c["cell_type"] != "markdown":
            continue
        fenced = False
        for line in "".join(c["source"]).split("\n"):
            if line.lstrip().startswith(("```", "~~~", ":::")) and not line.lstrip().startswith(":::{"):
                fenced = not fenced if line.lstrip().startswith(("```", "~~~")) else fenced
            if fenced or not line.startswith("#"):
                continue
            level = len(line) - len(line.lstrip("#"))
            if line[level:level + 1] != " ":
                continue
            if prev is not None and level > prev + 1:
                jumps.append((c.get("id"), prev, level, line[:60]))
            prev = level
    return jumps


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_heading_level_is_skipped(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert not heading_jumps(cells), heading_jumps(cells)


def test_the_check_sees_a_jump_and_ignores_code():
    md = lambda s: {"cell_type": "markdown", "source": [s], "id": "x"}  # noqa: E731
    assert heading_jumps([md("# A\n## B\n#### C")]) == [("x", 2, 4, "#### C")]
    assert heading_jumps([md("# A\n```\n#### not a heading\n```\n## B")]) == []
    assert heading_jumps([md("## A"), md("### B\n## C")]) == []
