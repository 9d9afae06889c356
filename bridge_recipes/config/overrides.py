"""Command-line overrides of a built ConfigContainer: convenience flags, then ``KEY=VALUE``.

The grammar is Hydra's (parsed by Hydra's own override parser): ``a.b=1``, ``+a.key=v`` adds a
dictionary key, ``++a.b=v`` sets or adds, ``~a.b`` deletes a dictionary key or sets an
optional field to null, lists ``[1,2]``, ``null``, quoted strings, typed numbers and booleans.

Unlike a round trip through OmegaConf, each override is applied to the live object, so
nothing else in the config is rewritten, and every problem is an :class:`OverrideError` that
names the token: a key that does not exist (with the nearest valid keys), a value of the wrong
type, or a malformed token. Nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from bridge_recipes.features import FEATURES


@dataclass(frozen=True)
class Flag:
    """A convenience flag: the dotted keys it sets and the type its value is read as."""

    keys: tuple[str, ...]
    type: type


# Convenience flags (argparse dest -> keys and value type). -sl sets both sequence lengths,
# which must agree.
FLAG_KEYS: dict[str, Flag] = {
    "tp": Flag(("model.tensor_model_parallel_size",), int),
    "pp": Flag(("model.pipeline_model_parallel_size",), int),
    "cp": Flag(("model.context_parallel_size",), int),
    "vp": Flag(("model.virtual_pipeline_model_parallel_size",), int),
    "ep": Flag(("model.expert_model_parallel_size",), int),
    "etp": Flag(("model.expert_tensor_parallel_size",), int),
    "gb": Flag(("train.global_batch_size",), int),
    "mb": Flag(("train.micro_batch_size",), int),
    "sl": Flag(("model.seq_length", "dataset.seq_length"), int),
    "max_steps": Flag(("train.train_iters",), int),
    "lr": Flag(("optimizer.lr",), float),
    "min_lr": Flag(("optimizer.min_lr",), float),
    "warmup_iters": Flag(("scheduler.lr_warmup_iters",), int),
    "save_dir": Flag(("checkpoint.save",), str),
    "load_dir": Flag(("checkpoint.load",), str),
    "pretrained_checkpoint": Flag(("checkpoint.pretrained_checkpoint",), str),
    "save_interval": Flag(("checkpoint.save_interval",), int),
    # Weights & Biases (the wandb extra): the experiment name defaults to the recipe's name.
    "wandb_project": Flag(("logger.wandb_project",), str),
    "wandb_exp_name": Flag(("logger.wandb_exp_name",), str),
}
SHORT_FLAGS = {"tp", "pp", "cp", "vp", "ep", "etp", "gb", "mb", "sl"}  # the rest are --long-names


def flag_option(dest: str) -> str:
    """The command-line spelling of a flag: ``-gb``, ``--max-steps``."""
    return f"-{dest}" if dest in SHORT_FLAGS else f"--{dest.replace('_', '-')}"


# The library's keyword arguments that the command lines spell as options (``bridge_recipes.build``'s
# and the benchmark's): library errors name the keyword (``scale_down=8``), the command lines turn it
# into the option (``--scale-down 8``) with :func:`in_cli_terms`.
CLI_OPTIONS = {
    "scale_down": "--scale-down",
    "scale_experts": "--scale-experts",
    "gpus": "--gpus",
    "dataset": "--dataset",
    "peft": "--peft",
    "hf_checkpoint": "--hf-checkpoint",
    "export_hf": "--export-hf",
    "config_file": "--config-file",
    "epochs": "--epochs",
    "candidate": "--candidate",
    "without_mtp": "--without-mtp",
    "intercept_result": "--intercept-result",
}
# a keyword with its value (``scale_down=8``), or alone where it cannot be a word of prose (``scale_down``)
_KEYWORD = re.compile(
    r"(?<!['\"])\b(?:("
    + "|".join(CLI_OPTIONS)
    + r")=|("
    + "|".join(k for k in CLI_OPTIONS if "_" in k)
    + r")\b(?![.\w=]))"
)


def in_cli_terms(message: str) -> str:
    """``message`` with the library's keyword arguments spelt as the command line's options (a quoted
    token, as the user typed it, is kept)."""
    return _KEYWORD.sub(lambda m: CLI_OPTIONS[m.group(1)] + " " if m.group(1) else CLI_OPTIONS[m.group(2)], message)


def flag_values(flags: dict[str, Any] | None) -> dict[str, Any]:
    """``flags`` checked against :data:`FLAG_KEYS` and read as each flag's type (None: not given)."""
    out = {}
    for dest, value in (flags or {}).items():
        if dest not in FLAG_KEYS:
            near = difflib.get_close_matches(dest, FLAG_KEYS, n=3, cutoff=0.5)
            hint = f" Nearest: {', '.join(near)}." if near else ""
            raise OverrideError(f"unknown flag {dest!r}; flags are {', '.join(FLAG_KEYS)}.{hint}")
        if value is None:
            continue
        kind = FLAG_KEYS[dest].type
        try:
            out[dest] = kind(value)
        except (TypeError, ValueError):
            raise OverrideError(f"flag {dest}={value!r}: expected {kind.__name__}") from None
        if kind is int and isinstance(value, float) and value != out[dest]:
            raise OverrideError(f"flag {dest}={value!r}: expected int")
    return out


