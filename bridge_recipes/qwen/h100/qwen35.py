"""H100 recipes for Qwen3.5 / Qwen3.6 text models.

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

from bridge_recipes.common import sft_config
from bridge_recipes.qwen.policy import (
    OPENRECIPES_ENV,
    cpu_optimizer_offload,
    full_recompute,
    set_layout,
    set_openrecipes_numerics,
    shard_optimizer_precision_aware,
)
from bridge_recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_35b_a3b_sft_8gpu_h100_bf16_config"]

SLIME_35B_H100 = (
    "slime's Qwen3_6_35b_Recipe (modal_training_gym), 1 x 8 H100; no figure published"
    " (slime-35b-h100, docs/sources.md)"
)


def _apply_qwen35_35b_a3b_8gpu_h100_execution_config(cfg: ConfigContainer) -> None:
    """TP2 SP PP2 CP2 EP4 ETP1 (DP1) on 8 x H100 80 GB, as slime's recipe class sets it."""
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    set_layout(cfg, tp=2, pp=2, cp=2, ep=4, etp=1, sp=True)
    full_recompute(cfg)
    cpu_optimizer_offload(cfg)
    cfg.model.moe_token_dispatcher_type = "flex"  # slime: moe_token_dispatcher_type=flex
    cfg.model.moe_flex_dispatcher_backend = "deepep"  # slime: moe_enable_deepep=True
    # 8,192 tokens per GPU at CP2
    cfg.model.seq_length = 16384
    cfg.dataset.seq_length = 16384
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**OPENRECIPES_ENV}


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
