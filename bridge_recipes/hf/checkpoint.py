"""Hugging Face checkpoints in and out of the recipes: check, import, export, cache.

- :func:`inspect_folder` reads a local Hugging Face folder (``config.json``, the safetensors
  shards and their index, the tokenizer files) and checks that every shard the index lists is
  there and whole (a safetensors file's header gives the byte length it must have), and that the
  weights are the model its config declares, not a quantized release (:mod:`bridge_recipes.hf.weights_check`).
- :func:`check_against` compares its architecture with what a recipe expects: the catalog spec
  of the recipe's model (:func:`expected_from_spec`), that spec with only the family fields
  kept (``scaled``: a toy or scaled-down checkpoint), or the recipe's Megatron model config
  after the user's ``model.*`` overrides (:func:`expected_from_model`, what the runner uses).
- :func:`import_checkpoint` and :func:`export_checkpoint` run Megatron-Bridge's ``AutoBridge``
  (its registered Qwen3.5 bridges hold the weight mapping) into a temporary folder next to the
  output and rename it into place only once the whole conversion succeeded.
- :func:`cache_key` / :func:`cached_import` give the runner's convert-once cache.

Every bad input raises :class:`HfCheckpointError` with a message that names the problem and
the fix; the command line turns it into exit status 2.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_recipes.hf import weights_check
from bridge_recipes.hf.files import (  # noqa: F401  (the folder's files, named here for the callers)
    BIN_INDEX_FILE,
    CONFIG_FILE,
    INDEX_FILE,
    MAX_HEADER_BYTES,
    SINGLE_FILE,
    AdapterExportError,
    HfCheckpointError,
    safetensors_header,
)
from bridge_recipes.models.qwen35 import SPECS, Qwen35Spec
from bridge_recipes.training import saved_runs
from bridge_recipes.utils import outputs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CACHE_ENV = "QWEN35_RECIPES_CACHE"
CACHE_KEY_VERSION = "1"  # bump when the import's output changes for the same input

# model_type of a Hugging Face Qwen3.5 config -> (mixture of experts, vision-language).
MODEL_TYPES: dict[str, tuple[bool, bool]] = {
    "qwen3_5_text": (False, False),
    "qwen3_5_moe_text": (True, False),
    "qwen3_5": (False, True),
    "qwen3_5_moe": (True, True),
}
FAMILY_NAMES = {
    (False, False): "dense text (Qwen3_5ForCausalLM)",
    (True, False): "MoE text (Qwen3_5MoeForCausalLM)",
    (False, True): "dense VL (Qwen3_5ForConditionalGeneration)",
    (True, True): "MoE VL (Qwen3_5MoeForConditionalGeneration)",
}

# Fields compared, in the order errors are reported. The family fields hold for a checkpoint
# of the recipe's model at any size; the size fields are the ones a toy or scaled-down
# checkpoint changes (layers, widths, head and expert counts, vocabulary, MTP depth).
FAMILY_FIELDS = (
    "architecture",
    "full_attention_interval",
    "head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "partial_rotary_factor",
    "tie_word_embeddings",
)
SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "layer_types",
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "vocab_size",
    "mtp_num_hidden_layers",
)


# --------------------------------------------------------------------------- source folder


def resolve_source(source: str | os.PathLike) -> Path:
    """A local folder, or a hub id already in the local Hugging Face cache (never downloaded)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise HfCheckpointError(f"{source} is a file; pass the checkpoint folder (the one holding {CONFIG_FILE})")
    text = str(source)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        for var in ("HF_HUB_CACHE", "HF_HOME"):  # the cache a hub id is looked up in
            if (value := os.environ.get(var)) and os.path.exists(value) and not os.path.isdir(value):
                raise HfCheckpointError(
                    f"${var}={value} is a file, so the Hugging Face cache {text} would be looked up in cannot "
                    f"exist; point ${var} at the cache folder (or unset it), or pass the local checkpoint folder"
                )
        try:
            return Path(snapshot_download(text, local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            raise HfCheckpointError(
                f"{text} is not in the local Hugging Face cache and conversions run offline; download it first "
                f"(huggingface-cli download {text}) or pass the local folder"
            ) from None
    raise HfCheckpointError(f"checkpoint folder not found: {source}")


def _read_json(file: Path, what: str) -> dict:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise HfCheckpointError(f"{file} is missing: {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise HfCheckpointError(f"{file} is not valid JSON ({e})") from None
    except OSError as e:
        raise HfCheckpointError(f"{file} cannot be read: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise HfCheckpointError(f"{file} must hold a JSON object")
    return data


# Types of the config.json fields the checks read (absent or null is allowed for each).
_INT_FIELDS = tuple(
    f
    for f in FAMILY_FIELDS + SIZE_FIELDS
    if f not in ("architecture", "partial_rotary_factor", "tie_word_embeddings", "layer_types")
)
MAX_LAYERS = 10_000  # far above any Qwen3.5 model; a larger count is a damaged config

LAYER_TYPES = ("linear_attention", "full_attention")
# Whole-number fields of a vision_config (each >= 1; depth >= 0) the weights check derives shapes from.
_VISION_INT_FIELDS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "in_channels",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "out_hidden_size",
    "num_position_embeddings",
)


def _config_type_problem(file: Path, config: dict, vl: bool) -> str | None:
    """Why the fields of a config.json the checks read cannot be read (a wrong type, a section of a
    VL model missing), or None."""
    if problem := _sections_problem(file, config, vl):
        return problem
    text = config["text_config"] if vl else config
    for name in _INT_FIELDS:
        v = text.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"{file}: {name} is {v!r}; it must be a whole number >= 0"
    layers, every = text.get("num_hidden_layers"), text.get("full_attention_interval")
    for name in ("num_hidden_layers", "mtp_num_hidden_layers"):
        if (text.get(name) or 0) > MAX_LAYERS:
            return f"{file}: {name} is {text[name]}, over {MAX_LAYERS:,}; the config is damaged"
    if every is not None and every < 1:
        return f"{file}: full_attention_interval is {every}; it must be >= 1"
    types = text.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or len(types) > MAX_LAYERS or not all(isinstance(t, str) for t in types)
    ):
        return f"{file}: layer_types must be a list of layer type names"
    if types is not None and (odd := [t for t in types if t not in LAYER_TYPES]):
        return f"{file}: layer_types holds {odd[0]!r}; each layer is one of {', '.join(LAYER_TYPES)}"
    if types is not None and layers is not None and len(types) != layers:
        return (
            f"{file}: layer_types names {len(types)} layers but num_hidden_layers is {layers}; the config is damaged"
        )
    rope = text.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        return f"{file}: rope_parameters is {type(rope).__name__}, not an object"
    for holder in (rope or {}, text):
        factor = holder.get("partial_rotary_factor")
        if factor is not None and (not isinstance(factor, int | float) or isinstance(factor, bool)):
            return f"{file}: partial_rotary_factor is {factor!r}; it must be a number"
    return _vision_type_problem(file, config) if vl else None


def _sections_problem(file: Path, config: dict, vl: bool) -> str | None:
    """The sections a config.json holds as objects (a VL model's text_config and vision_config, which
    transformers would otherwise fill with its defaults), and its top-level flags' types."""
    for name in ("text_config", "vision_config") if vl else ():
        section = config.get(name)
        if not isinstance(section, dict):
            what = (
                "is missing" if name not in config else f"is {type(section).__name__} {section!r:.60}, not an object"
            )
            part = "language model" if name == "text_config" else "vision tower"
            return (
                f"{file}: {name} {what}; model_type {config['model_type']!r} is a vision-language model, whose "
                f"config.json gives its {part}'s settings there; download config.json again with the weights (a "
                "text model's folder has model_type qwen3_5_text or qwen3_5_moe_text)"
            )
    holders = [(config, "")] + ([(config["text_config"], "text_config.")] if vl else [])
    for holder, where in holders:
        q = holder.get("quantization_config")
        if q is not None and not isinstance(q, dict):
            return f"{file}: {where}quantization_config is {q!r}, not an object"
        tied = holder.get("tie_word_embeddings")
        if tied is not None and not isinstance(tied, bool):
            return f"{file}: {where}tie_word_embeddings is {tied!r}; it must be true or false"
    names = config.get("architectures")
    if names is not None and (not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names)):
        return f'{file}: architectures is {names!r}; it must be a list of class names (["Qwen3_5MoeForCausalLM"])'
    return None


def _vision_type_problem(file: Path, config: dict) -> str | None:
    vision = config["vision_config"]
    for name in _VISION_INT_FIELDS:
        v = vision.get(name)
        least = 0 if name == "depth" else 1
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            return f"{file}: vision_config.{name} is {v!r}; it must be a whole number >= {least}"
    if (vision.get("depth") or 0) > MAX_LAYERS:
        return f"{file}: vision_config.depth is {vision['depth']}, over {MAX_LAYERS:,}; the config is damaged"
    return None


@dataclass
class HfFolder:
    """A checked Hugging Face checkpoint folder."""

    path: Path
    config: dict
    shards: list[Path]
    index: dict | None = None
    text_config: dict = field(default_factory=dict)

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def is_moe(self) -> bool:
        return MODEL_TYPES[self.model_type][0]

    @property
    def is_vl(self) -> bool:
        return MODEL_TYPES[self.model_type][1]


def inspect_folder(source: str | os.PathLike, progress: bool = False) -> HfFolder:
    """Read and check ``source``: config, known model type, not a quantized release, every shard whole,
    tokenizer files, and the weights the model its config declares (:mod:`bridge_recipes.hf.weights_check`:
    every tensor there in its shape, the index listing what the shards hold), shard headers only."""
    path = resolve_source(source)
    config = _read_json(path / CONFIG_FILE, "a Hugging Face checkpoint folder holds config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise HfCheckpointError(
            f"{path / CONFIG_FILE}: model_type {model_type!r} is not a Qwen3.5/3.6 model; "
            f"these recipes convert {', '.join(MODEL_TYPES)}"
        )
    moe, vl = MODEL_TYPES[model_type]
    if problem := _config_type_problem(path / CONFIG_FILE, config, vl):
        raise HfCheckpointError(problem)
    text = config["text_config"] if vl else config
    index, weight_map = _weight_files(path)
    # a quantized release is named before its shards are read: downloading them again would not help
    if weight_map and (problem := weights_check.quantized_problem(path, config, text, weight_map, {})):
        raise HfCheckpointError(problem)
    shards = [path / n for n in (sorted(set(weight_map.values())) if weight_map is not None else [SINGLE_FILE])]
    entries, files = _read_shards(path, shards, weight_map, progress)
    absent = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if absent:
        raise HfCheckpointError(
            f"{path} lacks tokenizer file(s) {', '.join(absent)}: the checkpoint's own tokenizer is used for "
            "training and copied into exports; save it beside the weights (tokenizer.save_pretrained)"
        )
    weights = weights_check.Folder(path, config, vl, moe, entries, files, weight_map)
    if problem := weights_check.weights_problem(weights):
        raise HfCheckpointError(problem)
    return HfFolder(path=path, config=config, shards=shards, index=index, text_config=text)


def _weight_files(path: Path) -> tuple[dict | None, dict[str, str] | None]:
    """(the index, its weight_map) of the folder's safetensors, or (None, None) for a single
    model.safetensors; a folder of PyTorch .bin weights, or of shards without their index, is named."""
    if (path / INDEX_FILE).exists():
        index = _read_json(path / INDEX_FILE, "the shard index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HfCheckpointError(f"{path / INDEX_FILE} has no weight_map")
        files = {v if isinstance(v, str) else repr(v) for v in weight_map.values()}  # each shard named once
        bad = [v for v in weight_map.values() if not isinstance(v, str)]
        bad += [v for v in sorted(files) if Path(v).name != v or v in ("", ".", "..")]
        if bad:
            raise HfCheckpointError(
                f"{path / INDEX_FILE}: weight_map names {bad[0]!r} as a shard; shards are file names in {path}"
            )
        return index, weight_map
    if (path / SINGLE_FILE).exists():
        return None, None
    bins = sorted(p.name for p in path.glob("pytorch_model*.bin"))
    if bins or (path / BIN_INDEX_FILE).exists():
        held = f"{len(bins)} file(s) {bins[0]}{' ...' if len(bins) > 1 else ''}" if bins else BIN_INDEX_FILE
        raise HfCheckpointError(
            f"{path} holds PyTorch .bin weights ({held}), no safetensors ({INDEX_FILE} or {SINGLE_FILE}), and the "
            "conversion reads safetensors only; convert them, every tensor kept: python "
            f"scripts/convert_checkpoint.py safetensors --hf {path} --out {path}-safetensors, then pass that folder"
        )
    loose = sorted(p.name for p in path.glob("*.safetensors"))
    if loose:
        raise HfCheckpointError(
            f"{path} holds {len(loose)} safetensors shard(s) ({loose[0]}{' ...' if len(loose) > 1 else ''}) but not "
            f"their index {INDEX_FILE}, which says which tensor is in which shard; download it again"
        )
    raise HfCheckpointError(f"{path} holds no weights: neither {INDEX_FILE} nor {SINGLE_FILE}")


def _read_shards(
    path: Path, shards: list[Path], weight_map: dict[str, str] | None, progress: bool
) -> tuple[dict[str, dict], dict[str, str]]:
    """Every shard there and whole, holding what the index puts in it: (tensor name -> header entry,
    tensor name -> shard file name), from the headers alone."""
    listed: dict[str, list[str]] = {}
    for name, file in (weight_map or {}).items():
        listed.setdefault(file, []).append(name)
    entries: dict[str, dict] = {}
    files: dict[str, str] = {}
    for shard in _progress(shards, "checking shards", progress):
        if not shard.is_file():
            raise HfCheckpointError(f"shard {shard.name} listed in {INDEX_FILE} is missing from {path}")
        header, size = safetensors_header(shard)
        actual = shard.stat().st_size
        if actual != size:
            raise HfCheckpointError(
                f"shard {shard.name} is truncated or damaged: {actual} bytes, its header needs {size}; "
                "download it again"
            )
        if missing := [k for k in listed.get(shard.name, []) if k not in header]:
            raise HfCheckpointError(
                f"shard {shard.name} lacks {len(missing)} tensor(s) the index puts there (e.g. {missing[0]}); "
                "download it again"
            )
        for name, entry in header.items():
            if name != "__metadata__":
                entries[name], files[name] = entry, shard.name
    return entries, files


def _progress(items: list, desc: str, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="shard")


# --------------------------------------------------------------------------- architecture check


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
    ``qwen36_`` alias by its registry entry (:func:`bridge_recipes.recipes.registry.entries`), any other name by
    the longest catalog name it starts with (a ``qwen36_`` name read as its ``qwen35_`` twin, for a size
    with a Qwen3.6 checkpoint in the catalog)."""
    from bridge_recipes.recipes import registry

    entry = registry.entries().get(recipe)
    if entry is not None and entry.model is not None:
        return SPECS[entry.model]
    qwen36 = recipe.startswith(registry.QWEN36_PREFIX)
    base = registry.QWEN35_PREFIX + recipe.removeprefix(registry.QWEN36_PREFIX) if qwen36 else recipe
    hits = [name for name in SPECS if base == name or base.startswith(name + "_")]
    if not hits:
        raise HfCheckpointError(
            f"cannot tell the model of recipe {recipe!r}: its name starts with no catalog model "
            f"({', '.join(sorted(SPECS))}); run_recipe.py --list shows the recipes"
        )
    spec = SPECS[max(hits, key=len)]
    if qwen36 and registry.QWEN36_FAMILY not in spec.checkpoints:
        with_qwen36 = sorted(n for n, s in SPECS.items() if registry.QWEN36_FAMILY in s.checkpoints)
        raise HfCheckpointError(
            f"recipe {recipe!r}: the catalog has no Qwen3.6 checkpoint of {spec.name} (Qwen3.6 sizes: "
            f"{', '.join(with_qwen36)}); use its qwen35_ name, or run_recipe.py --list --filter qwen3.6"
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


# --------------------------------------------------------------------------- atomic output

# a folder written whole or not at all (bridge_recipes.utils.outputs), its refusals as conversion errors
staged_output = functools.partial(outputs.staged_output, error=HfCheckpointError)


def refuse_overlap(
    out: str | os.PathLike,
    *inputs: tuple[str, str | os.PathLike | None],
    overwrite: bool = False,
    what: str | None = None,
) -> None:
    """--out checked before any work, as :func:`staged_output` will: not, holding or inside an input
    folder, not the current folder, and (with ``overwrite``) a folder only a conversion wrote.
    ``what``: how a folder written beside --out is named (see :func:`outputs.folder_output_problem`)."""
    if problem := outputs.folder_output_problem(out, overwrite, inputs=inputs, what=what):
        raise HfCheckpointError(problem)


# --------------------------------------------------------------------------- conversions


def _need_gpu(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise HfCheckpointError(
            f"the checks passed, but {what} needs a CUDA GPU (Megatron-Bridge builds the model with "
            "Transformer Engine); run it on a GPU machine"
        )


def _quiet_megatron_import() -> None:
    """Megatron-Bridge first: imported after cuDNN has been used in the process, its Transformer Engine
    attention fails to initialize."""
    import megatron.bridge  # noqa: F401


def _conversion_context():
    """A one-process distributed context when none is running (a conversion builds a Megatron model)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return contextlib.nullcontext()
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    return temporary_distributed_context(backend="gloo")


def _no_apex_fusion(provider: Any) -> None:
    """gradient_accumulation_fusion needs APEX's fused kernel, also when the model is built only to
    convert: off when APEX is absent."""
    from bridge_recipes.hardware.installed import apex_grad_fusion_available

    if not apex_grad_fusion_available():
        provider.gradient_accumulation_fusion = False


def convert_hf_to_megatron(src: Path, out: Path) -> None:
    """Megatron-Bridge's import (``AutoBridge.import_ckpt``'s steps, with APEX-free model building):
    the HF weights through the registered Qwen3.5 bridge into a torch_dist checkpoint at ``out``."""
    _need_gpu("the import")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(src))
    with _conversion_context():
        provider = bridge.to_megatron_provider(load_weights=True)
        _no_apex_fusion(provider)
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        bridge.save_megatron_model(model, str(out), hf_tokenizer_path=str(src), low_memory_save=True)


def convert_megatron_to_hf(megatron: Path, template: Path, out: Path) -> None:
    """Megatron-Bridge's export (``AutoBridge.export_ckpt``'s steps): the newest ``iter_*`` of
    ``megatron`` into safetensors at ``out``, with config and tokenizer copied from ``template``."""
    _need_gpu("the export")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(template))
    with _conversion_context():
        model = bridge.load_megatron_model(
            str(megatron), mp_overrides={"gradient_accumulation_fusion": False}, wrap_with_ddp=False
        )
        bridge.save_hf_pretrained(model, str(out), source_path=str(template), show_progress=True)


