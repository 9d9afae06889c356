"""H200 benchmark recipes: the real-data recipes of ``bridge_recipes.recipes.qwen.h200.qwen35`` on mock
SFT-shaped data (8,192-token rows, global batch 128, BF16), with benchmark settings.

A LoRA benchmark (``*_peft_*``) still needs base weights: Megatron-Bridge's fine-tuning refuses
LoRA without ``checkpoint.pretrained_checkpoint`` (any checkpoint of the architecture will do
for throughput, e.g. one written by scripts/convert_checkpoint.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen.h200 import qwen35 as real
from bridge_recipes.recipes.recipe import benchmark_of
from perf_recipes._common import benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_mock_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_mock_config",
    "qwen35_27b_sft_8gpu_h200_bf16_mock_config",
    "qwen35_27b_sft_8gpu_h200_bf16_fast_mock_config",
    "qwen35_27b_sft_8gpu_h200_fp8cs_fast_mock_config",
    "qwen35_27b_sft_8gpu_h200_bf16_slime_reference_mock_config",
    "qwen35_122b_a10b_sft_24gpu_h200_bf16_mock_config",
    "qwen35_397b_a17b_sft_64gpu_h200_bf16_mock_config",
    "qwen35_27b_peft_1gpu_h200_bf16_mock_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_mock_config",
    "qwen35_122b_a10b_peft_8gpu_h200_bf16_mock_config",
    "qwen35_397b_a17b_peft_8gpu_h200_bf16_mock_config",
]


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_config (EP8, no offload)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config (EP8, BF16 moments, TE cross
    entropy, fused SwiGLU and router, block recompute of 5 layers)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config (EP8, the fast recipe's kernels and
    BF16 moments, two rows per micro batch, full recompute)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config (EP8, the fast recipe's kernels and
    BF16 moments, four rows per micro batch, full recompute)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config (16,384 tokens/GPU, offload)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config (PP2 EP4, offload)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config (CP2, 32,768 tokens)."""
    cfg = real.qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_27b_sft_8gpu_h200_bf16_config)
def qwen35_27b_sft_8gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_27b_sft_8gpu_h200_bf16_config (PP4 16/17/17/14, block recompute 12)."""
    cfg = real.qwen35_27b_sft_8gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_27b_sft_8gpu_h200_bf16_fast_config)
def qwen35_27b_sft_8gpu_h200_bf16_fast_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_27b_sft_8gpu_h200_bf16_fast_config (PP4 16/18/18/12, TE cross entropy,
    fused SwiGLU, block recompute 10)."""
    cfg = real.qwen35_27b_sft_8gpu_h200_bf16_fast_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_27b_sft_8gpu_h200_fp8cs_fast_config)
def qwen35_27b_sft_8gpu_h200_fp8cs_fast_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_27b_sft_8gpu_h200_fp8cs_fast_config (the BF16 fast policy with FP8 GEMMs,
    per-tensor current scaling, on BF16 parameters; its own split and recompute)."""
    cfg = real.qwen35_27b_sft_8gpu_h200_fp8cs_fast_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config)
def qwen35_27b_sft_8gpu_h200_bf16_slime_reference_mock_config() -> ConfigContainer:
    """Benchmark of the slime reference layout of the 27B (TP4 SP PP2 34/30, CPU Adam)."""
    cfg = real.qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_122b_a10b_sft_24gpu_h200_bf16_config)
def qwen35_122b_a10b_sft_24gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_122b_a10b_sft_24gpu_h200_bf16_config (PP3 17/18/13, EP8, full recompute)."""
    cfg = real.qwen35_122b_a10b_sft_24gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_397b_a17b_sft_64gpu_h200_bf16_config)
def qwen35_397b_a17b_sft_64gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_397b_a17b_sft_64gpu_h200_bf16_config (TP2 SP, PP4 15/16/16/13, EP16)."""
    cfg = real.qwen35_397b_a17b_sft_64gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_27b_peft_1gpu_h200_bf16_config)
def qwen35_27b_peft_1gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_27b_peft_1gpu_h200_bf16_config (LoRA, one GPU)."""
    cfg = real.qwen35_27b_peft_1gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_35b_a3b_peft_1gpu_h200_bf16_config)
def qwen35_35b_a3b_peft_1gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_35b_a3b_peft_1gpu_h200_bf16_config (LoRA, one GPU)."""
    cfg = real.qwen35_35b_a3b_peft_1gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_122b_a10b_peft_8gpu_h200_bf16_config)
def qwen35_122b_a10b_peft_8gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_122b_a10b_peft_8gpu_h200_bf16_config (LoRA, EP8)."""
    cfg = real.qwen35_122b_a10b_peft_8gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_397b_a17b_peft_8gpu_h200_bf16_config)
def qwen35_397b_a17b_peft_8gpu_h200_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_397b_a17b_peft_8gpu_h200_bf16_config (LoRA, TP2 SP EP8)."""
    cfg = real.qwen35_397b_a17b_peft_8gpu_h200_bf16_config()
    benchmark_settings(cfg)
    return cfg
