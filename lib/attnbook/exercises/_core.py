"""The machinery behind ``attnbook.exercises``: the registry, the hidden cases, the comparison.

An :class:`Exercise` holds a reference solution (the reader's signature), a gallery of classic
bugs, a function that builds the hidden cases from a seeded generator, and hint functions that
name a mistake's symptom. :func:`check` runs the reader's function on every case (smallest
first), compares with the solution and prints, in Chinese, the first failure made concrete.
The wording lives in ``_report``; the topics register their exercises in their own modules.
"""
from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .._checks import check_int
from ..testing import F64_TOL, max_abs_error, rounding_step
from . import _report

_REGISTRY: dict[str, "Exercise"] = {}
OUT = "返回值"  # the label of a function's single output


@dataclass(frozen=True)
class Case:
    """One hidden case: the arguments, what it tests (``title``) and a concrete ``note``."""

    title: str
    args: tuple
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    tags: frozenset = frozenset()


@dataclass
class Failure:
    """What went wrong in one case, handed to the hint functions."""

    kind: str          # "exception", "type", "dtype", "device", "wrong_dtype", "shape", "nan", "inf",
                       # "value", "mutated"
    case: Case
    inputs: dict       # argument name -> value, floating tensors in float64
    label: str = OUT   # which output (a function may have several, e.g. gradients)
    got: Any = None
    expected: Any = None
    index: tuple | None = None
    exc: BaseException | None = None
    want: Any = None   # "wrong_dtype": the dtype (or the tuple of dtypes) the result should have


def _call_plain(fn, args, kwargs):
    """Default runner: the reader's return value is the single output."""
    ret = fn(*args, **kwargs)
    return ret, {OUT: ret}


def _stub_plain(ret, outputs, case) -> bool:
    return ret is None or ret is NotImplemented


