"""The machinery behind ``attnbook.exercises``: the registry, the hidden cases, the comparison.

An :class:`Exercise` holds a reference solution (the reader's signature), a gallery of classic
bugs, a function that builds the hidden cases from a seeded generator, and hint functions that
name a mistake's symptom. :func:`check` runs the reader's function on every case (smallest
first), compares with the solution and prints, in Chinese, the first failure made concrete.
The wording lives in ``_report``; the topics register their exercises in their own modules.
"""
from __future__ import annotations

import ast
import contextlib
import dis
import inspect
import io
import signal
import sys
import textwrap
import threading
import zlib
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .._checks import check_int
from ..tolerance import F64_TOL, max_abs_error, rounding_step
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
    ret: Any = None    # what ``fn`` returned (the whole return value, for multi-output exercises)
    f32_err: float | None = None  # "value" in float64: the solution's own error run in float32
    forbidden: tuple = ()  # "forbidden": what ``fn`` called that the exercise rules out
    n_outputs: int = 1     # how many outputs the exercise expects


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
    # off limits while ``fn`` runs: (target, label) or (target, label, predicate(args, kwargs));
    # a target is a Python function (any call of its code is seen, however it was imported) or
    # a torch function / Tensor method (seen through a TorchFunctionMode). The exercise's own
    # ``solution`` is always off limits.
    forbidden: tuple = ()
    autograd: bool = True  # False: ``fn`` runs in torch.inference_mode, autograd off limits
    bool_result: bool = False  # True: the result must be a bool tensor (a mask), compared as 0/1
    # True: a build exercise (CHAPTER.md 25): several steps that build the chapter's key idea, not a
    # copy of code the chapter shows; every chapter checks at least one (tests/book/test_exercise_cells.py)
    build: bool = False

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
    if got.layout != torch.strided:
        return Failure("layout", **fail)
    if ex.bool_result:
        if got.dtype != torch.bool:
            return Failure("bool_dtype", **fail)
        got = got.double()
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
    lost = torch.isinf(expected) & (g64 != expected)  # an expected ±inf must be returned exactly
    if lost.any():
        return Failure("value", index=_first(lost), **fail)
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
    _report.set_expected(failure.expected if failure.kind in ("value", "nan", "inf") else None)
    try:
        for hint in (lambda f: _report.signature_hint(ex, f), _report.forbidden_hint,
                     _report.output_count_hint, *ex.hints, _report.precision_hint):
            try:
                text = hint(failure)
            except Exception:  # a hint must never hide the report itself
                text = None
            if text:
                return text
        return _report.generic_hint(failure)
    finally:
        _report.set_expected(None)


# --------------------------------------------------------------------------- check
def _is_stub(ex: Exercise, fn, ret, outputs, case) -> bool:
    if ret is NotImplemented:
        return True
    if ret is None and empty_body(fn) is False:  # code that forgot `return`, not a stub
        return False
    return ex.is_stub(ret, outputs, case)


# --------------------------------------------------------------------------- running the answer
TIME_LIMIT = 20.0   # seconds per case; a longer run is stopped and reported
PRINT_LINES = 20    # at most this many lines of what ``fn`` printed are shown
_AUTOGRAD = ((torch.autograd.grad, "torch.autograd.grad"),
             (torch.autograd.backward, "torch.autograd.backward"),
             (torch.Tensor.backward, "Tensor.backward()"),
             (torch.autograd.functional.jacobian, "torch.autograd.functional.jacobian"),
             (torch.autograd.functional.vjp, "torch.autograd.functional.vjp"))


class _Timeout(BaseException):
    """Raised in ``fn`` when a case runs past TIME_LIMIT (a BaseException: ``except Exception``
    in the reader's code does not swallow it)."""


def _codes(obj) -> list:
    """The code objects whose call means ``obj`` was called (the function and what it wraps)."""
    out = []
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        code = getattr(obj, "__code__", None)
        if code is None and isinstance(obj, (staticmethod, classmethod)):
            code = getattr(obj.__func__, "__code__", None)
        if code is not None:
            out.append(code)
        obj = getattr(obj, "__wrapped__", None)
    return out


_HERE = str(Path(__file__).resolve().parent)
_TORCH = str(Path(torch.__file__).resolve().parent)


_LIB = str(Path(__file__).resolve().parent.parent)