def lora_settings(megatron: Path) -> dict[str, Any] | None:
    """The ``peft`` section of the run config saved with ``megatron``'s newest checkpoint when that
    run trained LoRA adapters, else None (a full-parameter checkpoint)."""
    from bridge_recipes.training.saved_runs import CheckpointMetadataError, latest_run_config

    try:
        found = latest_run_config(megatron)
    except CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    peft = (found[1].get("peft") if found else None) or {}
    return peft if "LoRA" in str(peft.get("_target_", "")) else None


def lora_from_settings(settings: dict[str, Any]) -> Any:
    """Megatron-Bridge's ``LoRA`` with the saved run's fields (those its constructor takes)."""
    import dataclasses

    from megatron.bridge.peft.lora import LoRA

    names = {f.name for f in dataclasses.fields(LoRA) if f.init}
    return LoRA(**{k: v for k, v in settings.items() if k in names and v is not None})


def convert_lora_to_hf(megatron: Path, template: Path, out: Path, adapter_out: Path | None = None) -> None:
    """A LoRA run's newest checkpoint (adapter weights only, as Megatron-Bridge saves PEFT runs)
    merged into the base weights of ``template`` (the HF folder the run started from), saved as a
    plain HF folder: the base model built through the registered bridge with the run's LoRA
    wrapped around it, the adapters loaded from the checkpoint, then ``save_hf_pretrained``, which
    merges each adapter into its base weight. ``adapter_out``: then the adapters alone as a PEFT
    folder there (:func:`bridge_recipes.hf.released.write_adapter`); its failure is an
    :class:`AdapterExportError`."""
    _need_gpu("the export")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(template))
    with _conversion_context():
        model, lora = build_lora_model(bridge, megatron, lora_settings(megatron) or {})
        bridge.save_hf_pretrained(model, str(out), source_path=str(template), merge_adapter_weights=True)
        if adapter_out is not None:
            from bridge_recipes.hf.released import write_adapter

            try:
                write_adapter(
                    bridge.export_adapter_weights(model, cpu=True, show_progress=False),
                    adapter_out,
                    rank=lora.dim,
                    alpha=lora.alpha,
                    base_model=str(template),
                )
            except Exception as e:
                raise AdapterExportError(f"{type(e).__name__}: {e}") from e


