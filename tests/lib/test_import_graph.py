"""The import graph of lib/attnbook has no circle (imports inside functions included)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lib" / "attnbook"


def _imports(path: Path, modules: set) -> set:
    """The attnbook modules ``path`` imports, at the top or lazily inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and not (node.module or "").startswith("attnbook"):
                continue
            base = (node.module or "") if node.level == 0 else "attnbook." * (node.level == 1) + (node.module or "")
            base = base.removeprefix("attnbook").strip(".")
            if base:
                found.add(base.split(".")[0])
            else:  # from . import x, y: a submodule, or a name of the package face (__init__)
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("attnbook.")}
    return found & modules


def import_graph() -> dict:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {m: _imports(PACKAGE / f"{m}.py", modules) - {m} for m in modules}


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
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the detector itself


def test_no_import_circle():
    assert _cycle(import_graph()) is None


def test_the_trust_gate_never_imports_dispatch_or_the_kernels():
    graph = import_graph()
    assert not graph["trust"] & {"dispatch", "selfcheck", "triton_flash", "triton_kernels", "__init__"}
    assert "flash" not in graph["triton_flash"]  # the shared NaN / mask policy is in _policy
