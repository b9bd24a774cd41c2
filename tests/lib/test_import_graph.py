"""The import graph of lib/attnbook has no circle (imports inside functions included)."""
import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[2] / "lib" / "attnbook"


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