def build_lora_model(
    bridge: Any, megatron: Path, settings: dict[str, Any], overrides: dict[str, Any] | None = None
) -> tuple[list[Any], Any]:
    """The base model of ``bridge`` (its Hugging Face weights loaded) with the LoRA of ``settings``
    wrapped around it and the adapters of ``megatron``'s newest checkpoint loaded; (model, lora).
    ``overrides``: model config fields set before it is built. Runs inside a distributed context."""
    from megatron.bridge.training.checkpointing import (
        _generate_model_state_dict,
        apply_peft_adapter_filter_to_state_dict,
    )
    from megatron.core import dist_checkpointing

    from bridge_recipes.training.saved_runs import iteration_folder, latest_iteration

    iteration = latest_iteration(megatron)
    if iteration is None:
        raise HfCheckpointError(f"{megatron} has no latest_checkpointed_iteration.txt naming its newest save")
    lora = lora_from_settings(settings)
    provider = bridge.to_megatron_provider(load_weights=True)
    _no_apex_fusion(provider)
    for name, value in (overrides or {}).items():
        setattr(provider, name, value)
    provider.finalize()
    provider.register_pre_wrap_hook(lambda chunks: lora(chunks, training=False))
    model = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=False
    )
    wanted = apply_peft_adapter_filter_to_state_dict(_generate_model_state_dict(model, {}), lora)
    loaded = dist_checkpointing.load(wanted, str(iteration_folder(megatron, iteration)))
    key = "model" if "model" in loaded else next(k for k in loaded if k.startswith("model"))
    if not loaded[key]:
        raise HfCheckpointError(f"{megatron} holds no LoRA adapter weights for this model")
    load_adapters(model[0], loaded[key])
    return model, lora


