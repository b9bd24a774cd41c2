"""Colab badge and setup cell of every chapter notebook, derived from _config.yml.

The repository URL and branch live in one place, `_config.yml`'s `repository.url` and
`repository.branch`. Every chapter notebook starts with

    cell 0 (markdown): "# <title>", a blank line, then the badge line, which opens the
        chapter's Colab edition (colab/NN_slug.ipynb, plain Markdown: tools/colab_edition.py)
        [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/ORG/REPO/blob/BRANCH/colab/NN_slug.ipynb)
    cell 1 (code): `setup_cell_source()`: on Colab it pip-installs attnbook from the
        repository at BRANCH; anywhere else it does nothing. Every line is <= 88 characters.

`sync()` rewrites those two pieces in place (leaving every other cell, the metadata and the
cell ids alone) and `sync(check_only=True)` reports notebooks that are out of date.

Usage:
    python -m tools.colab            # rewrite badge + setup cell of chapters/*.ipynb
    python -m tools.colab --check    # exit 1 and list the notebooks that differ
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml

from tools import ROOT
from tools.book_index import cell_source

CONFIG = ROOT / "_config.yml"
PACKAGE = "attnbook"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_PREFIX = "[![Open In Colab]("
SETUP_MARKER = "google.colab"            # a code cell 1 containing this is the setup cell
EDITION_DIR = "colab"                    # the Colab edition of chapters/NN_slug.ipynb
MAX_LINE = 88                            # CHAPTER.md point 14: code lines <= 88 characters
_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Repository:
    """The GitHub repository the book is published from (from _config.yml)."""

    org: str
    name: str
    branch: str

    @property
    def url(self) -> str:
        return f"https://github.com/{self.org}/{self.name}"


def repository(config_path: str | Path = CONFIG) -> Repository:
    """Read `repository.url` and `repository.branch` from a Jupyter Book _config.yml.

    Raises:
        ValueError: the keys are missing, or the URL is not https://github.com/ORG/REPO.
    """
    config = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
    repo = config.get("repository") or {}
    url, branch = repo.get("url"), repo.get("branch")
    if not isinstance(url, str):
        raise ValueError(f"{config_path}: repository.url must be set, got {url!r}")
    match = _GITHUB.match(url.strip())
    if match is None:
        raise ValueError(f"{config_path}: repository.url must look like https://github.com/ORG/REPO, got {url!r}")
    if not isinstance(branch, str) or not re.fullmatch(r"[A-Za-z0-9_.\-/]+", branch):
        raise ValueError(f"{config_path}: repository.branch must be a branch name, got {branch!r}")
    return Repository(org=match.group(1), name=match.group(2), branch=branch)


def colab_url(nb_relpath: str | Path, *, config_path: str | Path = CONFIG) -> str:
    """URL that opens the notebook `nb_relpath` (relative to the repository root) in Colab."""
    rel = Path(nb_relpath).as_posix()
    if Path(nb_relpath).is_absolute() or rel.startswith("../") or not rel.endswith(".ipynb"):
        raise ValueError(f"nb_relpath must be a relative path to an .ipynb file, got {str(nb_relpath)!r}")
    repo = repository(config_path)
    return f"https://colab.research.google.com/github/{repo.org}/{repo.name}/blob/{repo.branch}/{rel}"


def colab_target(nb_relpath: str | Path) -> str:
    """The notebook Colab should open for `nb_relpath`: a chapter's Colab edition.

    chapters/NN_slug.ipynb -> colab/NN_slug.ipynb (MyST turned into plain Markdown, see
    tools/colab_edition.py); any other path is returned unchanged.
    """
    rel = Path(nb_relpath).as_posix()
    if rel.startswith("chapters/") and rel.count("/") == 1:
        return f"{EDITION_DIR}/{rel.split('/', 1)[1]}"
    return rel


def badge_markdown(nb_relpath: str | Path, *, config_path: str | Path = CONFIG) -> str:
    """The one-line "Open In Colab" badge of a notebook, e.g. of chapters/04_attention_qkv.ipynb.

    A chapter's badge opens its Colab edition (colab/04_attention_qkv.ipynb), which Colab renders
    without raw MyST markup.
    """
    return f"{BADGE_PREFIX}{BADGE_IMAGE})]({colab_url(colab_target(nb_relpath), config_path=config_path)})"


SETUP_TAG = "remove-cell"   # hidden in the HTML book only


def install_requirement(*, config_path: str | Path = CONFIG) -> str:
    """The pip requirement that installs the companion library from the repository."""
    repo = repository(config_path)
    return f"{PACKAGE} @ git+{repo.url}@{repo.branch}"


def setup_cell_source(*, config_path: str | Path = CONFIG) -> str:
    """Source of every chapter's first code cell: install attnbook on Colab, do nothing elsewhere."""
    return (
        "# On Google Colab, install the book's companion library; elsewhere this does nothing.\n"
        "# The import right after the install makes a failed install stop here, loudly, instead\n"
        "# of letting later cells fail one by one. pip's note that you 'may need to restart'\n"
        "# does not apply: attnbook is new to this runtime, and torch, numpy and matplotlib\n"
        "# stay as Colab ships them.\n"
        "import sys\n"
        "\n"
        f'if "{SETUP_MARKER}" in sys.modules:\n'
        f'    %pip install -q "{install_requirement(config_path=config_path)}"\n'
        "    import attnbook  # noqa: F401  (fails here if the install failed)"
    )


