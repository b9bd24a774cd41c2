"""The CPU-side parts of benchmarks/gpu.sh and benchmarks/gpu_tables.py (the prepared GPU run)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _gpu_tables():
    spec = importlib.util.spec_from_file_location("gpu_tables", ROOT / "benchmarks" / "gpu_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_gpu_script_plan_covers_the_issue():
    gt = _gpu_tables()
    groups, candidate, threshold = gt.plan(dry_run=False)
    timed = [g for g in groups if not g.config.get("memory")]
    assert candidate == "triton" and threshold == 4096
    assert {(g.config["dtype"], g.config["mode"], g.config["dims"], g.config["causal"]) for g in timed} == {
        (t, m, (d,), (c,)) for t in ("float16", "bfloat16") for m in ("fwd", "bwd") for d in (64, 128)
        for c in (False, True)}
    assert all(g.config["seqs"] == (1024, 2048, 4096, 8192, 16384) and g.config["device"] == "cuda"
               and set(g.config["backends"]) == {"sdpa", "triton"} for g in timed)
    assert groups[-1].config["memory"] and "triton" in groups[-1].config["backends"]


def _row(backend, seq, time_s, mode="fwd"):
    return {"backend": backend, "device": "cuda", "dtype": "float16", "mode": mode, "batch": 1, "heads": 16,
            "dim": 64, "seq": seq, "causal": False, "threads": 1, "min_time": 0.1, "max_time": 10.0,
            "memory_mode": False, "time_s": time_s, "runs": None, "mem_bytes": 1 << 20, "note": "",
            "skipped": None, "flops": 1e12, "flops_per_s": 1e12 / time_s, "mem_ratio_ref": None}


def test_gpu_script_targets_are_judged_right():
    gt = _gpu_tables()
    fwd = gt.Group("Forward", {"mode": "fwd"})
    bwd = gt.Group("Backward", {"mode": "bwd"})
    later = gt.Group("Forward, later", {"mode": "fwd"}, skipped="not run: the time budget of 1 s was spent (2 s)")
    fwd.rows = [_row("sdpa", 2048, 1.0), _row("triton", 2048, 5.0),  # below the threshold: ignored
                _row("sdpa", 4096, 1.0), _row("triton", 4096, 1.1), _row("sdpa", 8192, 1.0), _row("triton", 8192, 1.05)]
    bwd.rows = [_row("sdpa", 4096, 1.0, "bwd"), _row("triton", 4096, 1.5, "bwd")]
    for g in (fwd, bwd):
        g.seconds = 1.0
        base = {r["seq"]: r["time_s"] for r in g.rows if r["backend"] == "sdpa"}
        for r in g.rows:
            r["ratio_sdpa"] = r["time_s"] / base[r["seq"]]
    rows = {r["group"]: r for r in gt.target_rows([fwd, bwd, later], "triton", 4096)}
    assert rows["Forward"]["verdict"] == "met" and round(rows["Forward"]["ratios"][4096], 3) == round(1 / 1.1, 3)
    assert rows["Backward"]["verdict"] == "missed"  # 0.67 < 0.7
    assert rows["Forward, later"]["verdict"] == "not run"
    fwd.rows[3]["time_s"] = 1.2  # control: 1 / 1.2 = 0.83 < 0.9 fails the forward target
    fwd.rows[3]["ratio_sdpa"] = 1.2
    assert gt.target_rows([fwd], "triton", 4096)[0]["verdict"] == "missed"
    text = gt.render([fwd, bwd, later], "triton", 4096, header=dict(title="GPU: X", machine="m", date="d", command="c"))
    assert text.startswith("## GPU: X\n") and "| Backward | 0.67 | — | ≥ 0.7 | missed |" in text
    assert "not run: the time budget" in text and "fwd · float16 · cuda" in text


def test_gpu_tables_compare_with_sdpa_flash_backend(monkeypatch):
    # the targets are against SDPA's flash backend: the CUDA tables switch cuDNN's SDPA backend off
    gt = _gpu_tables()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with gt.sdpa_backends("flash", "cuda"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored on exit
    with gt.sdpa_backends("default", "cuda"), gt.sdpa_backends("flash", "cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled()  # control: nothing changed
    with pytest.raises(ValueError, match="choice"):
        gt.sdpa_backends("cudnn", "cuda")
    import attnbook.bench

    seen = []
    monkeypatch.setattr(attnbook.bench, "run_benchmark",
                        lambda cfg: seen.append((cfg["device"], torch.backends.cuda.cudnn_sdp_enabled())) or [])
    gt.run([gt.Group("gpu", {"device": "cuda"}), gt.Group("cpu", {"device": "cpu"})], 1e9, log=lambda m: None)
    gt.run([gt.Group("gpu", {"device": "cuda"})], 1e9, log=lambda m: None, sdpa="default")
    assert seen == [("cuda", False), ("cpu", True), ("cuda", True)]
    fwd = gt.Group("Forward", {"mode": "fwd"}, seconds=1.0)
    fwd.rows = [dict(_row("sdpa", 4096, 1.0), ratio_sdpa=1.0), dict(_row("triton", 4096, 1.0), ratio_sdpa=1.0)]
    header = dict(title="t", machine="m", date="d", command="c", sdpa=gt.SDPA_CHOICES["flash"])
    assert "sdpa is torch.nn.functional.scaled_dot_product_attention with cuDNN's backend off" in \
        gt.render([fwd], "triton", 4096, header=header)


def test_gpu_script_dry_run(tmp_path):
    out = tmp_path / "gpu_results.md"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), LOGDIR=str(tmp_path / "logs"), BUDGET="0")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("## Dry run on the CPU (tiny sizes)\n") and "torch " in text
    assert "### Targets: tiled ÷ sdpa throughput at T ≥ 128" in text
    assert "### Forward, float32, D=16, non-causal" in text and "| sdpa | 64 |" in text  # the first table ran
    assert "not run: the time budget of 0 s was spent" in text  # the budget stopped the rest
    assert "| benchmarks/gpu_tables.py --dry-run | passed |" in text
    assert "| cpu | tiled | float32 |" in text  # the self-check's output is kept
    assert (tmp_path / "gpu_results.json").exists()
    # without a GPU the real run refuses clearly instead of producing empty tables
    if not torch.cuda.is_available():
        proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr


def test_gpu_script_runs_the_library_tests_of_the_triton_path_on_the_gpu():
    script = (ROOT / "benchmarks" / "gpu.sh").read_text(encoding="utf-8")
    stage = next(line for line in script.splitlines() if "-m \"not gpu\"" in line and "$PYTHON" in line)
    for name in ("test_triton_flash.py", "test_trust.py", "test_selfcheck.py"):
        assert f"tests/lib/{name}" in stage, name
        assert (ROOT / "tests" / "lib" / name).exists(), name