class OverrideError(ValueError):
    """An override that cannot be applied; the message names the token and the fix."""


@dataclass(frozen=True)
class Override:
    key: str
    kind: str  # set | add | force_add | delete
    value: Any
    token: str


_KEY = re.compile(r"[A-Za-z0-9_$\-]+(\.[A-Za-z0-9_$\-]+)*|[A-Za-z0-9_$\-]")


def parse(token: str) -> Override:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "=" not in token and not token.startswith("~"):
        raise OverrideError(f"malformed override {token!r}: expected KEY=VALUE (or ~KEY to delete)")
    key = token.partition("=")[0].lstrip("+~")
    if key and "" in key.split("."):
        raise OverrideError(
            f"key {key!r} in {token!r} has an empty part between dots: config keys are names joined by single "
            f"'.' (e.g. {'.'.join(p for p in key.split('.') if p) or 'optimizer.lr'}=...)"
        )
    if key and not _KEY.fullmatch(key):
        odd = next(c for c in key if not _KEY.fullmatch(c) and c != ".")
        raise OverrideError(
            f"key {key!r} in {token!r} holds {odd!r}: config keys are ASCII letters, digits and '_', "
            "joined by '.' (e.g. optimizer.lr=1e-5)"
        )
    try:
        o = OverridesParser.create().parse_override(token)
    except Exception as exc:  # Hydra raises its own exception types for grammar errors
        hint = ""
        key, eq, value = token.partition("=")
        if eq and value and not value.startswith(("'", '"', "[", "{")):
            # Unquoted values may hold only letters, digits and a few symbols (paths, numbers)
            hint = f"; quote the value if it holds spaces or other characters: {key}='{value}'"
        raise OverrideError(f"malformed override {token!r}: {exc}{hint}") from None
    kind = "delete" if o.is_delete() else "force_add" if o.is_force_add() else "add" if o.is_add() else "set"
    return Override(o.key_or_group, kind, None if kind == "delete" else o.value(), token)


def container_fields() -> tuple[str, ...] | None:
    """The top-level sections of a recipe's run: Megatron-Bridge's ConfigContainer's, read from its source
    without importing Megatron (which takes many seconds), and ``features``; None where the source is not
    found."""
    found = container_annotations()
    return None if found is None else (*found, FEATURES)


