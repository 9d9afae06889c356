"""Released Qwen3.5/3.6 folders (the vision-language form people download) in text recipes.

A released folder's ``config.json`` names ``Qwen3_5(Moe)ForConditionalGeneration`` with a
``text_config`` and a ``vision_config``; its weights hold the language model
(``model.language_model.*``, ``lm_head.*``), the MTP layer (``mtp.*``) and the vision tower
(``model.visual.*``). A text recipe trains the language model and its MTP layer; the vision tower
never enters training memory and goes back into the export byte for byte, with the config,
tokenizer, chat template, generation and processor files, so the export is the form that came in.

- :func:`parts` / :func:`released_problem`: what a folder's weights hold, and why a VL folder
  cannot serve a text recipe (no vision tower, no MTP layer).
- :func:`text_config`: the text-form ``config.json`` (``Qwen3_5(Moe)ForCausalLM``) of a VL folder.
- :func:`write_export`: exported language-model and MTP tensors plus the input's vision tensors,
  in the input's shard layout (the VL form) or, on request, as a text-form folder.
- :func:`write_adapter`: a LoRA run's adapter weights (Hugging Face names) as a PEFT folder.
- :func:`write_lora_exports`: both folders of a LoRA run, the merged one first.

Standard library at import; torch and safetensors inside the writers. The folder checks
(:mod:`bridge_recipes.hf.checkpoint`) and the conversions (:mod:`bridge_recipes.hf.importer`,
:mod:`bridge_recipes.hf.exporter`) build on this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_recipes.hf.files import (
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    AdapterExportError,
    HfCheckpointError,
    safetensors_header,
)

# A checked folder (:class:`bridge_recipes.hf.checkpoint.HfFolder`: path, config, text_config, index,
# is_moe, is_vl); that module builds on this one.
HfFolder = Any

VISION_PREFIX = "model.visual."
VL_LANGUAGE_PREFIX = "model.language_model."
TEXT_LANGUAGE_PREFIX = "model."
MTP_PREFIX = "mtp."
HEAD_PREFIX = "lm_head."
# The text-form class and model_type of each family (mixture of experts or not).
TEXT_ARCHITECTURES = {True: "Qwen3_5MoeForCausalLM", False: "Qwen3_5ForCausalLM"}
TEXT_MODEL_TYPES = {True: "qwen3_5_moe_text", False: "qwen3_5_text"}
# Files of a released folder besides its weights that an export carries over (those present).
ARTIFACT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
IMAGE_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_SUFFIX = "-adapter"
TEXT_ONLY_OPTION = "--export-text-only"


def adapter_folder(export: str | os.PathLike) -> Path:
    """Where a LoRA run's adapter-only export goes: beside the merged export ``export``."""
    path = Path(export).expanduser()
    return path.with_name(path.name + ADAPTER_SUFFIX)


# --------------------------------------------------------------------------- what a folder holds


def weight_layout(folder: HfFolder) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or the single shard's header)."""
    if folder.index is not None:
        return dict(folder.index["weight_map"])
    header, _ = safetensors_header(folder.path / SINGLE_FILE)
    return {name: SINGLE_FILE for name in header if name != "__metadata__"}


def kind_of(name: str) -> str:
    """``vision``, ``mtp`` or ``language`` for a tensor name of a released folder."""
    if name.startswith(VISION_PREFIX):
        return "vision"
    if name.startswith(MTP_PREFIX):
        return "mtp"
    return "language"


@dataclass(frozen=True)
class Parts:
    """Tensor counts and bytes of each part of a folder's weights."""

    language: int
    mtp: int
    vision: int
    vision_bytes: int
    mtp_layers: set[int]

    def describe(self) -> str:
        return (
            f"language model {self.language} tensors, MTP {self.mtp} tensors, "
            f"vision tower {self.vision} tensors ({self.vision_bytes / 2**20:.1f} MiB)"
        )


