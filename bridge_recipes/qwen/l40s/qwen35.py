"""48 GB recipes for Qwen3.5 / Qwen3.6 text models: LoRA on one L40S or RTX 6000 Ada.

Neither model's BF16 base fits 48 GB (54 and 70 GB): the frozen base is stored in FP8 (one byte per
weight; Ada has FP8 tensor cores), the loss is taken a chunk of tokens at a time and every layer is
recomputed, one 8,192-token row per micro batch, as the memory planner fits them in the 47.7 GB such a
card reports (``run_recipe.py --recipe NAME --plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.qwen.h100 import qwen35 as h100
from bridge_recipes.qwen.h200 import qwen35 as h200
from bridge_recipes.qwen.policy import chunked_cross_entropy, fp8_frozen_base, rows_per_micro_batch
from bridge_recipes.recipe import recipe

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
    """Qwen3.5/3.6-27B LoRA on one 48 GB GPU: the H100 recipe (FP8 base, chunked loss) at one row per
    micro batch."""
    cfg = h100.qwen35_27b_peft_1gpu_h100_fp8base_config()
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
    """Qwen3.5/3.6-35B-A3B LoRA on one 48 GB GPU: the H200 recipe with its frozen base in FP8, multiplied
    in FP8, and the loss a chunk of tokens at a time, one row per micro batch. The only 35B-A3B LoRA
    that fits 48 GB: BF16 GEMMs on the dequantized weights run out of memory there. FP8 GEMMs put the
    adapters' gradients further from FP32 than a BF16 base's; the losses track the BF16 base's
    (docs/lora.md). For the adapters a BF16 base would learn, use an 80 GB recipe."""
    cfg = h200.qwen35_35b_a3b_peft_1gpu_h200_bf16_config()
    # the 256 experts' weights at one byte: 35 of the 70 GB of frozen base; FP8 GEMMs keep no layer's
    # dequantized BF16 weights for the backward, the memory BF16 GEMMs would need beyond 48 GB
    fp8_frozen_base(cfg, gemms="fp8")
    # no 248K-vocabulary logits of the whole micro batch
    chunked_cross_entropy(cfg)
    # 48 GB holds the 36 GB FP8 base and one row's recomputed layers
    rows_per_micro_batch(cfg, 1)
    return cfg
