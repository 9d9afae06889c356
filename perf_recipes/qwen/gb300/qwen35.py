"""GB300 benchmark recipes (mock data) sharing the execution policy of bridge_recipes.recipes.qwen.gb300."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen.gb300 import qwen35 as real
from bridge_recipes.recipes.recipe import benchmark_of
from perf_recipes._common import benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_122b_a10b_sft_32gpu_gb300_bf16_mock_config",
    "qwen35_397b_a17b_sft_64gpu_gb300_bf16_mock_config",
]


@benchmark_of(real.qwen35_122b_a10b_sft_32gpu_gb300_bf16_config)
def qwen35_122b_a10b_sft_32gpu_gb300_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_122b_a10b_sft_32gpu_gb300_bf16_config (EP32, HybridEP, no recompute)."""
    cfg = real.qwen35_122b_a10b_sft_32gpu_gb300_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_397b_a17b_sft_64gpu_gb300_bf16_config)
def qwen35_397b_a17b_sft_64gpu_gb300_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_397b_a17b_sft_64gpu_gb300_bf16_config (EP64, HybridEP, block recompute 40)."""
    cfg = real.qwen35_397b_a17b_sft_64gpu_gb300_bf16_config()
    benchmark_settings(cfg)
    return cfg
