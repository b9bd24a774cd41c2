"""Library source shown in the book fits the HTML code column (issue 17, part 3).

Chapters display library code with ``show_source(obj)``; the book's code column holds 91
monospace characters at 1280 px (89 in a folded cell), so every displayed line must be at most
88 characters. This test finds every ``show_source(...)`` target in the chapters' code cells,
resolves it as the chapter does (the chapter's own imports, else a dotted name searched in
attnbook's modules), takes exactly the lines ``attnbook.display.source_of`` returns and checks
their width. A target that cannot be resolved fails the test.
"""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
from pathlib import Path

import attnbook
from attnbook.display import source_of
from attnbook.testing import import_triton_flash

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
MAX_WIDTH = 88


def _code_cells(path: Path):
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        # IPython magics and shell escapes are not Python: blank them (keeps line numbers).
        lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()]
        yield ast.parse("\n".join(lines))


def _targets(path: Path):
    """The chapter's import statements and the ``show_source`` first arguments, as source."""
    imports, targets = [], []
    for tree in _code_cells(path):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.unparse(node))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "show_source"):
                targets.append(ast.unparse(node.args[0]) if node.args else "<no argument>")
    return imports, targets


def _library_modules():
    mods = [attnbook]
    for info in pkgutil.walk_packages(attnbook.__path__, "attnbook."):
        try:
            mods.append(importlib.import_module(info.name))
        except ImportError:
            continue
    return mods


def _getattr_path(root, parts):
    obj = root
    for part in parts:
        obj = getattr(obj, part)
    return obj


def _resolve(target: str, namespace: dict, modules: list):
    """The object ``target`` names, or raise LookupError saying why not."""
    try:
        expr = ast.parse(target, mode="eval").body
    except SyntaxError:
        raise LookupError(f"not a Python expression: {target!r}") from None
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        raise LookupError(f"not a dotted name: {target!r}")
    parts.insert(0, expr.id)
    if parts[0] in namespace:
        try:
            return _getattr_path(namespace[parts[0]], parts[1:])
        except AttributeError:
            pass
    found = []
    for mod in modules:
        for start in range(len(parts)):  # attnbook.dispatch._choose, dispatch._choose, _choose
            prefix = mod.__name__.split(".")
            if parts[:start] and parts[:start] != prefix[-start:]:
                continue
            try:
                obj = _getattr_path(mod, parts[start:])
            except AttributeError:
                continue
            if all(obj is not f for f in found):
                found.append(obj)
            break
    if len(found) != 1:
        raise LookupError(f"{target!r} matches {len(found)} library objects")
    return found[0]


def test_every_shown_line_fits_the_code_column():
    import_triton_flash()  # attnbook.triton_kernels importable, as in chapter 09's setup
    modules = _library_modules()
    too_long, unresolved, shown = [], [], {}
    for path in CHAPTERS:
        imports, targets = _targets(path)
        namespace: dict = {}
        for stmt in imports:
            try:
                exec(stmt, namespace)  # noqa: S102 - the chapter's own import statements
            except ImportError:
                continue
        for target in targets:
            try:
                obj = _resolve(target, namespace, modules)
                src, caption, first = source_of(obj)
            except (LookupError, TypeError) as exc:
                unresolved.append(f"{path.name}: show_source({target}): {exc}")
                continue
            shown[(caption, first)] = src
    assert not unresolved, "unresolved show_source targets:\n" + "\n".join(unresolved)
    assert len(shown) >= 40, f"only {len(shown)} shown objects found: is the search broken?"
    for (caption, first), src in sorted(shown.items()):
        for i, line in enumerate(src.splitlines()):
            if len(line) > MAX_WIDTH:
                too_long.append(f"{caption}:{first + i} ({len(line)}): {line}")
    assert not too_long, (f"{len(too_long)} displayed lines over {MAX_WIDTH} characters:\n"
                          + "\n".join(too_long))


def test_every_shown_name_is_public():
    """Issue 30: what a chapter shows with ``show_source`` is public API (no ``_private`` part), so
    a reader can call what they read and the library may not rename it silently."""
    private = []
    for path in CHAPTERS:
        for target in _targets(path)[1]:
            if any(part.startswith("_") for part in target.split(".")):
                private.append(f"{path.name}: show_source({target})")
    assert not private, private
