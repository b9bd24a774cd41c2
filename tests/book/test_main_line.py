"""CHAPTER.md point 17, measured: a chapter's main line is <= 35 cells before its first 深入
section (an H2/H3 heading that starts with 深入), and no visible code cell on it is over 25 lines
(folded ``hide-input`` cells do not count: the reader sees one line for them)."""
import json
import re

import pytest

from tests.book._tools import ROOT

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
MAX_CELLS, MAX_LINES = 35, 25
DEEP = re.compile(r"^#{2,3} 深入", re.M)


def main_line(cells):
    """``(number of cells before the first 深入 heading, [(cell id, lines)] of long visible code)``."""
    first = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and DEEP.search("".join(c["source"]))), None)
    if first is None:
        return None, []
    long = [(c.get("id"), len("".join(c["source"]).splitlines())) for c in cells[:first]
            if c["cell_type"] == "code" and "hide-input" not in c["metadata"].get("tags", [])
            and len("".join(c["source"]).splitlines()) > MAX_LINES]
    return first, long


def test_the_rule_sees_a_long_main_line_and_a_long_cell():
    md = lambda s: {"cell_type": "markdown", "source": [s], "metadata": {}}
    code = lambda n, tags=(): {"cell_type": "code", "source": ["x\n"] * n,
                               "metadata": {"tags": list(tags)}, "id": f"c{n}"}
    cells = [md("# t")] + [code(1)] * 36 + [code(26), code(40, ["hide-input"]), md("## 深入：x")]
    assert main_line(cells) == (39, [("c26", 26)])
    assert main_line([md("# t"), code(3)]) == (None, [])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_main_line_is_short(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first, long = main_line(cells)
    assert first is not None, f"{path.name}: no '## 深入…' section, so the main line is the whole chapter"
    assert first <= MAX_CELLS, f"{path.name}: {first} cells before the first 深入 section (<= {MAX_CELLS})"
    assert not long, f"{path.name}: main-line code cells over {MAX_LINES} lines: {long}"
