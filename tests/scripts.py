"""Tests load the repository's scripts (scripts/*.py, not a package) as modules."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module of the script at ``relative`` (from the repository root), executed once."""
    path = ROOT / relative
    name = "script_" + path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]