def load_adapters(module: Any, adapters: dict[str, Any]) -> None:
    """Load a LoRA run's adapter weights into ``module`` (the model, or Megatron's Float16Module
    around it, whose ``load_state_dict`` returns nothing): every saved weight must land in a
    parameter of the model; the base weights it does not carry stay as they are."""
    import torch

    while isinstance(getattr(module, "module", None), torch.nn.Module):
        module = module.module
    result = module.load_state_dict(adapters, strict=False)
    if result.unexpected_keys:
        raise HfCheckpointError(f"adapter weights with no place in the model: {sorted(result.unexpected_keys)[:5]}")


def is_megatron_checkpoint(folder: Path) -> bool:
    return (folder / "latest_checkpointed_iteration.txt").is_file() or any(folder.glob("iter_*"))


def _convert_released(src: Path, out: Path) -> None:
    _need_gpu("the import")
    _quiet_megatron_import()
    from bridge_recipes.hf import released_bridge

    released_bridge.convert_to_megatron(inspect_folder(src), out, context=_conversion_context, prepare=_no_apex_fusion)


def import_checkpoint(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    recipe: str | None = None,
    expected: dict[str, Any] | None = None,
    scaled: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    text_model: bool | None = None,
    convert: Callable[[Path, Path], None] | None = None,
) -> Path:
    """Check ``source`` against ``recipe`` (or ``expected`` fields) and convert it into ``out``.
    ``text_model`` (default: whether ``recipe`` is a text recipe): a released VL folder's
    language model and MTP layer are imported as the text model, its vision tower left out."""
    refuse_overlap(out, ("--hf", source), overwrite=overwrite)
    folder = inspect_folder(source, progress=progress)
    if text_model is None:
        text_model = recipe is not None and not spec_for_recipe(recipe).is_vl
    as_text = takes_language_model(folder, not text_model)
    if recipe is not None:
        if problems := check_folder_for_recipe(folder, recipe, scaled=scaled):
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    elif expected is not None:
        if problems := check_against(found_fields(folder, as_text=as_text), expected, scaled=scaled):
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    if convert is None:
        convert = _convert_released if as_text else convert_hf_to_megatron
    with staged_output(out, overwrite) as tmp:
        convert(folder.path, tmp)
        if not is_megatron_checkpoint(tmp):
            raise HfCheckpointError(f"the conversion wrote no Megatron checkpoint into {tmp}")
    return Path(out)


