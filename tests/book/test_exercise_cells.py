"""The chapters' hands-on exercises follow CHAPTER.md point 25 (issue 29, part 3).

For every ``check("chNN.x", my_x)`` a chapter runs on the reader's function:

- the reader's function is named ``my_*`` (never a library name or a name the chapter imports);
- its prompt, the markdown cell(s) right above the cell that defines ``my_x``, names what is off
  limits: the short name of every ``attnbook.*`` call the exercise rules out, torch's one-call
  equivalent where the exercise rules one out, and the exercise's own ``.solution``;
- no ``show_source`` cell above that prompt prints a function the exercise rules out (the reader
  would transcribe it);
- every chapter checks at least two exercises and at least one build exercise (``build=True``).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from attnbook import exercises
from attnbook.exercises._offlimits import labels

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
CHECK = re.compile(r"""check\(\s*["'](ch\d\d\.\w+)["']\s*,\s*(\w+)""")


def _cells(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"]))
            for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def _defines(src: str, name: str) -> bool:
    return re.search(rf"^\s*def {re.escape(name)}\s*\(", src, re.M) is not None


def reader_exercises(cells) -> list[tuple[str, str, int]]:
    """(exercise, the reader's function, index of the cell defining it) for every check on a
    function that is not the book's solution (``book_*``) or a gallery loop variable."""
    found = []
    for kind, src in cells:
        if kind != "code":
            continue
        for name, fn in CHECK.findall(src):
            if fn.startswith("book_") or fn in {"bug", "fn", "wrong"}:
                continue
            where = [i for i, (k, s) in enumerate(cells) if k == "code" and _defines(s, fn)]
            found.append((name, fn, where[0] if where else -1))
    return sorted(set(found), key=lambda t: t[2])


def _prompt(cells, i: int) -> str:
    j, parts = i - 1, []
    while j >= 0 and cells[j][0] == "markdown":
        parts.append(cells[j][1])
        j -= 1
    return "\n".join(reversed(parts))


def _short(label: str) -> str:
    return label.split("(")[0].split(".")[-1]


def _forbidden_labels(name: str) -> list[str]:
    ex = exercises.get(name)
    return list(dict.fromkeys([*labels(name), *(entry[1] for entry in ex.forbidden)]))


def _shown_before(cells, i: int) -> set[str]:
    shown = set()
    for kind, src in cells[:i]:
        if kind != "code" or "show_source(" not in src:
            continue
        try:
            tree = ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                                       for ln in src.splitlines()))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show_source" \
                    and node.args:
                shown.add(ast.unparse(node.args[0]).split(".")[-1])
    return shown


PARAMS = [(p, name, fn, i) for p in CHAPTERS for name, fn, i in reader_exercises(_cells(p))]
IDS = [f"{p.name[:2]}-{name}" for p, name, _, _ in PARAMS]


@pytest.mark.parametrize("path, name, fn, i", PARAMS, ids=IDS)
def test_reader_function_is_my_and_defined(path, name, fn, i):
    assert fn.startswith("my_"), f"{path.name}: {name} is checked on {fn!r}; name the reader's function my_*"
    assert i >= 0, f"{path.name}: no cell defines {fn} (the stub)"


@pytest.mark.parametrize("path, name, fn, i", PARAMS, ids=IDS)
def test_prompt_names_what_is_off_limits(path, name, fn, i):
    cells = _cells(path)
    prompt = _prompt(cells, i)
    assert prompt, f"{path.name}: no markdown prompt right above the cell defining {fn}"
    assert "solution" in prompt, f"{path.name}: {name}'s prompt must say its .solution is off limits"
    forbidden = _forbidden_labels(name)
    own = [lb for lb in forbidden if lb.startswith("attnbook.")]
    missing = [lb for lb in own if _short(lb) not in prompt]
    assert not missing, f"{path.name}: {name}'s prompt does not name these off-limits calls: {missing}"
    others = [lb for lb in forbidden if not lb.startswith("attnbook.")]
    if others:
        assert any(_short(lb) in prompt for lb in others), \
            f"{path.name}: {name}'s prompt names none of torch's off-limits calls {others}"


@pytest.mark.parametrize("path, name, fn, i", PARAMS, ids=IDS)
def test_no_exercise_asks_for_code_shown_above_it(path, name, fn, i):
    cells = _cells(path)
    start = i - 1
    while start >= 0 and cells[start][0] == "markdown":
        start -= 1
    shown = _shown_before(cells, start + 1)
    copied = sorted({_short(lb) for lb in _forbidden_labels(name) if lb.startswith("attnbook.")} & shown)
    assert not copied, (f"{path.name}: {name} asks for what show_source prints above it: {copied}; "
                        "show it after the exercise or ask for a variant")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name[:2] for p in CHAPTERS])
def test_every_chapter_has_exercises_and_a_build_exercise(path):
    names = {name for name, _, _ in reader_exercises(_cells(path))}
    assert len(names) >= 2, f"{path.name}: {len(names)} hands-on exercise(s); CHAPTER.md 21 asks for >= 2"
    assert any(exercises.get(n).build for n in names), \
        f"{path.name}: no build exercise among {sorted(names)} (Exercise.build; CHAPTER.md 25)"


def test_the_rules_catch_what_they_name():
    """Controls: each rule fails on a chapter written the old way."""
    cells = [("markdown", "**练习。** 写出 clip_grad_norm。"),
             ("code", "show_source(clip_grad_norm)"),
             ("markdown", "**练习 3。** 写出函数。"),
             ("code", "def clip_grad_norm(grads, max_norm):\n    ...\ncheck(\"ch01.clip_grad_norm\", clip_grad_norm)")]
    [(name, fn, i)] = reader_exercises(cells)
    assert (name, fn, i) == ("ch01.clip_grad_norm", "clip_grad_norm", 3) and not fn.startswith("my_")
    assert "solution" not in _prompt(cells, i)
    assert "clip_grad_norm" in _shown_before(cells, 2)
