"""Issue 28 §1 and §4, CHAPTER.md point 18: what a chapter may assert about a live training run.

A reader's notebook runs one seed on the reader's CPU, whose rounding gives another float32
trajectory than the machine that made ``benchmarks/EXPERIMENTS.json``. So no chapter may

1. assert on what ``attnbook.experiments.where`` returns (``assert where(...)["holds"]``, or a
   name bound to its result and asserted later): ``where`` only *shows* where this run falls;
2. compare a live metric with committed numbers (rows or summaries from ``group_rows``,
   ``committed``, ``quote`` ...) by ``assert_allclose`` / ``assert_close`` / ``isclose`` /
   ``allclose`` / ``approx`` at a fixed literal tolerance (or the function's default): such a
   check fails by one float32 ulp on another CPU. A tolerance computed by the library from the
   runs' spread (a non-literal ``rtol=``/``atol=``) is allowed.

Claims over the committed runs (``experiments.committed()[name]["holds"]``) and identities
(float64 ``assert_close`` of two computations) stay allowed. Every chapter, present and future
(``chapters/NN_*.ipynb``), is scanned with the ``ast`` module, code cells in notebook order,
hidden cells included.
"""
from __future__ import annotations

import ast
import json
import re

import pytest

from tests.book._tools import ROOT

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
# functions of attnbook.experiments whose result is committed data (rows or summaries)
COMMITTED_SOURCES = {"group_rows", "committed", "quote", "committed_rows", "rows_of",
                     "load_rows", "committed_row", "summaries", "range_text"}
CLOSE_FNS = {"assert_allclose", "assert_close", "allclose", "isclose", "approx",
             "assert_array_almost_equal", "assert_almost_equal"}
TOL_KWARGS = {"rtol", "atol", "rel", "abs", "rel_tol", "abs_tol", "decimal", None}
NOT_EXPERIMENTS = {"torch", "np", "numpy", "F", "pd", "jnp"}   # their .where is a tensor op
MAGIC = re.compile(r"^\s*[%!]")


def _code_cells(cells):
    for c in cells:
        if c["cell_type"] == "code":
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            yield c.get("id"), "\n".join("" if MAGIC.match(line) else line
                                         for line in src.splitlines())


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_literal(node):
    """A numeric constant, possibly negated or in a simple product/power (``1e-4``, ``5 * 1e-5``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    return False


class _Scanner:
    """Walks a notebook's code cells in order, keeping aliases and tainted names across cells."""

    def __init__(self):
        self.experiments = {"experiments"}   # names bound to attnbook.experiments (or its core)
        self.where_names = set()             # names bound to experiments.where itself
        self.where_results = set()           # names bound to a where(...) result
        self.committed = set()               # names bound to committed data
        self.committed_fns = set()           # bare names of committed-data functions
        self.problems = []

    # -- what a call is
    def _func_name(self, func):
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
        return None

    def _is_where(self, node):
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Name):
            return f.id in self.where_names
        if isinstance(f, ast.Attribute) and f.attr == "where":
            base = f.value
            while isinstance(base, ast.Attribute):
                base = base.value
            return isinstance(base, ast.Name) and (base.id in self.experiments
                                                   or (base.id not in NOT_EXPERIMENTS
                                                       and "exp" in base.id.lower()))
        return False

    def _is_committed_call(self, node):
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Name):
            return f.id in self.committed_fns or f.id in COMMITTED_SOURCES - {"quote", "summaries"}
        return isinstance(f, ast.Attribute) and f.attr in COMMITTED_SOURCES

    def _tainted(self, node):
        return any(self._is_committed_call(n) for n in ast.walk(node)) \
            or bool(_names(node) & self.committed)

    def _uses_where(self, node):
        return any(self._is_where(n) for n in ast.walk(node)) \
            or bool(_names(node) & self.where_results)

    # -- the scan
    def imports(self, node):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                bound = a.asname or a.name
                if node.module == "attnbook" and a.name == "experiments":
                    self.experiments.add(bound)
                elif node.module.startswith("attnbook.experiments"):
                    if a.name == "where":
                        self.where_names.add(bound)
                    elif a.name in COMMITTED_SOURCES:
                        self.committed_fns.add(bound)
                    elif a.name == "core":
                        self.experiments.add(bound)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("attnbook.experiments") and a.asname:
                    self.experiments.add(a.asname)

    def assign(self, targets, value):
        """Bind (or rebind, which clears) the targets' names: where-result, committed data."""
        names = set().union(*(_names(t) for t in targets)) if targets else set()
        for marks, on in ((self.where_results, self._uses_where(value)),
                          (self.committed, self._tainted(value))):
            if on:
                marks |= names
            else:
                marks -= names

    def check(self, cell_id, node):
        if isinstance(node, ast.Assert) and self._uses_where(node.test):
            self.problems.append(f"cell {cell_id}, line {node.lineno}: asserts on "
                                 "experiments.where(...): a live run is shown, not asserted")
        if isinstance(node, ast.Call) and self._func_name(node.func) in CLOSE_FNS:
            tainted = [self._tainted(a) for a in node.args]
            if any(tainted) and not all(tainted):
                # a literal tolerance, `**TOL` (a fixed dict) or none at all: fixed;
                # computed: `rtol=<expression>` or `**<call>`
                computed = [k for k in node.keywords if (k.arg in TOL_KWARGS and k.arg
                                                         and not _is_literal(k.value))
                            or (k.arg is None and isinstance(k.value, ast.Call))]
                if not computed:
                    self.problems.append(
                        f"cell {cell_id}, line {node.lineno}: {self._func_name(node.func)} "
                        "compares a live value with committed numbers at a fixed tolerance")

    def scan(self, cells):
        scanner = self

        class Visitor(ast.NodeVisitor):   # source order: a name's latest binding counts
            def __init__(self, cell_id):
                self.cell_id = cell_id

            def visit_Import(self, node):
                scanner.imports(node)

            visit_ImportFrom = visit_Import

            def generic_visit(self, node):
                scanner.check(self.cell_id, node)
                super().generic_visit(node)

            def visit_Assign(self, node):
                self.generic_visit(node)
                scanner.assign(node.targets, node.value)

            def visit_AnnAssign(self, node):
                self.generic_visit(node)
                if node.value is not None:
                    scanner.assign([node.target], node.value)

            def visit_NamedExpr(self, node):
                self.generic_visit(node)
                scanner.assign([node.target], node.value)

            def visit_For(self, node):
                self.visit(node.iter)
                scanner.assign([node.target], node.iter)
                for child in node.body + node.orelse:
                    self.visit(child)

            def visit_comprehension(self, node):
                self.visit(node.iter)
                scanner.assign([node.target], node.iter)
                for cond in node.ifs:
                    self.visit(cond)

        for cell_id, src in _code_cells(cells):
            try:
                tree = ast.parse(src)
            except SyntaxError as err:
                self.problems.append(f"cell {cell_id}: does not parse ({err.msg})")
                continue
            Visitor(cell_id).visit(tree)
        return list(dict.fromkeys(self.problems))