def _fix_hint(scaled: bool) -> str:
    if scaled:
        return "The family fields must match even for a scaled-down checkpoint; pick the recipe of this model."
    return (
        "Pick the recipe of this checkpoint's model, or pass --scaled for a toy or scaled-down checkpoint "
        "(only the family fields are compared)."
    )


def saved_model_is_vl(megatron: Path) -> bool | None:
    """Whether the newest checkpoint of ``megatron`` holds a VL model (its saved model config has a
    vision tower), or None when no run config says."""
    from bridge_recipes.training.saved_runs import CheckpointMetadataError, latest_run_config

    try:
        found = latest_run_config(megatron)
    except CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    model = (found[1].get("model") if found else None) or {}
    return ("vision_config" in model) if model else None


def _export_released(megatron: Path, template: Path, out: Path, *, text_only: bool, adapter_out: Path | None) -> None:
    _need_gpu("the export")
    _quiet_megatron_import()
    from bridge_recipes.hf import released_bridge

    settings = lora_settings(megatron)
    released_bridge.export(
        inspect_folder(template),
        megatron,
        out,
        context=_conversion_context,
        lora_model=None if settings is None else (lambda bridge: build_lora_model(bridge, megatron, settings)),
        text_only=text_only,
        adapter_out=adapter_out,
    )