def container_annotations() -> dict[str, Any] | None:
    """The annotation of each public field of Megatron-Bridge's ConfigContainer as an ``ast`` expression,
    read from its source without importing Megatron; None where the source is not found."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("megatron")  # a namespace package: importing it is instant
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        source = Path(root) / "bridge" / "training" / "config.py"
        if not source.is_file():
            continue
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "ConfigContainer":
                return {
                    n.target.id: n.annotation
                    for n in node.body
                    if isinstance(n, ast.AnnAssign)
                    and isinstance(n.target, ast.Name)
                    and not n.target.id.startswith("_")
                }
    return None


def feature_key_problem(key: str) -> str | None:
    """What is wrong with a ``features.`` key (an unknown feature or field, with the choices), or None."""
    import dataclasses

    from bridge_recipes.features import Features

    obj: Any = Features()
    parts = key.split(".")[1:]
    for depth, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(obj)]
        if part not in names:
            where = ".".join([FEATURES, *parts[:depth]])
            what = "feature" if depth == 0 else "setting"
            return f"unknown {what} {'.'.join([where, part])!r}; {where} has {', '.join(names)}"
        obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            return None if depth == len(parts) - 1 else f"{'.'.join([FEATURES, *parts[: depth + 1]])} has no sub-keys"
    return f"{key} is a section; set one of its fields, e.g. {key}.{dataclasses.fields(obj)[0].name}=..."


def feature_value_problem(o: Override) -> str | None:
    """What is wrong with the value an override gives a ``features.`` setting (a known one): its type or
    its choices (:func:`bridge_recipes.features.setting_problem`), or None."""
    from bridge_recipes.features import setting_problem

    if o.kind == "add" or len(o.key.split(".")) != 3:
        return None  # '+' on a field, or a section: refused as such by the full check
    return setting_problem(o.key, o.value)


def replaced_env_problem(key: str) -> str | None:
    """The message for an override of an ``env_vars`` entry that a config key replaced, or None."""
    from bridge_recipes.features import REPLACED_ENV

    section, _, name = key.partition(".")
    if section == "env_vars" and name in REPLACED_ENV:
        return f"env_vars.{name} no longer switches anything: set {REPLACED_ENV[name]}=... instead"
    return None


def precheck(tokens: list[str]) -> list[Override]:
    """The overrides parsed, and their sections and fields checked, before anything heavy is imported:
    a malformed token, a misspelt section or a field no config of its section has
    (:mod:`bridge_recipes.config.keys`) is answered at once. The full check runs on the built config
    (:func:`apply_all`)."""
    from bridge_recipes.config.keys import unknown_field

    parsed = [parse(t) for t in tokens]
    sections = container_fields() or ()
    for o in parsed:
        if problem := instead_problem(o):
            raise OverrideError(problem)
        if problem := replaced_env_problem(o.key):
            raise OverrideError(f"{o.token!r}: {problem}")
        if o.key.split(".", 1)[0] == FEATURES and (problem := feature_key_problem(o.key) or feature_value_problem(o)):
            raise OverrideError(f"{o.token!r}: {problem}")
        top = o.key.split(".", 1)[0]
        # a key without its section (``lr``) is left to the full check, which names the section it is in
        if sections and top not in sections and "." in o.key:
            near = difflib.get_close_matches(top, sections, n=3, cutoff=0.5)
            hint = f" Nearest valid keys: {', '.join(near)}." if near else f" Sections: {', '.join(sections)}."
            raise OverrideError(f"unknown key {top!r} in {o.token!r}.{hint}")
        if o.kind in ("set", "delete") and (field_hint := unknown_field(o.key)):
            field = ".".join(o.key.split(".")[:2])
            raise OverrideError(f"unknown key {field!r} in {o.token!r}. {field_hint}")
    range_precheck(parsed)
    return parsed


def range_precheck(overrides: list[Override]) -> None:
    """A value given on the command line outside its :data:`bridge_recipes.config.values.RANGES` entry, answered
    before anything heavy is imported (the built config is checked again in full)."""
    from bridge_recipes.config.values import RANGES

    ranges = {r.key: r for r in RANGES}
    for o in overrides:
        r = ranges.get(o.key)
        if o.kind == "set" and r is not None and not r.accepts(o.value):
            given = "" if o.token.lstrip("+").startswith(f"{o.key}=") else f" (from {o.token})"
            raise OverrideError(f"{o.key}={o.value!r}{given} must be {r.describe()}; {r.how()}")


def flag_overrides(flags: dict[str, Any]) -> list[Override]:
    """Overrides for the convenience flags that were given (value not None)."""
    out = []
    for dest, flag in FLAG_KEYS.items():
        if flags.get(dest) is not None:
            out += [Override(k, "set", flags[dest], f"--{dest.replace('_', '-')} {flags[dest]}") for k in flag.keys]
    return out


def _children(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return [str(k) for k in obj]
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")]
    return []


def _has(obj: Any, name: str) -> bool:
    if isinstance(obj, dict):
        return name in obj
    return dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}


def _below(obj: Any, name: str, prefix: str, depth: int = 3) -> list[str]:
    """Dotted keys under ``obj`` (``depth`` sections down) whose last part is ``name``: a field
    given without its section (``lr`` for ``optimizer.lr``)."""
    out = []
    for child in _children(obj):
        value = obj[child] if isinstance(obj, dict) else getattr(obj, child, None)
        if child == name and prefix:
            out.append(f"{prefix}{child}")
        if depth and (dataclasses.is_dataclass(value) and not isinstance(value, type) or isinstance(value, dict)):
            out += _below(value, name, f"{prefix}{child}.", depth - 1)
    return out


def _nearest(obj: Any, name: str, prefix: str) -> str:
    """Keys to suggest for ``name`` unknown in ``obj``: the same field in a section below it
    first, else the closest spellings at this level."""
    inside = sorted(_below(obj, name, prefix), key=len)[:3]
    if inside:
        return " Did you mean " + " or ".join(inside) + "?"
    near = difflib.get_close_matches(name, _children(obj), n=3, cutoff=0.5)
    if not near:
        return ""
    return " Nearest valid keys: " + ", ".join(f"{prefix}{n}" for n in near) + "."


# The top-level field a recipe may set to the name of a Megatron-Bridge preset instead of its config
PRESET_FIELD = "mixed_precision"


def mixed_precision_preset(name: str, token: str) -> Any:
    """Megatron-Bridge's mixed-precision config registered as ``name`` (e.g. ``bf16_mixed``), or an
    OverrideError naming the value and the presets there are."""
    from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES, get_mixed_precision_config

    try:
        return get_mixed_precision_config(name)
    except ValueError:
        names = ", ".join(sorted(n for n in MIXED_PRECISION_RECIPES if "-" not in n))
        raise OverrideError(f"{token!r}: no mixed-precision preset {name!r}; choose one of {names}") from None


def _walk(cfg: Any, parts: list[str], token: str) -> Any:
    obj, path = cfg, ""
    for part in parts:
        if not _has(obj, part):
            raise OverrideError(f"unknown key {path + part!r} in {token!r}.{_nearest(obj, part, path)}")
        parent, obj = obj, (obj[part] if isinstance(obj, dict) else getattr(obj, part))
        if not path and part == PRESET_FIELD and isinstance(obj, str):
            # a preset named by a string becomes its config, so that its fields can be set one by one
            obj = mixed_precision_preset(obj, token)
            setattr(parent, part, obj)
        path += part + "."
        if obj is None:
            raise OverrideError(f"{token!r}: {path[:-1]!r} is null in this recipe, so it has no sub-keys to set")
    return obj


def field_annotation(obj: Any, name: str) -> Any:
    try:
        return typing.get_type_hints(type(obj)).get(name)
    except Exception:  # forward references that cannot be resolved: fall back to the value's type
        return None


def allowed_types(annotation: Any) -> tuple[type, ...] | None:
    """Concrete classes an annotation admits, or None where it cannot be told (Any, callables)."""
    if annotation is None or annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out: list[type] = []
        for arg in typing.get_args(annotation):
            sub = allowed_types(arg)
            if sub is None:
                return None
            out += sub
        return tuple(out)
    if origin is typing.Literal:
        return tuple({type(a) for a in typing.get_args(annotation)})
    if origin is not None:
        return (origin,) if isinstance(origin, type) else None
    return (annotation,) if isinstance(annotation, type) else None


def _coerce(value: Any, current: Any, allowed: tuple[type, ...] | None, token: str, key: str) -> Any:
    """The value to store, or OverrideError when its type cannot be the field's."""
    import torch

    if value is None:
        if allowed is not None and type(None) not in allowed and current is not None:
            raise OverrideError(f"{token!r}: {key} cannot be null (expected {_names(allowed)})")
        return None
    if isinstance(current, torch.dtype) or (allowed and torch.dtype in allowed):
        if isinstance(value, str) and isinstance(getattr(torch, value.removeprefix("torch."), None), torch.dtype):
            return getattr(torch, value.removeprefix("torch."))
        raise OverrideError(f"{token!r}: {key} takes a torch dtype name such as bfloat16, not {value!r}")
    want = allowed if allowed is not None else ((type(current),) if current is not None else None)
    if want is None:
        return value
    if isinstance(value, bool):
        if bool in want:
            return value
    elif isinstance(value, int):
        if int in want:
            return value
        if float in want:
            return float(value)
    elif isinstance(value, float):
        if float in want:
            return value
    elif isinstance(value, str):
        if str in want:
            return value
    elif isinstance(value, (list, tuple)):
        if list in want or tuple in want:
            return type(current)(value) if isinstance(current, (list, tuple)) else list(value)
    elif isinstance(value, dict):
        if dict in want:
            return dict(value)
    if str in want and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. a numeric-looking path or name
    raise OverrideError(f"{token!r}: {key} expects {_names(want)}, got {type(value).__name__} {value!r}")


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join(sorted({"null" if t is type(None) else t.__name__ for t in kinds}))


