"""Building blocks of the Qwen3.5-VL execution policies, shared by the per-GPU VL modules."""

from __future__ import annotations

# Process settings of the Megatron-Bridge GB300 Qwen3.5-VL benchmarks
# (megatron.bridge.perf_recipes.qwen_vl.gb300.qwen35_vl, 0.6.2).
GB300_ENV = {
    "TORCH_NCCL_HIGH_PRIORITY": 1,
    "NCCL_GRAPH_REGISTER": 0,
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": 1,
    "NCCL_NVLS_ENABLE": 0,
    "NVTE_BWD_LAYERNORM_SM_MARGIN": 20,
    "NVTE_FWD_LAYERNORM_SM_MARGIN": 20,
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


def use_hybridep(cfg) -> None:
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.model.moe_flex_dispatcher_backend = "hybridep"
    cfg.model.moe_flex_dispatcher_num_sms = (
        32  # Megatron-Bridge benchmark default for HybridEP (moe_hybridep_num_sms is deprecated)
    )
    cfg.env_vars.update(hybridep_env(cfg.model.expert_model_parallel_size))


def vl_layout(cfg, *, ep: int) -> None:
    m = cfg.model
    m.tensor_model_parallel_size = m.pipeline_model_parallel_size = m.context_parallel_size = 1
    m.virtual_pipeline_model_parallel_size = None
    m.expert_model_parallel_size, m.expert_tensor_parallel_size = ep, 1
    m.sequence_parallel = False
    # Variable-length image inputs: no fused RoPE (mrope), as Megatron-Bridge's VL recipes.
    m.apply_rope_fusion = False
    m.bias_activation_fusion = True
    m.moe_router_fusion = True


def gb300_benchmark_layout(cfg, *, ep: int, micro_batch: int, global_batch: int) -> None:
    """The layout of Megatron-Bridge 0.6.2's GB300 Qwen3.5-VL benchmarks: TP/PP/CP 1, EP ``ep``
    ETP1, HybridEP, their environment; CUDA graphs off, as those benchmarks end up after their
    VL post-processing (variable-length image inputs)."""
    vl_layout(cfg, ep=ep)
    cfg.train.micro_batch_size, cfg.train.global_batch_size = micro_batch, global_batch
    cfg.model.cuda_graph_impl, cfg.model.cuda_graph_scope = "none", []
    cfg.env_vars = dict(GB300_ENV)
    use_hybridep(cfg)


def gdn_kernel_backend_declared() -> bool:
    """Whether this Megatron-Core declares ``gdn_kernel_backend`` (NVIDIA/Megatron-LM#7583)."""
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    return "gdn_kernel_backend" in {f.name for f in fields(TransformerConfig)}
