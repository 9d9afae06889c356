"""GB300 recipes for Qwen3.5/Qwen3.6-VL.

The module of the Megatron-Bridge reference page ``bridge.recipes.qwen_vl.gb300.qwen35_vl``
(bridge-gb300-vl in docs/sources.md), with exactly its public and private functions. Real-data recipes default to the
mock VLM dataset; ``--dataset energon dataset.path=...`` selects an Energon dataset without
rebuilding the execution policy, which lives in the two ``_apply_*`` helpers that the
benchmark recipes in ``perf_recipes.qwen_vl.gb300.qwen35_vl`` share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import vlm_pretrain_config
from bridge_recipes.recipes.qwen.policy import GB300_ENV, cuda_graphs_off, hybridep_env, use_hybridep_dispatcher
from bridge_recipes.recipes.qwen_vl.policy import (
    CUDNN_NORM_ENV,
    CUTEDSL_FUSED_GROUPED_MLP_ENV,
    gdn_kernel_backend_declared,
    set_batch,
    set_vl_fused_kernels,
    set_vl_layout,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config",
    "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
    "qwen35_vl_397b_a17b_pretrain_config",
]

# Vision CUDA-graph capacity of the 16-GPU recipe, measured with Energon DataComp images at
# max_pixels=200704 (784 patches of 16x16 per image) and micro batch 4 (bridge-gb300-vl).
VISION_CUDA_GRAPH_PATCH_CAP = 3712


def _apply_qwen35_vl_397b_a17b_64gpu_gb300_execution_config(cfg: ConfigContainer) -> None:
    """Apply the 64-GB300 execution policy for Qwen3.5/Qwen3.6-VL 397B-A17B.

    Mirrors Megatron-Bridge's ``qwen35_vl_397b_a17b_pretrain_64gpu_gb300_bf16_config``
    benchmark (bridge-perf-recipes in docs/sources.md) so real-data runs share its execution
    policy: TP/PP/CP 1, EP64 ETP1, micro batch 1, global batch 1024, HybridEP, its environment.
    CUDA graphs stay off, as in that benchmark after its VL post-processing (variable-length
    image inputs). Only the parallel layout, dispatcher, graph and env settings are set;
    dataset/tokenizer/freeze policy stay real-data.
    """
    set_vl_layout(cfg, ep=64)
    set_vl_fused_kernels(cfg)
    set_batch(cfg, micro_batch=1, global_batch=1024)
    cuda_graphs_off(cfg)
    use_hybridep_dispatcher(cfg)
    cfg.env_vars = {**GB300_ENV, **hybridep_env(64)}


@recipe(task="pretrain", gpus=64, gpu="gb300", precision="bf16", layout="TP1 PP1 EP64 DP64", status="unmeasured")
def qwen35_vl_397b_a17b_pretrain_config() -> ConfigContainer:
    """Return the full-pretraining config for Qwen3.5/Qwen3.6-VL 397B-A17B on 64 GB300 GPUs.

    Defaults to the mock VLM dataset; ``--dataset energon dataset.path=...`` selects real data
    without rebuilding the execution policy, which is the shipped 64-GB300 benchmark layout.
    """
    cfg = vlm_pretrain_config("qwen35_vl_397b_a17b")
    _apply_qwen35_vl_397b_a17b_64gpu_gb300_execution_config(cfg)
    return cfg


def _apply_qwen35_vl_35b_a3b_16gpu_gb300_execution_config(cfg: ConfigContainer) -> None:
    """Apply the 16-GB300 execution policy for Qwen3.5/Qwen3.6-VL 35B-A3B.

    TP/PP/CP 1, EP4 ETP1 (DP16), micro batch 4, global batch 2048 of 4,096-token samples, real
    routing (no forced load balance), alltoall dispatcher, Transformer Engine CUDA graphs of
    the router and dispatch preprocessing, the vision CUDA-graph cap of 3,712 patches per
    micro batch, and selective recompute of the MoE activation and norms. The page names
    these settings without their values where we chose them (graph scope, recompute modules);
    they follow Megatron-Bridge's Qwen3.5-VL benchmark recipes. Counterpart of
    :func:`_apply_qwen35_vl_397b_a17b_64gpu_gb300_execution_config`; dataset/tokenizer/freeze
    policy stay real-data.
    """
    set_vl_layout(cfg, ep=4)
    set_vl_fused_kernels(cfg)
    set_batch(cfg, micro_batch=4, global_batch=2048)
    m = cfg.model
    # Real routing through the alltoall dispatcher (no forced load balance).
    m.moe_token_dispatcher_type = "alltoall"
    m.moe_router_force_load_balancing = False
    # Transformer Engine CUDA graphs of the router and the dispatch preprocessing; they need
    # TE's RNG tracker.
    m.cuda_graph_impl = "transformer_engine"
    m.cuda_graph_scope = ["moe_router", "moe_preprocess"]
    cfg.rng.te_rng_tracker = True
    m.use_te_rng_tracker = True
    # Megatron-Bridge 0.6.2's Qwen3.5-VL provider has no vision CUDA-graph fields yet; the cap
    # is kept on the provider for the runner's image-budget check.
    m.max_vision_cuda_graph_seq_length = VISION_CUDA_GRAPH_PATCH_CAP
    # Selective recompute of the MoE activation and the norms.
    m.recompute_granularity = "selective"
    m.recompute_method = None
    m.recompute_num_layers = None
    m.recompute_modules = ["moe_act", "layernorm"]
    cfg.env_vars = {**GB300_ENV, "CUDA_DEVICE_MAX_CONNECTIONS": 1}


@recipe(
    task="pretrain",
    gpus=16,
    gpu="gb300",
    precision="bf16",
    layout="TP1 PP1 EP4 DP16",
    status="functional",
    evidence="results/h200_qwen35_vl_35b_a3b_evidence.json",
)
def qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config() -> ConfigContainer:
    """Return the full-pretraining config for Qwen3.5/Qwen3.6-VL 35B-A3B on 16 GB300 GPUs.

    GB300 counterpart of Megatron-Bridge's H100 ``qwen35_vl_35b_a3b_pretrain_config``, which
    keeps its H100 execution policy. Defaults to the mock VLM dataset; maintained launchers may
    select a real dataset without rebuilding the model execution policy.
    """
    cfg = vlm_pretrain_config("qwen35_vl_35b_a3b")
    _apply_qwen35_vl_35b_a3b_16gpu_gb300_execution_config(cfg)
    return cfg


@recipe(
    task="pretrain",
    gpus=8,
    gpu="gb300",
    precision="fp8mx",
    layout="TP1 PP1 EP4 DP8",
    status="unmeasured",
)
def qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config() -> ConfigContainer:
    """The 16-GB300 VL 35B-A3B policy on 8 GB300 with MXFP8, Transformer Engine's CuTe DSL fused
    grouped MLP and HybridEP; layout, CUDA graphs, recompute and batch shape kept (DP8, EP4).
    The vision CUDA-graph cap was measured with ``dataset.task_encoder.max_pixels=200704`` at micro
    batch 4; the runner stops a launch whose image budget exceeds it. TE reads
    ``NVTE_CUTEDSL_FUSED_GROUPED_MLP`` at import: the runner sets it by re-executing itself.
    ``_library`` keeps the name apart from the mock-data ``..._fp8mx_config`` benchmark."""
    from megatron.bridge.training.mixed_precision import bf16_with_mxfp8_mixed

    cfg = qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config()
    cfg.mixed_precision = bf16_with_mxfp8_mixed()
    if gdn_kernel_backend_declared():
        cfg.model.gdn_kernel_backend = "cudnn"
    use_hybridep_dispatcher(cfg)
    # The whole environment, replacing the 16-GPU recipe's: the GB300 benchmark groups, HybridEP
    # for EP4 on the NVL72 domain (CUDA_DEVICE_MAX_CONNECTIONS 32 in place of 1), TE's CuTe DSL
    # fused grouped MLP and cuDNN normalization.
    cfg.env_vars = {
        **GB300_ENV,
        **hybridep_env(cfg.model.expert_model_parallel_size),
        **CUTEDSL_FUSED_GROUPED_MLP_ENV,
        **CUDNN_NORM_ENV,
    }
    return cfg
