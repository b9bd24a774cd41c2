#!/usr/bin/env python3
"""The README's two commands (and a few helpers), with nothing but Python 3.11+ and git.

    python3 make.py book    # venv in .venv, install, build the HTML book -> _build/html/index.html
    python3 make.py test    # library tests, nbval on every chapter, the Colab simulation for one
                            # chapter, the book build with -W, HTML and browser checks

Other targets: ``env`` (only create/refresh .venv and the git output filter), ``lib`` (the
library tests, tests/lib, without those marked slow), ``hygiene`` (book, tooling and environment tests, tests/book, without
the built HTML), ``nb`` (nbval only), ``html`` (checks on an already built book),
``colab`` (refresh badges and setup cells from _config.yml's repository.url, link the first use
of each glossary term in every chapter, and regenerate the Colab edition colab/),
``colab-test [NN ...]`` (run the Colab edition of every chapter, or of the given ones, in a
simulated Colab runtime), ``bench`` (python -m attnbook.bench),
``experiments [--check] [--only ch08 ...] [--jobs N]`` (python -m attnbook.experiments: the full sweep, every empirical claim over seeds 0-9 under the native and the portable CPU kernel path
(ATEN_CPU_CAPABILITY=default; avx2 too where the native path is AVX-512), each path in its own
process, merged into lib/attnbook/experiments/data/chNN.json and rendered to
benchmarks/EXPERIMENTS.md; --check re-runs seeds 0-4 under ATEN_CPU_CAPABILITY=default, writes
nothing and fails naming a claim that no longer holds; --strict also reports drift against rows
of the same recorded environment; --render only re-renders EXPERIMENTS.md), ``clean``.

Options (environment variables, or --torch-index URL on the command line):
    ATTNBOOK_TORCH_INDEX=URL   install torch from this package index (pip --index-url), e.g. a
                               CPU-only PyTorch index: on Linux the default torch wheel is the
                               CUDA build, several GB of NVIDIA libraries.
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
MIN_PYTHON = (3, 11, 5)          # numpy 2.4, ipython 9 and soupsieve 4.1 in requirements.txt need it
COLAB_CI_CHAPTER = "04"          # the chapter `make.py test` runs in the simulated Colab runtime


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


def pinned(name: str, requirements: Path = ROOT / "requirements.txt") -> str | None:
    """The `name==version` line of requirements.txt (without a marker), or None."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        spec = line.split(";", 1)[0].split("#", 1)[0].strip()
        if spec.lower().startswith(name.lower() + "=="):
            return spec
    return None


def torch_index(argv: list[str] | None = None) -> str | None:
    """The package index to take torch from: --torch-index URL, else ATTNBOOK_TORCH_INDEX."""
    argv = argv if argv is not None else sys.argv
    for i, arg in enumerate(argv):
        if arg == "--torch-index" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--torch-index="):
            return arg.split("=", 1)[1]
    return os.environ.get("ATTNBOOK_TORCH_INDEX") or None