_EMPTY_OPS = {"RESUME", "NOP", "CACHE", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"}


def _empty_source(fn) -> bool | None:
    """The same question asked of the source (a bytecode this Python version words otherwise)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return all(isinstance(st, ast.Pass)
               or isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
               or isinstance(st, ast.Return) and (st.value is None or isinstance(
                   st.value, ast.Constant) and st.value.value is None)
               for st in node.body)


def empty_body(fn) -> bool | None:
    """Whether ``fn``'s body does nothing (``...``, ``pass``, a docstring, ``return None``):
    True / False, or None when ``fn`` has no Python code to look at (a builtin, a callable)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        ops = list(dis.get_instructions(code))
    except Exception:  # noqa: BLE001  (an exotic code object: cannot tell)
        return _empty_source(fn)
    if all(op.opname in _EMPTY_OPS and (op.opname not in ("LOAD_CONST", "RETURN_CONST")
                                        or op.argval is None) for op in ops):
        return True
    return bool(_empty_source(fn))  # False unless the source shows an empty body


@dataclass(frozen=True)
class Exercise:
    """A registered exercise; ``solution`` and every function in ``bugs`` take the reader's arguments."""

    name: str
    title: str
    solution: Callable
    bugs: Mapping[str, Callable]
    make_cases: Callable[[torch.Generator], list]
    hints: tuple = ()
    run: Callable = _call_plain     # (fn, args, kwargs) -> (return value, {label: output})
    is_stub: Callable = _stub_plain  # (return value, outputs, case) -> bool
    f64_tol: Mapping[str, float] = field(default_factory=lambda: dict(F64_TOL))
    low_atol: Callable | None = None  # (case, dtype) -> atol, instead of the FlashAttention rule
    mutates: bool = False  # True: changing the arguments in place is the task (clipping)
    # result dtypes accepted when a case has no floating input (else: the inputs' dtype)
    dtypes: tuple = (torch.float32, torch.float64)

    @property
    def params(self) -> list:
        return list(inspect.signature(self.solution).parameters)

    def cases(self, seed: int = 0) -> list:
        g = torch.Generator().manual_seed(zlib.crc32(self.name.encode()) + 1000003 * seed)
        return self.make_cases(g)


def register(ex: Exercise) -> Exercise:
    if ex.name in _REGISTRY:
        raise ValueError(f"register: exercise {ex.name!r} is already registered")
    _REGISTRY[ex.name] = ex
    return ex


def names() -> list:
    """The names of every registered exercise, sorted (``"ch04.masked_softmax"``, ...)."""
    return sorted(_REGISTRY)


def get(name: str) -> Exercise:
    """The registered :class:`Exercise` called ``name`` (``.solution``, ``.bugs``, ``.cases()``)."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"exercises: unknown exercise {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


# --------------------------------------------------------------------------- inputs and outputs
def _map(obj, fn):
    """Apply ``fn`` to every tensor in a (nested) tuple/list/dict argument structure."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {key: _map(o, fn) for key, o in obj.items()}
    return obj


def _fresh(obj, dtype=None):
    """A copy the reader may modify in place; floating tensors cast to ``dtype`` if given."""
    def one(t):
        t = t.detach().clone()
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t
    return _map(obj, one)


def named_inputs(ex: Exercise, case: Case, dtype=torch.float64) -> dict:
    """Argument name -> value for ``case`` (floating tensors in ``dtype``)."""
    names_ = ex.params
    out = dict(zip(names_, _fresh(case.args, dtype)))
    out.update(_fresh(dict(case.kwargs), dtype))
    return out


def _run(ex: Exercise, fn, case: Case, dtype=None):
    return ex.run(fn, _fresh(case.args, dtype), _fresh(dict(case.kwargs), dtype))


# --------------------------------------------------------------------------- comparison
def _first(mask: torch.Tensor) -> tuple:
    idx = mask.nonzero()[0]
    return tuple(int(i) for i in idx)


def _input_dtype(case: Case) -> torch.dtype | None:
    """The dtype of the case's floating inputs (None if it has none): the result's dtype."""
    found = []
    _map((case.args, dict(case.kwargs)),
         lambda t: found.append(t.dtype) if t.is_floating_point() else None)
    return max(found, key=lambda d: torch.finfo(d).eps) if found else None


def _working_dtype(dtype: torch.dtype, case: Case) -> torch.dtype:
    """The least precise of the result's dtype and the case's floating inputs: float32 inputs
    returned as float64 are judged as float32 (the answer cannot be better than its inputs)."""
    found = [dtype]
    _map((case.args, dict(case.kwargs)),
         lambda t: found.append(t.dtype) if t.is_floating_point() else None)
    return max(found, key=lambda d: torch.finfo(d).eps)


def _compare(ex: Exercise, case: Case, label: str, got, expected, inputs) -> Failure | None:
    """Check one output: type, dtype, shape, NaN/inf, then values (F64_TOL or the library rule)."""
    fail = dict(case=case, inputs=inputs, label=label, got=got, expected=expected)
    if not isinstance(got, torch.Tensor):
        return Failure("type", **fail)
    if not (got.is_floating_point() and got.dtype in (torch.float16, torch.bfloat16,
                                                      torch.float32, torch.float64)):
        return Failure("dtype", **fail)
    if got.device.type == "meta":  # no values to compare
        return Failure("device", **fail)
    got = got.detach().cpu()
    fail["got"] = got
    if tuple(got.shape) != tuple(expected.shape):
        return Failure("shape", **fail)
    want = _input_dtype(case)
    if (got.dtype != want) if want is not None else (got.dtype not in ex.dtypes):
        return Failure("wrong_dtype", want=want if want is not None else ex.dtypes, **fail)
    if got.numel() == 0:
        return None
    g64 = got.double()
    for kind, bad in (("nan", torch.isnan(g64) & ~torch.isnan(expected)),
                      ("inf", torch.isinf(g64) & ~torch.isinf(expected))):
        if bad.any():
            return Failure(kind, index=_first(bad), **fail)
    dtype = _working_dtype(got.dtype, case)
    if dtype == torch.float64:
        tol = ex.f64_tol
        bad = (g64 - expected).abs() > tol["atol"] + tol["rtol"] * expected.abs()
        bad &= ~(torch.isinf(expected) & (g64 == expected))
        return Failure("value", index=_first(bad), **fail) if bad.any() else None
    if ex.low_atol is not None:
        bound = ex.low_atol(case, dtype)
    else:  # FlashAttention's rule: at most 2x the error of the solution run in that dtype
        naive = _run(ex, ex.solution, case, dtype)[1][label]
        bound = 2 * max_abs_error(naive, expected) + rounding_step(expected, dtype)
    err = (g64 - expected).abs()
    if max_abs_error(got, expected) <= bound:
        return None
    return Failure("value", index=_first(err == err.max()), **fail)


def _mutated(ex: Exercise, case: Case, args, kwargs, inputs) -> Failure | None:
    """A Failure if ``fn`` changed one of its tensor arguments in place (the caller's data)."""
    if ex.mutates:
        return None
    given = dict(zip(ex.params, case.args), **case.kwargs)
    passed = dict(zip(ex.params, args), **kwargs)
    for key, before in given.items():
        after = passed.get(key)
        if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
            continue
        if after.shape != before.shape or after.dtype != before.dtype:
            return Failure("mutated", case=case, inputs=inputs, label=key, got=after,
                           expected=before)
        same = before == after
        if before.is_floating_point():
            same |= before.isnan() & after.isnan()
        if not bool(same.all()):
            return Failure("mutated", case=case, inputs=inputs, label=key, got=after,
                           expected=before, index=_first(~same))
    return None


def _hint(ex: Exercise, failure: Failure) -> str:
    for hint in (lambda f: _report.signature_hint(ex, f), *ex.hints):
        try:
            text = hint(failure)
        except Exception:  # a hint must never hide the report itself
            text = None
        if text:
            return text
    return _report.generic_hint(failure)


# --------------------------------------------------------------------------- check
def _is_stub(ex: Exercise, fn, ret, outputs, case) -> bool:
    if ret is NotImplemented:
        return True
    if ret is None and empty_body(fn) is False:  # code that forgot `return`, not a stub
        return False
    return ex.is_stub(ret, outputs, case)


def _check_seed(seed) -> None:
    if check_int("seed", seed, fn="check", minimum=0) >= 2**32:
        raise ValueError(f"check: `seed` must be an int in [0, 2**32), got {seed}")


def check(name: str, fn: Callable, *, seed: int = 0) -> bool:
    """Run exercise ``name``'s hidden cases on the reader's ``fn``; print the verdict in Chinese.

    Returns True when every case passes (after a one-line ✓), else False after explaining the
    first failing case: its inputs, the position, expected vs got, and a hint naming the
    mistake's symptom. A wrong answer, a wrong shape/dtype, NaN/inf and an exception raised
    inside ``fn`` are all reported, never raised. So is a result in another dtype than the
    inputs, and a change ``fn`` makes to its arguments in place (the caller's tensors). A stub
    counts as "还没有实现": on the first case ``fn`` raises NotImplementedError, returns
    ``NotImplemented``, or returns None from a body that does nothing (``...``, ``pass``); a
    body with code that returns None is told it forgot ``return`` (exercises that change
    their arguments in place refine this: see their ``is_stub``).

    Args:
        name: an exercise from :func:`names`, e.g. ``"ch04.masked_softmax"``.
        fn: the reader's function, with the signature of ``get(name).solution``.
        seed: which draw of the randomized cases (the same seed gives the same cases).
    Raises:
        ValueError for an unknown ``name`` or a ``seed`` outside [0, 2**32); TypeError when ``fn``
        is not callable or ``seed`` is not an int.
    """
    ex = get(name)
    if not callable(fn):
        raise TypeError(f"check: `fn` must be a function (pass the function itself, not its "
                        f"result), got {type(fn).__name__}")
    _check_seed(seed)
    cases = ex.cases(seed)
    for i, case in enumerate(cases):
        inputs = named_inputs(ex, case)
        expected = {key: val.detach().double()
                    for key, val in _run(ex, ex.solution, case, torch.float64)[1].items()}
        args, kwargs = _fresh(case.args), _fresh(dict(case.kwargs))
        try:
            ret, outputs = ex.run(fn, args, kwargs)
        except NotImplementedError as exc:
            if i == 0:
                print(_report.stub(ex))
                return False
            failure = Failure("exception", case=case, inputs=inputs, exc=exc)
        except Exception as exc:  # the reader's bug is reported, not propagated
            failure = Failure("exception", case=case, inputs=inputs, exc=exc)
        else:
            if i == 0 and _is_stub(ex, fn, ret, outputs, case):
                print(_report.stub(ex))
                return False
            failure = None
            for label, exp in expected.items():
                failure = _compare(ex, case, label, outputs.get(label), exp, inputs)
                if failure is not None:
                    break
            if failure is None:
                failure = _mutated(ex, case, args, kwargs, inputs)
        if failure is not None:
            print(_report.explain(ex, failure, i, len(cases), _hint(ex, failure)))
            return False
    print(_report.passed(ex, len(cases)))
    return True
