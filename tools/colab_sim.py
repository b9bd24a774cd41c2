"""Run the Colab edition (colab/*.ipynb) the way Google Colab would, as far as this machine allows.

What it sets up (under _build/colab-sim/, reused between runs while the pins are the same):
- a separate virtual environment with Colab's versions of the packages a chapter touches
  (COLAB_PINS: numpy 2.0, matplotlib 3.10, ipywidgets 7.7.1, IPython 7.34, ipykernel 6.17 ...)
  and a torch build (ATTNBOOK_COLAB_TORCH, default: the pinned torch==2.13.0, because on x86_64
  any other release is a CUDA wheel of several GB; Colab itself has torch 2.9-2.11);
- a fake `google.colab` module that the kernel imports at start-up, as Colab's kernel does, so
  the setup cell's `if "google.colab" in sys.modules:` branch runs;
- the setup cell's install source redirected to this checkout: git's `url.<local>.insteadOf`
  maps the repository URL from _config.yml to a local bare repository whose branch holds a
  snapshot of the working tree (committed or not), so `%pip install "attnbook @ git+…@main"`
  really clones, builds and installs the library, offline from GitHub;
- an empty working directory (Colab starts in /content without the repository's files).

Then for each chapter it uninstalls attnbook (a fresh Colab runtime does not have it), runs every
cell of colab/NN_slug.ipynb in a fresh kernel, and checks that torch / numpy / matplotlib /
ipywidgets / IPython versions did not change (the install must not upgrade what Colab ships),
that attnbook was imported from the installed copy (not from the checkout), and that the
explore(...) widget displayed an image.

The simulated runtime's python runs this file as a script (`--execute`), outside the
repository's import path: at module level it imports only the standard library.

Usage:
    python -m tools.colab_sim                 # every chapter (slow: about a minute each)
    python -m tools.colab_sim 04 06           # chapters by number
Environment: ATTNBOOK_COLAB_TORCH (pip requirement for torch), ATTNBOOK_COLAB_PYTHON (the
interpreter for the simulated runtime; default the one running this script),
ATTNBOOK_TORCH_INDEX (as in make.py: a package index to take torch from, e.g. a CPU-only one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = Path("_build") / "colab-sim"              # under the repository root
KERNEL_NAME = "attnbook-colab-sim"
# Colab's runtime (googlecolab/backend-info, 2026): the versions of what the chapters touch.
COLAB_PINS = [
    "numpy==2.0.2",
    "matplotlib==3.10.0",
    "ipywidgets==7.7.1",
    "widgetsnbextension==3.6.10",
    "ipython==7.34.0",
    "ipykernel==6.17.1",
    "jupyter_client==7.4.9",
    "traitlets==5.7.1",
    "tqdm==4.67.1",
    # what runs the notebook here (Colab's front end does that there)
    "nbclient==0.10.2",
    "nbformat==5.10.4",
]
DEFAULT_TORCH = "torch==2.13.0"
WATCHED = ("torch", "numpy", "matplotlib", "ipywidgets", "ipython", "ipykernel")
FAKE_COLAB = '''"""A stand-in for Colab's `google.colab` package (tools/colab_sim.py)."""
from . import output  # noqa: F401
'''
FAKE_OUTPUT = '''"""A stand-in for google.colab.output."""


def enable_custom_widget_manager():
    return None


def disable_custom_widget_manager():
    return None
