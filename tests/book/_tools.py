"""The tests in this folder import the book's tools as the package they are (`from tools import
glossary`); importing this module first makes the repository root importable however pytest was
started (`python -m pytest` from the root already has it on sys.path; the `pytest` script does not).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def load_tool(name: str):
    """The module tools.<name> (kept for callers that name a tool by string)."""
    return importlib.import_module(f"tools.{name}")
