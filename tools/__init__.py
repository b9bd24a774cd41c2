"""The book's tools: one package, run from the repository root as `python -m tools.<name>`.

- `book_index`: the book's labels, titles and numbers, and the cross-reference roles;
- `myst`: MyST Markdown read with markdown-it-py + mdit-py-plugins (myst-parser's tokenizer);
- `colab`, `glossary`, `colab_edition` (and `regenerate`, which runs the three): files derived
  from the chapters; `errata`, `book_pages`, `book_assets`: Sphinx extensions of the HTML book
  (`_config.yml`: local_extensions); `colab_sim`, `platform_check`: checks of the environment.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent   # the repository root: the one book root of every tool
