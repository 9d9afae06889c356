"""48 GB recipes for Qwen3.5 / Qwen3.6 text models: LoRA on one L40S or RTX 6000 Ada.

Neither model's BF16 base fits 48 GB (54 and 70 GB): the frozen base is stored in FP8 (one byte per
weight; Ada has FP8 tensor cores), the loss is taken a chunk of tokens at a time and every layer is
recomputed, one 8,192-token row per micro batch, as the memory planner fits them in the 47.7 GB such a
card reports (``run_recipe.py --recipe NAME --plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import peft_config
from bridge_recipes.recipes.qwen.policy import (
    OPENRECIPES_GROUPED_GEMM_ENV,
    chunked_cross_entropy,
    fast_lora_kernels,
    fp8_frozen_base,
    full_recompute,
    lora_one_gpu,
    rows_per_micro_batch,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_27b_peft_1gpu_l40s_fp8base_config", "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"]


@recipe(
    task="peft",
    gpus=1,
    gpu="l40s",
    precision="fp8base",
    layout="TP1 PP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_memory_classes/qwen35_27b_peft_1gpu_l40s_fp8base_config.yaml"},
)
def qwen35_27b_peft_1gpu_l40s_fp8base_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on one 48 GB GPU: the one-GPU LoRA layout with its frozen base in FP8
    (multiplied in BF16 on the dequantized weights) and the loss a chunk of tokens at a time, one row per
    micro batch."""
    cfg = peft_config("qwen35_27b")
    lora_one_gpu(cfg)
    # the 27B's linear weights at one byte: half the frozen base
    fp8_frozen_base(cfg)
    # no 248K-vocabulary logits of the whole micro batch
    chunked_cross_entropy(cfg)
    # 48 GB holds the 27 GB FP8 base and one row's recomputed layers, not two rows
    rows_per_micro_batch(cfg, 1)
    return cfg


@recipe(
    task="peft",
    gpus=1,
    gpu="l40s",
    precision="fp8base",
    layout="TP1 PP1 EP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_memory_classes/qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config.yaml"},
)
def qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on one 48 GB GPU: the H200 recipe's kernels with its frozen base in FP8,
    multiplied in FP8, and the loss a chunk of tokens at a time, one row per micro batch. The only 35B-A3B LoRA
    that fits 48 GB: BF16 GEMMs on the dequantized weights run out of memory there. FP8 GEMMs put the
    adapters' gradients further from FP32 than a BF16 base's; the losses track the BF16 base's
    (docs/lora.md). For the adapters a BF16 base would learn, use an 80 GB recipe."""
    cfg = peft_config("qwen35_35b_a3b")
    # the H200 recipe's kernels: one grouped kernel for the 256 experts, every layer recomputed
    lora_one_gpu(cfg, moe=True, env=OPENRECIPES_GROUPED_GEMM_ENV)
    fast_lora_kernels(cfg, router=True)
    full_recompute(cfg, "block", cfg.model.num_layers)
    # the 256 experts' weights at one byte: 35 of the 70 GB of frozen base; FP8 GEMMs keep no layer's
    # dequantized BF16 weights for the backward, the memory BF16 GEMMs would need beyond 48 GB
    fp8_frozen_base(cfg, gemms="fp8")
    # no 248K-vocabulary logits of the whole micro batch
    chunked_cross_entropy(cfg)
    # 48 GB holds the 36 GB FP8 base and one row's recomputed layers
    rows_per_micro_batch(cfg, 1)
    return cfg
