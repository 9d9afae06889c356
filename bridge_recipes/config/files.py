"""Config files: a built recipe written as YAML, and built again from that YAML.

A config file is Megatron-Bridge's ``ConfigContainer.to_yaml`` text behind one comment line
that names the recipe it came from (``# recipe: NAME``), so the runner knows the recipe's task
and GPUs when it builds from the file, and one line per runner option of the run that lives
outside the config (:data:`RUN_OPTIONS`: ``# hf-checkpoint: DIR``, ``# export-hf: DIR``,
``# gpu-memory-gb: GB``, ``# epochs: N``, the progress watch's ``# first-step-timeout: SECONDS`` and
``# step-timeout: SECONDS``), so
``--config-file`` launches the same run (``# epochs:`` sets the steps from the rows again, as they are
when it is loaded). A file the runner saves also records what its recipe was written for
(``# written for: TASK on N x GPU``), so a ``# recipe:`` line changed to another recipe is refused.

Every section is checked for its kind before Megatron is imported (a mapping naming its config class
by ``_target_``, or null or a preset name where the field takes one;
:func:`bridge_recipes.config.shape.shape_problem`), and every built field against its annotation. A
section or a field left out is refused, as it would be its dataclass default, not the run's; in
``features`` (which a plain ConfigContainer's file has none of) the blocks and settings left out take
the values of the recipe the file names, said in one line. Loading goes through
``ConfigContainer.from_yaml`` in
strict mode: an unknown key anywhere is an error, and every ``_target_`` must be on Megatron's
instantiation allow-list. This package's config classes are added to that list one class at a
time (:data:`YAML_CLASSES`), not as a package prefix, so a file can name a dataset config but
no other callable of the package. Before any of it, :mod:`bridge_recipes.config.safety` holds
the file to what a config may ask for (config classes and a short list of named functions, a
size and an alias-expansion limit), so a file received from someone else runs nothing of its
choosing.

Importing this module imports neither torch nor Megatron.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from bridge_recipes.features import CLASSES as FEATURE_CLASSES

RECIPE_LINE = re.compile(r"^# recipe: (\S+)\s*$", re.MULTILINE)
# Runner options a saved run needs that the ConfigContainer does not hold: the starting weights'
# Hugging Face folder (converted at launch), the folder the trained model is exported to, the memory
# cap, the run's length in passes over its rows (the steps derived again at load), and the progress watch's
# budgets in seconds (bridge_recipes.training.watchdog).
PATH_OPTIONS = ("hf-checkpoint", "export-hf")  # the run options that name a folder (kept absolute)
WATCH_OPTIONS = ("first-step-timeout", "step-timeout")
RUN_OPTIONS = (*PATH_OPTIONS, "export-text-only", "gpu-memory-gb", "epochs", *WATCH_OPTIONS)
# Those of them that are switches (recorded as ``true``), not folders or values.
RUN_SWITCHES = ("export-text-only",)
RUN_LINE = re.compile(r"^# (" + "|".join(RUN_OPTIONS) + r"): (.+?)\s*$", re.MULTILINE)
HEADER = "# run_recipe.py config file: build it again with --config-file FILE [KEY=VALUE ...]\n# recipe: {name}\n"
# What the recipe a runner's file was saved from was written for (its task, GPU count and card), so that a
# '# recipe:' line changed to another recipe is told from the recipe the file was saved from.
WRITTEN_FOR = "# written for: {task} on {gpus} x {gpu}\n"
WRITTEN_FOR_LINE = re.compile(r"^# written for: (\w+) on (\d+) x (\S+)\s*$", re.MULTILINE)

# The top-level ``_target_`` of a saved config: a recipe's run (``RecipeConfig``: Megatron-Bridge's
# ConfigContainer with the run's features), or a plain ConfigContainer, which runs with its recipe's features.
CONTAINER = "bridge_recipes.recipe_config.RecipeConfig"
CONTAINERS = (CONTAINER, "megatron.bridge.training.config.ConfigContainer")
# Classes of this package that a built config can hold, as module path and class name.
YAML_CLASSES = (CONTAINER, "bridge_recipes.data.packed_rows.PackedSFTRowsConfig", *FEATURE_CLASSES)


class ConfigFileError(ValueError):
    """A config file that cannot be read or built; the message names the file and the problem."""


def allow_package_classes() -> None:
    """Put :data:`YAML_CLASSES` on Megatron's ``_target_`` allow-list (idempotent)."""
    from megatron.bridge.utils.instantiate_utils import target_allowlist

    for target in YAML_CLASSES:
        target_allowlist.add_exact(target)


