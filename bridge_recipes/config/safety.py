"""What a config file may ask to run: checked on its text before anything in it is built.

A saved config names Python objects by ``_target_``, and Megatron-Bridge's loader calls each
one with the arguments beside it. A config file received from someone else must not be able
to run code of its choosing (``torch.save`` on a path it picks, a module's side effects), so
before any ``_target_`` is resolved the file is held to these rules:

- at most :data:`MAX_BYTES` bytes, and YAML anchors and aliases that expand to at most
  :data:`MAX_NODES` nodes (a few lines of aliases can stand for billions of nodes);
- a ``_target_`` that is called must be a config class: a dataclass, a Hugging Face
  ``PretrainedConfig`` or an enumeration, defined under :data:`CONFIG_MODULES` (or one of
  :data:`bridge_recipes.config.files.YAML_CLASSES`); only an enumeration takes ``_args_``;
- a ``_target_`` that is only referenced (``_call_: false``) must be one of
  :data:`REFERENCES`: dtypes, activation functions and layer-spec builders;
- ``_partial_`` is refused.

Each refusal names the key (its dotted path in the file) and what is allowed there. Only the
modules of the named config classes are imported while checking, the ones loading imports.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import Any

MAX_BYTES = 4 * 2**20  # a saved config is about 30 KB
MAX_NODES = 200_000  # YAML nodes after alias expansion (a saved config has a few thousand)

# Modules whose classes a config file may build (Megatron's and transformers' model configs).
CONFIG_MODULES = ("megatron.", "transformers.models.")
# Enumerations outside them that Megatron-Bridge's configs hold (the signal ending a run).
ENUMS = ("signal.Signals",)
# Objects a config file may name without calling them.
REFERENCES = (
    "torch.float32",
    "torch.float16",
    "torch.bfloat16",
    "torch.nn.functional.silu",
    "torch.nn.functional.gelu",
    "torch.nn.functional.relu",
    "torch._C._nn.gelu",
    "megatron.core.activations.squared_relu",
    "megatron.core.activations.quick_gelu",
    "megatron.core.activations.fast_gelu",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_decoder_block_spec",
    "megatron.core.models.gpt.experimental_attention_variant_module_specs."
    "get_transformer_block_with_experimental_attention_variant_spec",
)


class UnsafeConfig(ValueError):
    """A config file that asks for more than a config may; the message names the key."""


def check_text(text: str) -> None:
    """Size and alias expansion of a config file's text (before it is loaded)."""
    import yaml

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise UnsafeConfig(f"the file is {size:,} bytes, over the {MAX_BYTES:,}-byte limit of a config file")
    if "*" not in text:  # no alias: nothing to expand
        return
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return  # the YAML error itself is reported by the loading that follows
    if root is not None:
        _count(root, {}, [], MAX_NODES)


def _count(node: Any, done: dict[int, int], path: list[str], limit: int) -> int:
    import yaml

    if id(node) in done:
        if done[id(node)] < 0:
            raise UnsafeConfig(f"key {'.'.join(path) or '(top)'} refers to itself through a YAML alias")
        return done[id(node)]
    done[id(node)] = -1
    total = 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _count(v, done, [*path, str(k.value)], limit)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            total += _count(v, done, [*path, str(i)], limit)
    if total > limit:
        raise UnsafeConfig(
            f"key {'.'.join(path) or '(top)'} expands through YAML aliases to over {limit:,} values; "
            "a config file may not use aliases that grow it this way"
        )
    done[id(node)] = total
    return total


def check_targets(data: Any, extra_classes: tuple[str, ...] = ()) -> None:
    """Every ``_target_`` in the loaded mapping ``data`` against the rules above."""
    _walk(data, "", extra_classes)


def _walk(node: Any, path: str, extra: tuple[str, ...]) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, f"{path}.{i}" if path else str(i), extra)
        return
    if not isinstance(node, dict):
        return
    where = path or "(top)"
    if "_partial_" in node:
        raise UnsafeConfig(f"key {where}._partial_: a config file may not build partial calls")
    if "_target_" in node:
        target = node["_target_"]
        if not isinstance(target, str):
            raise UnsafeConfig(f"key {where}._target_ is {target!r}; it must name a config class")
        if node.get("_call_", True) is False:
            if target not in REFERENCES:
                raise UnsafeConfig(
                    f"key {where}._target_ names {target!r}, which a config file may not reference; "
                    f"allowed: {', '.join(REFERENCES)}"
                )
        else:
            kind = _config_class_kind(target, extra)
            if kind is None:
                raise UnsafeConfig(
                    f"key {where}._target_ names {target!r}, which is not a config class a config file may "
                    f"build (a dataclass, Hugging Face config or enumeration under {', '.join(CONFIG_MODULES)})"
                )
            if "_args_" in node and kind != "enum":
                raise UnsafeConfig(f"key {where}._args_: only an enumeration takes positional arguments")
    for k, v in node.items():
        _walk(v, f"{path}.{k}" if path else k, extra)


def _config_class_kind(target: str, extra: tuple[str, ...]) -> str | None:
    """``class`` or ``enum`` when ``target`` names a config class a file may build, else None."""
    if not (target in extra or target in ENUMS or target.startswith(CONFIG_MODULES)):
        return None
    if any(not part.isidentifier() for part in target.split(".")):
        return None
    obj = _locate(target)
    if not isinstance(obj, type):
        return None
    if issubclass(obj, enum.Enum):
        return "enum"
    if dataclasses.is_dataclass(obj) or _is_hf_config(obj):
        return "class"
    return None


def _locate(target: str) -> Any:
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _is_hf_config(cls: type) -> bool:
    try:
        from transformers import PretrainedConfig
    except ImportError:
        return False
    return issubclass(cls, PretrainedConfig)
