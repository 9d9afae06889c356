"""Building blocks of the Qwen3.5-VL execution policies, shared by the per-GPU VL modules.

Each block sets one kind of thing: the parallel layout, the fused kernels, the MoE dispatcher,
CUDA graphs. None of them touches ``cfg.env_vars``: the environment is composed from the dicts
here and in ``bridge_recipes.recipes.qwen.policy`` (:data:`GB300_ENV`, :func:`hybridep_env`, ...) in one
``cfg.env_vars = {...}`` statement at the end of each ``_apply_*`` helper or recipe that sets it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.qwen.policy import fused_router, fused_swiglu

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

# Transformer Engine's CuTe DSL fused grouped MLP; TE reads the gate once, when imported.
CUTEDSL_FUSED_GROUPED_MLP_ENV = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": 1}

# cuDNN normalization kernels, forward and backward.
CUDNN_NORM_ENV = {
    "NVTE_NORM_FWD_USE_CUDNN": 1,
    "NVTE_NORM_BWD_USE_CUDNN": 1,
}


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


def gdn_kernel_backend_declared() -> bool:
    """Whether this Megatron-Core declares ``gdn_kernel_backend`` (NVIDIA/Megatron-LM#7583)."""
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    return "gdn_kernel_backend" in {f.name for f in fields(TransformerConfig)}
