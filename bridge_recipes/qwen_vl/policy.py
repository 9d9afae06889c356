"""Building blocks of the Qwen3.5-VL execution policies, shared by the per-GPU VL modules.

Each block sets one kind of thing: the parallel layout, the fused kernels, the MoE dispatcher,
CUDA graphs. None of them touches ``cfg.env_vars``: the environment is composed from the dicts
here (:data:`GB300_ENV`, :func:`hybridep_env`, ...) in one ``cfg.env_vars = {...}`` statement
at the end of each ``_apply_*`` helper or recipe that sets it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.qwen.policy import fused_router, fused_swiglu

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

# Process settings of the Megatron-Bridge GB300 Qwen3.5-VL benchmarks
# (megatron.bridge.perf_recipes.qwen_vl.gb300.qwen35_vl, 0.6.2; bridge-perf-recipes in
# docs/sources.md).
GB300_ENV = {
    "TORCH_NCCL_HIGH_PRIORITY": 1,
    "NCCL_GRAPH_REGISTER": 0,
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": 1,
    "NCCL_NVLS_ENABLE": 0,
    "NVTE_BWD_LAYERNORM_SM_MARGIN": 20,
    "NVTE_FWD_LAYERNORM_SM_MARGIN": 20,
}

# Transformer Engine's CuTe DSL fused grouped MLP; TE reads the gate once, when imported.
CUTEDSL_FUSED_GROUPED_MLP_ENV = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": 1}

# cuDNN normalization kernels, forward and backward.
CUDNN_NORM_ENV = {
    "NVTE_NORM_FWD_USE_CUDNN": 1,
    "NVTE_NORM_BWD_USE_CUDNN": 1,
}


def hybridep_env(ep: int) -> dict:
    """HybridEP topology on an NVL72 domain; read by DeepEP's HybridEPBuffer only."""
    return {
        "CUDA_DEVICE_MAX_CONNECTIONS": 32,
        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": ep,
        "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": 128,
        "NVLINK_DOMAIN_SIZE": 72,
        "USE_MNNVL": 1,
    }


def use_hybridep_dispatcher(cfg: ConfigContainer) -> None:
    """The flex dispatcher with the HybridEP backend (its environment: :func:`hybridep_env`)."""
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.model.moe_flex_dispatcher_backend = "hybridep"
    # Megatron-Bridge benchmark default for HybridEP (moe_hybridep_num_sms is deprecated)
    cfg.model.moe_flex_dispatcher_num_sms = 32


def set_vl_layout(cfg: ConfigContainer, *, ep: int) -> None:
    """TP/PP/CP 1, no VPP, EP ``ep`` with ETP1, no sequence parallelism."""
    m = cfg.model
    m.tensor_model_parallel_size = 1
    m.pipeline_model_parallel_size = 1
    m.context_parallel_size = 1
    m.virtual_pipeline_model_parallel_size = None
    m.expert_model_parallel_size = ep
    m.expert_tensor_parallel_size = 1
    m.sequence_parallel = False


def set_vl_fused_kernels(cfg: ConfigContainer) -> None:
    """Fused bias-activation and router kernels; no fused RoPE, because variable-length image
    inputs use mrope (as Megatron-Bridge's VL recipes)."""
    cfg.model.apply_rope_fusion = False
    fused_swiglu(cfg)
    fused_router(cfg)


def set_batch(cfg: ConfigContainer, *, micro_batch: int, global_batch: int) -> None:
    cfg.train.micro_batch_size = micro_batch
    cfg.train.global_batch_size = global_batch


def cuda_graphs_off(cfg: ConfigContainer) -> None:
    """No CUDA graphs, as Megatron-Bridge's GB300 VL benchmarks end up after their VL
    post-processing (variable-length image inputs)."""
    cfg.model.cuda_graph_impl = "none"
    cfg.model.cuda_graph_scope = []


def gdn_kernel_backend_declared() -> bool:
    """Whether this Megatron-Core declares ``gdn_kernel_backend`` (NVIDIA/Megatron-LM#7583)."""
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    return "gdn_kernel_backend" in {f.name for f in fields(TransformerConfig)}
