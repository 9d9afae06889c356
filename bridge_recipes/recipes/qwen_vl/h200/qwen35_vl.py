"""H200 SFT recipes for Qwen3.5 / Qwen3.6-VL: the text recipes' H200 layouts on the VL models.

The language model of a VL checkpoint is the text model of its size, so the VL SFT recipes
apply the text recipes' execution policies (``bridge_recipes.recipes.qwen.h200.qwen35``) to
:func:`bridge_recipes.recipes.base.vlm_sft_config` (every part trained, no gradient/parameter-gather
overlap as in Megatron-Bridge's VLM defaults). The 27-layer vision tower (about 0.4e9
parameters) sits on the first pipeline stage and is not counted by the memory planner.

Data: mock image conversations by default; an Energon dataset with
``--dataset energon dataset.path=DIR`` (Megatron-Bridge's Qwen-VL task encoder, 16-pixel
patches), its image budget set by ``dataset.task_encoder.max_pixels``. These layouts use no
vision CUDA graphs, so no patch cap applies (the vision budget check has nothing to bound).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import vlm_sft_config
from bridge_recipes.recipes.qwen.h200.qwen35 import (
    _apply_qwen35_35b_a3b_8gpu_h200_execution_config,
    _apply_qwen35_397b_a17b_64gpu_h200_execution_config,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config",
    "qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config",
]


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="functional",
    evidence="evidence/vl/vl_finetune_summary.json",
)
def qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B-VL SFT on 8 x H200: the text recipe's EP8 layout, full recompute, no offload."""
    cfg = vlm_sft_config("qwen35_vl_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_h200_execution_config(cfg)
    return cfg


@recipe(
    task="sft",
    gpus=64,
    gpu="h200",
    precision="bf16",
    layout="TP2 PP4 EP16 DP8",
    status="unmeasured",
)
def qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5-397B-A17B-VL SFT on 8 x 8 H200: TP2 SP, PP4 15/16/16/13, EP16, full recompute, no offload."""
    cfg = vlm_sft_config("qwen35_vl_397b_a17b")
    _apply_qwen35_397b_a17b_64gpu_h200_execution_config(cfg)
    return cfg
