"""Hygiene of the book's sources: chapter notebooks, _toc.yml, _config.yml and the Colab header.

Chapters are stored without outputs, start with a title + Colab badge and a setup cell derived
from _config.yml (tools/colab.py), and contain what DESIGN.md asks of every chapter (asserts,
show_source in a remove-input cell, an explore() widget, a 练习 section).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


from tools import book_assets, colab  # noqa: E402  (pyproject's pythonpath has the root)


def _toc_files(node) -> list[str]:
    """Every `file:` entry (and the root) of a jb-book _toc.yml, in order."""
    found = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if key in node:
                found.append(node[key])
        for value in node.values():
            if isinstance(value, (list, dict)):
                found += _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            found += _toc_files(item)
    return found


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.fixture(scope="module")
def toc():
    return yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------- _toc.yml

def test_toc_format_and_parts(toc):
    assert toc["format"] == "jb-book"
    assert toc["root"] == "index"
    captions = [part["caption"] for part in toc["parts"]]
    assert captions[-1] == "附录", captions
    # Toctree numbering stays off: Sphinx would number chapters by position ("1." for chapter 04
    # while 01-03 are unwritten); each chapter carries its number in its title ("第 4 章 ...").
    for part in toc["parts"]:
        assert not part.get("numbered"), f"part {part['caption']!r} must not set numbered (see _toc.yml)"


def test_chapter_titles_carry_the_file_number():
    for nb_path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        first = nb.cells[0].source.splitlines()[0]
        number = int(nb_path.name[:2])
        assert re.match(rf"# 第 {number} 章 ", first), f"{nb_path.name}: title {first!r} must start with '# 第 {number} 章 '"


def test_every_toc_entry_exists(toc):
    for entry in _toc_files(toc):
        candidates = [ROOT / f"{entry}{ext}" for ext in (".md", ".ipynb")]
        existing = [p for p in candidates if p.is_file()]
        assert len(existing) == 1, f"_toc.yml lists {entry!r}; expected exactly one of {candidates}, found {existing}"


def test_every_notebook_is_in_toc(toc):
    listed = set(_toc_files(toc))
    for path in NOTEBOOKS:
        assert _rel(path)[: -len(".ipynb")] in listed, f"{_rel(path)} is not listed in _toc.yml"


def test_file_names_are_ascii():
    pages = NOTEBOOKS + sorted((ROOT / "appendix").glob("*"))
    for path in pages:
        assert path.name.isascii(), f"non-ASCII file name {path.name!r} (becomes a URL and a Colab path)"
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), f"chapter file {path.name!r} is not NN_slug.ipynb"


# ------------------------------------------------------------------------------------- _config.yml

def test_config_build_settings(config):
    execute = config["execute"]
    assert execute["execute_notebooks"] == "cache"
    assert execute["raise_on_error"] is True
    assert execute["allow_errors"] is False
    assert execute["stderr_output"] == "warn"       # with -W, stray stderr fails the build
    assert config["only_build_toc_files"] is True
    sphinx = config["sphinx"]
    assert sphinx["recursive_update"] is True       # keeps the launch/repository theme options
    assert sphinx["config"]["language"] == "zh_CN"
    assert config["bibtex_bibfiles"] == ["references.bib"]
    for folder in (".venv", "lib", "tests", "tools", "_build", "README.md"):
        assert folder in config["exclude_patterns"], folder


def test_mathjax_path_is_the_local_copy(config):
    path = config["sphinx"]["config"]["mathjax_path"]
    assert "://" not in path and not path.startswith("/"), f"mathjax_path {path!r} must be local (under _static)"
    assert path == f"mathjax/{book_assets.MATHJAX_ENTRY}"


def test_install_mathjax_copies_entry_and_fonts(tmp_path):
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    entry = book_assets.install_mathjax(tmp_path)
    assert entry == tmp_path / "_static" / "mathjax" / "tex-chtml.js"
    assert entry.stat().st_size > 100_000
    fonts = sorted((entry.parent / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) >= 20, fonts
    assert 'VERSION="3.' in entry.read_text(encoding="utf-8", errors="replace")
    assert book_assets.install_mathjax(tmp_path) == entry          # second call: up to date, no error


def test_install_mathjax_rejects_a_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="_config.yml"):
        book_assets.install_mathjax(tmp_path)


SHARED_BIB_KEYS = """
    vaswani2017attention bahdanau2015neural luong2015effective dao2022flashattention dao2023flashattention2
    milakov2018online rabe2021self katharopoulos2020transformers child2019generating beltagy2020longformer
    zaheer2020bigbird pascanu2013difficulty glorot2010understanding bhojanapalli2020low xiong2020layer ba2016layer
    press2022train su2021roformer britz2017massive cho2014learning sutskever2014sequence he2016identity
    shazeer2019fast ainslie2023gqa kaplan2020scaling golden2024flash
