"""Dry run and plan only: the ``__init__`` bodies of a few large packages run when first needed.

Importing ``megatron.bridge`` imports every model bridge Megatron-Bridge ships (for its Hugging Face
registry), ``megatron.training`` its whole training loop and ModelOpt, and ``fla`` every layer and model
of flash-linear-attention: about a third of a dry run's time, none of it used to build and check a
config. In a process that only builds and checks (``--dry-run``, ``--plan``) :func:`install` defers those
bodies: a submodule imports as usual, a name the package re-exports is imported from the submodule that
defines it, a literal (``__version__``) is set at once, another name runs its package's body, and
``AutoBridge``, whose registry needs every bridge, runs every deferred body first: nothing is missed,
only delayed. A training process never installs it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from bridge_recipes.patches.contract import Patch, version_problems
from bridge_recipes.registry import literal_assignments

# the packages whose bodies wait, parents after their children when all run
DEFERRED = (
    "megatron.bridge.models.conversion",
    "megatron.bridge.models",
    "megatron.bridge",
    "megatron.training",
    "fla",
)
# set to 1 to import as usual (the plain path, for comparison or if a deferred body is missed)
PLAIN_IMPORTS = "BRIDGE_RECIPES_PLAIN_IMPORTS"
# names whose use needs every body run (the bridge registry is filled by importing each bridge)
NEEDS_ALL = frozenset({"AutoBridge"})

_pending: dict[str, tuple[ModuleType, importlib.abc.Loader]] = {}


def reexports(tree: ast.Module, package: str) -> dict[str, tuple[str, str]]:
    """The names a parsed ``__init__`` re-exports with ``from X import name``: name -> (module, attribute)."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        for alias in node.names:
            if alias.name != "*":
                out[alias.asname or alias.name] = (module, alias.name)
    return out


def _run_body(name: str) -> None:
    module, loader = _pending.pop(name)
    module.__dict__.pop("__getattr__", None)
    loader.exec_module(module)


def run_all() -> None:
    """Run every body still deferred (children first) and defer no more: the process then matches a
    plain import."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in DEFERRED:
        if name in _pending:
            _run_body(name)


def _deferred_getattr(module: ModuleType, names: dict[str, tuple[str, str]]) -> Any:
    def __getattr__(attr: str) -> Any:
        if attr in NEEDS_ALL:
            run_all()
        elif attr in names:
            source, original = names[attr]
            value = getattr(importlib.import_module(source), original)
            setattr(module, attr, value)
            return value
        elif module.__name__ in _pending:
            _run_body(module.__name__)  # a name the map does not know: this body, as a plain import would
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return __getattr__


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader, source: str, name: str):
        tree = ast.parse(source)
        self.real = real
        self.names = reexports(tree, name)
        self.constants = literal_assignments(tree)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        _pending[module.__name__] = (module, self.real)
        module.__dict__.update(self.constants)
        module.__dict__["__getattr__"] = _deferred_getattr(module, self.names)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.origin is None:
            return None
        with open(spec.origin, encoding="utf-8") as f:
            spec.loader = _Loader(spec.loader, f.read(), fullname)
        return spec


def install() -> bool:
    """Defer the bodies in this process if none of the packages is imported yet, the installed
    versions are those this was written for and $BRIDGE_RECIPES_PLAIN_IMPORTS is not 1 (otherwise
    imports stay as they are); whether it did."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    if os.environ.get(PLAIN_IMPORTS) == "1" or any(name in sys.modules for name in DEFERRED):
        return False
    if version_problems(PATCH):
        return False
    sys.meta_path.insert(0, _Finder())
    return True


def deferred() -> list[str]:
    """The packages whose bodies have not run yet."""
    return [name for name in DEFERRED if name in _pending]


PATCH = Patch(
    name="lazy_inits",
    what="dry run and plan: the package bodies of Megatron-Bridge, Megatron training and fla run when needed",
    written_for={
        "megatron-bridge": ">=0.6.2,<0.7",
        "megatron-core": ">=0.19,<0.20",
        "flash-linear-attention": ">=0.6,<0.7",
    },
    targets={name: None for name in DEFERRED},
)
