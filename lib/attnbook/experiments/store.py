"""The committed rows: one JSON file per chapter inside the package, and where each row was made.

``data/chNN.json`` holds ``{"envs": {label: record}, "rows": [{claim, seed, env, metrics,
seconds}]}``; it ships as package data and is read with :mod:`importlib.resources`, so a
repository checkout, a pip install and Colab all read the same rows (and nothing is rerun when
a file is missing: there are then no committed rows). ``environment()`` is the record of the
machine and CPU kernel path a run is made on: CPU model, the kernel path PyTorch uses
(``torch.backends.cpu.get_cpu_capability()``) and the one asked for (``ATEN_CPU_CAPABILITY``),
BLAS, threads, torch, Python, OS/arch and the library's version.
"""
from __future__ import annotations

import json
import os
import platform
import re
from importlib import resources
from pathlib import Path

__all__ = ["environment", "env_label", "load", "write", "data_dir", "chapter_of", "CHAPTER_FILE"]

CHAPTER_FILE = "ch{chapter}.json"


def data_dir() -> Path:
    """The package's data folder (where ``make.py experiments`` writes the committed rows)."""
    return Path(__file__).resolve().parent / "data"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas(torch) -> str:
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def environment() -> dict:
    """Where a run is made: this machine, this CPU kernel path, this software."""
    import torch

    from .. import __version__
    return dict(cpu=_cpu_model(), capability=torch.backends.cpu.get_cpu_capability(),
                requested=os.environ.get("ATEN_CPU_CAPABILITY", ""), blas=_blas(torch),
                threads=torch.get_num_threads(), torch=torch.__version__,
                python=platform.python_version(), os=f"{platform.system()} {platform.machine()}",
                attnbook=__version__)


def _short_cpu(cpu: str) -> str:
    for word in ("EPYC", "Xeon", "Ryzen", "Core", "Apple", "Graviton", "Neoverse"):
        if word.lower() in cpu.lower():
            return word
    return (cpu.split() or ["cpu"])[0]


def env_label(env: dict) -> str:
    """A short label for an environment record, e.g. ``EPYC·AVX2`` or ``Xeon·native``."""
    cap = env.get("capability") or "native"
    return f"{_short_cpu(env.get('cpu', ''))}·{cap}"


def chapter_of(claim: str) -> str:
    """``"ch08.warmup"`` -> ``"08"``."""
    if not isinstance(claim, str) or not re.fullmatch(r"ch\d\d\.\w+", claim):
        raise ValueError(f"chapter_of: `claim` must look like 'ch08.name', got {claim!r}")
    return claim[2:4]


def load(chapter: str, folder: Path | None = None) -> dict:
    """The committed rows of one chapter (``{"envs": {}, "rows": []}`` if it has none)."""
    name = CHAPTER_FILE.format(chapter=chapter)
    if folder is not None:
        path = Path(folder) / name
        text = path.read_text(encoding="utf-8") if path.is_file() else None
    else:
        res = resources.files(__package__).joinpath("data", name)
        text = res.read_text(encoding="utf-8") if res.is_file() else None
    if text is None:
        return dict(envs={}, rows=[])
    data = json.loads(text)
    return dict(envs=dict(data.get("envs", {})), rows=list(data.get("rows", [])))


def write(chapter: str, data: dict, folder: Path | None = None) -> Path:
    """Write one chapter's rows (sorted by claim, seed, environment) as ``chNN.json``."""
    folder = data_dir() if folder is None else Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted(data["rows"], key=lambda r: (r["claim"], r["seed"], r["env"]))
    used = {r["env"] for r in rows}
    envs = {k: v for k, v in sorted(data["envs"].items()) if k in used}
    missing = used - set(envs)
    if missing:
        raise ValueError(f"write: rows name environments without a record: {sorted(missing)}")
    path = folder / CHAPTER_FILE.format(chapter=chapter)
    text = json.dumps(dict(chapter=chapter, envs=envs, rows=rows), indent=1, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def merge(data: dict, new_rows: list, env: dict) -> dict:
    """``data`` with ``new_rows`` (made in ``env``) added; a row of the same (claim, seed,
    environment) is replaced. Two different records with one label get distinct labels."""
    envs = dict(data["envs"])
    label = env_label(env)
    base, i = label, 2
    while label in envs and _same_env(envs[label], env) is False:
        label, i = f"{base}#{i}", i + 1
    envs[label] = env
    fresh = {(r["claim"], r["seed"]) for r in new_rows}
    kept = [r for r in data["rows"] if not (r["env"] == label and (r["claim"], r["seed"]) in fresh)]
    return dict(envs=envs, rows=kept + [dict(r, env=label) for r in new_rows])


def _same_env(a: dict, b: dict) -> bool:
    keys = ("cpu", "capability", "blas", "torch", "python", "os", "threads")
    return all(a.get(k) == b.get(k) for k in keys)


def same_env(a: dict, b: dict) -> bool:
    """Whether two environment records describe the same machine, kernel path and software."""
    return _same_env(a, b)
