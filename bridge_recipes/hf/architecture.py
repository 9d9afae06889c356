"""A Hugging Face folder's architecture against the model a recipe expects.

:func:`check_against` compares the fields a folder's config gives (:func:`found_fields`) with the
catalog spec of the recipe's model (:func:`expected_from_spec`), that spec with only the family
fields kept (``scaled``: a toy or scaled-down checkpoint), or the recipe's Megatron model config
after the user's ``model.*`` overrides (:func:`expected_from_model`, what the runner uses). The
import, the export and the runner check a folder this way before anything is converted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge_recipes.hf.checkpoint import FAMILY_FIELDS, FAMILY_NAMES, SIZE_FIELDS, HfFolder
from bridge_recipes.hf.files import CONFIG_FILE, HfCheckpointError
from bridge_recipes.models.qwen35 import SPECS, Qwen35Spec


def _attention_every(layer_types: list[str]) -> int | None:
    """The interval k when full attention sits exactly at every k-th layer, else None."""
    full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    if not full:
        return None
    k = full[0] + 1
    return (
        k
        if all(t == ("full_attention" if (i + 1) % k == 0 else "linear_attention") for i, t in enumerate(layer_types))
        else None
    )


def found_fields(folder: HfFolder, *, as_text: bool = False) -> dict[str, Any]:
    """The compared fields as the checkpoint's config gives them (text part for VL configs).
    ``as_text``: a VL folder is read as the text model of its language model (what a text recipe
    trains from a released folder)."""
    t = folder.text_config
    layer_types = t.get("layer_types")
    if not layer_types and t.get("full_attention_interval") and t.get("num_hidden_layers"):
        k = t["full_attention_interval"]
        layer_types = [
            "full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(t["num_hidden_layers"])
        ]
    rope = t.get("rope_parameters") or {}
    out = {
        "architecture": FAMILY_NAMES[(folder.is_moe, folder.is_vl and not as_text)],
        "full_attention_interval": _attention_every(layer_types or []),
        "layer_types": list(layer_types or []),
        "partial_rotary_factor": rope.get("partial_rotary_factor", t.get("partial_rotary_factor")),
        "tie_word_embeddings": bool(folder.config.get("tie_word_embeddings", t.get("tie_word_embeddings", False))),
        "mtp_num_hidden_layers": t.get("mtp_num_hidden_layers") or 0,
    }
    for name in FAMILY_FIELDS + SIZE_FIELDS:
        if name not in out:
            out[name] = t.get(name)
    if not folder.is_moe:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            out[name] = None
    else:
        out["intermediate_size"] = None
    return out


def _layer_types(pattern: list[int]) -> list[str]:
    return ["linear_attention" if p else "full_attention" for p in pattern]


def expected_from_spec(spec: Qwen35Spec) -> dict[str, Any]:
    """The fields a checkpoint of the catalog model ``spec`` has."""
    return {
        "architecture": FAMILY_NAMES[(spec.is_moe, spec.is_vl)],
        "full_attention_interval": spec.full_attention_interval,
        "head_dim": spec.head_dim,
        "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_value_head_dim": spec.linear_value_head_dim,
        "linear_conv_kernel_dim": spec.linear_conv_kernel_dim,
        "partial_rotary_factor": spec.partial_rotary_factor,
        "tie_word_embeddings": False,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "layer_types": _layer_types(spec.layer_pattern),
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_query_groups,
        "linear_num_key_heads": spec.linear_num_key_heads,
        "linear_num_value_heads": spec.linear_num_value_heads,
        "intermediate_size": spec.ffn_hidden_size,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.moe_router_topk,
        "moe_intermediate_size": spec.moe_ffn_hidden_size,
        "shared_expert_intermediate_size": spec.moe_shared_expert_ffn_hidden_size,
        "vocab_size": spec.vocab_size,
        "mtp_num_hidden_layers": spec.mtp_num_layers,
    }


def expected_from_model(model: Any, vl: bool) -> dict[str, Any]:
    """The fields a checkpoint must have to load into the Megatron model config ``model``
    (a recipe's ``cfg.model`` after overrides); ``vl``: the recipe is a VL recipe."""
    moe = bool(getattr(model, "num_moe_experts", None))
    freq = getattr(model, "linear_attention_freq", None)
    n = model.num_layers
    pattern = freq if isinstance(freq, list) else [0 if (i + 1) % (freq or 1) == 0 else 1 for i in range(n)]
    layer_types = _layer_types(pattern)
    return {
        "architecture": FAMILY_NAMES[(moe, vl)],
        "full_attention_interval": _attention_every(layer_types),
        "head_dim": model.kv_channels,
        "linear_key_head_dim": model.linear_key_head_dim,
        "linear_value_head_dim": model.linear_value_head_dim,
        "linear_conv_kernel_dim": model.linear_conv_kernel_dim,
        "partial_rotary_factor": model.rotary_percent,
        "tie_word_embeddings": bool(model.share_embeddings_and_output_weights),
        "hidden_size": model.hidden_size,
        "num_hidden_layers": n,
        "layer_types": layer_types,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups,
        "linear_num_key_heads": model.linear_num_key_heads,
        "linear_num_value_heads": model.linear_num_value_heads,
        "intermediate_size": None if moe else model.ffn_hidden_size,
        "num_experts": model.num_moe_experts if moe else None,
        "num_experts_per_tok": model.moe_router_topk if moe else None,
        "moe_intermediate_size": model.moe_ffn_hidden_size if moe else None,
        "shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size if moe else None,
        "vocab_size": model.vocab_size,
        "mtp_num_hidden_layers": model.mtp_num_layers or 0,
    }


# Megatron config field a ``model.*`` override sets to fix each compared field.
MODEL_FIELD_OF = {
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_query_groups",
    "head_dim": "kv_channels",
    "linear_num_key_heads": "linear_num_key_heads",
    "linear_num_value_heads": "linear_num_value_heads",
    "intermediate_size": "ffn_hidden_size",
    "num_experts": "num_moe_experts",
    "num_experts_per_tok": "moe_router_topk",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
    "vocab_size": "vocab_size",
    "mtp_num_hidden_layers": "mtp_num_layers",
}


# The Megatron model fields a checkpoint's config.json decides (Megatron-Bridge's Qwen3.5 bridges
# read them from it): the sizes above, the hybrid layer pattern, head dimensions, rotary settings,
# norm epsilon, tied embeddings, the vision tower. The rest of a recipe's model (parallel layout,
# recompute, kernels, precision, sequence length) is execution policy and stays the recipe's.
SHAPE_FIELDS = (
    *dict.fromkeys(MODEL_FIELD_OF.values()),
    "linear_attention_freq",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "rotary_percent",
    "rotary_base",
    "layernorm_epsilon",
    "add_qkv_bias",
    "share_embeddings_and_output_weights",
    "vision_config",
)


def vision_token_ids(folder: HfFolder) -> dict[str, int]:
    """A VL checkpoint's own ids of the tokens that mark images and videos (its processor writes them),
    as its config.json gives them (top level first, else text_config); an id that is not an integer
    >= 0 is refused naming the field."""
    from bridge_recipes.vl.vl_checks import VISION_TOKEN_FIELDS

    out = {}
    for name in VISION_TOKEN_FIELDS if folder.is_vl else ():
        for where, holder in (("", folder.config), ("text_config.", folder.config.get("text_config") or {})):
            if isinstance(holder, dict) and holder.get(name) is not None:
                value = holder[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise HfCheckpointError(
                        f"{folder.path / CONFIG_FILE}: {where}{name} is {value!r}; a token id is an integer >= 0 "
                        "(the id its processor writes for the token)"
                    )
                out[name] = value
                break
    return out


def provider_of(folder: HfFolder, text_model: bool = False) -> Any:
    """Megatron-Bridge's model provider for ``folder`` (``AutoBridge`` reads its config.json; no
    weights are loaded); for a text model of a released VL folder, the text provider of its
    language model (:mod:`bridge_recipes.hf.released_bridge`)."""
    if takes_language_model(folder, not text_model):
        from bridge_recipes.hf import released_bridge

        return released_bridge.provider(folder)
    from megatron.bridge import AutoBridge

    return AutoBridge.from_hf_pretrained(str(folder.path)).to_megatron_provider(load_weights=False)


def _show(name: str, value: Any) -> str:
    if name == "layer_types" and isinstance(value, list):
        full = [i for i, t in enumerate(value) if t == "full_attention"]
        return f"{len(value)} layers, full attention at {full}"
    return repr(value)


def check_against(found: dict[str, Any], expected: dict[str, Any], *, scaled: bool = False) -> list[str]:
    """One line per differing field: ``FIELD: checkpoint has X, the recipe's model has Y``.
    ``scaled``: compare the family fields only (a toy or scaled-down checkpoint)."""
    names = FAMILY_FIELDS if scaled else FAMILY_FIELDS + SIZE_FIELDS
    out = []
    for name in names:
        a, b = found.get(name), expected.get(name)
        if isinstance(a, float) or isinstance(b, float):
            same = a is not None and b is not None and abs(float(a) - float(b)) < 1e-9
        else:
            same = a == b
        if not same:
            out.append(f"{name}: checkpoint has {_show(name, a)}, the recipe's model has {_show(name, b)}")
    return out


def spec_for_recipe(recipe: str) -> Qwen35Spec:
    """The catalog model a recipe (or a catalog name) is for, as the runner finds it: a listed recipe or
    ``qwen36_`` / ``qwen38_`` alias by its registry entry (:func:`bridge_recipes.recipes.registry.entries`), any
    other name by the longest catalog name it starts with (a ``qwen36_`` name read as its ``qwen35_`` twin,
    for a size with a Qwen3.6 checkpoint in the catalog; ``qwen38_`` likewise)."""
    from bridge_recipes.recipes import registry

    entry = registry.entries().get(recipe)
    if entry is not None and entry.model is not None:
        return SPECS[entry.model]
    family, prefix = next(((f, p) for f, p in registry.ALIAS_FAMILIES.items() if recipe.startswith(p)), (None, ""))
    base = registry.QWEN35_PREFIX + recipe.removeprefix(prefix) if family else recipe
    hits = [name for name in SPECS if base == name or base.startswith(name + "_")]
    if not hits:
        raise HfCheckpointError(
            f"cannot tell the model of recipe {recipe!r}: its name starts with no catalog model "
            f"({', '.join(sorted(SPECS))}); run_recipe.py --list shows the recipes"
        )
    spec = SPECS[max(hits, key=len)]
    if family and family not in spec.checkpoints:
        release = registry.release_name(family)
        sizes = sorted(n for n, s in SPECS.items() if family in s.checkpoints)
        raise HfCheckpointError(
            f"recipe {recipe!r}: the catalog has no {release} checkpoint of {spec.name} ({release} sizes: "
            f"{', '.join(sizes)}); use its qwen35_ name, or run_recipe.py --list --filter {family}"
        )
    return spec


def check_folder_for_recipe(folder: HfFolder, recipe: str, *, scaled: bool = False) -> list[str]:
    """Mismatches between ``folder`` and the catalog model of ``recipe`` (empty: it fits). A text
    recipe takes a released VL folder's language model (:func:`takes_language_model`), when the
    folder holds its vision tower and MTP layer."""
    spec = spec_for_recipe(recipe)
    as_text = takes_language_model(folder, spec.is_vl)
    problems = check_against(found_fields(folder, as_text=as_text), expected_from_spec(spec), scaled=scaled)
    if as_text and not problems:
        from bridge_recipes.hf.released import released_problem

        if problem := released_problem(folder):
            problems.append(problem)
    return problems


def takes_language_model(folder: HfFolder, recipe_is_vl: bool) -> bool:
    """Whether a recipe (VL or not) takes only the language model (and MTP layer) of ``folder``:
    a text recipe given a released vision-language folder."""
    return folder.is_vl and not recipe_is_vl


def mismatch_error(folder: Path, problems: list[str], fix: str) -> HfCheckpointError:
    lines = "\n  ".join(problems)
    return HfCheckpointError(f"{folder} does not match the recipe's model:\n  {lines}\n{fix}")


def _fix_hint(scaled: bool) -> str:
    if scaled:
        return "The family fields must match even for a scaled-down checkpoint; pick the recipe of this model."
    return (
        "Pick the recipe of this checkpoint's model, or pass --scaled for a toy or scaled-down checkpoint "
        "(only the family fields are compared)."
    )
