"""H200 Qwen3.5/3.6-VL SFT benchmark recipes, sharing the execution policies of
``bridge_recipes.recipes.qwen_vl.h200.qwen35_vl`` (mock image conversations and
:func:`perf_recipes._common.vl_benchmark_settings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen_vl.h200 import qwen35_vl as real
from bridge_recipes.recipes.recipe import benchmark_of
from perf_recipes._common import vl_benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_mock_config",
    "qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_mock_config",
]


@benchmark_of(real.qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config)
def qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config (EP8, full recompute)."""
    cfg = real.qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config()
    vl_benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config)
def qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config (TP2 SP, PP4, EP16)."""
    cfg = real.qwen35_vl_397b_a17b_sft_64gpu_h200_bf16_config()
    vl_benchmark_settings(cfg)
    return cfg
