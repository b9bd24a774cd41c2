"""The Chinese wording of ``check``: the ✓ line, "还没有实现", and the explanation of a failure.

A failure is made small and concrete: the inputs (names, shapes, dtypes), the position of the
first wrong number, the row it sits in (expected vs got) and a hint. Hints that name a topic's
classic mistakes live with the topic; the generic ones below are the fallback.
"""
from __future__ import annotations

import inspect
import re
import unicodedata

import torch

__all__ = ["WIDTH", "close", "describe", "explain", "fmt_row", "generic_hint", "nearest", "passed",
           "signature_hint", "stub", "wrap"]

# The book's code and output column shows ~80 monospace columns at 1280 px (CHAPTER.md point 14);
# a Chinese character takes two. Every line check prints fits in WIDTH columns.
WIDTH = 76
# runs of spaces, words (ASCII and the maths signs written inside them: −inf, √d_k, p·ω_i), others
_UNITS = re.compile(r"[ ]+|[\x21-\x7e−√Σ‖²·αβγεωπ…]+|.", re.S)
_NO_LINE_START = set("，。；：、）》」』！？…—")
_NO_LINE_END = set("（《「『")


def _cols(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def wrap(line: str, width: int = WIDTH) -> list:
    """Split one line into lines of at most ``width`` columns (CJK = 2), breaking between
    Chinese characters or at spaces, never inside an ASCII word, never before a closing mark
    (the unit before it moves down with it) and never after an opening mark; continuation
    lines keep the line's indent plus two spaces. A single unit wider than the line stays whole."""
    indent = line[: len(line) - len(line.lstrip(" "))]
    out, cur = [], []  # cur: the units of the line being filled

    def cols(units):
        return _cols("".join(units))

    for unit in _UNITS.findall(line[len(indent):]):
        lead = indent if not out else indent + "  "
        if cur and _cols(lead) + cols(cur) + _cols(unit) > width:
            carry = []
            while len(cur) > 1 and not cur[-1].isspace() and (
                    cur[-1][-1] in _NO_LINE_END or (carry or [unit])[0][0] in _NO_LINE_START):
                carry.insert(0, cur.pop())
            out.append((lead + "".join(cur)).rstrip())
            cur = carry
            if unit.isspace() and not cur:
                continue
        cur.append(unit)
    out.append(((indent if not out else indent + "  ") + "".join(cur)).rstrip())
    return out


def _wrapped(lines) -> str:
    return "\n".join(piece for line in lines for piece in wrap(line))


_EXPECTED = [None]  # the failing case's right answer while the hints run (set by check)


def set_expected(expected) -> None:
    """Tell :func:`close` and :func:`nearest` the right answer of the case being explained."""
    _EXPECTED[0] = expected


def _same_as_expected(alt) -> bool:
    """Whether a bug's output equals the right answer on this case (it cannot be told apart)."""
    exp = _EXPECTED[0]
    if not isinstance(exp, torch.Tensor) or not isinstance(alt, torch.Tensor) \
            or tuple(exp.shape) != tuple(alt.shape):
        return False
    return bool(torch.allclose(alt.detach().double(), exp.double(), rtol=1e-9, atol=1e-12,
                               equal_nan=True))


def close(got, alt, rtol=1e-3, atol=1e-5) -> bool:
    """Whether ``got`` equals an alternative (wrong) result ``alt``: used to recognise a bug.
    A bug whose output equals the right answer on this case is never recognised."""
    if not isinstance(got, torch.Tensor) or alt is None or tuple(got.shape) != tuple(alt.shape):
        return False
    if _same_as_expected(alt):
        return False
    return bool(torch.allclose(got.detach().double(), alt.double(), rtol=rtol, atol=atol,
                               equal_nan=True))


def nearest(got, expected, alternatives):
    """The hint of the alternative (wrong) result nearest to ``got``, if it is far nearer than the
    right answer (10x): recognises a bug even when it changes the result only slightly.

    ``alternatives``: (hint, tensor) pairs. Returns the hint or None.
    """
    if not isinstance(got, torch.Tensor):
        return None
    g = got.detach().double()
    ref = float((g - expected).abs().max())
    best = None
    for text, alt in alternatives:
        if alt is None or tuple(alt.shape) != tuple(g.shape) or _same_as_expected(alt):
            continue
        err = float((g - alt.double()).abs().max())
        if err < 0.1 * ref and (best is None or err < best[0]):
            best = (err, text)
    return best[1] if best else None


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + (",)" if t.ndim == 1 else ")")


def describe(value) -> str:
    """A short description of one argument: shape and dtype for a tensor, the value otherwise."""
    if isinstance(value, torch.Tensor):
        return f"形状 {_shape(value)}，{str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) or v is None
                                                          for v in value):
        return f"{len(value)} 个张量，形状 " + "、".join("None" if v is None else _shape(v)
                                                     for v in value)
    return repr(value)


