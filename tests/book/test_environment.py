"""The local-Jupyter reader's environment: installable on Linux, macOS and Windows, honest about
its downloads, output-free commits, and JupyterLab that renders the chapters' MyST.

- requirements.txt: triton only on Linux; every pin has a wheel on macOS arm64 and Windows
  (tools/platform_check.py, a pip dry run per platform; skips only when no index is reachable);
  the tests that use triton skip cleanly where it is absent.
- make.py: pip runs without -q (progress), the download is announced, and a CPU-only torch index
  can be passed (ATTNBOOK_TORCH_INDEX / --torch-index) without the repository naming a host.
- git: the nbstripout clean filter that `make.py env` defines strips outputs on `git add` and
  leaves the committed chapters byte for byte as they are.
- JupyterLab (browser marker): with jupyterlab_myst, a chapter shows admonitions, citations and
  equations rendered, not as raw MyST.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CHROMIUM = Path("/usr/bin/chromium")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make = _load("attnbook_make", ROOT / "make.py")
import _tools  # noqa: E402,F401  (the repository root on sys.path)
from tools import platform_check  # noqa: E402

HAS_NBSTRIPOUT = importlib.util.find_spec("nbstripout") is not None


def _pins() -> dict[str, Requirement]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    return pins


# ------------------------------------------------------------------------------ requirements

def test_triton_is_pinned_for_linux_only():
    triton = _pins()["triton"]
    assert triton.marker is not None, "triton has no macOS/Windows wheels: give it `; sys_platform == \"linux\"`"
    for target in ("macosx_14_0_arm64:3.12", "win_amd64:3.12"):
        env = platform_check.Target.parse(target).marker_environment()
        assert not triton.marker.evaluate(env), target
    assert triton.marker.evaluate(platform_check.Target.parse("manylinux_2_28_x86_64:3.12").marker_environment())


def test_reader_tools_are_pinned():
    pins = _pins()
    for name in ("jupyterlab", "jupyterlab-myst", "nbstripout", "jupyter-book", "torch"):
        assert name in pins and str(pins[name].specifier).startswith("=="), f"{name} must be pinned"


@pytest.mark.network
def test_every_pin_has_a_wheel_on_macos_and_windows():
    """A pip dry run per (platform, Python): every pin that applies there has a wheel."""
    results = platform_check.check_all()
    if all(r.network_error for r in results):
        pytest.skip("no package index reachable for the cross-platform dry run")
    failed = [f"{r.target}:\n" + "\n".join(l for l in r.output.splitlines() if "ERROR" in l)[-1500:]
              for r in results if not r.ok]
    assert not failed, "requirements.txt does not install there:\n" + "\n".join(failed)


def test_pins_for_evaluates_markers_for_the_target(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# c\nnumpy==2.0.2\ntriton==3.9.0 ; sys_platform == \"linux\"\njieba==0.42.1\n"
                   "pywin32==306 ; sys_platform == \"win32\"\n", encoding="utf-8")
    mac, skipped = platform_check.pins_for(platform_check.Target.parse("macosx_14_0_arm64:3.12"), req)
    assert mac == ["numpy==2.0.2"] and skipped == ["triton", "pywin32"]
    win, _ = platform_check.pins_for(platform_check.Target.parse("win_amd64:3.11.9"), req)
    assert win == ["numpy==2.0.2", "pywin32==306"]


def test_tests_skip_cleanly_without_triton():
    """Every triton test skips (none errors) when `import triton` fails, as on macOS/Windows."""
    files = [str(p) for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if "triton" in p.read_text(encoding="utf-8") and p.name != Path(__file__).name]
    code = ("import sys; sys.modules['triton'] = None\n"          # import triton -> ImportError
            "import pytest\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'triton or Triton',"
            " '-m', 'not book and not browser', *sys.argv[1:]]))")
    proc = subprocess.run([sys.executable, "-c", code, *files], cwd=ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"tests fail without triton:\n{tail}"
    assert "skipped" in tail, tail


# ------------------------------------------------------------------------------ make.py

def test_make_py_shows_progress_and_takes_a_cpu_torch_index(monkeypatch):
    index = "https://packages.example.invalid/whl/cpu"
    commands = make.install_commands(index)
    flat = [[str(c) for c in cmd] for cmd in commands]
    assert not any("-q" in cmd or "--quiet" in cmd for cmd in flat), "pip must show its progress"
    first = flat[0]
    assert "--index-url" in first and first[first.index("--index-url") + 1] == index
    assert make.pinned("torch") in first and "--no-deps" in first
    assert any("requirements.txt" in cmd for cmd in flat[1])
    assert make.install_commands(None)[0][-2:] == ["-r", "requirements.txt"]
    assert make.torch_index(["make.py", "book", "--torch-index", index]) == index
    assert make.torch_index(["make.py", "book", f"--torch-index={index}"]) == index
    monkeypatch.setenv("ATTNBOOK_TORCH_INDEX", index)
    assert make.torch_index(["make.py", "book"]) == index
    notice = make.download_notice(None, "linux")
    assert "CUDA" in notice and "ATTNBOOK_TORCH_INDEX" in notice and "GB" in notice
    assert index in make.download_notice(index, "linux")


def test_no_file_names_a_torch_index_host():
    for path in (ROOT / "make.py", ROOT / "README.md", ROOT / "requirements.txt"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://[^\s)]*(whl|pytorch)[^\s)]*", text), f"{path.name} names a package host"


# ------------------------------------------------------------------------------ git output filter

def test_gitattributes_route_notebooks_through_nbstripout():
    lines = (ROOT / ".gitattributes").read_text(encoding="utf-8").splitlines()
    assert "*.ipynb filter=nbstripout" in lines


@pytest.mark.skipif(not HAS_NBSTRIPOUT, reason="nbstripout is not installed (python3 make.py env installs it)")
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_add_strips_outputs_and_keeps_cell_ids(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(ROOT / ".gitattributes", tmp_path / ".gitattributes")
    assert make.configure_git_filter(tmp_path, Path(sys.executable))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell("print(1)", id="keep-me")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    cell.execution_count = 3
    nb.cells = [nbformat.v4.new_markdown_cell("# t", id="title"), cell]
    nbformat.write(nb, tmp_path / "ch.ipynb")
    subprocess.run(["git", "-C", str(tmp_path), "add", "ch.ipynb"], check=True)
    staged = subprocess.run(["git", "-C", str(tmp_path), "show", ":ch.ipynb"], check=True,
                            capture_output=True, text=True).stdout
    clean = nbformat.reads(staged, as_version=4)
    assert clean.cells[1].outputs == [] and clean.cells[1].execution_count is None
    assert [c.id for c in clean.cells] == ["title", "keep-me"]
    assert nbformat.read(tmp_path / "ch.ipynb", as_version=4).cells[1].outputs, "the working copy keeps its outputs"


@pytest.mark.skipif(not HAS_NBSTRIPOUT, reason="nbstripout is not installed (python3 make.py env installs it)")
def test_the_filter_leaves_committed_chapters_unchanged(tmp_path):
    """Installing the filter must not make every chapter show up as modified."""
    copies = []
    for path in CHAPTERS:
        copies.append(tmp_path / path.name)
        shutil.copy(path, copies[-1])
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-id", *map(str, copies)], check=True)
    changed = [c.name for c, path in zip(copies, CHAPTERS) if c.read_bytes() != path.read_bytes()]
    assert not changed, f"nbstripout would rewrite {changed} (outputs, metadata or formatting)"


# ------------------------------------------------------------------------------ JupyterLab + MyST

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAB_PROBE = """async () => {
  const deadline = Date.now() + 60000;
  let md = [];
  while (Date.now() < deadline) {
    // jupyterlab_myst renders a Markdown cell into div.myst (JupyterLab's own: .jp-RenderedMarkdown)
    md = [...document.querySelectorAll('.jp-MarkdownCell .myst, .jp-MarkdownCell .jp-RenderedMarkdown')];
    if (md.length > 5 && document.querySelector('.jp-MarkdownCell aside, .jp-MarkdownCell .admonition')) break;
    await new Promise(r => setTimeout(r, 500));
  }
  const text = md.map(e => e.innerText).join('\\n');
  return {
    cells: md.length,
    myst: document.querySelectorAll('.jp-MarkdownCell .myst').length,
    admonitions: document.querySelectorAll('.jp-MarkdownCell aside, .jp-MarkdownCell .admonition').length,
    math: document.querySelectorAll('.jp-MarkdownCell mjx-container, .jp-MarkdownCell .MathJax, .jp-MarkdownCell .katex').length,
    raw: (text.match(/:::\\{|\\{cite(:t)?\\}`|\\{ref\\}`|\\{eq\\}`|^\\([a-z0-9-]+\\)=$/gm) || []).slice(0, 10),
  };
}"""


@pytest.mark.browser
def test_jupyterlab_renders_the_chapters_myst(tmp_path):
    if importlib.util.find_spec("jupyterlab_myst") is None:
        pytest.skip("jupyterlab_myst is not installed (python3 make.py env installs it)")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} not found: `apt-get install chromium` (Debian)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chapter = CHAPTERS[0]
    port, token = _free_port(), "attnbook-test"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={chapter.parent}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start in 60 s")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                        args=["--no-sandbox", "--headless", "--disable-gpu",
                                              "--disable-background-networking", "--disable-component-update"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 2000})
                page.route("**/*", lambda r: r.continue_() if "127.0.0.1" in r.request.url else r.abort())
                page.goto(f"{url}/lab/tree/{chapter.name}?token={token}", wait_until="load")
                result = page.evaluate(LAB_PROBE)
                shots = Path(os.environ.get("ATTNBOOK_SCREENSHOTS", ROOT / "_build" / "screenshots")) / "jupyterlab"
                shots.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(shots / (chapter.stem + ".png")))
            finally:
                browser.close()
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()
    print(json.dumps(result, ensure_ascii=False))
    assert result["cells"] > 5, f"no rendered Markdown cells in JupyterLab: {result}"
    assert result["myst"] > 5, f"Markdown cells are not rendered by jupyterlab_myst: {result}"
    assert result["math"] > 0, f"no typeset equations: {result}"
    assert result["admonitions"] > 0, f"no admonition rendered (is jupyterlab_myst enabled?): {result}"
    assert not result["raw"], f"raw MyST shown in JupyterLab: {result['raw']}"