def to_text(cfg: Any, recipe: str, run: dict[str, str] | None = None, written_for: bool = False) -> str:
    """The config file's text: the recipe line, with ``written_for`` the line of what the recipe was written
    for (:data:`WRITTEN_FOR`), a line per given runner option (``run``, by :data:`RUN_OPTIONS` name), then
    Megatron-Bridge's YAML of ``cfg``."""
    import yaml
    from megatron.training.config.yaml_utils import safe_yaml_representers

    from bridge_recipes.recipes import registry

    with safe_yaml_representers():
        body = yaml.safe_dump(_plain(cfg.to_dict()), default_flow_style=False)
    lines = "".join(f"# {name}: {run[name]}\n" for name in RUN_OPTIONS if (run or {}).get(name))
    if written_for:
        m = registry.find(recipe).meta
        lines = WRITTEN_FOR.format(task=m.task, gpus=m.gpus, gpu=m.gpu) + lines
    return HEADER.format(name=recipe) + lines + body


def run_options(path: str | os.PathLike) -> dict[str, str | bool]:
    """The runner options recorded in a config file (:data:`RUN_OPTIONS` names to values)."""
    text, _ = _load_data(path)
    found = {m.group(1): m.group(2) for m in RUN_LINE.finditer(text)}
    return {k: (v == "true") if k in RUN_SWITCHES else v for k, v in found.items()}


