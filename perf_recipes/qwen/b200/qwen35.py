"""B200 benchmark recipes (mock data) sharing the execution policy of bridge_recipes.qwen.b200."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.qwen.b200 import qwen35 as real
from bridge_recipes.recipe import recipe
from perf_recipes._common import benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_35b_a3b_sft_8gpu_b200_bf16_mock_config"]

OPENRECIPES_35B_B200 = (
    "OpenRecipes Qwen3.6-35B-A3B SFT on 8 x B200, layout not published (openrecipes-35b-h200, docs/sources.md)"
)


@recipe(
    task="sft",
    gpus=8,
    gpu="b200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 6573.4, "source": OPENRECIPES_35B_B200},
)
def qwen35_35b_a3b_sft_8gpu_b200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_b200_bf16_config (our proposed B200 layout)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_b200_bf16_config()
    benchmark_settings(cfg)
    return cfg