def live_claim_problems(cells) -> list[str]:
    """The cells of a notebook (``nbformat`` dicts) that assert a live run against committed
    evidence: ``[]`` when the notebook follows issue 28 §1."""
    return _Scanner().scan(cells)


def _cells(*sources):
    return [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": s}
            for i, s in enumerate(sources)]


BAD = {
    "holds": 'from attnbook import experiments\n'
             'assert experiments.where("ch08.warmup", m)["holds"]\n',
    "holds, by name": 'w = experiments.where("ch07.xor", m, display=False)\nprint(w)\n'
                      'assert all(w.values())\n',
    "holds, bare where": 'from attnbook.experiments import where as show\n'
                         'assert show("ch10.errors", errs)["holds"], "clause"\n',
    "holds, in a loop": 'for claim in ("a", "b"):\n'
                        '    assert experiments.where(claim, m_prof, display=False)["holds"]\n',
    "allclose vs group_rows": 'from attnbook.experiments.ch08 import group_rows\n'
                              'rows = group_rows("ch08.last_layer_gap")\n'
                              'np.testing.assert_allclose([rows[k][0] for k in m_prof], '
                              'list(m_prof.values()), rtol=1e-4)\n',
    "isclose vs committed": 'c = experiments.committed()["ch07.xor"]["metrics"]\n'
                            'assert math.isclose(m["loss"], c["loss"]["median"], rel_tol=1e-3)\n',
    "assert_close, default tol": 'ref = experiments.group_rows("ch08.x")\n'
                                 'torch.testing.assert_close(torch.tensor(live), '
                                 'torch.tensor(ref["a"]))\n',
    "assert_close, **TOL": 'ref = experiments.group_rows("ch08.x")\n'
                           'torch.testing.assert_close(live, ref, **TOL)\n',
}
GOOD = {
    "float64 identity": 'torch.testing.assert_close(row_form, col_form, rtol=1e-12, atol=0)\n'
                        'torch.testing.assert_close(ffn(X), row_form, **TOL)\n',
    "torch.where in an assert": 'assert torch.where(x > 0, 1, 0).sum() == 3\n'
                                'assert np.where(a)[0].tolist() == [1]\n',
    "where shown": 'experiments.where("ch08.warmup", m_warm)\n',
    "committed claim": 'assert experiments.committed()["ch07.xor"]["holds"]\n',
    "committed vs committed": 'rows = group_rows("ch08.x")\n'
                              'np.testing.assert_allclose(rows["a"], rows["a"], rtol=1e-4)\n',
    "sane live run": 'assert math.isfinite(loss) and loss < 0.5 * loss0\n',
    "spread tolerance": 'rows = group_rows("ch08.x")\n'
                        'np.testing.assert_allclose(rows["a"][0], live, '
                        'rtol=experiments.spread_rtol("ch08.x", "a"))\n'
                        'np.testing.assert_allclose(rows["a"][0], live, '
                        '**experiments.tolerance("ch08.x"))\n',
    "rebound name": 'rows = group_rows("ch08.x")\nrows = Xb.reshape(-1, 6)\n'
                    'torch.testing.assert_close(ln6(rows), by_row, **TOL)\n',
    "magic line": '%matplotlib inline\nassert 1 + 1 == 2\n',
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_scan_catches_a_live_claim(name):
    assert live_claim_problems(_cells(BAD[name])), name


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_scan_passes_identities_and_committed_claims(name):
    assert live_claim_problems(_cells(GOOD[name])) == [], name


def test_taint_and_aliases_cross_cells():
    cells = _cells('from attnbook import experiments as ex\n',
                   'shown = ex.where("ch11.heads", ratios)\n',
                   'assert shown["holds"]\n')
    assert len(live_claim_problems(cells)) == 1
    cells = _cells('rows = group_rows("ch08.x")\n', 'live = m["a"]\n',
                   'np.testing.assert_allclose(rows["a"][0], live, rtol=1e-4)\n')
    assert len(live_claim_problems(cells)) == 1


def test_there_are_chapters():
    assert len(CHAPTERS) >= 11


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_no_chapter_asserts_a_live_run_against_committed_evidence(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    problems = live_claim_problems(cells)
    assert not problems, f"{path.name} (issue 28 §1):\n" + "\n".join(problems)
