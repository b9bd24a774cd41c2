"""Tests for attnbook.bench: FLOP convention, rows through the backend registry, ratios, skips, CLI,
honest CPU memory."""
import json
import subprocess
import sys

import pytest
import torch

import attnbook.bench as bench
from attnbook import _bench_memory
from attnbook import attention, dispatch
from attnbook.bench import BenchConfig, attention_flops, format_table, main, run_benchmark
from attnbook.testing import CPU_BACKENDS

QUICK = dict(device="cpu", quick=True, min_time=0.01, max_time=0.05)  # a few hundredths of a second per row


def test_flops_follow_the_flashattention_convention():
    fwd = attention_flops(2, 8, 1024, 1024, 64)
    assert fwd == 4 * 2 * 8 * 1024 * 1024 * 64
    assert attention_flops(2, 8, 1024, 1024, 64, causal=True) == fwd / 2
    assert attention_flops(2, 8, 1024, 1024, 64, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 8, 1024, 1024, 64, mode="fwd+bwd") == 3.5 * fwd
    assert attention_flops(1, 1, 128, 256, 32) == 4 * 128 * 256 * 32  # cross-attention: Tq * Tk
    with pytest.raises(ValueError, match="attention_flops: `mode` must be one of"):
        attention_flops(1, 1, 8, 8, 8, mode="backward")
    with pytest.raises(ValueError, match="attention_flops: `tq` must be an int >= 1, got 0"):
        attention_flops(1, 1, 0, 8, 8)


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_every_registered_backend_has_rows_or_is_skipped_with_its_reason(mode, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the Triton kernel then declines CPU tensors
    rows = run_benchmark(BenchConfig(mode=mode, **QUICK))  # backends=None: the whole registry
    assert [r["backend"] for r in rows[:len(dispatch.BACKENDS)]] == sorted(dispatch.BACKENDS, key=lambda n: n != "sdpa")
    measured = [r for r in rows if not r["skipped"]]
    skipped = {r["backend"]: r["skipped"] for r in rows if r["skipped"]}
    assert set(skipped) == {"triton"} and ("CUDA" in skipped["triton"] or "TRITON_INTERPRET" in skipped["triton"])
    assert sorted(r["backend"] for r in measured) == sorted(CPU_BACKENDS * 2)
    sdpa_time = {r["seq"]: r["time_s"] for r in measured if r["backend"] == "sdpa"}
    for r in measured:
        assert r["time_s"] > 0 and r["runs"] >= 1, r  # timed calls (>= 4 blocks unless max_time ran out)
        assert r["ratio_sdpa"] == pytest.approx(r["time_s"] / sdpa_time[r["seq"]])
        assert r["flops"] == attention_flops(1, 2, r["seq"], r["seq"], 16, mode=mode)
        assert r["flops_per_s"] == pytest.approx(r["flops"] / r["time_s"])
        if r["backend"] == "sdpa":
            assert r["ratio_sdpa"] == 1.0
    table = format_table(rows)
    assert "| backend | T | time (ms) | GFLOP/s | time / sdpa |" in table
    for name in CPU_BACKENDS:
        assert table.count(f"| {name} |") == 2
    assert "| triton |" not in table and f"Skipped triton: {skipped['triton']}." in table
    assert f"{mode} · float32 · cpu" in table and "Timer.adaptive_autorange" in table


def test_a_registered_backend_is_timed_and_its_refusals_are_skips(monkeypatch):
    calls = []

    def short_only(q, k, v, mask, causal, scale):
        calls.append(q.shape[-2])
        return attention(q, k, v, mask=mask, causal=causal, scale=scale, backend="sdpa")

    monkeypatch.setitem(dispatch.BACKENDS, "short", dispatch.Backend(
        short_only, lambda q, k, v, mask: (q.shape[-2] <= 64, f"T = {q.shape[-2]} > 64")))
    rows = run_benchmark(BenchConfig(backends=("sdpa", "short"), **QUICK))
    assert set(calls) == {64}  # timed through attention(..., backend="short"); T = 128 never called
    short = {r["seq"]: r for r in rows if r["backend"] == "short"}
    assert short[64]["time_s"] > 0 and short[64]["skipped"] is None
    assert short[128]["time_s"] is None and short[128]["skipped"] == "T = 128 > 64"
    table = format_table(rows)
    assert "| short | 128 | skipped | — | — |" in table and "Skipped short (where marked): T = 128 > 64." in table


def test_causal_rows_count_half_the_flops_and_threads_are_restored():
    before = torch.get_num_threads()
    rows = run_benchmark(BenchConfig(causal=(True,), backends=("sdpa", "ref"), seqs=(48,), threads=1, **QUICK))
    assert torch.get_num_threads() == before
    assert [r["backend"] for r in rows] == ["sdpa", "ref"]
    assert all(r["flops"] == 4 * 2 * 48 * 48 * 16 / 2 and r["causal"] and r["threads"] == 1 for r in rows)


@pytest.mark.slow
def test_cli_quick_prints_a_markdown_table():
    cmd = [sys.executable, "-m", "attnbook.bench", "--quick", "--markdown", "--device", "cpu",
           "--backends", "sdpa", "ref", "--min-time", "0.01", "--max-time", "0.05", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"torch {torch.__version__}" in out and "logical cores" in out
    assert "Command: `python -m attnbook.bench --quick --markdown" in out
    assert "| backend | T | time (ms) | GFLOP/s | time / sdpa |" in out
    assert out.count("| sdpa |") == 2 and out.count("| ref |") == 2
    assert "ref    B=1 H=2 T=128" in proc.stderr  # progress goes to stderr, the table to stdout


@pytest.mark.slow
def test_cpu_memory_mode_is_quadratic_for_ref_and_linear_for_tiled():
    # Two sizes two doublings apart (4 fresh subprocesses); growth per doubling = ratio ** (1/2).
    lo, hi = 512, 2048
    rows = run_benchmark(BenchConfig(device="cpu", memory=True, seqs=(lo, hi), heads=1, dims=(64,),
                                     backends=("ref", "tiled"), jobs=2))
    mem = {(r["backend"], r["seq"]): r["mem_bytes"] for r in rows if not r["skipped"]}
    for t in (lo, hi):
        # ref holds at least one float32 T x T matrix; the subprocess's RSS must show it
        assert 1.0 <= mem["ref", t] / (4 * t * t) <= 6.0, mem
    assert 3.2 <= (mem["ref", hi] / mem["ref", lo]) ** 0.5 <= 4.8, mem
    # tiled: linear (4x over the two doublings), far from ref's 16x; peaks of a few hundred KiB are
    # page-granular RSS readings, so both are floored at 0.25 MiB before the ratio
    floor = 0.25 * 2**20
    assert 0 < mem["tiled", lo] and max(mem["tiled", hi], floor) / max(mem["tiled", lo], floor) < 8, mem
    assert mem["tiled", hi] < mem["ref", hi] / 4, mem
    table = format_table(rows)
    assert "peak extra (MiB)" in table and "MALLOC_MMAP_THRESHOLD_" in table and "time (ms)" not in table


def test_cpu_memory_mode_skips_what_a_fresh_interpreter_cannot_run(monkeypatch):
    # The child side: a name the fresh interpreter's registry lacks (one registered by the caller).
    case = {"backend": "mine", "dtype": "float32", "mode": "fwd", "shape": [1, 1, 8, 4], "causal": False,
            "threads": 1}
    why = _bench_memory.child(case)["skipped"]
    assert "registered in the calling process only" in why
    # The parent side: the child's answer becomes a skipped row and a note (no real subprocess here).
    monkeypatch.setitem(dispatch.BACKENDS, "mine", dispatch.BACKENDS["sdpa"])
    answers = {"ref": {"extra_bytes": 4096}, "mine": {"skipped": why}}
    answer = lambda cmd, **kw: subprocess.CompletedProcess(  # noqa: E731
        cmd, 0, json.dumps(answers[json.loads(cmd[-1])["backend"]]), "")
    monkeypatch.setattr(_bench_memory.subprocess, "run", answer)
    rows = run_benchmark(BenchConfig(device="cpu", memory=True, seqs=(32,), heads=1, dims=(8,),
                                     backends=("ref", "mine")))
    assert rows[0]["mem_bytes"] == 4096 and rows[1]["skipped"] == why and rows[1]["mem_bytes"] is None
    table = format_table(rows)
    assert "| mine |" not in table and f"Skipped mine: {why}." in table


def test_bad_arguments_give_the_library_wide_errors(capsys):
    fn = "run_benchmark: "
    for kwargs, exc, message in [
        (dict(backends=("sdpa", "flash2")), ValueError, fn + "`backends` must be one of .* got 'flash2'"),
        (dict(seqs=(128, 0)), ValueError, fn + "`seqs` must be an int >= 1, got 0"),
        (dict(seqs=128), ValueError, fn + "`seqs` must be a non-empty sequence, got 128"),
        (dict(mode="forward"), ValueError, fn + "`mode` must be one of"),
        (dict(heads=0), ValueError, fn + "`heads` must be an int >= 1, got 0"),
        (dict(heads=2.0), TypeError, fn + "`heads` must be an int >= 1"),
        (dict(causal=(1,)), TypeError, fn + "`causal` must be a bool"),
        (dict(min_time=0), ValueError, fn + r"`min_time` must lie in \(0, inf\)"),
        (dict(min_time=1.0, max_time=0.5), ValueError, fn + r"`max_time` must lie in \[1, inf\]"),
        (dict(device="tpu"), ValueError, fn + "`device` must be one of"),
    ]:
        with pytest.raises(exc, match=message):
            run_benchmark(BenchConfig(**kwargs))
    with pytest.raises(ValueError, match="no measured rows"):
        format_table([{"backend": "triton", "skipped": "needs CUDA"}])
    for argv, message in ((["--backends", "sdpa", "nope"], "`backends` must be one of"),
                          (["--seq", "0"], "`seqs` must be an int >= 1")):
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
                   "python -m attnbook.bench --quick", "--memory", "attnbook.attention(..., backend=name)",
                   "attnbook.dispatch.BACKENDS"):
        assert needle in text, needle


def test_a_config_that_is_not_one_gets_a_clear_error():
    with pytest.raises(TypeError, match=r"run_benchmark: `config` must be a BenchConfig or a dict of its fields, "
                                        r"got 'quick' \(str\)"):
        run_benchmark("quick")
    with pytest.raises(TypeError, match="run_benchmark: `config` has no field 'seq' .*seqs"):
        run_benchmark({"seq": (64,)})


def test_defaults_come_from_one_table():
    cpu, gpu = bench._resolve(BenchConfig()), bench._resolve(BenchConfig(quick=True, memory=True))
    assert (cpu.dtype, cpu.dims, cpu.seqs[0], cpu.seqs[-1], cpu.causal) == ("float32", (64,), 512, 8192, (False,))
    assert (gpu.seqs, gpu.min_time, gpu.max_time) == ((256, 512), 0.01, 0.1)
    assert bench._sizes(cpu, 512, 64) == (1, 8) and bench._sizes(gpu, 512, 16) == (1, 1)
    cuda = BenchConfig(device="cuda")  # the CUDA row of the table, without a GPU: _default alone
    assert bench._default("batch", cuda, 4096, 64) == 4 and bench._default("heads", cuda, 4096, 128) == 16
    assert bench._default("seqs", cuda) == (1024, 2048, 4096, 8192, 16384)
    assert bench.describe_default("dtype") == "float16 on CUDA; float32 on CPU"
    assert bench.describe_default("heads") == "1 with memory; 2 with quick; 2048 // D on CUDA; 8 on CPU"
    assert bench.describe_default("seqs").startswith("256 and 512 with quick and memory; 64 and 128 with quick; "
                                                     "1024, 2048, ..., 16384 with memory")


def test_help_prints_the_defaults_table(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for field in bench.DEFAULTS:
        assert f"  {field:9s} {bench.describe_default(field)}" in text, field


def test_the_docstring_quotes_no_measured_time_and_results_md_backs_its_words():
    # bench's docstring says "ref" at T = 8192 takes seconds per forward on a 2-core CPU and points to
    # benchmarks/RESULTS.md for the number: the number is read from there, not quoted.
    import re
    from pathlib import Path

    assert not re.search(r"\d(\.\d+)? s a forward", bench.__doc__)
    assert "seconds per\nforward on a 2-core CPU: see its row in benchmarks/RESULTS.md" in bench.__doc__
    results = (Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    ref_8192 = re.search(r"^\| ref \| 8192 \| ([\d.]+) \|", results, re.M)
    assert ref_8192 and 1000 <= float(ref_8192.group(1)) < 60000  # milliseconds: seconds, as the docstring says