# Fields an override may not set, each with what to use instead.
INSTEAD = {
    "train.num_epochs": "Megatron-Bridge counts epochs only for its own SFT dataset, not for these recipes' rows; "
    "set the run's length in passes over the rows with epochs=N, which sets train.train_iters from the rows "
    "folder's row count and the rows per step",
}


# The section of the adapters, and how a run trains every weight instead.
PEFT = "peft"
WITHOUT_PEFT = (
    "to train every weight without LoRA, delete a LoRA recipe's adapters with ~peft, or use a full fine-tuning "
    "recipe (run_recipe.py --list --filter sft)"
)
# Values a user writes to mean "none" (Hydra reads null as None, false as False, the rest as text).
NONE_WORDS = ("", "null", "none", "no", "off", "false")


def means_none(value: Any) -> bool:
    """Whether ``value`` is what a user writes for "none" (:data:`NONE_WORDS`, null, false)."""
    return value is None or value is False or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)


def instead_problem(o: Override) -> str | None:
    """Why override ``o`` sets a field of :data:`INSTEAD` (to a value), naming what to use instead, or sets
    the adapters' section to "none"; or None."""
    if o.key in INSTEAD and o.kind != "delete" and o.value is not None:
        return f"{o.token!r}: {INSTEAD[o.key]}"
    if o.key == PEFT and o.kind != "delete" and means_none(o.value):
        return f"{o.token!r}: {PEFT} is the section of the LoRA adapters, not a value; {WITHOUT_PEFT}"
    return None