# --------------------------------------------------------------------------- the run a checkpoint records
# An export names a recipe and a Hugging Face template; the checkpoint folder records the run that
# saved it: run_identity.json (its recipe, model architecture, starting weights and LoRA settings;
# bridge_recipes.training.saved_runs) or, in a folder saved without one, the newest run_config.yaml.
# saved_run_problem names each way the recipe and the template do not fit that run: a recipe of
# another model family, a LoRA recipe for a full fine-tuning checkpoint or the reverse, a template of
# another shape, and for a LoRA run a template holding other weights than those it started from (the
# export merges the adapters into the template's weights).

# The template's config.json field (as found_fields reads it) of each recorded architecture field.
TEMPLATE_FIELD_OF = {m: hf for hf, m in MODEL_FIELD_OF.items() if m in saved_runs.ARCHITECTURE_FIELDS}
START_FOLDER = "Hugging Face folder"  # the kind of starting weights a template can be compared with


def iteration_folder_error(megatron: Path) -> HfCheckpointError | None:
    """One iteration folder of a run given as --megatron: the export reads the run's folder (its newest step)."""
    if saved_runs.iteration_of(megatron) is None or not (megatron.parent / saved_runs.TRACKER).is_file():
        return None
    return HfCheckpointError(
        f"--megatron {megatron} is one iteration folder of a run; pass the run's folder, --megatron {megatron.parent} "
        f"(the export reads the step its {saved_runs.TRACKER} names)"
    )


def tracker_error(megatron: Path) -> HfCheckpointError | None:
    """The error for a checkpoint whose tracker names no saved step (or saved steps with no tracker)."""
    problem = saved_runs.tracker_problem(megatron)
    return HfCheckpointError(f"--megatron {megatron}: {problem}") if problem else None


def recorded_run(megatron: Path) -> tuple[dict, str]:
    """(what the run that saved ``megatron`` recorded, the file it comes from): its identity, else the
    architecture and LoRA settings of its newest run_config.yaml; ({}, "") when neither is there."""
    try:
        identity = saved_runs.read_identity(megatron)
        if identity is not None:
            return identity, saved_runs.IDENTITY
        found = saved_runs.latest_run_config(megatron)
    except saved_runs.CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    if not found or not found[1]:
        return {}, ""
    model = found[1].get("model") or {}
    record = saved_runs.identity_of_run_config(found[1])
    record["model"] = {f: model[f] for f in saved_runs.ARCHITECTURE_FIELDS if f in model}
    return record, saved_runs.RUN_CONFIG


def _family_problem(saved_recipe: str, recipe: str) -> str | None:
    """``recipe`` for a model of another family than the recipe the run was (MoE or dense, attention
    pattern, head sizes); a VL recipe and its text model are of one family."""
    try:
        saved, given = spec_for_recipe(saved_recipe), spec_for_recipe(recipe)
    except HfCheckpointError:
        return None
    a, b = expected_from_spec(saved), expected_from_spec(given)
    a["architecture"], b["architecture"] = (
        FAMILY_NAMES[(saved.is_moe, False)],
        FAMILY_NAMES[(given.is_moe, False)],
    )
    differ = [f"{f} {a[f]!r} -> {b[f]!r}" for f in FAMILY_FIELDS if a[f] != b[f]]
    if not differ:
        return None
    return f"--recipe {recipe} is of another model family than the run's recipe {saved_recipe}: {'; '.join(differ)}"


def _task_problem(record: dict, recipe: str) -> str | None:
    """A LoRA recipe given for the checkpoint of a full fine-tuning recipe's run, or the reverse (both
    recipes known; a run of a recipe given ``--peft`` keeps its recipe's name and is not compared)."""
    from bridge_recipes.recipes import registry

    try:
        saved, given = registry.find(record["recipe"]).meta.task, registry.find(recipe).meta.task
    except registry.UnknownRecipe:  # a catalog model name, or a recipe no longer listed: no task
        return None
    if saved == given or {saved, given} != {"sft", "peft"}:
        return None
    kind = "a LoRA recipe" if given == "peft" else "a full fine-tuning recipe"
    return (
        f"--recipe {recipe} is {kind}, and the run's recipe {record['recipe']} was not: its checkpoint holds "
        f"{saved_runs.lora_words(record.get('lora'))}"
    )


