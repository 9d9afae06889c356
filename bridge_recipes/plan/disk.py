"""The disk a fine-tuning needs, in GB of 1e9 bytes, from the parameter counts (one definition:
:mod:`bridge_recipes.models.params`; weights in BF16, 2 bytes each):

- the released Hugging Face folder: the whole model (vision tower and MTP layer included);
- its conversion, kept in ``$QWEN35_RECIPES_CACHE/hf_import`` once per folder: the model the recipe
  trains (for a text recipe, a released folder's language model and MTP layer);
- a checkpoint: what training changes and the optimizer's state of it (its master copy and Adam
  moments, :func:`~bridge_recipes.plan.optimizer.optimizer_bytes_per_param`, when
  ``checkpoint.save_optim``): a LoRA run's adapters on the decoder and MTP layers
  (:func:`~bridge_recipes.plan.params.lora_params`), a full run's whole model. A run saves every
  ``checkpoint.save_interval`` steps and at its last step (Megatron-Bridge's final save), and keeps
  the newest ``checkpoint.most_recent_k`` (all of them at -1);
- the exports: the merged model, as large as the original, and a LoRA run's adapter folder
  (:func:`~bridge_recipes.plan.params.adapter_folder_params`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bridge_recipes.hardware.gpus import GB
from bridge_recipes.models.dims import ModelDims
from bridge_recipes.models.params import count_dims, vision_params
from bridge_recipes.models.qwen35 import VisionSpec
from bridge_recipes.plan.dims import BF16
from bridge_recipes.plan.optimizer import optimizer_bytes_per_param
from bridge_recipes.plan.params import ONE_RANK, adapter_folder_params, layer_linears, lora_params, lora_targets


def model_vision_params(cfg: Any) -> int:
    """The vision tower of a VL recipe's model (0 for a text recipe), counted from its ``vision_config``."""
    vision = getattr(cfg.model, "vision_config", None)
    if vision is None:
        return 0
    fields = vision.to_dict() if hasattr(vision, "to_dict") else dict(vars(vision))
    return folder_vision_params({"vision_config": fields, "text_config": {"hidden_size": cfg.model.hidden_size}})


def trained_params(cfg: Any, d: ModelDims) -> float:
    """The parameters training changes: a LoRA run's adapters (the decoder's and the MTP layers'), or the
    whole model (a VL model's vision tower too, unless frozen)."""
    lora = lora_targets(cfg)
    if lora is None:
        frozen = getattr(cfg.model, "freeze_vision_model", False)
        return float(count_dims(d, 0 if frozen else model_vision_params(cfg)).total)
    targets, dim = lora
    mtp_layer = layer_linears(d, ONE_RANK, False, bool(d.experts))  # an MTP layer: attention and the model's MLP
    mtp = d.mtp_layers * sum(dim * (n + m) for name, n, m, _ in mtp_layer if name in targets)
    return lora_params(d, ONE_RANK, list(range(len(d.layer_pattern))), targets, dim) + mtp


def checkpoint_bytes(cfg: Any, d: ModelDims) -> float:
    """One checkpoint of the run: the trained parameters in BF16, and their optimizer state when saved."""
    per_param = BF16 + (optimizer_bytes_per_param(cfg) if getattr(cfg.checkpoint, "save_optim", True) else 0)
    return trained_params(cfg, d) * per_param


def saves(cfg: Any) -> int:
    """Checkpoints the run writes: one every ``save_interval`` steps and one at its last step."""
    ckpt, steps = cfg.checkpoint, cfg.train.train_iters or 0
    if not ckpt.save or not steps or ckpt.save_interval == 0:
        return 0
    return math.ceil(steps / ckpt.save_interval) if ckpt.save_interval else 1


def kept(cfg: Any) -> int:
    """Checkpoints left on disk at the end: the newest ``most_recent_k``, or all the run writes."""
    k = getattr(cfg.checkpoint, "most_recent_k", -1)
    return min(saves(cfg), k) if k is not None and k > 0 else saves(cfg)


def folder_vision_params(config: dict) -> int:
    """The vision tower of a Hugging Face folder's ``config.json`` (0 without one), counted as the
    catalog counts it, from its ``vision_config`` fields (the catalog's where one is missing)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    fields = {k: vision[k] for k in VisionSpec.__dataclass_fields__ if isinstance(vision.get(k), int)}
    out_hidden = vision.get("out_hidden_size") or (config.get("text_config") or {}).get("hidden_size") or 0
    return vision_params(VisionSpec(**fields), int(out_hidden))


def amount(gb: float) -> str:
    """A size as the summary prints it: GB from 1 GB up, MB below."""
    return f"{gb:,.1f} GB" if gb >= 1 else f"{gb * 1000:,.1f} MB"


@dataclass(frozen=True)
class RunDisk:
    """What a run writes (GB): its checkpoints and its exports; and the conversion it makes once."""

    checkpoint_gb: float
    saves: int
    kept: int
    lora: bool
    merged_gb: float | None = None  # None: no export
    adapter_gb: float | None = None  # a LoRA run's adapter folder
    conversion_gb: float | None = None  # the Hugging Face folder converted at launch (None: nothing to convert)

    @property
    def written_gb(self) -> float:
        """The checkpoints kept and the exports."""
        return self.checkpoint_gb * self.kept + (self.merged_gb or 0.0) + (self.adapter_gb or 0.0)

    def line(self) -> str:
        """The summary's one line."""
        what = "adapters" if self.lora else "model"
        kept = "all kept" if self.kept == self.saves else f"the newest {self.kept} kept"
        parts = [
            f"{self.saves} checkpoint(s) x {amount(self.checkpoint_gb)} ({what} + optimizer state, {kept})"
            if self.saves
            else "no checkpoint"
        ]
        if self.merged_gb is not None:
            adapter = f" + {amount(self.adapter_gb)} adapter" if self.adapter_gb is not None else ""
            parts.append(f"exports {amount(self.merged_gb)} merged{adapter}")
        out = f"about {amount(self.written_gb)}: " + ", ".join(parts)
        if self.conversion_gb is not None:
            out += f"; conversion cache {amount(self.conversion_gb)} more, once per folder"
        return out


def run_disk(
    cfg: Any, d: ModelDims, *, export: bool, export_vision: int = 0, conversion_vision: int | None = None
) -> RunDisk:
    """The disk of the run ``cfg`` of dimensions ``d`` (:func:`bridge_recipes.plan.dims.model_dims`):
    ``export`` with ``export_vision`` vision-tower parameters in the merged folder; ``conversion_vision``
    (those the conversion keeps) when the launch converts a Hugging Face folder, None when it does not."""
    lora = lora_targets(cfg)
    model = count_dims(d).total
    adapter = None
    if export and lora is not None:
        adapter = BF16 * adapter_folder_params(d, list(range(len(d.layer_pattern))), *lora) / GB
    return RunDisk(
        checkpoint_gb=checkpoint_bytes(cfg, d) / GB,
        saves=saves(cfg),
        kept=kept(cfg),
        lora=lora is not None,
        merged_gb=BF16 * (model + export_vision) / GB if export else None,
        adapter_gb=adapter,
        conversion_gb=None if conversion_vision is None else BF16 * (model + conversion_vision) / GB,
    )