def apply(cfg: Any, override: Override) -> None:
    """Apply one override to ``cfg`` in place."""
    if problem := instead_problem(override):
        raise OverrideError(problem)
    parts = override.key.split(".")
    if not all(parts):
        raise OverrideError(f"malformed key in {override.token!r}")
    parent = _walk(cfg, parts[:-1], override.token)
    leaf, prefix = parts[-1], ".".join(parts[:-1]) + ("." if len(parts) > 1 else "")
    exists = _has(parent, leaf)
    if isinstance(parent, dict):
        if override.kind == "delete":
            if not exists:
                raise OverrideError(
                    f"{override.token!r}: no key {override.key!r} to delete.{_nearest(parent, leaf, prefix)}"
                )
            del parent[leaf]
        elif override.kind == "add" and exists:
            raise OverrideError(f"{override.token!r}: {override.key!r} exists already; set it without '+' or use '++'")
        elif override.kind == "set" and not exists:
            raise OverrideError(
                f"unknown key {override.key!r} in {override.token!r}; add a new entry with "
                f"'+{override.key}=...'.{_nearest(parent, leaf, prefix)}"
            )
        else:
            parent[leaf] = override.value
        return
    if not dataclasses.is_dataclass(parent):
        raise OverrideError(f"{override.token!r}: {prefix[:-1]!r} is a {type(parent).__name__}, not a config section")
    if not exists:
        how = " ('+' adds keys to dictionaries such as env_vars, not fields)" if override.kind != "set" else ""
        raise OverrideError(
            f"unknown key {override.key!r} in {override.token!r}{how}.{_nearest(parent, leaf, prefix)}"
        )
    if override.kind == "add":
        raise OverrideError(f"{override.token!r}: {override.key!r} exists already; set it without '+'")
    current = getattr(parent, leaf)
    allowed = allowed_types(field_annotation(parent, leaf))
    if override.kind == "delete":
        setattr(parent, leaf, _coerce(None, current, allowed, override.token, override.key))
        return
    named_preset = override.key == PRESET_FIELD and isinstance(override.value, str)
    if dataclasses.is_dataclass(current) and not isinstance(override.value, type(current)) and not named_preset:
        drop = ""
        if override.value is None:  # a section set to null: deleted where it may be null, else refused as such
            optional = allowed is None or type(None) in allowed
            drop = f"; to drop it, delete it: ~{override.key}" if optional else f"; {override.key} cannot be null"
        raise OverrideError(
            f"{override.token!r}: {override.key!r} is a section ({type(current).__name__}); set its fields, "
            f"e.g. {override.key}.{_children(current)[0]}=...{drop}"
        )
    value = _coerce(override.value, current, allowed, override.token, override.key)
    if override.key == PRESET_FIELD and isinstance(value, str):
        mixed_precision_preset(value, override.token)  # a misspelt preset fails here, not at launch
    setattr(parent, leaf, value)


def apply_all(cfg: Any, flags: dict[str, Any], tokens: list[str]) -> list[Override]:
    """Flags first, then trailing tokens (which therefore win). Returns what was applied."""
    todo = flag_overrides(flags) + [parse(t) for t in tokens]
    for o in todo:
        apply(cfg, o)
    return todo