def parts(folder: HfFolder) -> Parts:
    """What ``folder``'s weights hold, read from the shard headers (no tensor is loaded)."""
    counts = {"language": 0, "mtp": 0, "vision": 0}
    vision_bytes, mtp_layers = 0, set()
    by_file: dict[str, list[str]] = {}
    for name, file in weight_layout(folder).items():
        counts[kind_of(name)] += 1
        by_file.setdefault(file, []).append(name)
        if m := re.match(r"mtp\.layers\.(\d+)\.", name):
            mtp_layers.add(int(m.group(1)))
    for file, names in by_file.items():
        vision = [n for n in names if kind_of(n) == "vision"]
        if vision:
            header, _ = safetensors_header(folder.path / file)
            vision_bytes += sum(header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in vision)
    return Parts(counts["language"], counts["mtp"], counts["vision"], vision_bytes, mtp_layers)


def declared_mtp_layers(folder: HfFolder) -> int:
    return int(folder.text_config.get("mtp_num_hidden_layers") or 0)


def released_problem(folder: HfFolder) -> str | None:
    """Why the VL folder ``folder`` cannot start a text recipe (its vision tower or MTP layer is
    missing), or None; None for a text-form folder."""
    if not folder.is_vl:
        return None
    found = parts(folder)
    where = f"{folder.path} ({folder.config.get('architectures', ['a VL model'])[0]})"
    fix = (
        "download the folder again whole, or pass a text-form folder "
        "(scripts/convert_checkpoint.py toy --text-only makes a toy of that form)"
    )
    if found.vision == 0:
        return (
            f"{where} holds no vision tower weights ({VISION_PREFIX}*): a released folder has them, and the "
            f"export gives them back unchanged; {fix}"
        )
    declared = declared_mtp_layers(folder)
    if declared == 0:
        return (
            f"{where}: text_config.mtp_num_hidden_layers is {declared}; a released folder has its MTP layer "
            f"(text_config.mtp_num_hidden_layers >= 1 and {MTP_PREFIX}* weights), which serving with speculative "
            f"decoding needs in the export; {fix}"
        )
    missing = [i for i in range(declared) if i not in found.mtp_layers]
    if found.mtp == 0 or missing:
        return (
            f"{where}: text_config.mtp_num_hidden_layers is {declared} but the weights lack MTP layer(s) "
            f"{missing or list(range(declared))} ({MTP_PREFIX}layers.N.*); {fix}"
        )
    return None


def text_config(folder: HfFolder) -> dict[str, Any]:
    """The text-form ``config.json`` of the VL folder ``folder``: its ``text_config`` with the
    text class and model type, and the top-level tied-embeddings flag and dtype."""
    out = dict(folder.text_config)
    out["architectures"] = [TEXT_ARCHITECTURES[folder.is_moe]]
    out["model_type"] = TEXT_MODEL_TYPES[folder.is_moe]
    out["tie_word_embeddings"] = bool(folder.config.get("tie_word_embeddings", out.get("tie_word_embeddings", False)))
    if "dtype" in folder.config and "dtype" not in out:
        out["dtype"] = folder.config["dtype"]
    return out


def text_name(name: str) -> str:
    """A released folder's tensor name in the text form (``model.language_model.X`` -> ``model.X``)."""
    if name.startswith(VL_LANGUAGE_PREFIX):
        return TEXT_LANGUAGE_PREFIX + name[len(VL_LANGUAGE_PREFIX) :]
    return name


# --------------------------------------------------------------------------- export


def independent(tensor: Any, seen: set[int]) -> Any:
    """``tensor`` on the CPU, contiguous and owning its memory alone among the tensors already
    passed with the same ``seen`` set: Megatron-Bridge hands one tensor to several names (one
    LoRA A for a fused projection's parts) and slices of one tensor to others (a fused B split
    per projection), which safetensors refuses to save side by side."""
    import torch

    out = tensor.detach().to("cpu")
    storage = out.untyped_storage()
    whole = out.is_contiguous() and out.storage_offset() == 0 and storage.nbytes() == out.numel() * out.element_size()
    if not whole or storage.data_ptr() in seen:
        out = out.clone(memory_format=torch.contiguous_format)
    if out.numel():
        seen.add(out.untyped_storage().data_ptr())
    return out


