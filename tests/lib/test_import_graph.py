"""The import contract of lib/attnbook (imports inside functions included).

- no import circle, in the core and in the subpackages;
- the core (every module outside ``exercises`` and ``experiments``) never imports
  ``attnbook.testing`` (test fixtures), ``exercises`` or ``experiments``; nothing in the package
  imports ``attnbook.testing`` (production code takes its numerics from ``attnbook.tolerance``);
- the trust gate imports neither the dispatcher nor the kernels.

None of it can pass vacuously: the package path is the installed ``attnbook``'s, checked to exist,
the graph must hold the modules named in ``EXPECTED``, and each rule is shown to catch a planted
edge.
"""
import ast
from pathlib import Path

import attnbook

PACKAGE = Path(attnbook.__file__).resolve().parent
EXPECTED = {"", "reference", "dispatch", "flash", "trust", "tolerance", "testing", "layers", "train",
            "selfcheck", "exercises", "exercises._core", "experiments", "experiments.core"}
TEST_ONLY = {"testing"}
TOP_LAYERS = ("exercises", "experiments")


def _name(path: Path) -> str:
    """``experiments/core.py`` -> ``"experiments.core"``; a package's ``__init__.py`` -> the package (``""`` for attnbook)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set) -> set:
    """The attnbook modules ``path`` imports, at the top or lazily inside a function or branch."""
    me = _name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]  # what "." means in this file
    found = set()

    def add(name):  # the module itself if it is one, else the package holding the name
        while name not in modules:
            name = name.rpartition(".")[0]
        found.add(name)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module or "").startswith("attnbook"):
                    continue
                base = node.module.removeprefix("attnbook").strip(".")
            else:
                up = package.split(".") if package else []
                up = up[:len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                add(f"{base}.{alias.name}".strip(".") if f"{base}.{alias.name}".strip(".") in modules else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnbook."):
                    add(alias.name.removeprefix("attnbook."))
    return found


def import_graph() -> dict:
    """``{module: modules it imports}`` over every .py file of lib/attnbook (``""`` = the package face)."""
    paths = {_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {m: _imports(p, modules) - {m} for m, p in paths.items()}


def _cycle(graph):
    """One circle as a list of modules, or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_parser_sees_lazy_imports_and_the_known_edges():
    graph = import_graph()
    assert "triton_kernels" in graph["triton_flash"]  # inside an `if triton is not None:`
    assert "triton_flash" in graph["dispatch"]  # inside functions only
    assert "trust" in graph["dispatch"] and "dispatch" in graph["selfcheck"]
    assert "dispatch" in graph[""] and "flash" in graph[""]  # the package face
    assert any(m.startswith("experiments") for m in graph)  # subpackages too
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the detector itself


def _core(module: str) -> bool:
    return not any(module == top or module.startswith(top + ".") for top in TOP_LAYERS)


def forbidden_edges(graph: dict) -> list[tuple[str, str]]:
    """Every edge that breaks the contract: core -> testing/exercises/experiments, any -> testing."""
    bad = []
    for m, ns in graph.items():
        for n in ns:
            if n in TEST_ONLY and m not in TEST_ONLY:
                bad.append((m, n))
            elif _core(m) and not _core(n):
                bad.append((m, n))
    return sorted(bad)


def test_the_graph_is_the_real_package():
    """Was vacuous: a wrong PACKAGE path gave an empty graph, in which nothing is ever wrong."""
    assert PACKAGE.is_dir() and (PACKAGE / "__init__.py").is_file(), PACKAGE
    graph = import_graph()
    assert EXPECTED <= set(graph), sorted(EXPECTED - set(graph))
    assert len(graph) >= 40 and sum(map(len, graph.values())) >= 80  # a real graph, not a stub


def test_core_never_imports_testing_exercises_or_experiments():
    graph = import_graph()
    assert forbidden_edges(graph) == []
    for planted in (("trust", "testing"), ("dispatch", "exercises._core"), ("layers", "experiments"),
                    ("exercises._core", "testing")):  # controls: each kind of edge is caught
        m, n = planted
        assert planted in forbidden_edges({**graph, m: graph[m] | {n}}), planted
    assert forbidden_edges({**graph, "experiments.core": graph["experiments.core"] | {"layers"}}) == []


def test_no_import_circle():
    graph = {m: {n for n in ns if not n.startswith("experiments")}
             for m, ns in import_graph().items() if not m.startswith("experiments")}
    assert _cycle(graph) is None


def test_no_import_circle_in_the_experiments_subpackage():
    assert _cycle(import_graph()) is None


def test_the_trust_gate_never_imports_dispatch_or_the_kernels():
    graph = import_graph()
    assert not graph["trust"] & {"dispatch", "selfcheck", "triton_flash", "triton_kernels", ""}
    assert "flash" not in graph["triton_flash"]  # the shared NaN / mask policy is in _policy