def _num(x: float, digits: int = 4) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}f}"


def _digits(a: float, b: float) -> int:
    """Enough decimals (4 to 12) for ``a`` and ``b`` to print differently."""
    for d in range(4, 13):
        if _num(a, d) != _num(b, d):
            return d
    return 12


def fmt_row(t: torch.Tensor, limit: int = 8, digits: int = 4) -> str:
    """``[0.1234, nan, …]``: at most ``limit`` numbers of a 1-D tensor, ``digits`` decimals."""
    vals = [_num(float(x), digits) for x in t.reshape(-1)[:limit]]
    more = "，…" if t.numel() > limit else ""
    return "[" + "，".join(vals) + more + "]"


def _value(t: torch.Tensor, idx: tuple) -> str:
    """One entry of ``t`` for a message: True / False for a bool tensor, a number otherwise."""
    x = t[idx].item()
    return str(x) if isinstance(x, bool) else _num(float(x))


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _index(idx: tuple) -> str:
    return "[" + ", ".join(str(i) for i in idx) + "]"


def stub(ex) -> str:
    return _wrapped([f"… {ex.name}（{ex.title}）还没有实现：把函数体里的 `...` 换成你的代码，"
                     f"再运行这个单元。"])


def passed(ex, n: int) -> str:
    return _wrapped([f"✓ {ex.name}（{ex.title}）：{n} 个隐藏测试全部通过。"])


def _where(f) -> list:
    """The position of the first wrong number and, for tensors of rank >= 1, its row."""
    got, exp, idx = f.got, f.expected, f.index
    lines = []
    what = f"`{f.label}` " if f.label != "返回值" else "返回值"
    if idx is None:
        return lines
    e, g = float(exp[idx]), float(got[idx])
    d = _digits(e, g)
    if exp.ndim == 0:
        lines.append(f"{what.rstrip()}：期望 {_num(e, d)}，得到 {_num(g, d)}。")
        return lines
    lines.append(f"{what}在位置 {_index(idx)} 不对：期望 {_num(e, d)}，得到 {_num(g, d)}。")
    row = idx[:-1]
    name = f"第 {_index(row)} 行" if row else "整个向量"
    lines.append(f"{name}：")
    limit = 6 if d <= 5 else 4  # a row stays within WIDTH
    lines.append(f"  期望 {fmt_row(exp[row], limit, d)}")
    lines.append(f"  得到 {fmt_row(got[row].double(), limit, d)}")
    return lines


def printed_header() -> str:
    return "（你的函数打印的内容：）"


