"""Regenerate or check ``bridge_recipes/config/keys.json`` from the installed Megatron-Bridge and every
recipe (imports Megatron; :mod:`bridge_recipes.config.keys` reads the file without it).

    python -m bridge_recipes.config.keys_generate --write   # after upgrading Megatron-Bridge
    python -m bridge_recipes.config.keys_generate           # exit 1 when the file is stale
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import json
import sys
import types
import typing
from typing import Any

from bridge_recipes.config.keys import CATALOGUE, OPEN
from bridge_recipes.utils import quiet


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _classes(annotation: Any) -> tuple[set[type], bool]:
    """The dataclasses an annotation names, and whether it admits a mapping or anything at all."""
    if annotation is Any:
        return set(), True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found, open_ = set(), False
        for arg in typing.get_args(annotation):
            classes, is_open = _classes(arg)
            found |= classes
            open_ |= is_open
        return found, open_
    if origin is not None:  # dict[...], Mapping[...]: a mapping; list[...] and the like: neither
        return set(), _is_mapping(origin)
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            return {annotation}, False
        return set(), _is_mapping(annotation)
    return set(), False


def _is_mapping(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, collections.abc.Mapping)


def generate() -> dict[str, list[str]]:
    """The catalogue from the installed Megatron-Bridge and every recipe (imports Megatron)."""
    import importlib
    import pkgutil

    import megatron.bridge.models
    from megatron.bridge.training.config import ConfigContainer

    from bridge_recipes.config import builder
    from bridge_recipes.config.datasets import KINDS
    from bridge_recipes.recipes import registry

    for mod in pkgutil.walk_packages(megatron.bridge.models.__path__, "megatron.bridge.models."):
        try:  # every model provider class, so that their subclasses are known
            importlib.import_module(mod.name)
        except Exception:  # noqa: BLE001 - a provider needing an optional package is left out
            continue
    hints = typing.get_type_hints(ConfigContainer)
    sections: dict[str, set[str]] = {}
    open_sections: set[str] = set()
    for f in dataclasses.fields(ConfigContainer):
        if f.name.startswith("_"):
            continue
        classes, is_open = _classes(hints.get(f.name, Any))
        names = sections.setdefault(f.name, set())
        for cls in classes:
            for c in {cls, *_subclasses(cls)}:
                if dataclasses.is_dataclass(c):
                    names |= _fields(c)
        if is_open or not classes:
            open_sections.add(f.name)
    for name in sorted(registry.discover()):
        for kind in (None, *KINDS):
            try:
                cfg = builder.build(name, dataset=kind)
            except Exception:  # noqa: BLE001 - a dataset kind a recipe refuses adds nothing
                continue
            for section in sections:
                value = getattr(cfg, section, None)
                if isinstance(value, dict):
                    open_sections.add(section)
                elif dataclasses.is_dataclass(value):
                    sections[section] |= _fields(type(value))
    return {s: [OPEN] if s in open_sections else sorted(names) for s, names in sorted(sections.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bridge_recipes.config.keys_generate", description=__doc__)
    ap.add_argument("--write", action="store_true", help=f"write {CATALOGUE.name} (default: check it)")
    args = ap.parse_args(argv)
    quiet.install()
    text = json.dumps(generate(), indent=1) + "\n"
    if args.write:
        CATALOGUE.write_text(text)
        print(f"wrote {CATALOGUE}")
        return 0
    if (CATALOGUE.read_text() if CATALOGUE.exists() else "") != text:
        print(f"{CATALOGUE} is stale: run python -m bridge_recipes.config.keys_generate --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
