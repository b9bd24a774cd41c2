"""Tests for lib/attnbook/selfcheck.py, the machine report (the first-use check: test_trust.py;
benchmarks/gpu.sh: tests/book/test_gpu_script.py)."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbook import attention_tiled, dispatch
from attnbook import selfcheck as sc
from attnbook.bench import machine_info

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# The machine report
# ---------------------------------------------------------------------------------------------

def test_report_on_this_machine(capsys):
    result = sc.selfcheck(backends=["ref", "tiled", "sdpa"], dtypes=["float64", "float16"])
    text = capsys.readouterr().out
    assert text == result["text"] + "\n"
    assert {(r["backend"], r["dtype"], r["result"]) for r in result["rows"]} == {
        (b, t, "pass") for b in ("ref", "tiled", "sdpa") for t in ("float64", "float16")}
    assert [a["auto"] for a in result["auto"]] == ["tiled", "tiled"]
    assert "auto uses Triton only on CUDA tensors" in text and "Every backend that runs here passed." in text
    row = next(r for r in result["rows"] if r["backend"] == "tiled" and r["dtype"] == "float64")
    assert 0 < row["err_out"] < 1e-12  # the float64 tiled kernel: equal up to rounding, not bit for bit


def test_report_lists_skips_and_failures(monkeypatch, capsys):
    monkeypatch.setattr(dispatch, "BACKENDS", dict(dispatch.BACKENDS))
    dispatch.register_backend("off", lambda q, k, v, mask, causal, scale: 1.01 * attention_tiled(
        q, k, v, mask=mask, causal=causal, scale=scale).out)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert sc.main(["--backends", "off", "triton", "--dtypes", "float32", "--device", "cpu"]) == 1
    text = capsys.readouterr().out
    assert "| cpu | off | float32 |" in text and "FAIL" in text and "1 failure(s)." in text
    assert "| cpu | triton | float32 | — | — | skipped |" in text


def test_the_report_is_a_function_and_the_module_is_a_plain_module():
    import attnbook.selfcheck

    assert not callable(attnbook.selfcheck)  # one way to call it: attnbook.selfcheck.selfcheck(...)
    result = attnbook.selfcheck.selfcheck(backends=["tiled"], dtypes=["float32"], verbose=False)
    assert [r["result"] for r in result["rows"]] == ["pass"]


def test_the_report_names_the_machine_as_bench_does():
    result = sc.selfcheck(backends=["tiled"], dtypes=["float64"], verbose=False)
    assert result["text"].splitlines()[0] == f"attnbook self-check: {machine_info()}"
    assert f"torch {torch.__version__}" in machine_info() and "logical cores" in machine_info()


def test_the_report_uses_only_public_names_of_dispatch():
    tree = ast.parse((ROOT / "lib" / "attnbook" / "selfcheck.py").read_text())
    private = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Name) and n.value.id == "dispatch" and n.attr.startswith("_")]
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "dispatch"}
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.endswith("dispatch") for a in n.names]
    assert not private and "choose_backend" in used and not [name for name in imported if name.startswith("_")]


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(d=0), ValueError, "selfcheck: `d` must be an int >= 1, got 0"),
    (dict(d="8"), TypeError, "selfcheck: `d` must be an int >= 1, got '8'"),
    (dict(d=True), TypeError, "selfcheck: `d` must be an int >= 1, got a bool"),
    (dict(d=8.0), TypeError, "selfcheck: `d` must be an int >= 1"),
    (dict(d=10**6), ValueError, "selfcheck: `d` must be a head dim of at most 1024, got 1000000"),
    (dict(dtypes=[torch.int64]), ValueError, "selfcheck: `dtypes` must hold names or torch dtypes among"),
    (dict(dtypes=["float8"]), ValueError, "selfcheck: `dtypes` must be one of"),
    (dict(dtypes="float32"), TypeError, "selfcheck: `dtypes` must be a non-empty list or tuple"),
    (dict(dtypes=[]), TypeError, "selfcheck: `dtypes` must be a non-empty list or tuple"),
    (dict(devices=["nope"]), ValueError, "selfcheck: `devices` must hold device names such as 'cpu'"),
    (dict(devices="cpu"), TypeError, "selfcheck: `devices` must be a non-empty list or tuple"),
    (dict(devices=["meta"]), ValueError, "selfcheck: `devices` must be CPU or CUDA devices, got 'meta'"),
    (dict(backends=["flash3"]), ValueError, "selfcheck: `backends` must be one of"),
    (dict(backends="tiled"), TypeError, "selfcheck: `backends` must be a non-empty list or tuple"),
    (dict(verbose=1), TypeError, "selfcheck: `verbose` must be a bool"),
    (dict(file="out.txt"), TypeError, "selfcheck: `file` must be a writable text stream"),
])
def test_bad_arguments_get_clear_errors(kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        sc.selfcheck(**{"verbose": False, **kwargs})


def test_cuda_device_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="selfcheck: `devices` names 'cuda' but torch.cuda.is_available"):
        sc.selfcheck(devices=["cuda"], verbose=False)


def test_cli_bad_dim_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        sc.main(["--dim", "0", "--backends", "tiled"])
    assert exc.value.code == 2 and "selfcheck: `d` must be an int >= 1, got 0" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnbook.selfcheck", "--backends", "tiled", "--dtypes", "float64",
                           "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| cpu | tiled | float64 |" in proc.stdout and "pass" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr  # e.g. runpy's "found in sys.modules" warning