def _problem(f) -> list:
    what = f"`{f.label}` " if f.label != "返回值" else "返回值"
    if f.kind == "forbidden":
        return [f"你的函数调用了本题不许用的 {'、'.join(f.forbidden)}：这一题要你自己写出"
                "这一步。"]
    if f.kind == "bool_dtype":
        return [f"{what}应是 bool 张量（True = 可以关注），得到的 dtype 是 "
                f"{str(f.got.dtype).replace('torch.', '')}。"]
    if f.kind == "layout":
        return [f"{what}是 {str(f.got.layout).replace('torch.', '')} 布局的张量，应是普通的"
                "稠密张量（strided）。"]
    if f.kind == "exception" and type(f.exc).__name__ == "_Timeout":
        return ["你的函数在这一例上运行太久，被停下了（每例的时间上限是几十秒，正确的写法"
                "不到一秒）。"]
    if f.kind == "mutated":
        if f.index is None:
            return [f"你的函数原地修改了输入 `{f.label}`：调用之后它的形状或 dtype 变了。"]
        return [f"返回值是对的，但你的函数原地修改了输入 `{f.label}`：调用之后它和传入时"
                f"不一样（第一处在位置 {_index(f.index)}：传入时是 "
                f"{_value(f.expected, f.index)}，调用后是 {_value(f.got, f.index)}）。"]
    if f.kind == "wrong_dtype":
        if isinstance(f.want, torch.dtype):
            return [f"{what}的 dtype 应和输入一样是 {_dtype(f.want)}，得到的是 "
                    f"{_dtype(f.got.dtype)}。"]
        return [f"{what}的 dtype 应是 {' 或 '.join(_dtype(d) for d in f.want)}，得到的是 "
                f"{_dtype(f.got.dtype)}。"]
    if f.kind == "exception":
        return [f"你的函数抛出了异常 {type(f.exc).__name__}: {f.exc}"]
    if f.kind == "type":
        return [f"{what}应是 torch.Tensor，得到的是 {type(f.got).__name__}。"]
    if f.kind == "dtype":
        return [f"{what}应是实数浮点张量（float16、bfloat16、float32 或 float64），得到的 dtype 是 "
                f"{str(f.got.dtype).replace('torch.', '')}。"]
    if f.kind == "device":
        return [f"{what}是 meta 设备上的张量（只有形状，没有数值），应和输入一样放在 CPU 上。"]
    if f.kind == "shape":
        return [f"{what}的形状应是 {_shape(f.expected)}，得到的是 {_shape(f.got)}。"]
    if f.kind == "nan":
        return [f"{what}里出现了 NaN（期望是有限的数）。", *_where(f)[1:]]
    if f.kind == "inf":
        return [f"{what}里出现了 inf（期望是有限的数）。", *_where(f)[1:]]
    return _where(f)


def signature_hint(ex, f) -> str | None:
    """For a TypeError raised by the call itself: the parameters the exercise expects."""
    text = str(f.exc) if f.kind == "exception" else ""
    if not (isinstance(f.exc, TypeError) and re.search(
            r"positional argument|keyword argument|takes \d+|missing \d+ required", text)):
        return None
    sig = inspect.signature(ex.solution)
    return (f"函数的参数要和题目一致：{ex.solution.__name__}{sig}（check 按这个顺序传入"
            "参数；带默认值的参数也要保留默认值）。")


def forbidden_hint(f) -> str | None:
    if f.kind != "forbidden":
        return None
    return ("题目不许调用这些现成的实现：它们替你做了本题要练习的那一步。用基本的张量运算"
            "（+、*、@、exp、sum、amax、torch.where …）自己写出来。")


def output_count_hint(f) -> str | None:
    """A multi-output exercise whose answer returned another number of values."""
    if f.kind != "type" or f.got is not None or f.n_outputs < 2 or f.ret is None:
        return None
    if isinstance(f.ret, (tuple, list)):
        return (f"应返回 {f.n_outputs} 个值组成的元组，你的函数返回了 {len(f.ret)} 个："
                f"缺少 `{f.label}`（或者顺序、个数不对）。")
    return (f"应返回 {f.n_outputs} 个值组成的元组（return a, b, …），你的函数只返回了一个 "
            f"{type(f.ret).__name__}：缺少 `{f.label}`。")


def precision_hint(f) -> str | None:
    """"Looks like float32" only when the error is the size float32 rounding would give."""
    if f.kind != "value" or f.got is None or f.got.dtype != torch.float64 or not f.f32_err:
        return None
    err = float((f.got.double() - f.expected).abs().nan_to_num(0.0, 0.0, 0.0).max())
    if f.f32_err / 30 <= err <= 30 * f.f32_err:
        return (f"差别很小（最大约 {err:.1e}，正是 float32 舍入误差的大小）：像是中间某一步用了 "
                "float32 或 float16；float64 的输入请全程用 float64 计算（不要写死 "
                "dtype=torch.float32，也不要 .float()；torch.arange 要写 dtype=x.dtype）。")
    return None


