"""``python -m attnbook.experiments``: run the book's claims over seeds and CPU kernel paths.

Without ``--check`` (the full sweep): seeds 0-9 (``--seeds``) under each kernel path of
``--paths`` (default: this CPU's native path and ``default``, plus ``avx2`` where the native path
is AVX-512), each path in its own subprocess with ``ATEN_CPU_CAPABILITY`` set; the rows are
merged into ``data/chNN.json`` by (claim, seed, environment) and benchmarks/EXPERIMENTS.md is
rendered from all committed rows; exit 1 if a claim does not hold.

``--check``: seeds 0-4 under ``ATEN_CPU_CAPABILITY=default`` (a path other than the native one
the rows were mostly made on); write nothing; exit 1 naming every claim whose rule fails on a
fresh run (rules over all runs are judged on the committed rows plus the fresh ones).
``--budget S`` runs a claim whose committed median seconds per seed exceed S on ``--few-seeds``
only. ``--strict`` also reports drift beyond ``--rtol`` against committed rows made in the SAME
recorded environment (rows of other environments are never compared). ``--jobs N`` checks the
chapters in N processes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import core, store

ROOT = Path(__file__).resolve().parents[3]
MD = ROOT / "benchmarks" / "EXPERIMENTS.md"


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m attnbook.experiments",
                                description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", default=None, help="chapters (ch08) or claims to run")
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="default: 0-9 for the sweep, 0-4 for --check")
    p.add_argument("--paths", nargs="+", default=None,
                   help="kernel paths (ATEN_CPU_CAPABILITY values) for the sweep")
    p.add_argument("--check", action="store_true", help="run and check; write nothing")
    p.add_argument("--capability", default="default",
                   help="with --check: the ATEN_CPU_CAPABILITY to check under ('' = as is)")
    p.add_argument("--strict", action="store_true", help="with --check: also fail on drift "
                   "against committed rows of the same recorded environment")
    p.add_argument("--rtol", type=float, default=1e-6)
    p.add_argument("--budget", type=float, default=None,
                   help="with --check: seconds per seed above which a claim runs on --few-seeds")
    p.add_argument("--few-seeds", nargs="+", type=int, default=[0])
    p.add_argument("--jobs", type=int, default=1, help="processes (one thread each)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the registered claims and exit")
    p.add_argument("--render", action="store_true",
                   help="only render EXPERIMENTS.md from the committed rows")
    p.add_argument("--md", type=Path, default=MD)
    p.add_argument("--data", type=Path, default=None, help="folder of chNN.json (default: package)")
    p.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: must be >= 1, got {args.jobs}")
    if args.seeds is None:
        args.seeds = list(core.DEFAULT_SEEDS if args.check else core.SWEEP_SEEDS)
    return args


def native_paths() -> list[str]:
    """The kernel paths a full sweep uses on this CPU: native and default (+ avx2 under AVX-512)."""
    import torch
    native = torch.backends.cpu.get_cpu_capability().lower()
    paths = [native, "default"]
    if native.startswith("avx512"):
        paths.insert(1, "avx2")
    return list(dict.fromkeys(paths))


def _worker(args, registry) -> int:
    """Run the selection here (one thread) and write {env, rows} to ``args.worker``."""
    import torch
    torch.set_num_threads(1)
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "")
    got = torch.backends.cpu.get_cpu_capability()
    if asked and asked.lower() != got.lower():
        raise SystemExit(f"experiments: ATEN_CPU_CAPABILITY={asked!r} is not a kernel path this CPU "
                         f"and torch run (they run {got}); the rows would be mislabelled")
    chosen = core.select(args.only, registry)
    seeds = list(args.seeds)
    rows = core.run_experiments(chosen, seeds, progress=not args.no_progress)
    args.worker.write_text(json.dumps(dict(env=store.environment(), rows=rows)), encoding="utf-8")
    return 0


def _spawn(only, seeds, capability, out: Path, progress: bool):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    cmd = [sys.executable, "-m", "attnbook.experiments", "--worker", str(out),
           "--seeds", *map(str, seeds), "--only", *only] + ([] if progress else ["--no-progress"])
    return subprocess.Popen(cmd, env=env)


def _cost(name: str) -> float:
    """Committed median seconds per seed of a claim's run (0 if unknown or shared)."""
    secs = [r["seconds"] for r in core.rows(name) if r["seconds"] > 0]
    return statistics.median(secs) if secs else 0.0


def _groups(names: list[str], jobs: int) -> list[list[str]]:
    """Chapters into ``jobs`` groups of about equal committed time, longest first."""
    by_chapter: dict = {}
    for n in names:
        by_chapter.setdefault(n[:4], []).append(n)
    cost = {c: sum(_cost(n) for n in ns) for c, ns in by_chapter.items()}
    groups, loads = [[] for _ in range(min(jobs, len(by_chapter)))], [0.0] * min(jobs, len(by_chapter))
    for c in sorted(by_chapter, key=lambda c: -cost[c]):
        i = loads.index(min(loads))
        groups[i] += by_chapter[c]
        loads[i] += cost[c]
    return [g for g in groups if g]