_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _source_dtypes(folder: HfFolder, layout: dict[str, str]) -> dict[str, str]:
    """Tensor name -> torch dtype name, as the input's shard headers store each tensor."""
    out: dict[str, str] = {}
    for file in sorted(set(layout.values())):
        header, _ = safetensors_header(folder.path / file)
        for name, entry in header.items():
            if name != "__metadata__" and entry.get("dtype") in _DTYPES:
                out[name] = _DTYPES[entry["dtype"]]
    return out


@dataclass(frozen=True)
class ExportReport:
    """What :func:`write_export` wrote."""

    form: str  # "vl" or "text"
    trained: int  # language-model and MTP tensors from the run
    mtp: int
    vision: int  # vision tensors copied from the input
    files: list[str]


def write_export(
    tensors: Iterable[tuple[str, Any]], source: HfFolder, out: str | os.PathLike, *, text_only: bool = False
) -> ExportReport:
    """Write the fine-tuned ``tensors`` (released names: ``model.language_model.*``, ``lm_head.*``,
    ``mtp.*``) into ``out`` as the released folder ``source`` is laid out: each in the shard and
    dtype the input has it, the vision tensors copied from the input unchanged, the input's
    config and tokenizer/template/generation/processor files copied. ``text_only``: the text
    form instead (``model.*`` names, no vision tower, :func:`text_config`). Every language-model
    and MTP tensor of the input must come from ``tensors`` and nothing else may: a missing or
    unknown one is an HfCheckpointError (an export without its MTP layer is refused by vLLM)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layout = weight_layout(source)
    dtypes = _source_dtypes(source, layout)
    rename = text_name if text_only else (lambda n: n)
    wanted = {name: file for name, file in layout.items() if kind_of(name) != "vision" or not text_only}
    remaining: dict[str, set[str]] = {}
    for name, file in wanted.items():
        remaining.setdefault(file, set()).add(name)
    buffers: dict[str, dict[str, Any]] = {file: {} for file in remaining}
    written: list[str] = []

    seen: set[int] = set()

    def put(name: str, tensor: Any) -> None:
        file = wanted[name]
        buffers[file][rename(name)] = independent(tensor, seen)
        remaining[file].discard(name)
        if not remaining[file]:
            save_file(buffers.pop(file), str(out / file), metadata={"format": "pt"})
            written.append(file)

    vision = 0
    if not text_only:
        for file in sorted({f for n, f in layout.items() if kind_of(n) == "vision"}):
            with safe_open(str(source.path / file), framework="pt") as f:
                for name in f.keys():
                    if kind_of(name) == "vision":
                        put(name, f.get_tensor(name))  # as stored: same dtype, same bytes
                        vision += 1
    trained = mtp = 0
    for name, tensor in tensors:
        if name not in wanted or kind_of(name) == "vision":
            raise HfCheckpointError(
                f"the export produced tensor {name!r}, which {source.path} does not hold as a language-model or "
                "MTP tensor: the trained model is not of this folder's architecture"
            )
        if name in dtypes:
            tensor = tensor.to(getattr(torch, dtypes[name]))
        put(name, tensor)
        trained += 1
        mtp += kind_of(name) == "mtp"
    missing = sorted(n for names in remaining.values() for n in names)
    if missing:
        raise HfCheckpointError(
            f"the export lacks {len(missing)} tensor(s) of {source.path} (e.g. {missing[0]}); "
            "the trained model does not cover the folder's language model and MTP layer"
        )
    if source.index is not None:
        index = {
            "metadata": {"total_size": sum((out / f).stat().st_size for f in set(wanted.values()))},
            "weight_map": {rename(n): f for n, f in sorted(wanted.items())},
        }
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    copy_artifacts(source, out, text_only=text_only)
    return ExportReport("text" if text_only else "vl", trained, mtp, vision, sorted(written))


def copy_artifacts(source: HfFolder, out: Path, *, text_only: bool = False) -> list[str]:
    """The input's config (byte for byte; the text form's for ``text_only``) and the files of
    :data:`ARTIFACT_FILES` it has (a text-form export leaves the image processor's out)."""
    copied = []
    if text_only:
        (out / CONFIG_FILE).write_text(json.dumps(text_config(source), indent=2, sort_keys=True) + "\n")
    else:
        shutil.copyfile(source.path / CONFIG_FILE, out / CONFIG_FILE)
    copied.append(CONFIG_FILE)
    for name in ARTIFACT_FILES:
        if text_only and name in IMAGE_FILES:
            continue
        if (source.path / name).is_file():
            shutil.copyfile(source.path / name, out / name)
            copied.append(name)
    return copied


# --------------------------------------------------------------------------- adapter-only export

_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
_EXPERT = re.compile(
    r"^(?P<parent>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)(?P<suffix>\.lora_[AB]\.weight)$"
)
# Adapters on the stacked expert weights (a folder storing ``experts.gate_up_proj`` [E, 2I, H] and
# ``experts.down_proj`` [E, H, I]): A [E, r, in] and B [E, out, r], one slice per expert.
_STACKED_EXPERTS = re.compile(
    r"^(?P<parent>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)\.lora_(?P<ab>[AB])\.weight$"
)


def _pack_experts(per_expert: dict[str, dict[int, dict[str, Any]]]) -> dict[str, tuple[Any, Any]]:
    """Per-expert adapters (``...experts.E.gate_proj`` etc., the layout a released folder stores)
    as adapters on the stacked expert parameters the transformers model holds
    (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]), in PEFT's layout for
    a 3-D target parameter: A [E*r, in] grouped by expert, B [out, r*E] with expert as the
    fastest index. Gate and up share their A (one adapter on the fused first projection)."""
    import torch

    out = {}
    for key, experts in per_expert.items():
        parent, proj = key.rsplit("|", 1)
        order = sorted(experts)
        if order != list(range(len(order))):
            raise HfCheckpointError(f"adapter weights of {parent} do not cover experts 0..{len(order) - 1}")
        a_rows, b_cols = [], []
        for e in order:
            w = experts[e]
            if proj == "gate_up_proj" and "gate_up_proj.lora_A" not in w:
                a_gate, a_up = w["gate_proj.lora_A"], w["up_proj.lora_A"]
                if not torch.equal(a_gate, a_up):
                    raise HfCheckpointError(
                        f"{parent}.{e}: the gate and up adapters have different A matrices; they cannot be one "
                        "adapter on the stacked gate_up_proj"
                    )
                a_rows.append(a_gate)
                b_cols.append(torch.cat([w["gate_proj.lora_B"], w["up_proj.lora_B"]], dim=0))
            else:
                a_rows.append(w[f"{proj}.lora_A"])
                b_cols.append(w[f"{proj}.lora_B"])
        a = torch.cat(a_rows, dim=0)  # [E*r, in]
        b = torch.stack(b_cols, dim=-1).reshape(b_cols[0].shape[0], -1)  # [out, r, E] -> [out, r*E]
        out[f"{parent}.{proj}"] = (a, b)
    return out


def write_adapter(
    adapter_weights: Iterable[tuple[str, Any]],
    out: str | os.PathLike,
    *,
    rank: int,
    alpha: float,
    base_model: str,
) -> dict[str, Any]:
    """Write LoRA ``adapter_weights`` (Hugging Face module names with ``.lora_A.weight`` /
    ``.lora_B.weight``, as Megatron-Bridge exports them) to ``out`` as PEFT's
    ``adapter_config.json`` + ``adapter_model.safetensors``, which ``PeftModel.from_pretrained(base,
    out)`` loads onto ``base_model``'s model. Adapters on single experts, or stacked over the
    experts, go onto the expert parameters the transformers model holds (``target_parameters``);
    the rest target modules. A tensor given under several names (one A of a fused projection) is
    saved once per name. The MTP layer's adapters stay out: neither transformers' model nor a LoRA
    server has that layer (the merged export carries it trained). Returns the adapter config."""
    from safetensors.torch import save_file

    state: dict[str, Any] = {}
    modules: set[str] = set()
    per_expert: dict[str, dict[int, dict[str, Any]]] = {}
    ranks: dict[str, int] = {}
    seen: set[int] = set()
    for name, tensor in adapter_weights:
        if name.startswith(MTP_PREFIX):  # no module of transformers' model (nor of a LoRA server) to land on
            continue
        tensor = independent(tensor, seen)
        if m := _EXPERT.match(name):
            proj = "down_proj" if m["proj"] == "down_proj" else "gate_up_proj"
            slot = per_expert.setdefault(f"{m['parent']}|{proj}", {}).setdefault(int(m["e"]), {})
            slot[m["proj"] + m["suffix"].removesuffix(".weight")] = tensor
            continue
        if (m := _STACKED_EXPERTS.match(name)) and tensor.ndim == 3:
            for e in range(tensor.shape[0]):
                slot = per_expert.setdefault(f"{m['parent']}|{m['proj']}", {}).setdefault(e, {})
                slot[f"{m['proj']}.lora_{m['ab']}"] = tensor[e]
            continue
        if tensor.ndim != 2 or not name.endswith(_LORA_SUFFIXES):
            raise HfCheckpointError(f"adapter weight {name!r} ({tuple(tensor.shape)}) is not a 2-D LoRA matrix")
        state[f"base_model.model.{name}"] = tensor
        base = name.rsplit(".lora_", 1)[0]
        modules.add(base.rsplit(".", 1)[-1])
        if name.endswith(".lora_A.weight"):
            ranks[base] = tensor.shape[0]
    parameters = []
    packed = _pack_experts(per_expert)
    depth: dict[str, int] = {}
    for target in sorted(packed):  # PEFT nests one wrapper per parameter of a module, in this order
        parent = target.rsplit(".", 1)[0]
        prefix = f"base_model.model.{parent}" + ".base_layer" * depth.get(parent, 0)
        depth[parent] = depth.get(parent, 0) + 1
        a, b = packed[target]
        state[f"{prefix}.lora_A.weight"], state[f"{prefix}.lora_B.weight"] = a, b
        parameters.append(target)
    if not state:
        raise HfCheckpointError("the run holds no LoRA adapter weights to export")
    config = _adapter_config(base_model, rank, alpha, modules, ranks, parameters)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return config


def _adapter_config(
    base_model: str, rank: int, alpha: float, modules: set[str], ranks: dict[str, int], parameters: list[str]
) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of a LoRA on ``modules`` (and the stacked expert ``parameters``)."""
    pattern = {base: r for base, r in ranks.items() if r != rank}
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {re.escape(k): v for k, v in pattern.items()},
        "alpha_pattern": {},
        "target_modules": sorted(modules),
        "use_dora": False,
        "use_rslora": False,
    }
    if parameters:
        config["target_parameters"] = sorted({p.rsplit(".", 1)[-1] for p in parameters})
        config["target_parameters"] = [f"experts.{p}" for p in config["target_parameters"]]
    return config


def write_lora_exports(
    merged: Iterable[tuple[str, Any]],
    adapters: Callable[[], Iterable[tuple[str, Any]]],
    source: HfFolder,
    out: str | os.PathLike,
    adapter_out: str | os.PathLike | None,
    *,
    rank: int,
    alpha: float,
    text_only: bool = False,
) -> ExportReport:
    """A LoRA run's two exports: the ``merged`` tensors into ``out`` (:func:`write_export`), then,
    only once that folder is whole, the adapters (``adapters()``, streamed then) into
    ``adapter_out`` (:func:`write_adapter`). A failure of the second is an
    :class:`AdapterExportError`, so the caller can keep the merged folder."""
    report = write_export(merged, source, out, text_only=text_only)
    if adapter_out is not None:
        try:
            write_adapter(adapters(), adapter_out, rank=rank, alpha=alpha, base_model=str(source.path))
        except Exception as e:
            raise AdapterExportError(f"{type(e).__name__}: {e}") from e
    return report
