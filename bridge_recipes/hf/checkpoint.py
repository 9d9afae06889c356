"""A Hugging Face checkpoint folder, read and checked, and what every conversion shares.

- :func:`inspect_folder` reads a local Hugging Face folder (``config.json``, the safetensors
  shards and their index, the tokenizer files) and checks that every shard the index lists is
  there and whole (a safetensors file's header gives the byte length it must have), and that the
  weights are the model its config declares, not a quantized release (:mod:`bridge_recipes.hf.weights_check`);
  :class:`HfFolder` is the folder it checked.
- :func:`staged_output` / :func:`refuse_overlap`: an output folder written whole or not at all;
  :func:`is_megatron_checkpoint` and the GPU, distributed-context and APEX helpers every conversion uses.

The rest of the Hugging Face road builds on this module: the architecture check against a recipe
(:mod:`bridge_recipes.hf.architecture`), the import and its cache (:mod:`bridge_recipes.hf.importer`),
the export (:mod:`bridge_recipes.hf.exporter`) and LoRA runs' adapters (:mod:`bridge_recipes.hf.adapters`).
Every bad input raises :class:`~bridge_recipes.hf.files.HfCheckpointError` with a message that names
the problem and the fix; the command line turns it into exit status 2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_recipes.hf import weights_check
from bridge_recipes.hf.files import (
    BIN_INDEX_FILE,
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    HfCheckpointError,
    safetensors_header,
)
from bridge_recipes.utils import outputs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

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


# --------------------------------------------------------------------------- conversion helpers


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


def is_megatron_checkpoint(folder: Path) -> bool:
    return (folder / "latest_checkpointed_iteration.txt").is_file() or any(folder.glob("iter_*"))
