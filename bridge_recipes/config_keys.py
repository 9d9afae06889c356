"""The keys an override may name, per section, without importing Megatron-Bridge.

``config_keys.json`` lists, for each section of the ConfigContainer, every field of every config
class that section can hold: the classes the section's annotation names and their subclasses, and
the classes of every recipe built with every ``--dataset`` kind. A misspelt field (``train.trian_iters``)
is then answered in a fraction of a second instead of after Megatron's 15-second import; a key this
catalogue holds still goes through the full check on the built config. Sections whose value is a
mapping take any key.

    python -m bridge_recipes.config_keys --write   # regenerate after upgrading Megatron-Bridge
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).with_name("config_keys.json")
OPEN = "*"  # a section (or a mapping-valued one) that takes any key


@lru_cache(maxsize=1)
def catalogue() -> dict[str, list[str]]:
    """Section -> its field names (``["*"]`` for a section that takes any key); empty when missing."""
    try:
        return json.loads(CATALOGUE.read_text())
    except (OSError, ValueError):
        return {}


def unknown_field(key: str) -> str | None:
    """What to say of ``section.field[...]`` when no config class of its section has that field (the
    nearest fields, or the section); None when it may be valid (or the catalogue cannot tell)."""
    section, dot, rest = key.partition(".")
    fields = catalogue().get(section)
    if not dot or not fields or OPEN in fields:
        return None
    name = rest.split(".", 1)[0]
    if name in fields:
        return None
    elsewhere = [f"{s}.{name}" for s, names in catalogue().items() if name in names]
    if elsewhere:
        return f"Did you mean {' or '.join(elsewhere[:3])}?"
    near = difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
    if near:
        return f"Nearest valid keys: {', '.join(f'{section}.{n}' for n in near)}."
    return f"No config of section {section!r} has a field {name!r}."


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def _subclasses(cls: type) -> set[type]:
    out, todo = set(), [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _classes(annotation: Any) -> tuple[set[type], bool]:
    """The dataclasses an annotation names, and whether it admits a mapping or anything at all."""
    if annotation is Any:
        return set(), True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        found, open_ = set(), False
        for arg in typing.get_args(annotation):
            classes, is_open = _classes(arg)
            found |= classes
            open_ |= is_open
        return found, open_
    if origin is not None:
        return set(), origin in (dict, typing.Mapping) or _is_mapping(origin)
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            return {annotation}, False
        return set(), _is_mapping(annotation)
    return set(), False


def _is_mapping(cls: Any) -> bool:
    import collections.abc

    return isinstance(cls, type) and issubclass(cls, collections.abc.Mapping)


def generate() -> dict[str, list[str]]:
    """The catalogue from the installed Megatron-Bridge and every recipe (imports Megatron)."""
    import importlib
    import pkgutil

    import megatron.bridge.models
    from megatron.bridge.training.config import ConfigContainer

    from bridge_recipes import builder, registry
    from bridge_recipes.datasets import KINDS

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
    ap = argparse.ArgumentParser(prog="python -m bridge_recipes.config_keys", description=__doc__)
    ap.add_argument("--write", action="store_true", help=f"write {CATALOGUE.name} (default: check it)")
    args = ap.parse_args(argv)
    text = json.dumps(generate(), indent=1) + "\n"
    if args.write:
        CATALOGUE.write_text(text)
        print(f"wrote {CATALOGUE}")
        return 0
    if (CATALOGUE.read_text() if CATALOGUE.exists() else "") != text:
        print(f"{CATALOGUE} is stale: run python -m bridge_recipes.config_keys --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