def _shape_problems(record: dict, folder: HfFolder) -> list[str]:
    """The recorded architecture against the template's config.json: the export writes the weights in
    the template's shape."""
    found, out, model = found_fields(folder), [], record.get("model") or {}
    for key, name in TEMPLATE_FIELD_OF.items():
        if key not in model:  # not recorded: not compared
            continue
        saved, have = model[key], found.get(name)
        if key == "num_moe_experts":
            saved, have = saved or None, have or None  # 0 and None: a dense model
        elif saved is None or (have is None and key == "ffn_hidden_size"):  # a MoE config has no dense FFN
            continue
        if saved != have:
            out.append(f"model.{key}: the run has {saved}, --hf-template's config.json {name} is {have}")
    return out


def _start_problem(record: dict, folder: HfFolder) -> str | None:
    """A LoRA run's template holding other weights than those the run started from."""
    start = record.get("start")
    if record.get("lora") is None or not start or start.get("kind") != START_FOLDER or not start.get("weights_key"):
        return None
    key = saved_runs.weights_key(sorted(folder.path.glob("*.safetensors")), folder.path)
    if key is None or key == start["weights_key"]:
        return None
    return (
        f"--hf-template {folder.path} holds other weights (weights key {key[:12]}) than the run started from, "
        f"{saved_runs.start_words(start)}: the adapters were trained on those, and the export merges them into "
        "the template's"
    )


def saved_run_problem(megatron: Path, folder: HfFolder, recipe: str | None) -> HfCheckpointError | None:
    """The error naming how ``recipe`` and the template ``folder`` do not fit the run that saved
    ``megatron`` (see the comment above), or None when they fit or the folder records no run."""
    record, source = recorded_run(megatron)
    if not record:
        return None
    saved_recipe = record.get("recipe")
    problems = []
    if recipe and saved_recipe and recipe != saved_recipe:
        problems += [_family_problem(saved_recipe, recipe), _task_problem(record, recipe)]
    problems += _shape_problems(record, folder)
    problems.append(_start_problem(record, folder))
    if not (problems := [p for p in problems if p]):
        return None
    start = record.get("start") or {}
    fix = "Pass the run's recipe" + (f" (--recipe {saved_recipe})" if saved_recipe else "")
    fix += " and the Hugging Face folder it started from as --hf-template"
    fix += f" ({start['path']})" if start.get("kind") == START_FOLDER else ""
    lines = "\n  ".join(problems)
    return HfCheckpointError(
        f"--megatron {megatron} was saved by a run that --recipe and --hf-template do not fit (its {source}):\n"
        f"  {lines}\n{fix}."
    )


def _export_inputs(megatron: Path, template: str | os.PathLike, recipe: str | None, progress: bool) -> HfFolder:
    """The export's checkpoint folder checked (a run's folder whose tracker names a saved step) and its
    template read and checked against the run the checkpoint records; the template's folder."""
    if error := iteration_folder_error(megatron):
        raise error
    if not megatron.is_dir() or not is_megatron_checkpoint(megatron):
        raise HfCheckpointError(
            f"--megatron {megatron} is not a Megatron checkpoint folder (no latest_checkpointed_iteration.txt "
            "or iter_* inside); pass the run's checkpoint.save folder or an imported checkpoint"
        )
    if error := tracker_error(megatron):
        raise error
    folder = inspect_folder(template, progress=progress)
    if error := saved_run_problem(megatron, folder, recipe):
        raise error
    return folder