def expected_header(nb, nb_relpath: str, *, config_path: str | Path = CONFIG):
    """Return a copy of `nb` whose badge line and setup cell are the expected ones.

    Cell 0 must be a markdown cell that starts with a "# " title line; its badge line (any line
    starting with "[![Open In Colab](") is replaced, or inserted after the title if absent.
    Cell 1 is replaced if it is a code cell mentioning google.colab, else a setup cell is inserted.
    """
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    cells = nb.cells
    if not cells or cells[0].cell_type != "markdown" or not cell_source(cells[0]).lstrip().startswith("# "):
        raise ValueError(f"{nb_relpath}: cell 0 must be a markdown cell starting with a '# ' title")
    badge = badge_markdown(nb_relpath, config_path=config_path)
    lines = cell_source(cells[0]).split("\n")
    badge_rows = [i for i, line in enumerate(lines) if line.strip().startswith(BADGE_PREFIX)]
    if badge_rows:
        lines[badge_rows[0]] = badge
        for i in reversed(badge_rows[1:]):
            del lines[i]
    else:
        title = next(i for i, line in enumerate(lines) if line.strip())
        lines[title + 1:title + 1] = ["", badge]
        after = title + 3                                # first line after the badge
        if after < len(lines) and lines[after].strip():
            lines.insert(after, "")                      # keep a blank line before the prose
    cells[0].source = "\n".join(lines)

    setup = setup_cell_source(config_path=config_path)
    if len(cells) > 1 and cells[1].cell_type == "code" and SETUP_MARKER in cell_source(cells[1]):
        cells[1].source = setup
    else:
        cells.insert(1, nbformat.v4.new_code_cell(setup))
    # The HTML book does not show the install cell (it does nothing outside Colab, and the badge
    # is right above it); the notebook and the Colab edition keep it, and nbval still runs it.
    tags = cells[1].metadata.setdefault("tags", [])
    if SETUP_TAG not in tags:
        tags.append(SETUP_TAG)
    return nb


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def sync(check_only: bool = False, *, root: str | Path = ROOT,
         config_path: str | Path | None = None) -> list[Path]:
    """Make the badge and setup cell of every root/chapters/*.ipynb match _config.yml.

    Args:
        check_only: only report, do not write.
        root: the book root (holds chapters/ and, by default, _config.yml).
        config_path: the _config.yml to read (default root/_config.yml).

    Returns:
        The notebooks that were (or, with check_only, would be) changed.
    """
    root = Path(root)
    config_path = Path(config_path) if config_path is not None else root / "_config.yml"
    changed = []
    for path in sorted((root / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        new = expected_header(nb, path.relative_to(root).as_posix(), config_path=config_path)
        if _same(nb, new):
            continue
        changed.append(path)
        if not check_only:
            nbformat.write(new, path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sync the Colab badge and setup cell of chapters/*.ipynb with _config.yml.")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if any notebook differs")
    args = parser.parse_args(argv)
    changed = sync(check_only=args.check)
    repo = repository()
    verb = "out of date" if args.check else "rewritten"
    for path in changed:
        print(f"{verb}: {path.relative_to(ROOT)}")
    print(f"{len(changed)} notebook(s) {verb}; repository {repo.url} branch {repo.branch}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
