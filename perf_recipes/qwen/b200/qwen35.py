"""B200 benchmark recipes (mock data) sharing the execution policy of bridge_recipes.recipes.qwen.b200."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen.b200 import qwen35 as real
from bridge_recipes.recipes.recipe import benchmark_of
from perf_recipes._common import benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["qwen35_35b_a3b_sft_8gpu_b200_bf16_mock_config"]


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_b200_bf16_config)
def qwen35_35b_a3b_sft_8gpu_b200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_b200_bf16_config (our proposed B200 layout)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_b200_bf16_config()
    benchmark_settings(cfg)
    return cfg
