"""A100 recipes for Qwen3.5 / Qwen3.6 text models: LoRA on one 80 GB A100.

The A100 has no FP8 tensor cores, so its frozen base stays BF16; what makes the one-GPU LoRA layout fit
80 GB is the loss a chunk of tokens at a time (no 248K-vocabulary logits of the whole row) and every layer
recomputed. These recipes are sized by the memory planner at the A100's memory
(``run_recipe.py --recipe NAME --plan``) and measured at the A100's memory on an H100 (its peak, not an
A100's speed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import peft_config
from bridge_recipes.recipes.qwen.policy import chunked_cross_entropy, lora_one_gpu
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_27b_peft_1gpu_a100_bf16_config", "qwen35_35b_a3b_peft_1gpu_a100_bf16_config"]


@recipe(
    task="peft",
    gpus=1,
    gpu="a100",
    precision="bf16",
    layout="TP1 PP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_memory_classes/qwen35_27b_peft_1gpu_a100_bf16_config.yaml"},
)
def qwen35_27b_peft_1gpu_a100_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on one 80 GB A100: the one-GPU LoRA layout (BF16 base, every layer recomputed,
    one row per micro batch) with the loss a chunk of tokens at a time."""
    cfg = peft_config("qwen35_27b")
    lora_one_gpu(cfg)
    # no 248K-vocabulary logits of the whole row: what takes the layout under 80 GB
    chunked_cross_entropy(cfg)
    return cfg


@recipe(
    task="peft",
    gpus=1,
    gpu="a100",
    precision="bf16",
    layout="TP1 PP1 EP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_memory_classes/qwen35_35b_a3b_peft_1gpu_a100_bf16_config.yaml"},
)
def qwen35_35b_a3b_peft_1gpu_a100_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on one 80 GB A100: the one-GPU LoRA layout (70 GB of BF16 base, every layer
    recomputed, one row per micro batch) with the loss a chunk of tokens at a time."""
    cfg = peft_config("qwen35_35b_a3b")
    lora_one_gpu(cfg, moe=True)
    # no 248K-vocabulary logits of the whole row: what takes the layout under 80 GB
    chunked_cross_entropy(cfg)
    return cfg