def export_checkpoint(
    megatron: str | os.PathLike,
    template: str | os.PathLike,
    out: str | os.PathLike,
    *,
    recipe: str | None = None,
    scaled: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    text_model: bool | None = None,
    text_only: bool = False,
    adapter: bool = True,
    convert: Callable[[Path, Path, Path], None] = convert_megatron_to_hf,
    lora_convert: Callable[..., None] = convert_lora_to_hf,
    released_convert: Callable[..., None] = _export_released,
) -> Path:
    """Export the Megatron checkpoint ``megatron`` to a HF folder shaped like ``template``; a LoRA
    run's checkpoint (adapters only) is merged into ``template``'s base weights and, unless not
    ``adapter``, also written alone as a PEFT folder beside ``out``
    (:func:`bridge_recipes.hf.released.adapter_folder`).

    A text model trained from a released VL ``template`` (``text_model``; default: what the
    checkpoint's saved config says, else whether ``recipe`` is a text recipe) comes back in the
    released form: the template's vision tower and config unchanged, its MTP layer present
    (:func:`bridge_recipes.hf.released.write_export`); ``text_only`` asks for the text form."""
    from bridge_recipes.hf.released import TEXT_ONLY_OPTION, adapter_folder

    inputs = (("--megatron", megatron), ("--hf-template", template))
    refuse_overlap(out, *inputs, overwrite=overwrite)
    megatron = Path(megatron).expanduser()
    folder = _export_inputs(megatron, template, recipe, progress)
    if recipe is not None:
        problems = check_folder_for_recipe(folder, recipe, scaled=scaled)
        if problems:
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    if text_model is None:
        saved_vl = saved_model_is_vl(megatron)
        if saved_vl is not None:
            text_model = not saved_vl
        else:
            text_model = recipe is not None and not spec_for_recipe(recipe).is_vl
    released = takes_language_model(folder, not text_model)
    if text_only and folder.is_vl and not released:
        raise HfCheckpointError(
            f"{TEXT_ONLY_OPTION}: {megatron} holds a VL model (vision tower included); its export is the VL form. "
            "The text form is for a text recipe trained from a released folder"
        )
    lora = lora_settings(megatron) is not None
    adapter_out = adapter_folder(out) if lora and adapter else None
    if adapter_out is not None:
        refuse_overlap(
            adapter_out, *inputs, overwrite=overwrite, what=f"the adapter folder {adapter_out} beside --out"
        )
    staged_adapter = staged_output(adapter_out, overwrite) if adapter_out is not None else contextlib.nullcontext()
    adapter_failure = None
    with staged_output(out, overwrite) as tmp:
        try:  # the adapter folder is written after the merged one: its failure keeps the merged folder
            with staged_adapter as tmp_adapter:
                if released:
                    released_convert(megatron, folder.path, tmp, text_only=text_only, adapter_out=tmp_adapter)
                elif lora:  # adapters only: merged into the template's base weights
                    lora_convert(megatron, folder.path, tmp, tmp_adapter)
                else:
                    convert(megatron, folder.path, tmp)
        except AdapterExportError as e:
            adapter_failure = e
        if not list(tmp.glob("*.safetensors")):
            raise HfCheckpointError(f"the export wrote no safetensors into {tmp}")
    if adapter_failure is not None:
        raise AdapterExportError(
            f"the merged export is complete in {out}, but the adapter-only folder {adapter_out} could not be "
            f"written ({adapter_failure})"
        ) from adapter_failure.__cause__
    return Path(out)


# --------------------------------------------------------------------------- runner cache


def cache_root() -> Path:
    """$QWEN35_RECIPES_CACHE/hf_import, else ~/.cache/qwen35_recipes/hf_import."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "qwen35_recipes") / "hf_import"


def cache_problem(folder: HfFolder | None = None, text_model: bool = False) -> str | None:
    """Why the conversion cache (:func:`cache_root`) cannot be created or written, or None: ``$QWEN35_RECIPES_CACHE``
    (or a folder on the way to it) naming a file, or a folder without write access (tried by making a
    folder there: a pseudo file system such as /proc takes none, whatever its permissions say; no matter when
    ``folder``'s conversion is there already). Checked at the dry run; otherwise the launch stops at
    the conversion, on the GPU machine."""
    root, given = cache_root(), os.environ.get(CACHE_ENV)
    key = cache_key(folder, text_model) if folder is not None else None
    if key is not None and (root / key).is_dir() and is_megatron_checkpoint(root / key):
        return None
    named = f"${CACHE_ENV}={given}" if given else f"the default cache {root.parent} (${CACHE_ENV} unset)"
    fix = f"point ${CACHE_ENV} at a folder the run can write (it creates {root.name}/ inside)"
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "not a folder"
        return f"{named}: {existing} is {what}, so the converted checkpoint cannot be kept in {root}; {fix}"
    if not os.access(existing, os.W_OK | os.X_OK) or not _can_make_folder(existing):
        return f"{named}: {existing} cannot be written, so the converted checkpoint cannot be kept in {root}; {fix}"
    return None


def _can_make_folder(parent: Path) -> bool:
    """Whether a folder can be made in ``parent`` (one is made and removed): file permissions alone do not
    tell, e.g. for root on a pseudo file system such as /proc, which takes no new folder."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=parent))
    except OSError:
        return False
    return True


def cache_key(folder: HfFolder, text_model: bool = False) -> str:
    """sha256 over config.json, the shard index, each shard's name, size and mtime, and the tokenizer
    files: a changed or replaced file gives a new key (a conversion is never reused for other weights).
    A released VL folder converted for a text recipe (``text_model``: its language model alone) has
    a key of its own beside its VL conversion."""
    from importlib.metadata import version

    h = hashlib.sha256()
    h.update(f"key-v{CACHE_KEY_VERSION} megatron-bridge {version('megatron-bridge')}\n".encode())
    if takes_language_model(folder, not text_model):
        h.update(b"form: language model of a released VL folder\n")
    for name in (CONFIG_FILE, INDEX_FILE, *TOKENIZER_FILES):
        file = folder.path / name
        h.update(f"{name}\n".encode())
        h.update(file.read_bytes() if file.is_file() else b"<absent>")
    for shard in folder.shards:
        st = shard.stat()
        h.update(f"{shard.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def cached_import(
    folder: HfFolder,
    *,
    progress: bool = True,
    text_model: bool = False,
    convert: Callable[[Path, Path], None] | None = None,
) -> tuple[Path, bool]:
    """The cache folder holding ``folder``'s Megatron conversion (for a text model: see
    :func:`import_checkpoint`), converting first when absent; (path, True when this call converted)."""
    target = cache_root() / cache_key(folder, text_model)
    if target.is_dir() and is_megatron_checkpoint(target):
        return target, False
    import_checkpoint(folder.path, target, overwrite=True, progress=progress, text_model=text_model, convert=convert)
    return target, True
