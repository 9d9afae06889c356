"""B200 recipes for Qwen3.5 / Qwen3.6 text models.

OpenRecipes lists 6,573.4 tokens/s/GPU for Qwen3.6-35B-A3B SFT on 8 x B200 (openrecipes-35b-h200) without
publishing the layout. The layout here is our proposal, unmeasured; the reasoning:

- B200 has 180 GB per GPU against H200's 141 GB and about 2.3x the dense BF16 rate, so the
  H200 winner (TP1 PP1 EP8 DP8, one 8,192-token row per micro batch, no offload) is the
  starting point: no tensor or pipeline parallelism to pay for, all experts sharded by EP8.
- The extra memory goes to recompute: on H200 the run needed full recompute of every layer
  (uniform, 1); on B200 recomputing only part of the stack (block method, 20 of 40 layers)
  trades ~40 GB of activations for about a quarter less recomputed forward work.
- Two 8,192-token rows per micro batch (16,384 tokens per GPU) without CPU offload would halve
  the number of micro batches and their fixed costs; on H200 that shape needed the optimizer
  on the CPU, which cost more than it saved (3,466.8 vs 4,663.1). It stays a variant to
  measure, not the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import sft_config
from bridge_recipes.recipes.qwen.policy import (
    full_recompute,
    openrecipes_execution,
    set_layout,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_35b_a3b_sft_8gpu_b200_bf16_config"]

OPENRECIPES_35B_B200 = (
    "OpenRecipes Qwen3.6-35B-A3B SFT on 8 x B200, layout not published (openrecipes-35b-h200, docs/sources.md)"
)


def _apply_qwen35_35b_a3b_8gpu_b200_execution_config(cfg: ConfigContainer) -> None:
    """TP1 PP1 EP8 ETP1 DP8, one 8,192-token row per micro batch, block recompute of 20 layers,
    alltoall dispatcher, precision-aware distributed Adam on the GPU."""
    with openrecipes_execution(cfg):
        set_layout(cfg, ep=8)
        full_recompute(cfg, "block", 20)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="sft",
    gpus=8,
    gpu="b200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 6573.4, "source": OPENRECIPES_35B_B200},
)
def qwen35_35b_a3b_sft_8gpu_b200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B SFT on 8 x B200: our proposed layout (unmeasured; 6,573.4 published
    for an unpublished layout)."""
    cfg = sft_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_b200_execution_config(cfg)
    return cfg
