"""H100 recipes for Qwen3.5 / Qwen3.6 text models.

The one-GPU LoRA recipes are the shared one-GPU LoRA layout (``policy.lora_one_gpu``) on one 80 GB H100
with the loss a chunk of tokens at a time: the 27B's frozen base stored in FP8 (one byte per weight,
``policy.fp8_frozen_base``), the 35B-A3B's in BF16 with the H200 recipe's kernels (the experts' CUTLASS
grouped GEMM takes BF16 only); each carries as many rows per micro batch as the planner fits
(``run_recipe.py --recipe NAME --plan``).

The 35B-A3B layout is the one of the slime recipe class ``Qwen3_6_35b_Recipe`` for one
8 x H100 node (slime-35b-h100 in docs/sources.md): TP2 with sequence parallelism, PP2, CP2, EP4 ETP1, full uniform
recompute, optimizer on the CPU with overlapped copies, precision-aware distributed Adam,
flash attention, flex dispatcher with DeepEP, and dynamic batches of up to 8,192 tokens per
GPU (here: 16,384-token sequences split over CP2, one per micro batch). The slime recipe is an
RL recipe; here its training layout carries the SFT workload. No throughput is published
for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import peft_config, sft_config
from bridge_recipes.recipes.qwen.policy import (
    OPENRECIPES_GROUPED_GEMM_ENV,
    chunked_cross_entropy,
    cpu_optimizer_offload,
    fast_lora_kernels,
    fp8_frozen_base,
    full_recompute,
    lora_one_gpu,
    openrecipes_execution,
    rows_per_micro_batch,
    set_layout,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_35b_a3b_sft_8gpu_h100_bf16_config",
    "qwen35_27b_peft_1gpu_h100_fp8base_config",
    "qwen35_35b_a3b_peft_1gpu_h100_bf16_config",
]

SLIME_35B_H100 = (
    "slime's Qwen3_6_35b_Recipe (modal_training_gym), 1 x 8 H100; no figure published"
    " (slime-35b-h100, docs/sources.md)"
)


def _apply_qwen35_35b_a3b_8gpu_h100_execution_config(cfg: ConfigContainer) -> None:
    """TP2 SP PP2 CP2 EP4 ETP1 (DP1) on 8 x H100 80 GB, as slime's recipe class sets it."""
    with openrecipes_execution(cfg):
        set_layout(cfg, tp=2, pp=2, cp=2, ep=4, etp=1, sp=True)
        full_recompute(cfg)
        cpu_optimizer_offload(cfg)
        cfg.model.moe_token_dispatcher_type = "flex"  # slime: moe_token_dispatcher_type=flex
        cfg.model.moe_flex_dispatcher_backend = "deepep"  # slime: moe_enable_deepep=True
        # 8,192 tokens per GPU at CP2
        cfg.model.seq_length = 16384
        cfg.dataset.seq_length = 16384


@recipe(
    task="sft",
    gpus=8,
    gpu="h100",
    precision="bf16",
    layout="TP2 PP2 CP2 EP4 ETP1 DP1",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": None, "source": SLIME_35B_H100},
)
def qwen35_35b_a3b_sft_8gpu_h100_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B SFT on one 8 x H100 node with slime's layout (slime-35b-h100)."""
    cfg = sft_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_h100_execution_config(cfg)
    return cfg


# --- LoRA on one 80 GB H100 ----------------------------------------------------------------


@recipe(
    task="peft",
    gpus=1,
    gpu="h100",
    precision="fp8base",
    layout="TP1 PP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_memory_classes/qwen35_27b_peft_1gpu_h100_fp8base_config.yaml"},
)
def qwen35_27b_peft_1gpu_h100_fp8base_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on one 80 GB H100: the one-GPU LoRA layout with its frozen base in FP8 and the
    loss a chunk of tokens at a time, two rows per micro batch."""
    cfg = peft_config("qwen35_27b")
    lora_one_gpu(cfg)
    # the 27B's linear weights at one byte: half the frozen base
    fp8_frozen_base(cfg)
    # no 248K-vocabulary logits of the whole micro batch
    chunked_cross_entropy(cfg)
    # the room the FP8 base and the chunked loss free carries two 8,192-token rows (one packed sequence on
    # boundaries rows)
    rows_per_micro_batch(cfg, 2)
    return cfg


@recipe(
    task="peft",
    gpus=1,
    gpu="h100",
    precision="bf16",
    layout="TP1 PP1 EP1 DP1",
    status="measured",
    measured={"result": "evidence/full_size/qwen35_35b_a3b_peft_1gpu_h100_bf16_config__short__flash_varlen.yaml"},
)
def qwen35_35b_a3b_peft_1gpu_h100_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on one 80 GB H100: the H200 recipe's kernels (BF16 base, one CUTLASS
    grouped GEMM for the 256 experts per layer, every layer recomputed) at one row per micro batch with the
    loss a chunk of tokens at a time. Its base stays BF16: FP8 experts run one cuBLAS GEMM per expert,
    several times slower."""
    cfg = peft_config("qwen35_35b_a3b")
    # one grouped kernel for the 256 experts instead of 256 cuBLAS launches from the host
    lora_one_gpu(cfg, moe=True, env=OPENRECIPES_GROUPED_GEMM_ENV)
    fast_lora_kernels(cfg, router=True)
    full_recompute(cfg, "block", cfg.model.num_layers)
    # no 248K-vocabulary logits of the whole micro batch
    chunked_cross_entropy(cfg)
    # 71 GB of BF16 base leaves the room for one 8,192-token row with every layer recomputed
    rows_per_micro_batch(cfg, 1)
    # a packed row's attention in one flash-attention launch per layer pass, not one per conversation: this
    # recipe ran it at full size on short and on long split conversations (python -m lab.full_size)
    cfg.features.packed_attention.mode = "flash_varlen"
    return cfg
