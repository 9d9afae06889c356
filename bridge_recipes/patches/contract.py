"""What a run-time patch of upstream code promises: the upstream versions it was written against and
the symbols it replaces or wraps, each with the parameters it expects.

A patch reaches into another package's internals, which move between releases without notice. Each
patch here names the distributions and version ranges it was written for (``written_for``) and the
fully qualified symbols it touches with their parameter names (``targets``); :func:`problems` compares
both with what is installed, without a GPU, so a moved symbol or an untried release is refused before a
run rather than failing, or silently doing nothing, in the middle of one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class PatchError(ValueError):
    """A patch cannot be installed on the upstream code at hand (the message names what and why)."""


def _never(cfg: Any, **run: Any) -> bool:
    return False


@dataclass(frozen=True)
class Patch:
    """One run-time patch: its name (its module in ``bridge_recipes.patches``, or its feature's), what it
    does, the upstream it was written for and the symbols it touches.

    ``targets`` maps a fully qualified symbol to its parameter names, or to None for a value that is
    replaced (not called). ``wanted(cfg)`` says whether a run of ``cfg`` installs it at launch;
    ``install(cfg)`` installs it once per process and returns the line the runner logs, or None. A patch
    installed elsewhere than at launch (the dry run's validation, the row builder's renderer) has no
    ``install`` here: its module says where. A run-time feature's patch lives in its feature's module
    (``bridge_recipes.features``, named by ``module``)."""

    name: str
    what: str
    written_for: Mapping[str, str]
    targets: Mapping[str, tuple[str, ...] | None]
    install: Callable[[Any], str | None] | None = None
    wanted: Callable[..., bool] = field(default=_never)
    module: str = ""  # the module that defines it, when not bridge_recipes.patches.<name>

    @property
    def source(self) -> str:
        """The file that holds the patch, relative to the repository."""
        return (self.module or f"bridge_recipes.patches.{self.name}").replace(".", "/") + ".py"


def resolve(symbol: str) -> Any:
    """The object a fully qualified name (``package.module.Class.attribute``) names; AttributeError or
    ImportError when it is gone."""
    parts = symbol.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module of {symbol} imports")


def parameters(obj: Any) -> tuple[str, ...]:
    """The parameter names of a callable (through ``functools.wraps`` wrappers to the original)."""
    return tuple(inspect.signature(obj).parameters)


def written_for_text(patch: Patch) -> str:
    return ", ".join(f"{dist} {spec}" for dist, spec in patch.written_for.items())


def version_problems(patch: Patch) -> list[str]:
    """Each distribution the patch was written for whose installed version is outside its range."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    out = []
    for dist, spec in patch.written_for.items():
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"patch {patch.name} was written for {dist} {spec}; {dist} is not installed")
            continue
        try:
            inside = Version(installed) in SpecifierSet(spec)
        except InvalidVersion:
            inside = False
        if not inside:
            out.append(
                f"patch {patch.name} was written for {dist} {spec}; installed {installed}: install {dist}{spec}, "
                f"or check {patch.source} against {dist} {installed} and widen its range "
                "(docs/patches.md)"
            )
    return out


def target_problems(patch: Patch) -> list[str]:
    """Each symbol the patch touches that is gone or takes other parameters than it was written for."""
    out = []
    for symbol, expected in patch.targets.items():
        try:
            obj = resolve(symbol)
        except (ImportError, AttributeError, OSError) as exc:
            out.append(
                f"patch {patch.name}: {symbol} is gone ({type(exc).__name__}: {exc}; written for "
                f"{written_for_text(patch)})"
            )
            continue
        if expected is None:
            continue
        try:
            found = parameters(obj)
        except (TypeError, ValueError):
            found = None
        if found != tuple(expected):
            out.append(
                f"patch {patch.name}: {symbol} takes {found}, not {tuple(expected)} (written for "
                f"{written_for_text(patch)})"
            )
    return out


def problems(patch: Patch) -> list[str]:
    """Versions first (they need no import), then the symbols."""
    return version_problems(patch) + target_problems(patch)


def register_pre_wrap_hook_once(cfg: Any, hook: Callable) -> None:
    """Add ``hook`` to the pre-wrap hooks of ``cfg.model`` (Megatron-Bridge's provider) unless it is there."""
    if hook not in (getattr(cfg.model, "_pre_wrap_hooks", None) or []):
        cfg.model.register_pre_wrap_hook(hook)


def check(patch: Patch) -> None:
    """Raise :class:`PatchError` naming every problem of ``patch`` (called before installing it)."""
    if found := problems(patch):
        raise PatchError("; ".join(found))
