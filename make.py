#!/usr/bin/env python3
"""The README's two commands (and a few helpers), with nothing but Python 3.10+ and git.

    python3 make.py book    # venv in .venv, install, build the HTML book -> _build/html/index.html
    python3 make.py test    # library tests, nbval on every chapter, the book build with -W, HTML checks

Other targets: ``env`` (only create/refresh .venv), ``lib`` (library tests only), ``nb`` (nbval
only), ``html`` (checks on an already built book), ``colab`` (refresh badges and setup cells
from _config.yml's repository.url), ``bench`` (python -m attnbook.bench), ``clean``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".attnbook-installed"


def say(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def run(cmd: list, env: dict | None = None) -> None:
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    full_env = dict(os.environ, **(env or {}))
    # The venv's bin first, so jupyter-book's kernels and pytest's subprocesses use it.
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env["VIRTUAL_ENV"] = str(VENV)
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=full_env)
    if code != 0:
        sys.exit(code)


def ensure_env() -> None:
    """Create .venv and install requirements.txt + the package, once per requirements change."""
    digest = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest and PY.exists():
        return
    if not PY.exists():
        say(f"creating the virtual environment {VENV}")
        venv.create(VENV, with_pip=True)
    say("installing the pinned environment (requirements.txt) and attnbook (pip install -e .)")
    run([PY, "-m", "pip", "install", "-q", "-r", "requirements.txt"])
    run([PY, "-m", "pip", "install", "-q", "--no-deps", "-e", "."])
    run([PY, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3", "--display-name", "Python 3"])
    STAMP.write_text(digest)


def library_fingerprint() -> str:
    """A hash of the library's source: chapter outputs (show_source, asserts) depend on it."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "lib" / "attnbook").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_book(strict: bool = True) -> None:
    say("building the HTML book (notebooks executed, warnings are errors)")
    run([PY, "tools/book_assets.py"])
    cmd = [BIN / "jupyter-book", "build", ".", "--keep-going"]
    # jupyter-cache keys a notebook on its own code cells only, so a library change would leave
    # stale outputs (shown source, printed numbers). When lib/ changed, re-execute everything.
    stamp, fingerprint = ROOT / "_build" / ".library-fingerprint", library_fingerprint()
    if not stamp.exists() or stamp.read_text() != fingerprint:
        shutil.rmtree(ROOT / "_build" / ".jupyter_cache", ignore_errors=True)
        cmd.append("--all")
    if strict:
        cmd += ["-W", "-n"]
    # ATTNBOOK_STATIC=1: widgets render as static small-multiples figures (no kernel in HTML).
    run(cmd, env={"ATTNBOOK_STATIC": "1"})
    index = ROOT / "_build" / "html" / "index.html"
    if not index.exists():
        sys.exit("the build finished but _build/html/index.html is missing")
    stamp.write_text(fingerprint)
    print(f"\nThe book is at: {index}")


def test_lib() -> None:
    say("library tests (pytest tests/, Triton kernel under TRITON_INTERPRET=1)")
    run([PY, "-m", "pytest", "tests", "-q", "-m", "not book and not browser"])


def test_notebooks() -> None:
    say("every chapter re-executed by nbval")
    run([PY, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300",
         "-q", "chapters"])


def test_html() -> None:
    say("checks on the built HTML (links, local MathJax, Chinese search, real browser)")
    run([PY, "-m", "pytest", "tests", "-q", "-m", "book or browser", "-rs"])


def main(argv: list[str]) -> None:
    target = argv[1] if len(argv) > 1 else "help"
    t0 = time.time()
    if target in ("help", "-h", "--help"):
        print(__doc__)
        return
    if target == "clean":
        shutil.rmtree(ROOT / "_build", ignore_errors=True)
        return
    ensure_env()
    if target == "env":
        pass
    elif target == "book":
        build_book()
    elif target == "test":
        test_lib()
        test_notebooks()
        build_book()
        test_html()
        print(f"\nAll tests passed in {time.time() - t0:.0f} s.")
    elif target == "lib":
        test_lib()
    elif target == "nb":
        test_notebooks()
    elif target == "html":
        test_html()
    elif target == "colab":
        run([PY, "tools/colab.py"])
    elif target == "bench":
        run([PY, "-m", "attnbook.bench", *argv[2:]])
    else:
        sys.exit(f"unknown target {target!r}; see: python3 make.py help")


if __name__ == "__main__":
    main(sys.argv)
