"""Load the book's scripts in tools/ for the tests in this folder."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str):
    """Import tools/<name>.py as module `name` (tools/ is not a package; its scripts import each other)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(TOOLS / f"{name}.py"):
        return sys.modules[name]
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