def _caller_is_package(frame) -> bool:
    """Whether the call made in ``frame``'s caller chain comes from this package: the first
    frame above ``frame`` outside torch, contextlib and the rest of the library (whose
    functions call each other) belongs to the exercises package (a solution, a gallery bug, a
    runner), not to the reader."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_HERE):
            return True
        if not (name.startswith(_TORCH) or name.startswith(_LIB)
                or name.endswith("contextlib.py")):
            return False
        frame = frame.f_back
    return False


class _Recorder(torch.overrides.TorchFunctionMode):
    """Records calls of the forbidden torch functions while the reader's ``fn`` runs."""

    def __init__(self, targets: dict):
        super().__init__()
        self.targets = targets
        self.hits: list = []
        # torch.ops.aten.<op> called directly reaches the mode as an OpOverload(Packet): it is
        # the forbidden function when its name holds the function's (aten._softmax: softmax,
        # aten._scaled_dot_product_attention_math: scaled_dot_product_attention). Entries with a
        # predicate are left out (aten's arguments are not the function's).
        self.aten = [(getattr(f, "__name__", "").lstrip("_"), (label, None))
                     for f, (label, pred) in targets.items()
                     if pred is None and len(getattr(f, "__name__", "").lstrip("_")) > 3]

    def _aten_entry(self, func):
        if not isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return None
        op = str(getattr(func, "__name__", "")).split(".")[0]
        return next((entry for name, entry in self.aten if name in op), None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            entry = self.targets.get(func)
        except TypeError:  # an unhashable callable
            entry = None
        if entry is None:
            entry = self._aten_entry(func)
        if entry is not None and not _caller_is_package(sys._getframe(1)):
            label, pred = entry
            try:
                hit = pred is None or pred(args, kwargs)
            except Exception:  # noqa: BLE001  (a predicate never breaks the run)
                hit = False
            if hit and label not in self.hits:
                self.hits.append(label)
        return func(*args, **kwargs)


def _forbidden_tables(ex: "Exercise"):
    """(code object -> (label, predicate), torch function -> (label, predicate)) for ``ex``; a
    predicate gets (args, kwargs) from torch, ((), the arguments by name) from a Python call."""
    entries = [(ex.solution, f"exercises.get({ex.name!r}).solution（本题的参考答案）")]
    entries += list(ex.forbidden)
    from ._offlimits import OFF_LIMITS  # noqa: PLC0415  (imports the library's modules)
    entries += [e for e in OFF_LIMITS.get(ex.name, ()) if e not in ex.forbidden]
    if not ex.autograd:
        entries += list(_AUTOGRAD)
    codes, funcs = {}, {}
    for entry in entries:
        target, label = entry[0], entry[1]
        pred = entry[2] if len(entry) > 2 else None
        found = _codes(target)
        if found:  # a Python function: seen by its code; a predicate reads its arguments
            for code in found:
                codes.setdefault(code, (label, pred))
        if not found or pred is not None:  # a torch function (F.* also dispatch through it)
            funcs[target] = (label, pred)
    return codes, funcs


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Stop the block after ``seconds`` (main thread with SIGALRM only; elsewhere: no limit)."""
    usable = (hasattr(signal, "setitimer") and seconds
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def stop(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(ex: "Exercise", fn, args, kwargs, out: io.StringIO):
    """Run ``fn`` on one case: printed text into ``out``, under the time limit, with the
    forbidden calls recorded. Returns (ret, outputs, exc, hits); ``exc`` is None or the
    Exception ``fn`` raised (``_Timeout`` for a case that ran too long)."""
    codes, funcs = _forbidden_tables(ex)
    hits: list = []
    if fn is not ex.solution:  # the forbidden function itself passed as the answer
        for code in _codes(fn):
            if code in codes and codes[code][1] is None and codes[code][0] not in hits:
                hits.append(codes[code][0])
        try:
            if fn in funcs and funcs[fn][1] is None:
                hits.append(funcs[fn][0])
        except TypeError:
            pass
    recorder = _Recorder(funcs)

    def profile(frame, event, arg):
        if event == "call":
            entry = codes.get(frame.f_code)
            if entry is None or entry[0] in hits or _caller_is_package(frame.f_back):
                return
            if entry[1] is not None:
                try:
                    if not entry[1]((), dict(frame.f_locals)):
                        return
                except Exception:  # noqa: BLE001  (a predicate never breaks the run)
                    return
            hits.append(entry[0])

    ret, outputs, exc = None, {}, None
    old_profile = sys.getprofile()
    grad = torch.inference_mode() if not ex.autograd else contextlib.nullcontext()
    try:
        with contextlib.redirect_stdout(out), _time_limit(TIME_LIMIT), grad, recorder:
            sys.setprofile(profile)
            try:
                ret, outputs = ex.run(fn, args, kwargs)
            finally:
                sys.setprofile(old_profile)
    except _Timeout as e:
        exc = e
    except Exception as e:  # noqa: BLE001  (the reader's bug is reported, not propagated)
        exc = e
    return ret, outputs, exc, hits + [h for h in recorder.hits if h not in hits]


def _printed(out: io.StringIO) -> str:
    """What ``fn`` printed, cut to PRINT_LINES lines (each at most 200 characters)."""
    text = out.getvalue()
    if not text:
        return ""
    lines = text.rstrip("\n").split("\n")
    shown = [line if len(line) <= 200 else line[:200] + " …" for line in lines[:PRINT_LINES]]
    if len(lines) > PRINT_LINES:
        shown.append(f"……（你的函数一共打印了 {len(lines)} 行，只显示前 {PRINT_LINES} 行）")
    return "\n".join(shown)


class Verdict:
    """The result of :func:`check`: truthy when every case passed, falsy otherwise.

    It behaves like the bool it stands for (``assert check(...)``, ``not check(...)``,
    ``any([...])``, ``== True``) and its ``repr`` is ``True`` / ``False``; in IPython it displays
    nothing, so a cell that ends with ``check(...)`` shows the printed message only."""

    __slots__ = ("ok",)

    def __init__(self, ok: bool):
        self.ok = bool(ok)

    def __bool__(self) -> bool:
        return self.ok

    def __eq__(self, other):
        if isinstance(other, (bool, Verdict)):
            return self.ok == bool(other)
        return NotImplemented

    def __hash__(self):
        return hash(self.ok)

    def __repr__(self) -> str:
        return repr(self.ok)

    def _ipython_display_(self) -> None:  # the message is already printed
        return None


def _check_seed(seed) -> None:
    if check_int("seed", seed, fn="check", minimum=0) >= 2**32:
        raise ValueError(f"check: `seed` must be an int in [0, 2**32), got {seed}")


def check(name: str, fn: Callable, *, seed: int = 0) -> Verdict:
    """Run exercise ``name``'s hidden cases on the reader's ``fn``; print the verdict in Chinese.

    Returns a :class:`Verdict`, truthy when every case passes (after a one-line ✓), else falsy
    after explaining the first failing case: its inputs, the position, expected vs got, and a
    hint naming the mistake's symptom. A wrong answer, a wrong shape/dtype, NaN/inf and an exception raised
    inside ``fn`` are all reported, never raised. So is a result in another dtype than the
    inputs, and a change ``fn`` makes to its arguments in place (the caller's tensors). A stub
    counts as "还没有实现": on the first case ``fn`` raises NotImplementedError, returns
    ``NotImplemented``, or returns None from a body that does nothing (``...``, ``pass``); a
    body with code that returns None is told it forgot ``return`` (exercises that change
    their arguments in place refine this: see their ``is_stub``). An answer that calls what the
    exercise rules out (``Exercise.forbidden``: the library's own implementation, torch's
    one-call equivalent; always the exercise's ``solution``) is rejected, naming the call. Each
    case runs under a time limit (``TIME_LIMIT`` seconds, where SIGALRM exists); what ``fn``
    prints is captured and shown, cut, before the verdict; an unusual return (sparse, complex,
    meta, a list, a tuple of the wrong length) is reported, never raised. Interrupting the
    kernel (KeyboardInterrupt) stops ``check`` itself.

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
    printed = io.StringIO()
    verdict = None
    for i, case in enumerate(cases):
        inputs = named_inputs(ex, case)
        expected = {key: val.detach().double()
                    for key, val in _run(ex, ex.solution, case, torch.float64)[1].items()}
        if ex.autograd:
            args, kwargs = _fresh(case.args), _fresh(dict(case.kwargs))
        else:
            with torch.inference_mode():
                args, kwargs = _fresh(case.args), _fresh(dict(case.kwargs))
        ret, outputs, exc, hits = _call(ex, fn, args, kwargs, printed)
        failure = None
        if hits:
            failure = Failure("forbidden", case=case, inputs=inputs, forbidden=tuple(hits))
        elif isinstance(exc, NotImplementedError) and i == 0:
            verdict = (_report.stub(ex), False)
        elif exc is not None:
            failure = Failure("exception", case=case, inputs=inputs, exc=exc)
        elif i == 0 and _is_stub(ex, fn, ret, outputs, case):
            verdict = (_report.stub(ex), False)
        else:
            for label, exp in expected.items():
                try:
                    failure = _compare(ex, case, label, outputs.get(label), exp, inputs)
                except Exception:  # noqa: BLE001  (an exotic return value: reported)
                    failure = Failure("type", case=case, inputs=inputs, label=label,
                                      got=outputs.get(label), expected=exp)
                if failure is not None:
                    failure.ret = ret
                    failure.n_outputs = len(expected)
                    break
            if failure is None:
                failure = _mutated(ex, case, args, kwargs, inputs)
        if failure is not None:
            if failure.kind == "value" and failure.got.dtype == torch.float64:
                failure.f32_err = _f32_error(ex, case, failure.label, failure.expected)
            verdict = (_report.explain(ex, failure, i, len(cases), _hint(ex, failure)), False)
        if verdict is not None:
            break
    if verdict is None:
        verdict = (_report.passed(ex, len(cases)), True)
    shown = _printed(printed)
    if shown:
        print(_report.printed_header())
        print(shown)
    print(verdict[0])
    return Verdict(verdict[1])


def _f32_error(ex: Exercise, case: Case, label: str, expected) -> float | None:
    """The error of the solution itself when its floating inputs are float32, and at least
    float32's rounding of the expected values: the size a float32 intermediate would give."""
    try:
        naive = _run(ex, ex.solution, case, torch.float32)[1][label].detach().double()
        err = float((naive - expected).abs().nan_to_num(0.0, 0.0, 0.0).max())
    except Exception:  # noqa: BLE001
        err = 0.0
    finite = expected[torch.isfinite(expected)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return max(err, torch.finfo(torch.float32).eps * scale)
