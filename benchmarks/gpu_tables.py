"""The benchmark part of benchmarks/gpu.sh: GPU tables ready to paste into benchmarks/RESULTS.md.

Runs ``attnbook.bench.run_benchmark`` over a fixed plan and writes one Markdown file: the
machine, date and versions, the targets of issue 10 with the measured ratios, and every table as
``attnbook.bench.format_table`` prints it; the raw rows go to a JSON file beside it.

The plan (GPU): for float16 then bfloat16, forward then backward, head dims 64 and 128, non-causal
and causal: T = 1024, 2048, 4096, 8192, 16384 with B = 16384 // T and H = 2048 // D (16K tokens,
the FlashAttention-2 setting), backends "sdpa" (PyTorch's scaled_dot_product_attention) and
"triton"; then one memory table (float16 forward, D = 64, every backend, T up to 16384). Groups
run in that order; once ``--budget`` seconds have passed no new group starts, and the ones left
are listed as not run, so a slow machine still gets the first tables inside gpu.sh's time limit.

Targets (H100/H200-class GPU), from the same run: Triton forward >= 0.9x the TFLOP/s of SDPA's
flash backend at every T >= 4096, backward >= 0.7x. The ratio is SDPA's time / Triton's time
(= Triton's TFLOP/s over SDPA's, the FLOP count being the same). So that "sdpa" means the flash
backend, as the targets say, the CUDA tables run SDPA with cuDNN's backend switched off
(``--sdpa flash``, the default: torch then prefers FLASH_ATTENTION and falls back to
EFFICIENT_ATTENTION or MATH only where flash cannot serve; some torch versions would otherwise
pick cuDNN on Hopper); ``--sdpa default`` keeps torch's own choice. The header says which.

``--dry-run`` runs the same code on the CPU with tiny sizes ("tiled" standing in for "triton",
float32, T = 64, 128, 256, targets judged at T >= 128): it checks the plan, the budget logic and
the writer on a machine without a GPU (tests/book/test_gpu_script.py runs it).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

TARGETS = {"fwd": 0.9, "bwd": 0.7}  # Triton TFLOP/s / SDPA TFLOP/s, at T >= the threshold
SDPA_CHOICES = {
    "flash": "torch.nn.functional.scaled_dot_product_attention with cuDNN's backend off "
             "(sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH]): flash wherever it can serve)",
    "default": "torch.nn.functional.scaled_dot_product_attention with PyTorch's own backend choice",
}


def sdpa_backends(choice: str, device: str):
    """The context the CUDA tables run in: ``"flash"`` switches cuDNN's SDPA backend off, so that
    torch picks FLASH_ATTENTION first (EFFICIENT_ATTENTION / MATH only where flash cannot serve:
    no table fails for want of a kernel); ``"default"``, or a CPU run, changes nothing."""
    if choice not in SDPA_CHOICES:
        raise ValueError(f"sdpa_backends: `choice` must be one of {tuple(SDPA_CHOICES)}, got {choice!r}")
    if choice == "default" or device != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@dataclasses.dataclass
class Group:
    """One call of run_benchmark: one table."""
    title: str
    config: dict
    rows: list | None = None
    seconds: float | None = None
    skipped: str = ""

    @property
    def mode(self) -> str:
        return self.config.get("mode", "fwd")


def plan(dry_run: bool = False) -> tuple[list[Group], str, int]:
    """(groups, candidate backend, smallest T at which the targets are judged)."""
    if dry_run:
        common = dict(device="cpu", batch=1, heads=2, seqs=(64, 128, 256), backends=("sdpa", "tiled"),
                      min_time=0.01, max_time=0.05)
        dtypes, dims, candidate, threshold = ("float32",), (16,), "tiled", 128
        memory = dict(device="cpu", dtype="float32", dims=(16,), seqs=(128,), causal=(False,),
                      backends=("ref", "tiled"), memory=True)
    else:
        common = dict(device="cuda", seqs=(1024, 2048, 4096, 8192, 16384), backends=("sdpa", "triton"),
                      min_time=0.1)
        dtypes, dims, candidate, threshold = ("float16", "bfloat16"), (64, 128), "triton", 4096
        memory = dict(device="cuda", dtype="float16", dims=(64,), causal=(False,), memory=True,
                      seqs=(1024, 2048, 4096, 8192, 16384), backends=("ref", "tiled", "triton", "sdpa"))
    groups = []
    for dtype in dtypes:
        for mode in ("fwd", "bwd"):
            for d in dims:
                for causal in (False, True):
                    cfg = dict(common, dtype=dtype, mode=mode, dims=(d,), causal=(causal,))
                    title = f"{'Forward' if mode == 'fwd' else 'Backward'}, {dtype}, D={d}, " \
                            f"{'causal' if causal else 'non-causal'}"
                    groups.append(Group(title, cfg))
    groups.append(Group(f"Peak extra memory, forward, {memory['dtype']}, D={memory['dims'][0]}", memory))
    return groups, candidate, threshold


def run(groups, budget, *, log=print, after=None, sdpa="flash") -> list[Group]:
    """Run each group unless ``budget`` seconds have already passed (then mark it not run); the first always runs.

    ``sdpa``: which SDPA the CUDA groups compare against (see :func:`sdpa_backends`).
    """
    from attnbook.bench import run_benchmark

    start = time.perf_counter()
    for i, g in enumerate(groups):
        spent = time.perf_counter() - start
        if i and spent > budget:  # the first table always runs
            g.skipped = f"not run: the time budget of {budget:g} s was spent ({spent:.0f} s)"
            log(f"[gpu_tables] {g.title}: {g.skipped}")
            continue
        t0 = time.perf_counter()
        log(f"[gpu_tables] {g.title} ...")
        try:
            with sdpa_backends(sdpa, g.config.get("device", "cpu")):
                g.rows = run_benchmark(g.config)
        except Exception as exc:  # a kernel that fails here is a finding: record it, go on with the next table
            g.skipped = f"failed: {type(exc).__name__}: {str(exc).strip()[:500]}"
            log(f"[gpu_tables] {g.title}: {g.skipped}")
        g.seconds = time.perf_counter() - t0
        log(f"[gpu_tables] {g.title}: {g.seconds:.1f} s")
        if after is not None:  # e.g. rewrite the output file: a run killed later keeps its tables
            after()
    return groups


def target_rows(groups, candidate, threshold) -> list[dict]:
    """One dict per timed group: the candidate / sdpa throughput ratio at each T >= threshold."""
    out = []
    for g in groups:
        if g.config.get("memory"):
            continue
        ratios = {}
        for r in g.rows or []:
            if r["backend"] == candidate and r["seq"] >= threshold:
                ratios[r["seq"]] = (1.0 / r["ratio_sdpa"]) if r.get("ratio_sdpa") else None
        target = TARGETS[g.mode]
        known = [x for x in ratios.values() if x is not None]
        if g.rows is None:
            verdict = "not run"
        elif not ratios or len(known) < len(ratios):
            verdict = "incomplete"
        else:
            verdict = "met" if min(known) >= target else "missed"
        out.append({"group": g.title, "mode": g.mode, "ratios": ratios, "target": target, "verdict": verdict})
    return out


def _ratio(x):
    return "—" if x is None else f"{x:.2f}"


def render(groups, candidate, threshold, *, header: dict) -> str:
    """The Markdown section for RESULTS.md."""
    from attnbook.bench import format_table

    lines = [f"## {header['title']}", "",
             f"Machine: {header['machine']}  ",
             f"Date: {header['date']}  ",
             f"Command: `{header['command']}`", ""]
    targets = target_rows(groups, candidate, threshold)
    if targets:
        seqs = sorted({t for row in targets for t in row["ratios"]})
        lines += [f"### Targets: {candidate} ÷ sdpa throughput at T ≥ {threshold} "
                  f"(forward ≥ {TARGETS['fwd']}×, backward ≥ {TARGETS['bwd']}×)", "",
                  "| table | " + " | ".join(f"T={t}" for t in seqs) + " | target | verdict |",
                  "|---|" + "---|" * (len(seqs) + 2)]
        for row in targets:
            cells = [_ratio(row["ratios"].get(t)) for t in seqs]
            lines.append(f"| {row['group']} | " + " | ".join(cells) + f" | ≥ {row['target']} | {row['verdict']} |")
        sdpa = header.get("sdpa", SDPA_CHOICES["default"])
        lines += ["", f"Ratio = sdpa's time ÷ {candidate}'s time in the same run (= {candidate}'s TFLOP/s ÷ "
                  f"sdpa's); sdpa is {sdpa}.", ""]
    for g in groups:
        lines += [f"### {g.title}", ""]
        if g.rows is None:  # skipped for the budget, or still to come when the run was stopped
            lines += [g.skipped or "not run: the run stopped before this table", ""]
            continue
        try:
            table = format_table(g.rows)
        except ValueError as exc:  # every backend skipped: say why
            reasons = sorted({f"{r['backend']}: {r['skipped']}" for r in g.rows if r.get("skipped")})
            table = f"{exc}. " + "; ".join(reasons)
        lines += [table, "", f"({g.seconds:.1f} s for this table)", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_tables.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="Markdown file to write (the raw rows go to the same name .json)")
    p.add_argument("--budget", type=float, default=210.0, help="seconds after which no new table starts (210)")
    p.add_argument("--dry-run", action="store_true", help="tiny CPU run of the same plan and writer")
    p.add_argument("--sdpa", choices=tuple(SDPA_CHOICES), default="flash",
                   help="SDPA to compare with on CUDA: 'flash' (cuDNN off; the targets' baseline) or 'default'")
    args = p.parse_args(argv)
    import torch
    from attnbook.bench import machine_info

    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA GPU visible to torch (use --dry-run to check the script on a CPU)")
    groups, candidate, threshold = plan(args.dry_run)
    started = datetime.datetime.now().astimezone()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "CPU (dry run)"
    header = {"title": f"GPU: {gpu}, {started:%Y-%m-%d}" if not args.dry_run else "Dry run on the CPU (tiny sizes)",
              "machine": machine_info(), "date": f"{started:%Y-%m-%d %H:%M %Z}",
              "command": " ".join(["python", "benchmarks/gpu_tables.py", *(argv if argv is not None else sys.argv[1:])]),
              "sdpa": SDPA_CHOICES["default" if args.dry_run else args.sdpa]}
    out = Path(args.out)

    def write():
        out.write_text(render(groups, candidate, threshold, header=header), encoding="utf-8")
        raw = {"header": header, "groups": [dataclasses.asdict(g) for g in groups]}
        out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str), encoding="utf-8")

    run(groups, args.budget, log=lambda m: print(m, file=sys.stderr, flush=True), after=write, sdpa=args.sdpa)
    write()
    print(f"[gpu_tables] wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
