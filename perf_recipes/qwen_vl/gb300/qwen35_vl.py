"""GB300 Qwen3.5/3.6-VL benchmark recipes (mock image conversations, forced load balance as in
Megatron-Bridge's VL benchmark family), sharing the execution policies of
``bridge_recipes.qwen_vl.gb300.qwen35_vl``.
"""

from __future__ import annotations

from bridge_recipes.qwen_vl.gb300 import qwen35_vl as real
from bridge_recipes.qwen_vl.policy import (
    GB300_ENV,
    cuda_graphs_off,
    hybridep_env,
    set_batch,
    set_vl_fused_kernels,
    set_vl_layout,
    use_hybridep_dispatcher,
)
from bridge_recipes.recipe import recipe
from perf_recipes._common import benchmark_settings

__all__ = [
    "qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config",
    "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_mock_config",
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config",
]


def _vl_benchmark(cfg) -> None:
    benchmark_settings(cfg)
    cfg.model.moe_router_force_load_balancing = True
    # Megatron-Bridge's benchmark defaults (_benchmark_common): TE's fused cross entropy
    cfg.model.cross_entropy_loss_fusion, cfg.model.cross_entropy_fusion_impl = True, "te"


@recipe(task="pretrain", gpus=64, gpu="gb300", precision="bf16", layout="TP1 PP1 EP64 DP64", status="unmeasured")
def qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config():
    """Qwen3.5-VL 397B-A17B benchmark on 64 x GB300 (BF16, EP64), the shipped layout."""
    cfg = real.qwen35_vl_397b_a17b_pretrain_config()
    _vl_benchmark(cfg)
    return cfg


@recipe(task="pretrain", gpus=16, gpu="gb300", precision="bf16", layout="TP1 PP1 EP4 DP16", status="unmeasured")
def qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_mock_config():
    """Benchmark of qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config on mock data."""
    cfg = real.qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config()
    _vl_benchmark(cfg)
    return cfg


def _apply_qwen35_vl_35b_a3b_8gpu_gb300_execution_config(cfg) -> None:
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


@recipe(task="pretrain", gpus=8, gpu="gb300", precision="fp8mx", layout="TP1 PP1 EP8 DP8", status="unmeasured")
def qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_config():
    """Qwen3.5-VL 35B-A3B benchmark on 8 x GB300, MXFP8, EP8, global batch 512 (not the
    ``_library`` real-data recipe, which keeps the 16-GPU layout)."""
    from megatron.bridge.training.mixed_precision import bf16_with_mxfp8_mixed

    from bridge_recipes.common import vlm_pretrain_config

    cfg = vlm_pretrain_config("qwen35_vl_35b_a3b")
    _apply_qwen35_vl_35b_a3b_8gpu_gb300_execution_config(cfg)
    cfg.mixed_precision = bf16_with_mxfp8_mixed()
    _vl_benchmark(cfg)
    return cfg
