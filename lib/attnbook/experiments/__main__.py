"""``python -m attnbook.experiments [--only ch08 ...] [--seeds 0 1 2 3 4] [--check [--jobs N]] [--strict]``.

Without ``--check``: run the claims, write benchmarks/EXPERIMENTS.md, benchmarks/EXPERIMENTS.json
and lib/attnbook/experiments/_committed.py (a run with ``--only`` merges its claims into the
committed files), and exit 1 if a claim does not hold. With ``--check``: run, write nothing,
exit 1 naming every claim whose predicate fails on some seed; ``--strict`` also fails when a
fresh value differs from the committed JSON by more than ``--rtol`` (default 1e-6).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import core

ROOT = Path(__file__).resolve().parents[3]
MD, RAW = ROOT / "benchmarks" / "EXPERIMENTS.md", ROOT / "benchmarks" / "EXPERIMENTS.json"
MODULE = Path(__file__).resolve().parent / "_committed.py"


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m attnbook.experiments", description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", default=None, help="chapters (ch08) or claims to run")
    p.add_argument("--seeds", nargs="+", type=int, default=list(core.DEFAULT_SEEDS))
    p.add_argument("--check", action="store_true", help="run and check; write nothing")
    p.add_argument("--strict", action="store_true", help="with --check: also fail on drift")
    p.add_argument("--rtol", type=float, default=1e-6)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--jobs", type=int, default=1,
                   help="with --check: run the chapters in this many processes (one thread each)")
    p.add_argument("--list", action="store_true", help="list the registered claims and exit")
    p.add_argument("--md", type=Path, default=MD)
    p.add_argument("--json", type=Path, default=RAW)
    p.add_argument("--module", type=Path, default=MODULE)
    args = p.parse_args(argv)
    if len(args.seeds) < 5 and not args.check:
        p.error(f"--seeds: the committed files need at least 5 seeds, got {args.seeds}")
    if args.jobs < 1 or (args.jobs > 1 and not args.check):
        p.error(f"--jobs: must be >= 1, and > 1 only with --check, got {args.jobs}")
    return args


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}, "
            f"python {platform.python_version()}, 1 thread")


@contextlib.contextmanager
def _write_lock(path: Path):
    """Hold an exclusive lock (where the OS has fcntl) from reading the committed rows to writing."""
    try:
        import fcntl
    except ImportError:                          # Windows: no lock; run one writer at a time
        yield
        return
    name = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"attnbook-experiments-{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _check_in_parallel(args, chosen) -> int:
    """``--check --jobs N``: the chapters split into N groups of about equal committed run time,
    each checked by its own ``python -m attnbook.experiments --check`` process; exit 1 if any fails."""
    cost: dict = {}
    for r in _old_rows(args.json):
        chapter = r["claim"].split(".")[0]
        cost[chapter] = cost.get(chapter, 0.0) + r["seconds"]
    chapters = sorted({e.name.split(".")[0] for e in chosen}, key=lambda c: -cost.get(c, 60.0))
    groups = [[] for _ in range(min(args.jobs, len(chapters)))]
    loads = [0.0] * len(groups)
    for c in chapters:                           # longest first, into the least loaded group
        i = loads.index(min(loads))
        groups[i].append(c)
        loads[i] += cost.get(c, 60.0)
    only = [[n for n in (args.only or [e.name for e in chosen]) if n.split(".")[0] in g] or g
            for g in groups]
    extra = ["--strict", "--rtol", str(args.rtol)] if args.strict else []
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "attnbook.experiments", "--check", "--no-progress",
                               "--json", str(args.json), "--seeds", *map(str, args.seeds), *extra,
                               "--only", *o], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for o in only]
    codes = []
    for o, proc in zip(only, procs):
        out, _ = proc.communicate()
        print(f"--- {' '.join(o)} ---\n{out}", end="" if out.endswith("\n") else "\n")
        codes.append(proc.returncode)
    print(f"{len(chosen)} claims in {len(procs)} processes in {time.perf_counter() - t0:.0f} s")
    return 1 if any(codes) else 0


def _old_rows(path: Path) -> list:
    return json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []


def main(argv=None, registry=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name in core.names(registry):
            print(f"{name}: {core.get(name, registry).claim}")
        return 0
    torch.set_num_threads(1)                    # deterministic per seed, and fair to a 2-core CI
    chosen = core.select(args.only, registry)
    if args.jobs > 1 and registry is None:
        return _check_in_parallel(args, chosen)
    t0 = time.perf_counter()
    rows = core.run_experiments(chosen, args.seeds, progress=not args.no_progress)
    seconds = time.perf_counter() - t0
    summaries = [core.summarize(e, rows) for e in chosen]
    for s in summaries:
        mark = "holds" if s["holds"] else "FAILS"
        quoted = "; ".join(f"{k} {v}" for k, v in s["quotes"].items())
        print(f"{mark:5s} {s['claim']}: {quoted}")
    print(f"{len(chosen)} claims x {len(args.seeds)} seeds in {seconds:.0f} s")
    bad = core.failures(summaries)
    if args.check:
        problems = list(bad)
        if args.strict:
            problems += [f"drift: {d}" for d in core.drift(rows, _old_rows(args.json), args.rtol)]
        for line in problems:
            print(f"experiments --check: {line}", file=sys.stderr)
        return 1 if problems else 0
    with _write_lock(args.json):                # concurrent --only runs must not lose rows
        if args.only:                           # merge into the committed rows of other claims
            mine = {e.name for e in chosen}
            old = [r for r in _old_rows(args.json) if r["claim"] not in mine]
            rows = sorted(old + rows, key=lambda r: (r["claim"], r["seed"]))
            every = [core.get(n, registry) for n in sorted({r["claim"] for r in rows})]
            summaries = [core.summarize(e, rows) for e in every]
            bad = core.failures(summaries)      # the files must not hide a failing claim
        meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    machine=_machine(),
                    command="python3 make.py experiments" + (f" --only {' '.join(args.only)}" if args.only else ""),
                    seeds=args.seeds, seconds=round(seconds, 1))
        core.write_outputs(rows, summaries, meta, md=args.md, raw=args.json, module=args.module)
    print(f"wrote {args.md}, {args.json} and {args.module}")
    for line in bad:
        print(f"experiments: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
