"""Static assets the HTML book serves itself: a local copy of MathJax 3 (see _config.yml).

The book sets `mathjax_path: mathjax/tex-chtml.js`, which Sphinx resolves relative to
`_static/`. This module copies MathJax's `es5/` build from the installed PyPI package
`django-static-mathjax` (MathJax 3.2.2, a pinned build dependency) into `_static/mathjax/`
(gitignored), so the book typesets equations offline and from behind firewalls that block
CDNs. The call is cheap when the copy is already up to date.

The module is also a Sphinx extension (`_config.yml`: `sphinx.local_extensions:
{book_assets: tools}`), so a plain `jupyter-book build .` installs MathJax itself. The extension
also works around two quirks of Jupyter Book 1 / Sphinx 7.4:
- JB adds every `*.js` file under `_static/` to every page's <script> tags, which would load all
  ~70 MathJax components eagerly; only the entry script named by `mathjax_path` must be loaded
  (MathJax loads the rest on demand), so the others are dropped from `html_js_files`;
- Sphinx repeats inline scripts registered after builder init, so sphinx-thebe's
  `const THEBE_JS_URL` is declared twice and the page throws a SyntaxError; duplicates are
  removed from each page's script list.

Usage:
    python -m tools.book_assets [--book-root DIR] [--force]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

from tools import ROOT

MATHJAX_PACKAGE = "mathjax"            # import name of the PyPI distribution django-static-mathjax
MATHJAX_ENTRY = "tex-chtml.js"         # must equal the file name in _config.yml's mathjax_path
MATHJAX_MAJOR = "3"                    # Sphinx 7's mathjax3_config / startup API
# Folders MathJax loads at run time relative to the entry script: fonts (output/chtml/fonts),
# TeX extensions pulled in by \require and autoload (input/tex/extensions), the menu and the
# accessibility tools the menu can switch on (ui, a11y, sre), and adaptors.
MATHJAX_DIRS = ("a11y", "adaptors", "input", "output", "sre", "ui")
STAMP = ".attnbook-mathjax.json"


def mathjax_source() -> tuple[Path, str]:
    """Locate the installed MathJax es5 build and its version.

    Returns:
        (es5 folder, version string such as "3.2.2").

    Raises:
        FileNotFoundError: the package is missing or does not hold an es5 build.
        RuntimeError: the installed MathJax is not version 3.
    """
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "MathJax is not installed: `pip install django-static-mathjax==3.2.2.1` "
            "(it provides the import package 'mathjax' with MathJax's es5 build)")
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    root = pkg_dir / "static" / "mathjax"
    es5 = root / "es5"
    if not (es5 / MATHJAX_ENTRY).is_file():
        raise FileNotFoundError(f"no {MATHJAX_ENTRY} under {es5}; is django-static-mathjax intact?")
    version = json.loads((root / "package.json").read_text(encoding="utf-8"))["version"]
    if version.split(".")[0] != MATHJAX_MAJOR:
        raise RuntimeError(f"MathJax {version} found in {root}, but the book needs MathJax 3.x")
    return es5, version


def install_mathjax(book_root: str | Path = ROOT, *, force: bool = False) -> Path:
    """Copy MathJax's es5 build into `<book_root>/_static/mathjax/` unless it is already there.

    Args:
        book_root: folder that holds _config.yml.
        force: copy again even if the stamp says the copy is current.

    Returns:
        Path of the entry script `_static/mathjax/tex-chtml.js`.
    """
    book_root = Path(book_root)
    if not (book_root / "_config.yml").is_file():
        raise ValueError(f"book_root={str(book_root)!r} has no _config.yml")
    es5, version = mathjax_source()
    dest = book_root / "_static" / "mathjax"
    stamp = {"version": version, "source": str(es5), "entry": MATHJAX_ENTRY, "dirs": list(MATHJAX_DIRS)}
    stamp_file = dest / STAMP
    if not force and stamp_file.is_file() and (dest / MATHJAX_ENTRY).is_file():
        if json.loads(stamp_file.read_text(encoding="utf-8")) == stamp:
            return dest / MATHJAX_ENTRY

    staging = dest.with_name("mathjax.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy2(es5 / MATHJAX_ENTRY, staging / MATHJAX_ENTRY)
    for name in MATHJAX_DIRS:
        shutil.copytree(es5 / name, staging / name)
    licence = es5.parent / "LICENSE"          # Apache-2.0 asks redistributions to carry it
    if licence.is_file():
        shutil.copy2(licence, staging / "LICENSE")
    (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    check_mathjax_copy(staging)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest / MATHJAX_ENTRY


def check_mathjax_copy(folder: Path) -> None:
    """Raise FileNotFoundError if the copy lacks the entry script, the CHTML fonts or the TeX extensions."""
    needed = [
        folder / MATHJAX_ENTRY,
        folder / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Main-Regular.woff",
        folder / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Math-Italic.woff",
        folder / "input" / "tex" / "extensions" / "boldsymbol.js",
    ]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"incomplete MathJax copy, missing: {missing}")


def _asset_name(entry) -> str:
    """File name of an html_js_files entry (a string or a (name, attributes) pair)."""
    return entry[0] if isinstance(entry, (tuple, list)) else str(entry)


def _on_config_inited(app, config) -> None:
    install_mathjax(app.srcdir)
    config.html_js_files = [
        entry for entry in config.html_js_files if not _asset_name(entry).startswith("mathjax/")
    ]


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    """Remove repeated <script> entries from a page.

    Sphinx 7.4 re-adds inline scripts registered after builder init with filename '' instead of
    None, so sphinx-thebe's `const THEBE_JS_URL = ...` appears twice and the second copy throws
    "Identifier 'THEBE_JS_URL' has already been declared" in the browser.
    """
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, unique = set(), []
    for js in scripts:
        attributes = getattr(js, "attributes", {}) or {}
        key = (getattr(js, "filename", js) or "", getattr(js, "priority", 500),
               tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def setup(app) -> dict:
    """Sphinx extension entry point: install MathJax, keep its components out of <script> tags,
    and drop duplicated inline scripts."""
    app.connect("config-inited", _on_config_inited)
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy the book's static assets (MathJax 3) into _static/.")
    parser.add_argument("--book-root", default=str(ROOT), help="folder holding _config.yml")
    parser.add_argument("--force", action="store_true", help="copy even if the current copy is up to date")
    args = parser.parse_args(argv)
    entry = install_mathjax(args.book_root, force=args.force)
    _, version = mathjax_source()
    print(f"MathJax {version}: {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