def _plain(obj: Any) -> Any:
    """``obj`` with sets as sorted lists: a YAML ``!!set`` does not load back into the config
    (OmegaConf has no set type), and the fields holding sets (LoRA's ``params_to_save``) are
    only ever tested for membership."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, set | frozenset):
        return sorted(_plain(v) for v in obj)
    return obj


def recipe_of(path: str | os.PathLike, recipe: str | None = None) -> str:
    """The recipe a config file was written from (its ``# recipe:`` line), checked against
    ``recipe`` when both are given; ``recipe`` alone for a file without the line. The file is read and
    its sections checked (:mod:`bridge_recipes.config.shape`), and the recipe's model, task and GPUs held
    against the file's, without importing Megatron."""
    text, data = _load_data(path)
    m = RECIPE_LINE.search(text)
    if m and recipe and m.group(1) != recipe:
        raise ConfigFileError(
            f"config file {path} was written from {m.group(1)}, but --recipe names {recipe}; drop --recipe"
        )
    if not m and not recipe:
        raise ConfigFileError(f"config file {path} has no '# recipe: NAME' line; pass --recipe NAME with it")
    if m and len(names := set(RECIPE_LINE.findall(text))) > 1:
        raise ConfigFileError(
            f"config file {path} names {len(names)} recipes ({', '.join(sorted(names))}) in '# recipe:' lines; "
            "keep the one it was written from"
        )
    name = m.group(1) if m else str(recipe)
    # a run from Hugging Face weights takes its model's sizes from that folder (a toy's may be any)
    weights = any(m.group(1) == "hf-checkpoint" for m in RUN_LINE.finditer(text))
    if problem := _model_kind_problem(name, data, sized=not weights) or _task_problem(name, data, text):
        raise ConfigFileError(f"config file {path}: {problem}")
    return name


def _task_problem(recipe: str, data: dict, text: str) -> str | None:
    """The recipe line's task and GPUs against the file's: against its ``# written for:`` line where it has
    one (a file saved with LoRA put on or taken off on purpose says so there), else its body's task (a
    ``peft`` section is a LoRA recipe's, ``peft: null`` one training every weight)."""
    from bridge_recipes.recipes import registry

    try:
        entry = registry.find(recipe)
    except registry.UnknownRecipe:
        return None  # named as such by the runner
    m = entry.meta
    if found := WRITTEN_FOR_LINE.search(text):
        saved = (found.group(1), int(found.group(2)), found.group(3))
        if saved == (m.task, m.gpus, m.gpu):
            return None
        return (
            f"its '# recipe: {recipe}' line names a recipe written for {m.task} on {m.gpus} x {m.gpu}, but the "
            f"file was saved from one written for {saved[0]} on {saved[1]} x {saved[2]} (its '# written for:' "
            f"line); fix the '# recipe:' line to the recipe the file was saved from{_peers(entry, *saved)}"
        )
    lora = isinstance(data.get("peft"), dict)
    if lora == (m.task == "peft"):
        return None
    body = "a LoRA 'peft' section" if lora else "'peft: null' (it trains every weight)"
    task = "peft" if lora else "sft"
    return (
        f"its '# recipe: {recipe}' line names a recipe of task {m.task}, but the config holds {body}: another task's "
        f"config; fix the '# recipe:' line to the recipe the file was saved from{_peers(entry, task, None, None)}, "
        f"or, where LoRA was {'put on' if lora else 'taken off'} this recipe on purpose, keep it and add the line "
        f"'{WRITTEN_FOR.format(task=m.task, gpus=m.gpus, gpu=m.gpu).strip()}'"
    )


def _peers(entry: Any, task: str, gpus: int | None, gpu: str | None) -> str:
    """`` (this model's recipes of that kind: ...)``: the recipes of ``entry``'s model with ``task`` (and,
    where given, ``gpus`` and ``gpu``), or nothing when there are none."""
    from bridge_recipes.recipes import registry

    names = sorted(
        e.name
        for e in registry.entries().values()
        if e.model == entry.model
        and e.meta.task == task
        and gpus in (None, e.meta.gpus)
        and gpu in (None, e.meta.gpu)
        and not e.name.endswith("_mock_config")
    )
    return f" (this model's recipes of that kind: {', '.join(names[:4])})" if names else ""


def _model_kind_problem(recipe: str, data: dict, sized: bool = True) -> str | None:
    """The recipe line's model against the file's: text or vision-language, dense or MoE, and (``sized``:
    the body's sizes are the recipe's own, not a checkpoint folder's) its width and heads (the runner
    takes the task and GPUs from the recipe, the model from the body)."""
    from bridge_recipes.models.qwen35 import SPECS
    from bridge_recipes.recipes import registry

    try:
        spec = SPECS.get(registry.find(recipe).model or "")
    except registry.UnknownRecipe:
        return None  # named as such by the runner
    model = data.get("model")
    if spec is None or not isinstance(model, dict) or not isinstance(model.get("_target_"), str):
        return None
    kind = {True: "vision-language", False: "text"}
    moe = {True: "MoE", False: "dense"}
    body_vl, body_moe = "VL" in model["_target_"].rsplit(".", 1)[-1], bool(model.get("num_moe_experts"))
    if (body_vl, body_moe) == (spec.is_vl, spec.is_moe):
        if not sized:
            return None
        # the same kind of model: the sizes no scale-down changes tell another model of that kind
        sizes = {"hidden_size": spec.hidden_size, "num_attention_heads": spec.num_attention_heads}
        other = {k: model.get(k) for k, v in sizes.items() if isinstance(model.get(k), int) and model.get(k) != v}
        if not other:
            return None
        found = ", ".join(f"model.{k} {v}" for k, v in other.items())
        wanted = ", ".join(f"{k} {sizes[k]}" for k in other)
        return (
            f"its '# recipe: {recipe}' line names {spec.name}, whose model has {wanted}, but the config holds "
            f"{found}: another model's config; fix the '# recipe:' line to the recipe the file was saved from"
        )
    return (
        f"its '# recipe: {recipe}' line names a {kind[spec.is_vl]} {moe[spec.is_moe]} model, but the config "
        f"holds a {kind[body_vl]} {moe[body_moe]} one (model._target_ {model['_target_']}, model.num_moe_experts "
        f"{model.get('num_moe_experts')}); fix the '# recipe:' line to the recipe the file was saved from"
    )


def _read(path: str | os.PathLike) -> str:
    from bridge_recipes.config.safety import MAX_BYTES

    p = Path(path)
    if not p.is_file():
        raise ConfigFileError(f"config file {p} does not exist" if not p.exists() else f"config file {p} is a folder")
    try:
        if (size := p.stat().st_size) > MAX_BYTES:
            raise ConfigFileError(f"config file {p} is {size:,} bytes, over the {MAX_BYTES:,}-byte limit")
        return p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"config file {p} cannot be read: {exc}") from None


