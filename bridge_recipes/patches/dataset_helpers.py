"""Megatron-Bridge's ``initialize.compile_helpers`` runs ``make`` for the dataset index helpers, but
the megatron-core wheel ships the compiled ``helpers_cpp`` and no Makefile: where the compiled module
imports, the compile step becomes a no-op."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from bridge_recipes.patches.contract import Patch, check

TARGET = "megatron.bridge.training.initialize.compile_helpers"


def prebuilt() -> bool:
    """The wheel's compiled helpers import and there is no Makefile to build them with."""
    spec = importlib.util.find_spec("megatron.core.datasets")
    folder = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    if folder is None or (folder / "Makefile").exists():
        return False
    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
        return True
    except ImportError:
        return False


def wanted(cfg: Any = None, **run: Any) -> bool:
    return prebuilt()


def _skipped() -> None:
    """The compiled helpers are in place (the wheel's ``helpers_cpp``): nothing to compile."""


def install(cfg: Any = None) -> str:
    check(PATCH)
    import megatron.bridge.training.initialize as init

    init.compile_helpers = _skipped
    return "dataset helpers: using the compiled helpers_cpp shipped in the megatron-core wheel (no Makefile to run)"


PATCH = Patch(
    name="dataset_helpers",
    what="skip compiling the dataset helpers the megatron-core wheel ships compiled",
    written_for={"megatron-bridge": ">=0.6,<0.7", "megatron-core": ">=0.19,<0.20"},
    targets={TARGET: (), "megatron.core.datasets.helpers_cpp": None},
    install=install,
    wanted=wanted,
)