def generic_hint(f) -> str:
    """The fallback hint for each kind of failure."""
    if f.kind == "mutated":
        why = "（同一个掩码会传给每一层、每个头）" if f.label == "mask" else ""
        return (f"不要改动传入的张量 `{f.label}`：调用者之后还要用它{why}。用返回新张量的写法"
                "（masked_fill、x = x / c），不用原地的（masked_fill_、x /= c、x[...] = …）；"
                "非改不可就先 .clone()。")
    if f.kind == "wrong_dtype":
        if not isinstance(f.want, torch.dtype):
            if tuple(f.want) == (torch.float64,):
                return ("题目要的是 float64 的结果：全程用 float64 计算（torch.arange(..., "
                        "dtype=torch.float64)），float32 的表在大位置上只有约 7 位有效数字。")
            return "用 float32 或 float64 计算并返回（float16 只有约 3 位有效数字）。"
        if f.want == torch.float64:
            return ("float64 的输入要全程用 float64 计算并返回：不要写死 dtype=torch.float32，"
                    "也不要 .float()。")
        return (f"为了精度把 {_dtype(f.want)} 的输入放到更高的精度里算没有问题，但最后要用 "
                f".to(输入.dtype) 转回 {_dtype(f.want)}：后面的 `@ v` 要求两边的 dtype 相同。")
    if f.kind == "exception" and type(f.exc).__name__ == "_Timeout":
        return "检查循环的结束条件（例如 while 里的变量有没有更新）。"
    if f.kind == "exception":
        return "先用这一例的形状在单元里单独调用你的函数，看看是哪一行出错。"
    if f.kind == "type":
        if f.got is None:
            return "函数没有返回任何东西：是不是忘了 `return`？"
        if isinstance(f.got, (tuple, list)):
            return "只返回一个张量，不要返回元组或列表（例如 (输出, 权重)）。"
        return "用 torch 的运算计算并返回一个张量（不要转成 numpy 或 Python 数）。"
    if f.kind == "layout":
        return "返回普通的稠密张量：稀疏张量先 .to_dense()。"
    if f.kind == "dtype":
        if f.got.is_complex():
            return "结果应是实数：复数只能做中间步骤，返回前取 .real（或 torch.view_as_real）。"
        return "整数或布尔张量做不了 softmax 这类运算：检查是不是把掩码当成了结果返回。"
    if f.kind == "shape":
        g, e = tuple(f.got.shape), tuple(f.expected.shape)
        if len(g) == len(e) >= 2 and g[:-2] == e[:-2] and g[-2:] == e[:-3:-1]:
            return "最后两维正好反了：是不是多了或少了一次转置？"
        return "逐行打印中间结果的 .shape，找出从哪一步开始和期望的形状不同。"
    if f.kind == "nan":
        return "NaN 通常来自 0/0、inf − inf 或 log(0)：检查分母和被减去的最大值。"
    if f.kind == "inf":
        return "inf 通常来自 exp 的溢出或除以 0：先减去最大值，分母不能为 0。"
    return "对照这一行的期望值和你的值，把这个小例子手算一遍。"


def explain(ex, f, i: int, n: int, hint: str) -> str:
    """The full report of the first failing case ``i`` (0-based) of ``n``."""
    lines = [f"✗ {ex.name}：第 {i + 1} 个隐藏测试（共 {n} 个）没有通过——{f.case.title}。"]
    shown = dict(zip(ex.params, f.case.args), **f.case.kwargs)
    args = [f"{key}：{describe(val)}" for key, val in shown.items()]
    if _cols("  输入：" + "；".join(args) + "。") <= WIDTH:
        lines.append("  输入：" + "；".join(args) + "。")
    else:  # one argument a line
        lines += ["  输入："] + [f"    {arg}" for arg in args]
    if f.case.note:
        lines.append(f"  {f.case.note}")
    lines += ["  " + line for line in _problem(f)]
    lines.append(f"  提示：{hint}")
    return _wrapped(lines)
