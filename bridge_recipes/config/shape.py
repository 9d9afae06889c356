"""What each section of a config file may hold, checked on its YAML before anything in it is built.

A saved config holds every section of the run: Megatron-Bridge's ConfigContainer's, each a mapping that
names its config class by ``_target_`` (or null, or a preset name, where the field takes one), and
``features``: a mapping naming :class:`bridge_recipes.features.Features`, with one block per feature
naming that feature's ``Config``. What a section may hold comes from its field's annotation, read from
Megatron-Bridge's source (:func:`bridge_recipes.config.overrides.container_annotations`), so a section of the
wrong kind is named, with its key, before Megatron is imported instead of failing deep inside it.

A section left out would be built as its dataclass default, not as the run was saved: it is refused,
except the features, whose missing blocks and fields take the values of the recipe the file names
(:func:`missing_features`, :func:`fill_features`); a plain ConfigContainer's file has no features at all.

Importing this module imports neither torch nor Megatron.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from bridge_recipes.config.overrides import FEATURES
from bridge_recipes.features import Features

# How a section that is wrong, or a part of it, is put right (a part of the features may also be left out).
FIX = "put back what --save-config wrote there, or write the file again with --dry-run --save-config FILE"
FIX_FEATURES = f"{FIX}; or leave it out to take the recipe's"
SCALARS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
SCALAR_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}
NOT_A_CLASS = ("Any", "Callable", "Optional", "Union", "Literal")


@dataclass(frozen=True)
class Admits:
    """The YAML values a field takes: null, scalars (by type name), a plain mapping (of ``values``), or a
    config class named by ``_target_`` (``classes``, by class name)."""

    null: bool = False
    scalars: tuple[str, ...] = ()
    mapping: bool = False
    values: Admits | None = None
    classes: tuple[str, ...] = ()

    def takes(self, value: Any) -> bool:
        if value is None:
            return self.null
        if isinstance(value, bool):
            return "bool" in self.scalars
        if isinstance(value, int):
            return "int" in self.scalars or "float" in self.scalars
        if isinstance(value, float):
            return "float" in self.scalars
        if isinstance(value, str):
            return "str" in self.scalars
        if isinstance(value, dict):
            if isinstance(value.get("_target_"), str):
                return bool(self.classes)
            return self.mapping and (self.values is None or all(self.values.takes(v) for v in value.values()))
        return False

    def describe(self) -> str:
        kinds = []
        if self.classes:
            kinds.append(f"a section (a mapping whose _target_ names its config class: {' or '.join(self.classes)})")
        if self.mapping:
            held = f" of names to {self.values.describe()}" if self.values else ""
            kinds.append(f"a mapping{held}")
        kinds += [SCALAR_WORDS[s] for s in self.scalars if not (s == "int" and "float" in self.scalars)]
        if self.null:
            kinds.append("null")
        return ", ".join(kinds[:-1]) + f" or {kinds[-1]}" if len(kinds) > 1 else "".join(kinds)


def _either(a: Admits | None, b: Admits | None) -> Admits | None:
    if a is None or b is None:
        return None
    return Admits(
        null=a.null or b.null,
        scalars=tuple(dict.fromkeys(a.scalars + b.scalars)),
        mapping=a.mapping or b.mapping,
        values=a.values or b.values,
        classes=a.classes + b.classes,
    )


def _name(node: Any) -> str | None:
    import ast

    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def admits(node: Any) -> Admits | None:
    """What the annotation ``node`` (an ``ast`` expression) admits, or None where it cannot be told."""
    import ast

    if isinstance(node, ast.Constant) and node.value is None:
        return Admits(null=True)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _either(admits(node.left), admits(node.right))
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return _either(admits(args[0]), Admits(null=True))
        if head == "Union":
            found: Admits | None = admits(args[0])
            for arg in args[1:]:
                found = _either(found, admits(arg))
            return found
        if head in ("dict", "Dict", "Mapping") and len(args) == 2:
            return Admits(mapping=True, values=admits(args[1]))
        return None
    name = _name(node)
    if name in SCALARS:
        return Admits(scalars=(name,))
    if name and name[0].isupper() and name not in NOT_A_CLASS:
        return Admits(classes=(name,))
    return None


@lru_cache(maxsize=1)
def section_admits() -> dict[str, Admits | None]:
    """Each ConfigContainer section and what it admits (None: not told); empty where Megatron-Bridge's
    source is not found."""
    from bridge_recipes.config.overrides import container_annotations

    return {name: admits(node) for name, node in (container_annotations() or {}).items()}


def _shown(value: Any) -> str:
    """``value`` as the file spells it (cut to 60 characters), and its kind."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    kinds = ((int | float, "a number"), (str, "a string"), (list, "a list"), (dict, "a mapping without _target_"))
    kind = next((word for cls, word in kinds if isinstance(value, cls)), type(value).__name__)
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({kind})"