def _run_parallel(tasks, progress) -> list[dict]:
    """tasks: [(only, seeds, capability)] -> the workers' outputs, in order; raises on a failure."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"w{i}.json" for i in range(len(tasks))]
        procs = [_spawn(o, s, c, out, progress) for (o, s, c), out in zip(tasks, outs)]
        codes = [p.wait() for p in procs]
        bad = [t for t, c in zip(tasks, codes) if c != 0]
        if bad:
            raise SystemExit(f"experiments: a worker failed: {bad}")
        return [json.loads(o.read_text(encoding="utf-8")) for o in outs]


def render(md: Path, folder: Path | None = None) -> list[dict]:
    """Write EXPERIMENTS.md from the committed rows; return the summaries."""
    summaries, envs = [], {}
    for exp in core.select(None):
        data = store.load(exp.chapter, folder)
        envs.update(data["envs"])
        if any(r["claim"] == exp.name for r in data["rows"]):
            summaries.append(core.summarize(exp, data["rows"]))
    md.write_text(core.markdown(summaries, envs), encoding="utf-8")
    return summaries


def _verdict(here: dict, both: dict) -> tuple[bool, float]:
    """``--check``'s verdict on one claim and the margin it prints: every fresh run passes the
    per-run rule (``here``: the fresh runs' summary), and every rule over the runs holds on the
    committed rows plus the fresh ones (``both``). The margin is the thinnest of those same
    clauses; a rule over the runs judged on five fresh runs alone (say, 'the argmax varies' on
    five runs that happen to share it) is not what decides, so it is not what is printed."""
    per_run = [p["margin"] for p in here["per_run"]]
    ok = all(p["holds"] for p in here["per_run"]) and all(o["holds"] for o in both["overall"])
    return ok, min(per_run + [o["margin"] for o in both["overall"]], default=float("inf"))


def check(args, registry=None) -> int:
    chosen = core.select(args.only, registry)
    names = [e.name for e in chosen]
    few = {n for n in names if args.budget is not None and _cost(n) > args.budget}
    tasks = []
    for group in _groups([n for n in names if n not in few], args.jobs):
        tasks.append((group, args.seeds, args.capability))
    if few:
        tasks.append((sorted(few), args.few_seeds, args.capability))
        print(f"over the {args.budget:g} s per seed budget, on seeds {args.few_seeds} only: "
              f"{', '.join(sorted(few))}")
    t0 = time.perf_counter()
    outs = _run_parallel(tasks, not args.no_progress)
    problems = []
    for out in outs:
        for name in sorted({r["claim"] for r in out["rows"]}):
            exp = core.get(name, registry)
            fresh = [dict(r, env="fresh") for r in out["rows"] if r["claim"] == name]
            here = core.summarize(exp, fresh)
            bad = [p for p in here["per_run"] if not p["holds"]]
            old = core.rows(name) if registry is None else []
            both = core.summarize(exp, old + fresh)
            ok, margin = _verdict(here, both)
            print(f"{'holds' if ok else 'FAILS':5s} {name}: {len(fresh)} fresh runs, worst margin "
                  f"{core._pct(margin)}")
            if bad:
                problems.append(f"{name}: fails on seed(s) {[p['seed'] for p in bad]} under "
                                f"{out['env']['capability']} (rule: {exp.rule.text()})")
            problems += [f"{name}: with the fresh runs, '{o['rule']}' fails"
                         for o in both["overall"] if not o["holds"]]
            if args.strict:
                label = next((k for k, v in store.load(exp.chapter)["envs"].items()
                              if store.same_env(v, out["env"])), None)
                if label is not None:
                    problems += [f"drift: {d}" for d in core.drift(
                        [dict(r, env=label) for r in fresh], old, args.rtol)]
    print(f"{len(names)} claims checked in {len(tasks)} processes in "
          f"{time.perf_counter() - t0:.0f} s")
    for line in problems:
        print(f"experiments --check: {line}", file=sys.stderr)
    return 1 if problems else 0


def sweep(args, registry=None) -> int:
    chosen = core.select(args.only, registry)
    paths = args.paths or native_paths()
    names = [e.name for e in chosen]
    t0 = time.perf_counter()
    for path in paths:                      # one subprocess (or --jobs) per kernel path
        print(f"--- ATEN_CPU_CAPABILITY={path}: {len(names)} claims x {len(args.seeds)} seeds")
        tasks = [(g, args.seeds, path) for g in _groups(names, args.jobs)]
        for out in _run_parallel(tasks, not args.no_progress):
            for chapter in sorted({r["claim"][2:4] for r in out["rows"]}):
                data = store.load(chapter, args.data)
                mine = [r for r in out["rows"] if r["claim"][2:4] == chapter]
                store.write(chapter, store.merge(data, mine, out["env"]), args.data)
    print(f"sweep: {len(paths)} kernel paths in {time.perf_counter() - t0:.0f} s")
    core._committed_cached.cache_clear()
    summaries = render(args.md, args.data)
    bad = core.failures(summaries)
    print(f"wrote the rows of {len({n[:4] for n in names})} chapters and {args.md}")
    for line in bad:
        print(f"experiments: {line}", file=sys.stderr)
    return 1 if bad else 0


def main(argv=None, registry=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name in core.names(registry):
            print(f"{name}: {core.get(name, registry).claim}")
        return 0
    if args.worker is not None:
        return _worker(args, registry)
    if args.render:
        bad = core.failures(render(args.md, args.data))
        for line in bad:
            print(f"experiments: {line}", file=sys.stderr)
        return 1 if bad else 0
    return check(args, registry) if args.check else sweep(args, registry)


if __name__ == "__main__":
    sys.exit(main())