""".split()


def _cited_keys(text: str) -> set[str]:
    keys = set()
    for group in re.findall(r"\{cite(?::[a-z]+)?\}`([^`]+)`", text):
        keys |= {k.strip() for k in group.split(",") if k.strip()}
    return keys


def test_bibliography_parses_and_holds_every_cited_key():
    pybtex_database = pytest.importorskip("pybtex.database")
    entries = pybtex_database.parse_file(str(ROOT / "references.bib")).entries
    missing_shared = [k for k in SHARED_BIB_KEYS if k not in entries]
    assert not missing_shared, f"references.bib lacks shared keys {missing_shared}"
    for key, entry in entries.items():
        assert "title" in entry.fields and "year" in entry.fields and entry.persons.get("author"), key
    sources = [(p, p.read_text(encoding="utf-8")) for p in sorted(ROOT.glob("*.md")) + sorted((ROOT / "appendix").glob("*.md"))]
    sources += [(p, "\n".join(_source(c) for c in nbformat.read(p, as_version=4).cells)) for p in NOTEBOOKS]
    for path, text in sources:
        unknown = sorted(_cited_keys(text) - set(entries))
        assert not unknown, f"{_rel(path)} cites keys missing from references.bib: {unknown}"


# ------------------------------------------------------------------------------------- Colab header

def test_url_in_config_is_the_single_source(tmp_path):
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    repo = colab.repository(ROOT / "_config.yml")
    assert text.count(repo.url) == 1, "repository.url must appear exactly once in _config.yml"
    forked = tmp_path / "_config.yml"
    forked.write_text(
        text.replace(repo.url, "https://github.com/someone/attn-fork")
            .replace(f"branch: {repo.branch}", "branch: v2-draft"),
        encoding="utf-8",
    )
    rel = "chapters/04_attention_qkv.ipynb"
    assert colab.badge_markdown(rel, config_path=forked) == (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/someone/attn-fork/blob/v2-draft/colab/04_attention_qkv.ipynb)"
    )
    setup = colab.setup_cell_source(config_path=forked)
    assert '"attnbook @ git+https://github.com/someone/attn-fork@v2-draft"' in setup
    assert repo.url not in setup and repo.url not in colab.badge_markdown(rel, config_path=forked)
    assert setup != colab.setup_cell_source()


def test_setup_cell_lines_fit_the_text_column():
    lines = colab.setup_cell_source().split("\n")
    too_long = [line for line in lines if len(line) > colab.MAX_LINE]
    assert not too_long, f"setup cell lines longer than {colab.MAX_LINE} characters (CHAPTER.md 14): {too_long}"


def test_chapter_badge_opens_the_colab_edition():
    badge = colab.badge_markdown("chapters/04_attention_qkv.ipynb")
    assert badge.endswith("/colab/04_attention_qkv.ipynb)"), badge
    assert colab.colab_target("appendix/x.ipynb") == "appendix/x.ipynb"


def test_sync_rewrites_only_the_header(tmp_path):
    (tmp_path / "chapters").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 第 9 章 标题\n\n[![Open In Colab](old.svg)](https://example.org/old)\n\n正文。"),
        nbformat.v4.new_code_cell('import sys\nif "google.colab" in sys.modules:\n    %pip install old'),
        nbformat.v4.new_code_cell("x = 1\nassert x == 1"),
    ]
    path = tmp_path / "chapters" / "09_demo.ipynb"
    nbformat.write(nb, path)
    assert colab.sync(check_only=True, root=tmp_path) == [path]
    assert nbformat.read(path, as_version=4) == nb                # check_only writes nothing
    assert colab.sync(root=tmp_path) == [path]
    new = nbformat.read(path, as_version=4)
    badge = colab.badge_markdown("chapters/09_demo.ipynb", config_path=tmp_path / "_config.yml")
    assert _source(new.cells[0]) == f"# 第 9 章 标题\n\n{badge}\n\n正文。"
    assert _source(new.cells[1]) == colab.setup_cell_source(config_path=tmp_path / "_config.yml")
    assert new.cells[2] == nb.cells[2] and len(new.cells) == 3
    assert [c["id"] for c in new.cells] == [c["id"] for c in nb.cells]
    assert colab.sync(check_only=True, root=tmp_path) == []


def test_sync_inserts_a_missing_badge_and_setup_cell(tmp_path):
    (tmp_path / "chapters").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 标题\n正文。"), nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, tmp_path / "chapters" / "01_demo.ipynb")
    colab.sync(root=tmp_path)
    new = nbformat.read(tmp_path / "chapters" / "01_demo.ipynb", as_version=4)
    badge = colab.badge_markdown("chapters/01_demo.ipynb", config_path=tmp_path / "_config.yml")
    assert _source(new.cells[0]) == f"# 标题\n\n{badge}\n\n正文。"
    assert _source(new.cells[1]) == colab.setup_cell_source(config_path=tmp_path / "_config.yml")
    assert new.cells[1].metadata["tags"] == [colab.SETUP_TAG]     # hidden in the HTML book
    assert "tags" not in new.cells[2].metadata                       # no other cell is touched
    assert _source(new.cells[2]) == "x = 1"


@pytest.mark.parametrize("url", ["https://gitlab.com/a/b", "github.com/a/b", "https://github.com/a", ""])
def test_repository_rejects_non_github_urls(tmp_path, url):
    cfg = tmp_path / "_config.yml"
    cfg.write_text(yaml.safe_dump({"repository": {"url": url, "branch": "main"}}), encoding="utf-8")
    with pytest.raises(ValueError, match="repository.url"):
        colab.repository(cfg)


def test_colab_url_rejects_bad_paths():
    for bad in ("/abs/chapters/x.ipynb", "../x.ipynb", "chapters/x.md"):
        with pytest.raises(ValueError, match="nb_relpath"):
            colab.colab_url(bad)


# ------------------------------------------------------------------------------------- notebooks

notebook_params = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])


def staged_text(paths: list[Path], root: Path = ROOT) -> dict[Path, str]:
    """What `git add` would store for each path: the file after git's clean filters.

    A reader who runs a chapter and saves it changes the working copy; with the nbstripout
    filter that `make.py env` installs, git still commits it without outputs. This stages the
    files into a throwaway index (the real index is untouched) and reads the blobs back. Outside
    a git checkout (or without git) it returns the files as they are.
    """
    if not (root / ".git").exists() or shutil.which("git") is None:
        return {p: p.read_text(encoding="utf-8") for p in paths}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"))
        rels = [p.relative_to(root).as_posix() for p in paths]
        subprocess.run(["git", "-C", str(root), "add", "--force", "--", *rels], check=True, env=env,
                       capture_output=True)
        listing = subprocess.run(["git", "-C", str(root), "ls-files", "-s", "--", *rels], check=True, env=env,
                                 capture_output=True, text=True).stdout
    blobs = {line.split("\t", 1)[1]: line.split()[1] for line in listing.splitlines()}
    return {p: subprocess.run(["git", "-C", str(root), "cat-file", "blob", blobs[p.relative_to(root).as_posix()]],
                              check=True, capture_output=True).stdout.decode("utf-8") for p in paths}


@pytest.fixture(scope="module")
def committable():
    return staged_text(NOTEBOOKS)


@notebook_params
def test_notebook_is_valid_and_clean(path, committable):
    """Checks the notebook as git would commit it (after the nbstripout filter, if installed)."""
    nb = nbformat.reads(committable[path], as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec must be python3"
    assert "widgets" not in nb.metadata, f"{path.name}: strip metadata.widgets (saved widget state)"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i}: stored with outputs"
            assert cell.execution_count is None, f"{path.name} cell {i}: stored with an execution count"


@notebook_params
def test_notebook_header_matches_config(path):
    nb = nbformat.read(path, as_version=4)
    rel = _rel(path)
    first = _source(nb.cells[0])
    assert nb.cells[0].cell_type == "markdown" and first.startswith("# "), f"{rel}: cell 0 must start with '# title'"
    assert colab.badge_markdown(rel) in first.split("\n"), f"{rel}: badge missing or stale; run python tools/colab.py"
    assert nb.cells[1].cell_type == "code", f"{rel}: cell 1 must be the setup cell"
    assert _source(nb.cells[1]) == colab.setup_cell_source(), f"{rel}: setup cell stale; run python tools/colab.py"
    assert colab.SETUP_TAG in nb.cells[1].metadata.get("tags", []), \
        f"{rel}: the setup cell must be hidden in the HTML book; run python3 make.py colab"


@notebook_params
def test_notebook_has_the_required_elements(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    markdown = [_source(c) for c in nb.cells if c.cell_type == "markdown"]
    assert any(re.search(r"^\s*assert\b", _source(c), re.M) for c in code), f"{path.name}: no assert"
    assert any(
        "show_source(" in _source(c) and "remove-input" in c.metadata.get("tags", []) for c in code
    ), f"{path.name}: needs a show_source(...) call in a cell tagged remove-input"
    assert any(re.search(r"\bexplore\(", _source(c)) for c in code), f"{path.name}: needs an explore(...) widget"
    assert any(re.search(r"^#{1,6}\s.*练习", m, re.M) for m in markdown), f"{path.name}: needs a 练习 section"


@notebook_params
def test_equation_references_are_not_preceded_by_the_word_shi(path):
    """`{eq}` renders as "式 (4.3)" (math_eqref_format), so "式 {eq}`…`" would read "式 式 (4.3)"."""
    nb = nbformat.read(path, as_version=4)
    doubled = [m.group(0) for c in nb.cells if c.cell_type == "markdown"
               for m in re.finditer(r".{0,12}式\s*\{eq\}`[^`]*`", _source(c))]
    assert not doubled, f"{path.name}: drop the word 式 before {{eq}}: {doubled}"


def test_chapter_09_quotes_benchmarks_results_verbatim():
    """Chapter 09 shows benchmarks/RESULTS.md's CPU tables in a dropdown (Colab has no repository
    checkout to read them from); the two copies must not drift apart."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    tables = results[results.index("## Forward"):]
    nb = nbformat.read(ROOT / "chapters" / "09_efficient_attention.ipynb", as_version=4)
    box = next(_source(c) for c in nb.cells if c.cell_type == "markdown" and "**Forward**" in _source(c))

    def lines(text):
        return [ln.strip() for ln in text.split("\n")
                if ln.startswith(("|", "Date:", "Command:", "Machine:", "Time", "Skipped", "Peak"))]

    assert lines(tables) and lines(box[box.index("**Forward**"):]) == lines(tables), \
        "chapter 09's copy of benchmarks/RESULTS.md differs; paste the new tables into its dropdown"