def shape_problem(data: dict, plain: bool) -> str | None:
    """What is wrong with the kind of a top-level section of the config file's mapping ``data`` (a plain
    ConfigContainer's when ``plain``): one left out, or of a kind its field does not take; then the
    features section (:func:`features_problem`). None when every section has its kind."""
    for name, kinds in section_admits().items():
        if name not in data:
            null = f" ('{name}: null' where the run has none)" if kinds and kinds.null else ""
            return (
                f"the '{name}' section is missing: a saved config holds every section, and one left out would be "
                f"Megatron-Bridge's default, not the run's; {FIX}{null}"
            )
        value = data[name]
        if kinds is None or kinds.takes(value):
            continue
        if isinstance(value, dict) and "_target_" not in value and kinds.classes:
            return f"{name} has no _target_ line naming its config class ({' or '.join(kinds.classes)}); {FIX}"
        return f"{name} is {_shown(value)}; it takes {kinds.describe()}: {FIX}"
    if plain:
        if FEATURES in data:
            return (
                f"a plain ConfigContainer has no {FEATURES} section; name the run's class at the top "
                "(_target_: bridge_recipes.recipe_config.RecipeConfig) or drop the section"
            )
        return None
    return features_problem(data[FEATURES]) if FEATURES in data else None


def _target(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _block_problem(key: str, value: Any, cls: type) -> str | None:
    """What is wrong with ``value`` as the mapping of config class ``cls`` at ``key``, or None."""
    if not isinstance(value, dict):
        wanted = f"a mapping with '_target_: {_target(cls)}' and its fields"
        return f"{key} is {_shown(value)}; it takes {wanted}: {FIX_FEATURES}"
    if value.get("_target_") != _target(cls):
        now = f"names {value['_target_']!r}" if "_target_" in value else "has no _target_ line"
        return f"{key} {now}; it must hold '_target_: {_target(cls)}': {FIX_FEATURES}"
    return None


def features_problem(section: Any) -> str | None:
    """What is wrong with a config file's ``features`` section: its kind, a block's kind or class, an
    unknown feature or setting, a setting of the wrong type; each names its key. None when it is sound."""
    if problem := _block_problem(FEATURES, section, Features):
        return problem
    blocks = typing.get_type_hints(Features)
    for name, block in section.items():
        if name == "_target_":
            continue
        key = f"{FEATURES}.{name}"
        if name not in blocks:
            return f"{key} is not a feature; {FEATURES} has {', '.join(blocks)}"
        if problem := _block_problem(key, block, blocks[name]):
            return problem
        fields = typing.get_type_hints(blocks[name])
        for setting, value in block.items():
            if setting == "_target_":
                continue
            if setting not in fields:
                return f"{key}.{setting} is not a setting of {key}; it has {', '.join(fields)}"
            kind = fields[setting]
            if kind in SCALARS.values() and not Admits(scalars=(kind.__name__,)).takes(value):
                wanted = Admits(scalars=(kind.__name__,)).describe()
                return f"{key}.{setting} is {_shown(value)}; it takes {wanted}"
    return None


def missing_features(data: dict, plain: bool) -> list[str]:
    """The keys of the features a config file's mapping ``data`` leaves out, as dotted keys: the whole
    section (always so for a plain ConfigContainer's file), a feature's block, or a setting of one."""
    if plain or not isinstance(data.get(FEATURES), dict):
        return [FEATURES]
    section, missing = data[FEATURES], []
    for f in dataclasses.fields(Features):
        block = section.get(f.name)
        if f.name not in section:
            missing.append(f"{FEATURES}.{f.name}")
        elif isinstance(block, dict):
            cls = typing.get_type_hints(Features)[f.name]
            missing += [f"{FEATURES}.{f.name}.{g.name}" for g in dataclasses.fields(cls) if g.name not in block]
    return missing


def _leaves(obj: Any, prefix: str) -> list[str]:
    if not dataclasses.is_dataclass(obj):
        value = str(obj).lower() if isinstance(obj, bool) else obj
        return [f"{prefix}={value}"]
    return [leaf for f in dataclasses.fields(obj) for leaf in _leaves(getattr(obj, f.name), f"{prefix}.{f.name}")]


def fill_features(features: Features, recipe_features: Features, missing: list[str]) -> tuple[Features, list[str]]:
    """``features`` with the ``missing`` keys (:func:`missing_features`) taken from ``recipe_features``, and
    the values taken, as ``key=value``."""
    out, taken = copy.deepcopy(features), []
    for key in missing:
        parts = key.split(".")[1:]
        if not parts:
            return copy.deepcopy(recipe_features), _leaves(recipe_features, FEATURES)
        owner, source = out, recipe_features
        for part in parts[:-1]:
            owner, source = getattr(owner, part), getattr(source, part)
        value = copy.deepcopy(getattr(source, parts[-1]))
        setattr(owner, parts[-1], value)
        taken += _leaves(value, key)
    return out, taken