def download_notice(index: str | None, platform: str = sys.platform) -> str:
    """What the first install will download, said before it starts."""
    n = sum(1 for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#"))
    torch = pinned("torch") or "torch"
    lines = [f"about to install {n} pinned packages (requirements.txt) into {VENV}."]
    if index:
        lines.append(f"{torch} comes from the index you gave ({index}); the rest from the default index.")
    elif platform.startswith("linux"):
        lines.append(f"{torch}: on Linux the default wheel is the CUDA build, which pulls NVIDIA libraries")
        lines.append("of several GB (plus triton). On a machine without an NVIDIA GPU, a CPU-only build is")
        lines.append("much smaller: rerun with ATTNBOOK_TORCH_INDEX=<a CPU-only PyTorch index URL> (or")
        lines.append("`--torch-index URL`); make.py passes it to pip as --index-url for torch alone.")
    else:
        lines.append(f"{torch} is a few hundred MB on {platform}; the whole install is about 1-2 GB.")
    lines.append("pip shows each download as it goes; a first install takes several minutes.")
    return "\n".join(lines)


def install_commands(index: str | None) -> list[list]:
    """The pip commands of a (re)install, in order. pip runs without -q: it shows progress."""
    pip = [PY, "-m", "pip", "install", "--disable-pip-version-check"]
    commands = []
    torch = pinned("torch")
    if index and torch:
        commands.append([*pip, "--no-deps", "--index-url", index, torch])
    commands.append([*pip, "-r", "requirements.txt"])
    commands.append([*pip, "--no-deps", "-e", "."])
    commands.append([PY, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
                     "--display-name", "Python 3"])
    return commands


def configure_git_filter(root: Path = ROOT, python: Path = PY) -> bool:
    """Let git strip notebook outputs on `git add` (nbstripout as a clean filter).

    .gitattributes (committed) maps *.ipynb to the filter `nbstripout`; this defines it in the
    repository's .git/config with the venv's interpreter. Cell ids are kept (--keep-id), so a
    saved-after-running chapter stages exactly as it was before it ran. Returns False when
    there is no git repository or nbstripout is not installed.
    """
    if not (root / ".git").exists() or shutil.which("git") is None:
        return False
    probe = subprocess.run([str(python), "-c", "import nbstripout"], capture_output=True)
    if probe.returncode != 0:
        return False
    quoted = f'"{python}"' if " " in str(python) else str(python)
    settings = {
        "filter.nbstripout.clean": f"{quoted} -m nbstripout --keep-id",
        "filter.nbstripout.smudge": "cat",
        "filter.nbstripout.required": "false",        # no venv -> git stages as is; tests catch it
        "diff.ipynb.textconv": f"{quoted} -m nbstripout --keep-id -t",
    }
    for key, value in settings.items():
        subprocess.run(["git", "-C", str(root), "config", "--local", key, value], check=True)
    return True


def check_python() -> None:
    if sys.version_info < MIN_PYTHON:
        sys.exit(f"make.py needs Python >= {'.'.join(map(str, MIN_PYTHON))} (the pinned environment "
                 f"does); this is {sys.version.split()[0]}. Run it with a newer python3.")


def ensure_env() -> None:
    """Create .venv and install requirements.txt + the package, once per requirements change."""
    check_python()
    index = torch_index()
    digest = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
        + (index or "").encode()
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest and PY.exists():
        configure_git_filter()
        return
    say(download_notice(index))
    if not PY.exists():
        say(f"creating the virtual environment {VENV}")
        venv.create(VENV, with_pip=True)
    say("installing the pinned environment (requirements.txt) and attnbook (pip install -e .)")
    for command in install_commands(index):
        run(command)
    if configure_git_filter():
        say("git now strips notebook outputs when you `git add` a chapter (nbstripout filter)")
    STAMP.write_text(digest)


def library_fingerprint() -> str:
    """A hash of the library's source: chapter outputs (show_source, asserts) depend on it."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "lib" / "attnbook").rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_book(strict: bool = True) -> None:
    say("building the HTML book (notebooks executed, warnings are errors)")
    run([PY, "-m", "tools.book_assets"])
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
    say("library tests (pytest tests/lib: every module, the Triton kernel under TRITON_INTERPRET=1; "
        "the slow ones, marked slow, run in make.py test's next stage)")
    run([PY, "-m", "pytest", "tests/lib", "-q", "-m", "not slow"])


def test_lib_slow() -> None:
    say("slow library tests (pytest tests/lib -m slow: real Jupyter kernels, benchmark subprocesses, "
        "the experiments' training runs, the sm_90 compile)")
    run([PY, "-m", "pytest", "tests/lib", "-q", "-m", "slow"])


def test_hygiene() -> None:
    say("book, tooling and environment tests (pytest tests/book: notebooks as git would commit them, "
        "Colab edition in sync and free of MyST, errata/glossary/notation, make.py, macOS/Windows "
        "resolution against the package index)")
    run([PY, "-m", "pytest", "tests/book", "-q", "-m", "not book and not browser"])


def test_colab(chapters: list[str]) -> None:
    which = "every chapter" if chapters == ["all"] else "chapter " + ", ".join(chapters)
    say(f"the Colab edition of {which} in a simulated Colab runtime (tools/colab_sim.py)")
    run([PY, "-m", "pytest", "tests/book/test_colab_edition.py", "-q", "-s", "-k", "test_colab_simulation", "-rs"],
        env={"ATTNBOOK_COLAB_CHAPTERS": ",".join(chapters)})


def test_notebooks() -> None:
    say("every chapter re-executed by nbval")
    run([PY, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300",
         "-q", "chapters"])


def test_html() -> None:
    say("checks on the built HTML (links, local MathJax, Chinese search, real browser)")
    run([PY, "-m", "pytest", "tests/book", "-q", "-m", "book or browser", "-rs"])


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
        test_lib_slow()
        test_hygiene()
        test_notebooks()
        test_colab([COLAB_CI_CHAPTER])
        build_book()
        test_html()
        print(f"\nAll tests passed in {time.time() - t0:.0f} s.")
    elif target == "lib":
        test_lib()
    elif target == "hygiene":
        test_hygiene()
    elif target == "nb":
        test_notebooks()
    elif target == "html":
        test_html()
    elif target == "colab":
        run([PY, "-m", "tools.regenerate"])     # badges/setup cells, glossary first-use links, colab/
    elif target == "colab-test":
        chapters = [a for a in argv[2:] if not a.startswith("--") and a != torch_index(argv)]
        test_colab(chapters or ["all"])
    elif target == "bench":
        run([PY, "-m", "attnbook.bench", *argv[2:]])
    elif target == "experiments":
        say("every empirical claim over seeds and CPU kernel paths (python -m attnbook.experiments)")
        run([PY, "-m", "attnbook.experiments", *argv[2:]])
    else:
        sys.exit(f"unknown target {target!r}; see: python3 make.py help")


if __name__ == "__main__":
    main(sys.argv)