@notebook_params
def test_code_lines_fit_the_text_column(path):
    """CHAPTER.md point 14: code lines <= colab.MAX_LINE (88) characters, or they scroll sideways.

    Measured in the built book (_static/custom.css): a code cell shows 91 monospace characters at
    1280 px (89 inside a folded cell) and 104 at 1920 px; tests/book/test_book_html.py checks that
    the column still shows at least MAX_LINE and that no cell scrolls sideways.
    """
    nb = nbformat.read(path, as_version=4)
    too_long = [(i, line) for i, c in enumerate(nb.cells) if c.cell_type == "code"
                for line in _source(c).split("\n") if len(line) > colab.MAX_LINE]
    assert not too_long, f"{path.name}: code lines over {colab.MAX_LINE} characters: {too_long}"


@notebook_params
def test_chapters_use_the_one_float64_tolerance(path):
    """Issue 16: one float64 tolerance (attnbook.testing.F64_TOL) for tests, chapters and the
    self-check; a chapter that writes its own `dict(rtol=..., atol=...)` would drift from it."""
    nb = nbformat.read(path, as_version=4)
    own = [m.group(0) for c in nb.cells if c.cell_type == "code"
           for m in re.finditer(r"^\s*\w*TOL\w*\s*=\s*dict\(.*$", _source(c), re.M)]
    assert not own, f"{path.name}: import attnbook.testing.F64_TOL instead of {own}"
