"""The tests in this folder import the book's tools as the package they are (`from tools import
glossary`): pyproject.toml's `pythonpath = ["."]` puts the repository root on sys.path.
"""
from __future__ import annotations

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository root


def load_tool(name: str):
    """The module tools.<name> (kept for callers that name a tool by string)."""
    return importlib.import_module(f"tools.{name}")