'''
PROBE_CELL = (
    "# colab-sim probe (added by tools/colab_sim.py, not part of the chapter)\n"
    "import importlib.metadata as _md, json as _json, sys as _sys\n"
    "import attnbook as _attnbook\n"
    "print('COLAB-SIM ' + _json.dumps({'attnbook_file': _attnbook.__file__,\n"
    "    'google_colab': 'google.colab' in _sys.modules,\n"
    "    'versions': {n: _md.version(n) for n in %r}}))\n" % (WATCHED,)
)


def say(msg: str) -> None:
    print(f"[colab-sim] {msg}", flush=True)


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def torch_requirement() -> str:
    return os.environ.get("ATTNBOOK_COLAB_TORCH", DEFAULT_TORCH)


def ensure_venv(work: Path | None = None) -> Path:
    """Create (or reuse) the simulated runtime's virtual environment; return its python."""
    work = work or _root() / WORK
    venv = work / "venv"
    py = _bin(venv, "python")
    base = os.environ.get("ATTNBOOK_COLAB_PYTHON", sys.executable)
    pins = [torch_requirement(), *COLAB_PINS]
    digest = hashlib.sha256(json.dumps([base, pins, FAKE_COLAB, FAKE_OUTPUT]).encode()).hexdigest()
    stamp = venv / ".colab-sim-ready"
    if stamp.is_file() and stamp.read_text() == digest and py.is_file():
        return py
    shutil.rmtree(venv, ignore_errors=True)
    say(f"creating the simulated Colab runtime in {venv} (Python: {base})")
    say(f"installing {' '.join(pins)} -- torch is the large download if it is not cached")
    _run([base, "-m", "venv", venv])
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    index = os.environ.get("ATTNBOOK_TORCH_INDEX")
    if index:
        _run([*pip, "--index-url", index, torch_requirement()])
    _run([*pip, *pins])
    _run([py, "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL_NAME,
          "--display-name", "Python 3 (simulated Colab)"])
    fake = work / "fake-colab" / "google" / "colab"
    shutil.rmtree(work / "fake-colab", ignore_errors=True)
    fake.mkdir(parents=True)                      # google/ stays a namespace package
    (fake / "__init__.py").write_text(FAKE_COLAB, encoding="utf-8")
    (fake / "output.py").write_text(FAKE_OUTPUT, encoding="utf-8")
    stamp.write_text(digest)
    return py


def _root() -> Path:
    from tools import ROOT           # not at module level: see the module docstring

    return ROOT


def snapshot_repository(work: Path | None = None, root: Path | None = None) -> tuple[Path, str]:
    """A bare repository whose branch (from _config.yml) holds the working tree as it is now.

    Returns (bare repository path, commit id). Uncommitted and untracked (not ignored) files
    are included, through a temporary index, so the simulation tests what is on disk.
    """
    from tools import colab

    root = root or _root()
    work = work or root / WORK
    repo = colab.repository(root / "_config.yml")
    bare = work / "attnbook.git"
    if not (bare / "HEAD").is_file():
        bare.parent.mkdir(parents=True, exist_ok=True)
        _run(["git", "init", "-q", "--bare", bare])
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"))
        git = ["git", "-C", str(root)]
        subprocess.run([*git, "read-tree", "HEAD"], check=True, env=env)
        subprocess.run([*git, "add", "-A"], check=True, env=env)
        tree = subprocess.run([*git, "write-tree"], check=True, env=env, capture_output=True,
                              text=True).stdout.strip()
        ident = dict(env, GIT_AUTHOR_NAME="colab-sim", GIT_AUTHOR_EMAIL="colab-sim@localhost",
                     GIT_COMMITTER_NAME="colab-sim", GIT_COMMITTER_EMAIL="colab-sim@localhost")
        commit = subprocess.run([*git, "commit-tree", tree, "-p", "HEAD", "-m", "colab-sim snapshot"],
                                check=True, env=ident, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(root), "push", "-q", "--force", str(bare),
                    f"{commit}:refs/heads/{repo.branch}"], check=True)
    return bare, repo.url


def runtime_env(work: Path, bare: Path, repo_url: str) -> dict:
    """Environment of the simulated kernel: fake google.colab, git redirect, IPython start-up."""
    gitconfig = work / "gitconfig"
    gitconfig.write_text(
        f'[url "{bare.resolve().as_uri()}"]\n\tinsteadOf = {repo_url}\n'
        f'[protocol "file"]\n\tallow = always\n', encoding="utf-8")
    ipython_dir = work / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-google-colab.py").write_text("import google.colab  # as Colab's kernel does\n",
                                                encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ATTNBOOK_STATIC", "MPLBACKEND", "PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_"))}
    env.update({
        "GIT_CONFIG_GLOBAL": str(gitconfig),
        "GIT_CONFIG_NOSYSTEM": "1",
        "IPYTHONDIR": str(ipython_dir),
        "PYTHONPATH": str(work / "fake-colab"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    })
    return env


def versions(py: Path) -> dict:
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in %r}))"
            % (WATCHED,))
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def run_chapter(number_or_name: str, *, work: Path | None = None, root: Path | None = None) -> dict:
    """Run one chapter's Colab edition in the simulated runtime; raise AssertionError on failure.

    Returns a report: chapter, seconds, versions before/after, the probe's output.
    """
    root = root or _root()
    work = work or root / WORK
    matches = sorted((root / "colab").glob(f"{number_or_name}*.ipynb"))
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one colab/{number_or_name}*.ipynb, found {matches} "
                                "(run `python3 make.py colab` first)")
    edition = matches[0]
    py = ensure_venv(work)
    bare, url = snapshot_repository(work, root)
    env = runtime_env(work, bare, url)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "attnbook"], env=env,
                   capture_output=True)
    before = versions(py)
    content = work / "content"
    shutil.rmtree(content, ignore_errors=True)
    content.mkdir(parents=True)
    executed = work / "executed" / edition.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    say(f"running {edition.relative_to(root)} in the simulated Colab runtime (cwd {content})")
    t0 = time.time()
    proc = subprocess.run(
        [str(py), str(Path(__file__).resolve()), "--execute", str(edition), str(executed), str(content)],
        env=env, cwd=content, capture_output=True, text=True)
    seconds = time.time() - t0
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"{edition.name}: a cell failed in the simulated Colab runtime:\n{tail}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    after = versions(py)
    report = {"chapter": edition.name, "seconds": round(seconds, 1), "before": before, "after": after,
              **result}
    (work / "executed" / (edition.stem + ".json")).write_text(json.dumps(report, indent=1), encoding="utf-8")
    problems = []
    if before != after:
        changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
        problems.append(f"the install changed preinstalled packages: {changed}")
    probe = result.get("probe") or {}
    if probe.get("versions") != before:
        problems.append(f"the kernel saw versions {probe.get('versions')} instead of {before}")
    if not probe.get("google_colab"):
        problems.append("google.colab was not in sys.modules inside the kernel")
    site = str(work / "venv")
    if not str(probe.get("attnbook_file", "")).startswith(site):
        problems.append(f"attnbook was imported from {probe.get('attnbook_file')}, not from the install in {site}")
    if not result.get("setup_installed"):
        problems.append("the setup cell did not run its %pip install branch")
    if not result.get("widget_images"):
        problems.append("no explore(...) widget displayed an image (checked the Output widget state)")
    if problems:
        raise AssertionError(f"{edition.name}: " + "; ".join(problems))
    say(f"{edition.name}: every cell ran in {seconds:.0f} s; {result['widget_images']} widget image(s); "
        f"versions unchanged {after}")
    return report


# ------------------------------------------------------------------------------ inside the runtime

def _execute(edition: str, executed: str, cwd: str) -> None:
    """Runs with the simulated runtime's python: execute the notebook with nbclient."""
    import nbclient
    import nbformat

    nb = nbformat.read(edition, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE_CELL))
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=900,
                                     resources={"metadata": {"path": cwd}}, record_timing=False)
    client.execute()
    nbformat.write(nb, executed)
    probe, setup_installed = None, False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        if "google.colab" in cell.source and "%pip install" in cell.source:
            setup_installed = "attnbook" in cell.source and not any(
                o.get("output_type") == "error" for o in cell.outputs)
        for line in text.splitlines():
            if line.startswith("COLAB-SIM "):
                probe = json.loads(line[len("COLAB-SIM "):])
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    images = 0
    for model in state.values():
        for output in model.get("state", {}).get("outputs", []) or []:
            if "image/png" in output.get("data", {}):
                images += 1
    print(json.dumps({"probe": probe, "setup_installed": setup_installed, "widget_images": images}))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--execute"]:
        _execute(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(description="Run colab/*.ipynb in a simulated Colab runtime.")
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: every colab/*.ipynb)")
    args = parser.parse_args(argv)
    chapters = args.chapters or [p.name[:2] for p in sorted((_root() / "colab").glob("*.ipynb"))]
    failures = []
    for chapter in chapters:
        try:
            run_chapter(chapter)
        except AssertionError as exc:
            failures.append(str(exc))
            say(f"FAILED: {exc}")
    say(f"{len(chapters) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
