"""Tests for attnbook.bench: FLOP convention, table rows and ratios, CLI, honest CPU memory."""
import importlib
import subprocess
import sys

import pytest
import torch

from attnbook.bench import BenchConfig, attention_flops, format_table, main, run_benchmark


def _importable(module, attr):
    try:
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False


HAS_TILED = _importable("attnbook.flash", "attention_tiled")
CPU_BACKENDS = ["sdpa", "ref"] + (["tiled"] if HAS_TILED else [])


def test_flops_follow_the_flashattention_convention():
    fwd = attention_flops(2, 8, 1024, 1024, 64)
    assert fwd == 4 * 2 * 8 * 1024 * 1024 * 64
    assert attention_flops(2, 8, 1024, 1024, 64, causal=True) == fwd / 2
    assert attention_flops(2, 8, 1024, 1024, 64, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 8, 1024, 1024, 64, mode="fwd+bwd") == 3.5 * fwd
    assert attention_flops(1, 1, 128, 256, 32) == 4 * 128 * 256 * 32  # cross-attention: Tq * Tk
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, 8, 8, 8, mode="backward")
    with pytest.raises(ValueError, match="tq"):
        attention_flops(1, 1, 0, 8, 8)


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_every_backend_has_a_row_with_positive_time_and_ratios(mode):
    cfg = BenchConfig(device="cpu", quick=True, mode=mode, repeats=2, backends=("sdpa", "ref", "tiled", "triton"))
    rows = run_benchmark(cfg)
    measured = [r for r in rows if not r.get("skipped")]
    skipped = {r["backend"]: r["skipped"] for r in rows if r.get("skipped")}
    assert "CUDA" in skipped["triton"]
    assert sorted({r["backend"] for r in measured}) == sorted(CPU_BACKENDS)
    assert sorted(r["seq"] for r in measured) == sorted([64, 128] * len(CPU_BACKENDS))
    sdpa_time = {r["seq"]: r["time_s"] for r in measured if r["backend"] == "sdpa"}
    for r in measured:
        assert r["time_s"] > 0 and r["flops_per_s"] > 0 and r["ratio_sdpa"] > 0, r
        assert r["ratio_sdpa"] == pytest.approx(r["time_s"] / sdpa_time[r["seq"]])
        assert r["flops"] == attention_flops(1, 2, r["seq"], r["seq"], 16, mode=mode)
        assert r["flops_per_s"] == pytest.approx(r["flops"] / r["time_s"])
        if r["backend"] == "sdpa":
            assert r["ratio_sdpa"] == 1.0
    table = format_table(rows)
    assert "| backend | T | time (ms) | GFLOP/s | time / sdpa |" in table
    for name in CPU_BACKENDS:
        assert table.count(f"| {name} |") == 2
    assert "Skipped triton" in table and f"{mode} · float32 · cpu" in table


def test_causal_rows_count_half_the_flops_and_threads_are_restored():
    before = torch.get_num_threads()
    rows = run_benchmark(BenchConfig(device="cpu", quick=True, causal=(True,), backends=("sdpa", "ref"),
                                     seqs=(48,), repeats=1, threads=1))
    assert torch.get_num_threads() == before
    assert [r["backend"] for r in rows] == ["sdpa", "ref"]
    assert all(r["flops"] == 4 * 2 * 48 * 48 * 16 / 2 and r["causal"] and r["threads"] == 1 for r in rows)


def test_cli_quick_prints_a_markdown_table():
    cmd = [sys.executable, "-m", "attnbook.bench", "--quick", "--markdown", "--device", "cpu",
           "--backends", "sdpa", "ref", "--repeats", "2", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"torch {torch.__version__}" in out and "logical cores" in out
    assert "Command: `python -m attnbook.bench --quick --markdown" in out
    assert "| backend | T | time (ms) | GFLOP/s | time / sdpa |" in out
    assert out.count("| sdpa |") == 2 and out.count("| ref |") == 2
    assert "ref    B=1 H=2 T=128" in proc.stderr  # progress goes to stderr, the table to stdout


def test_cpu_memory_mode_is_quadratic_for_ref_and_linear_for_tiled():
    # Two sizes two doublings apart (4 fresh subprocesses); growth per doubling = ratio ** (1/2).
    lo, hi = 512, 2048
    rows = run_benchmark(BenchConfig(device="cpu", memory=True, seqs=(lo, hi), heads=1, dims=(64,),
                                     backends=("ref", "tiled"), jobs=2))
    mem = {(r["backend"], r["seq"]): r["mem_bytes"] for r in rows if not r.get("skipped")}
    for t in (lo, hi):
        # ref holds at least one float32 T x T matrix; the subprocess's RSS must show it
        assert 1.0 <= mem["ref", t] / (4 * t * t) <= 6.0, mem
    assert 3.2 <= (mem["ref", hi] / mem["ref", lo]) ** 0.5 <= 4.8, mem
    table = format_table(rows)
    assert "peak extra (MiB)" in table and "MALLOC_MMAP_THRESHOLD_" in table and "time (ms)" not in table
    if not HAS_TILED:
        pytest.skip("attnbook.flash.attention_tiled is not available yet; ref part checked")
    assert 0 < mem["tiled", lo] and (mem["tiled", hi] / mem["tiled", lo]) ** 0.5 <= 2.2, mem
    assert mem["tiled", hi] < mem["ref", hi] / 4, mem


def test_bad_arguments_give_clear_errors(capsys):
    with pytest.raises(ValueError, match="unknown backend.*flash2"):
        run_benchmark(BenchConfig(backends=("sdpa", "flash2")))
    with pytest.raises(ValueError, match=r"seqs \(T, --seq\) must be ints >= 1"):
        run_benchmark(BenchConfig(seqs=(128, 0)))
    with pytest.raises(ValueError, match="mode"):
        run_benchmark(BenchConfig(mode="forward"))
    with pytest.raises(ValueError, match="heads"):
        run_benchmark(BenchConfig(heads=0))
    with pytest.raises(ValueError, match="no measured rows"):
        format_table([{"backend": "triton", "skipped": "needs CUDA"}])
    for argv, message in ((["--backends", "sdpa", "nope"], "unknown backend"), (["--seq", "0"], "seqs (T, --seq)")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the no-CUDA error cannot be triggered here")
    with pytest.raises(ValueError, match="cuda.*torch.cuda.is_available"):
        run_benchmark(BenchConfig(device="cuda"))
    with pytest.raises(SystemExit):
        main(["--device", "cuda", "--quick"])
    assert "use --device cpu" in capsys.readouterr().err


def test_help_explains_the_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    text = capsys.readouterr().out
    assert exc.value.code == 0
    for needle in ("Prints a Markdown table", "what is timed", "default: cuda when torch sees a GPU",
                   "python -m attnbook.bench --quick", "--memory"):
        assert needle in text, needle