def _load_data(path: str | os.PathLike) -> tuple[str, dict]:
    """The file's text and its YAML mapping, checked to be a saved ConfigContainer whose sections each have
    their kind (:func:`bridge_recipes.config.shape.shape_problem`); imports no Megatron."""
    import yaml

    from bridge_recipes.config.safety import UnsafeConfig, check_text
    from bridge_recipes.config.shape import shape_problem

    text = _read(path)
    try:
        check_text(text)  # size and alias expansion, before the YAML is expanded
        if twice := _duplicate_key(yaml.compose(text, Loader=yaml.SafeLoader)):
            raise ConfigFileError(f"config file {path}: {twice}")
        data = yaml.safe_load(text)
    except UnsafeConfig as exc:
        raise ConfigFileError(f"config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"config file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or data.get("_target_") not in CONTAINERS:
        raise ConfigFileError(
            f"config file {path} is not a saved config: expected a mapping with '_target_: {CONTAINER}' "
            "(write one with --dry-run --save-config FILE)"
        )
    if problem := shape_problem(data, plain=data["_target_"] != CONTAINER):
        raise ConfigFileError(f"config file {path}: {problem}")
    return text, data


def _parse(path: str | os.PathLike) -> tuple[str, dict]:
    """:func:`_load_data`, and every ``_target_`` it names held to :mod:`bridge_recipes.config.safety`."""
    from bridge_recipes.config.safety import UnsafeConfig, check_targets

    text, data = _load_data(path)
    try:
        check_targets(data, YAML_CLASSES)  # nothing it names is called before this passes
    except UnsafeConfig as exc:
        raise ConfigFileError(f"config file {path}: {exc}") from None
    return text, data


def _duplicate_key(node: Any, path: str = "") -> str | None:
    """The first key given twice in one mapping of the composed YAML ``node``, with both lines: YAML
    loaders keep the last silently, so one of two differing settings would be dropped unseen."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                if key in seen:
                    return (
                        f"key {path}{key} is given twice (lines {seen[key]} and {k.start_mark.line + 1}); "
                        "keep one of them"
                    )
                seen[key] = k.start_mark.line + 1
            if found := _duplicate_key(v, f"{path}{key}."):
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            if found := _duplicate_key(v, f"{path}{i}."):
                return found
    return None


def load(path: str | os.PathLike, recipe: str | None = None, report: Callable[[str], None] | None = None) -> Any:
    """The run in ``path`` (a :class:`bridge_recipes.recipe_config.RecipeConfig`), built by Megatron-Bridge's
    strict YAML loading. The features the file leaves out (all of them in a plain ConfigContainer's file)
    are those of ``recipe`` (the recipe it was written from), said through ``report`` in one line; without
    ``recipe`` such a file is refused."""
    _, data = _parse(path)
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.utils.instantiate_utils import InstantiationException, InstantiationMode

    from bridge_recipes.config.shape import missing_features
    from bridge_recipes.recipe_config import RecipeConfig, promote

    allow_package_classes()
    plain = data.get("_target_") != CONTAINER
    try:
        built = (ConfigContainer if plain else RecipeConfig).from_yaml(str(path), mode=InstantiationMode.STRICT)
    except (InstantiationException, ValueError, TypeError, KeyError, AttributeError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigFileError(f"config file {path} cannot be built: {detail}") from None
    features = None if plain else built.features
    if missing := missing_features(data, plain):
        features = _recipe_features(path, features, missing, recipe, report)
    cfg = promote(built, features)
    if problem := _field_type_problem(cfg) or _missing_field(_plain(cfg.to_dict()), data):
        raise ConfigFileError(f"config file {path}: {problem}")
    return cfg


def _missing_field(saved: dict, data: dict, prefix: str = "") -> str | None:
    """The first section of the file's mapping ``data`` that lacks some of the fields ``saved`` (what saving
    the built config writes) holds: they were built as their dataclass defaults, not as the run was saved.
    The features are not looked at: those left out are the recipe's."""
    from bridge_recipes.config.overrides import FEATURES
    from bridge_recipes.config.shape import FIX

    if missing := [k for k in saved if k not in data and not (k == FEATURES and not prefix)]:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return (
            f"{prefix.rstrip('.') or 'the file'} lacks {shown}: a saved config holds every field, and one left "
            f"out would be its default, not the run's; {FIX}"
        )
    for key, value in saved.items():
        if key != FEATURES and isinstance(value, dict) and "_target_" in value and isinstance(data.get(key), dict):
            if found := _missing_field(value, data[key], f"{prefix}{key}."):
                return found
    return None


def _recipe_features(
    path: str | os.PathLike,
    features: Any,
    missing: list[str],
    recipe: str | None,
    report: Callable[[str], None] | None,
) -> Any:
    """``features`` (None: none) with the ``missing`` keys taken from recipe ``recipe``'s, and the line
    saying so reported."""
    from bridge_recipes.config.shape import fill_features
    from bridge_recipes.features import Features
    from bridge_recipes.recipes import registry

    if recipe is None:
        raise ConfigFileError(
            f"config file {path} has no {missing[0]}; name the recipe it was written from (its '# recipe: NAME' "
            "line), whose values it takes"
        )
    filled, taken = fill_features(features or Features(), registry.load(recipe)().features, missing)
    if report is not None:
        report(f"config file {path} has no {', '.join(missing)}: taking its recipe {recipe}'s ({', '.join(taken)})")
    return filled


def _field_type_problem(obj: Any, prefix: str = "") -> str | None:
    """The first field of ``obj`` (a built config) whose value its annotation does not admit, as what to
    say: a string where only numbers or booleans go (YAML reads ``1e-4`` without a dot or a quoted number
    as text; strict loading keeps it), or a plain value where a config class goes (a section written
    without its ``_target_``, or as a scalar or a list)."""
    import dataclasses

    from bridge_recipes.config.overrides import allowed_types
    from bridge_recipes.config.shape import FIX

    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        kinds = allowed_types(hints.get(f.name)) if value is not None else None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            classes = [k for k in kinds or () if k is not type(None)]
            if classes and all(dataclasses.is_dataclass(k) for k in classes) and not isinstance(value, tuple(classes)):
                wanted = " or ".join(k.__name__ for k in classes)
                return f"{key} is a {type(value).__name__}; it takes {wanted}: {FIX}"
            if found := _field_type_problem(value, f"{key}."):
                return found
            continue
        if not kinds or not isinstance(value, str | int | float | bool | dict | list):
            continue
        if isinstance(value, str) and all(k in (int, float, bool, type(None)) for k in kinds):
            names = " or ".join(sorted({"null" if k is type(None) else k.__name__ for k in kinds}))
            return f"{key} is {value!r}, a string; it takes {names}"
        classes = [k for k in kinds if k is not type(None)]
        if classes and all(dataclasses.is_dataclass(k) for k in classes) and not isinstance(value, tuple(classes)):
            wanted = " or ".join(k.__name__ for k in classes)
            return f"{key} is {value!r:.60}, not a section; it takes a mapping whose _target_ names {wanted}: {FIX}"
    return None


@cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls``'s fields (empty where they cannot be resolved)."""
    import typing

    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - forward references that cannot be resolved: nothing is checked
        return {}
