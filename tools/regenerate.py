"""Regenerate every file derived from the chapters, in order (`python3 make.py colab` runs it):

1. tools/colab.py: each chapter's Colab badge and setup cell (from _config.yml);
2. tools/glossary.py: the link from each chapter's first use of each glossary term;
3. tools/colab_edition.py: the Colab edition colab/*.ipynb (from the chapters as 1-2 left them).

Usage:
    python -m tools.regenerate            # rewrite what is out of date
    python -m tools.regenerate --check    # write nothing; exit 1 if anything is out of date
"""

from __future__ import annotations

import argparse
import sys

from tools import colab, colab_edition, glossary

STEPS = (("colab", colab.main), ("glossary", glossary.main), ("colab_edition", colab_edition.main))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate badges/setup cells, glossary links and colab/.")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if anything is out of date")
    args = parser.parse_args(argv)
    failed = []
    for name, step in STEPS:
        print(f"--- tools/{name}.py", flush=True)
        if step(["--check"] if args.check else []) != 0:
            failed.append(name)
    if failed:
        print(f"out of date: {', '.join(failed)} (run `python3 make.py colab`)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
