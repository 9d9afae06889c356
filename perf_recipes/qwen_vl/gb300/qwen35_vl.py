"""GB300 Qwen3.5/3.6-VL benchmark recipes, sharing the execution policies of
``bridge_recipes.recipes.qwen_vl.gb300.qwen35_vl``.

Mock image conversations and :func:`perf_recipes._common.vl_benchmark_settings`: the numerics of
the real-data recipe except the VL benchmark family's forced load-balanced routing and TE fused
cross entropy (``VL_BENCHMARK_MODEL_SETTINGS``, the declared differences).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen.policy import GB300_ENV, cuda_graphs_off, hybridep_env, use_hybridep_dispatcher
from bridge_recipes.recipes.qwen_vl.gb300 import qwen35_vl as real
from bridge_recipes.recipes.qwen_vl.policy import (
    set_batch,
    set_vl_fused_kernels,
    set_vl_layout,
)
from bridge_recipes.recipes.recipe import benchmark_of
from perf_recipes._common import vl_benchmark_settings

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config",
    "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_mock_config",
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config",
]

# Benchmarks with Megatron-Bridge's layout rather than their real-data recipe's (they may differ
# from it in perf_recipes._common.LAYOUT_FIELDS).
OWN_LAYOUT = ["qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config"]


@benchmark_of(real.qwen35_vl_397b_a17b_pretrain_config)
def qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config() -> ConfigContainer:
    """Qwen3.5-VL 397B-A17B benchmark on 64 x GB300 (BF16, EP64), the shipped layout.

    Numerics of qwen35_vl_397b_a17b_pretrain_config except forced load-balanced routing and TE
    fused cross entropy (``VL_BENCHMARK_MODEL_SETTINGS``)."""
    cfg = real.qwen35_vl_397b_a17b_pretrain_config()
    vl_benchmark_settings(cfg)
    return cfg


@benchmark_of(real.qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config)
def qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_mock_config() -> ConfigContainer:
    """Benchmark of qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config on mock data.

    Its numerics except forced load-balanced routing and TE fused cross entropy
    (``VL_BENCHMARK_MODEL_SETTINGS``)."""
    cfg = real.qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config()
    vl_benchmark_settings(cfg)
    return cfg


def _apply_qwen35_vl_35b_a3b_8gpu_gb300_execution_config(cfg: ConfigContainer) -> None:
    """The 8-GB300 benchmark layout of Megatron-Bridge 0.6.2 (qwen35_vl_35b_a3b_pretrain_8gpu_gb300_
    *_config): TP/PP/CP 1, EP8 ETP1, micro batch 8, global batch 512, HybridEP, graphs off after
    the VL post-processing. Only benchmarks use it; the real-data module keeps exactly the
    helpers its reference page lists, so this one lives here."""
    set_vl_layout(cfg, ep=8)
    set_vl_fused_kernels(cfg)
    set_batch(cfg, micro_batch=8, global_batch=512)
    cuda_graphs_off(cfg)
    use_hybridep_dispatcher(cfg)
    cfg.env_vars = {**GB300_ENV, **hybridep_env(8)}


@benchmark_of(real.qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config, layout="TP1 PP1 EP8 DP8")
def qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config() -> ConfigContainer:
    """Qwen3.5-VL 35B-A3B benchmark on 8 x GB300, MXFP8, EP8, global batch 512 (not the
    ``_library`` real-data recipe, which keeps the 16-GPU layout).

    Numerics of the ``_library`` recipe except forced load-balanced routing and TE fused cross
    entropy (``VL_BENCHMARK_MODEL_SETTINGS``); its layout is Megatron-Bridge's (``OWN_LAYOUT``:
    EP8, no CUDA graphs, no recompute), and it runs without the ``_library`` recipe's CuTe DSL
    fused grouped MLP and cuDNN normalization environment."""
    from megatron.bridge.training.mixed_precision import bf16_with_mxfp8_mixed

    from bridge_recipes.recipes.base import vlm_pretrain_config

    cfg = vlm_pretrain_config("qwen35_vl_35b_a3b")
    _apply_qwen35_vl_35b_a3b_8gpu_gb300_execution_config(cfg)
    cfg.mixed_precision = bf16_with_mxfp8_mixed()
    vl_benchmark_settings(cfg)
    return cfg
