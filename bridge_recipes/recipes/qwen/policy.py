"""Building blocks of execution policies, shared by the per-GPU recipe modules.

Each ``_apply_<model>_<N>gpu_<gpu>_execution_config`` helper is written from these, so one
setting (say, how CPU optimizer offload is switched on) has one definition. Each block sets one
kind of thing: numerics, optimizer sharding, recompute, offload, layout, a run-time feature
(``cfg.features``). None of them touches ``cfg.env_vars``: the environment is the process's only
(NCCL, Transformer Engine, PyTorch), one of the named dicts below assigned whole, by the frame the
helpers share (:func:`openrecipes_execution`) or by a recipe that needs another, so a recipe's
environment reads in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

# The environment of the OpenRecipes H200 SFT runs (openrecipes-35b-h200,
# openrecipes-27b-h200 in docs/sources.md). NCCL_NVLS_ENABLE there was
# 1 when the node reports NVLink (p5en does); export NCCL_NVLS_ENABLE=0 where NVLink SHARP must
# stay off (a value already in the environment wins over the recipe's).
OPENRECIPES_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": 1,
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCHINDUCTOR_COMPILE_THREADS": 1,
    "NCCL_NVLS_ENABLE": 1,
}

# Transformer Engine's switch from per-expert cuBLAS GEMMs to one CUTLASS grouped GEMM (Hopper only)
CUTLASS_GROUPED_GEMM_ENV = "NVTE_USE_CUTLASS_GROUPED_GEMM"
# :data:`OPENRECIPES_ENV` with the routed experts as one CUTLASS grouped GEMM: one kernel per grouped
# linear instead of one cuBLAS GEMM per expert, each launched from the host. With all 256 experts on one
# GPU those launches, not the GPU, set the step time. GEMMs whose inner dimension differs between
# experts (weight gradients) or is not a multiple of 128 stay on cuBLAS; other GPUs ignore the variable.
OPENRECIPES_GROUPED_GEMM_ENV = {**OPENRECIPES_ENV, CUTLASS_GROUPED_GEMM_ENV: 1}


def set_openrecipes_numerics(cfg: ConfigContainer) -> None:
    """The numerics every OpenRecipes SFT run shares (the flags of openrecipes-35b-h200's command):
    flash attention, FP32 softmax, no dropout, per-token loss, FP32 router, native fused cross
    entropy, FP32 gradient reduction."""
    from megatron.core.transformer.enums import AttnBackend

    m = cfg.model
    # --attention-backend flash, softmax in FP32, no dropout
    m.attention_backend = AttnBackend.flash
    m.attention_softmax_in_fp32 = True
    m.attention_dropout = 0.0
    m.hidden_dropout = 0.0
    # --calculate-per-token-loss: the loss sums in the collective, then divides by the token count
    m.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    m.moe_router_dtype = "fp32" if m.num_moe_experts else None
    # Fused cross entropy keeps the 248K-vocab logits small; Megatron-Core 0.19.2 flags the TE
    # implementation as unstable, so the recipes use its native fused kernel.
    m.cross_entropy_loss_fusion = True
    m.cross_entropy_fusion_impl = "native"
    # --accumulate-allreduce-grads-in-fp32
    cfg.ddp.grad_reduce_in_fp32 = True


def shard_optimizer_precision_aware(cfg: ConfigContainer) -> None:
    """Optimizer state sharded over data parallelism (distributed optimizer, in the optimizer and
    the DDP wrapper), kept by TE's precision-aware FusedAdam (BF16 parameter plus remainder)."""
    cfg.optimizer.use_distributed_optimizer = True
    cfg.ddp.use_distributed_optimizer = True
    cfg.optimizer.use_precision_aware_optimizer = True


@contextmanager
def openrecipes_execution(cfg: ConfigContainer, env: dict | None = None) -> Iterator[None]:
    """The frame of an OpenRecipes execution policy, around the layout, recompute and dispatcher
    its block sets: first the shared numerics and the precision-aware sharded optimizer, last one
    row per micro batch and the environment ``env`` (:data:`OPENRECIPES_ENV` by default)."""
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    yield
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**(OPENRECIPES_ENV if env is None else env)}


def lora_one_gpu(cfg: ConfigContainer, *, moe: bool = False, env: dict | None = None) -> None:
    """A LoRA model replica on one GPU, whatever the GPU: TP1 PP1 (EP1), full uniform recompute of 1
    layer, one row per micro batch, the OpenRecipes numerics and optimizer, for an MoE the alltoall
    dispatcher; the environment ``env`` (:func:`openrecipes_execution`). Each GPU's recipes add what its
    memory asks for (rows per micro batch, recompute, the loss a chunk at a time, an FP8 base)."""
    with openrecipes_execution(cfg, env):
        set_layout(cfg)
        full_recompute(cfg)
        if moe:
            cfg.model.moe_token_dispatcher_type = "alltoall"


def fast_lora_kernels(cfg: ConfigContainer, *, router: bool = False) -> None:
    """The kernels a one-GPU LoRA recipe spends its spare memory on: Transformer Engine's cross entropy,
    the fused SwiGLU and, for an MoE, the fused router."""
    te_cross_entropy(cfg)
    fused_swiglu(cfg)
    if router:
        fused_router(cfg)


def full_recompute(cfg: ConfigContainer, method: str = "uniform", num_layers: int = 1) -> None:
    cfg.model.recompute_granularity = "full"
    cfg.model.recompute_method = method
    cfg.model.recompute_num_layers = num_layers


def rows_per_micro_batch(cfg: ConfigContainer, rows: int) -> None:
    """``rows`` rows of the data a micro batch, so that one host launch carries them all. On mock data
    and rows without conversation boundaries they run side by side (``train.micro_batch_size``); rows
    with boundaries run one packed sequence per micro batch, so there the build joins them into one
    sequence of the ``rows`` rows (``dataset.rows_per_sample``, ``model.seq_length`` x ``rows``, the
    same rows per step: ``bridge_recipes.data.packed_rows.join_recipe_rows``) and says so."""
    from bridge_recipes.data.packed_rows import RECIPE_ROWS

    cfg.train.micro_batch_size = rows
    setattr(cfg.train, RECIPE_ROWS, rows)


def te_cross_entropy(cfg: ConfigContainer) -> None:
    """Transformer Engine's fused cross entropy instead of Megatron-Core's native kernel: it keeps a
    BF16 copy of the 248K-vocabulary logits instead of an FP32 one (a smaller loss working set) and
    ran faster on the H200 proxy. Megatron-Core 0.19.2 still warns of known
    stability issues: Megatron-LM disabled it in 2026-06 after runs diverged, traced to its backward
    keeping the gradient in the BF16 logits buffer. Transformer Engine 2.20 (the lock's) saves FP32
    softmax statistics and rebuilds the gradient in FP32 in the backward (a test checks the installed
    kernel has that form), which is the fix Megatron-LM's change to re-enable it cites. The recipes
    that use it also passed the loss-curve check against the native kernel."""
    cfg.model.cross_entropy_loss_fusion = True
    cfg.model.cross_entropy_fusion_impl = "te"


def fused_swiglu(cfg: ConfigContainer) -> None:
    """Megatron-Core's fused SwiGLU kernel instead of the unfused chunk, SiLU and product (Megatron-
    Bridge's default is off): each layer keeps 2 x FFN-width fewer elements per token for the backward
    and moves less memory."""
    cfg.model.bias_activation_fusion = True


def fused_router(cfg: ConfigContainer) -> None:
    """Transformer Engine's fused MoE router kernels (top-k with the score function, the auxiliary-loss
    scores and the load-balancing loss) instead of Megatron-Core's unfused ones (Megatron-Bridge's
    default is off for the text models): fewer, larger kernels a router pass, the same loss curve."""
    cfg.model.moe_router_fusion = True


def chunked_cross_entropy(cfg: ConfigContainer) -> None:
    """The output layer and the cross entropy a chunk of tokens at a time (``features.chunked_loss``,
    ``bridge_recipes.features.chunked_loss``): no loss keeps the 248K-vocabulary logits of the whole micro
    batch (32,768 tokens: 16 GB each, the MTP head's loss and the main one), one tensor-parallel rank only."""
    cfg.features.chunked_loss.enabled = True


def fp8_current_scaling(cfg: ConfigContainer) -> None:
    """The transformer layers' GEMMs in FP8 with per-tensor current scaling (Megatron-Bridge's
    ``bf16_with_fp8_current_scaling_mixed``: each tensor scaled from its own amax when it is cast;
    the model's first and last layers, the embedding, the output layer and the loss stay BF16, the
    MTP layer runs FP8), with the parameters kept in BF16.

    The preset also stores the parameters in FP8 (``fp8_param_gather``), which a fine-tuning run must
    not: Megatron-Core 0.19.2 then fills the optimizer's master weights from the FP8 parameters after a
    checkpoint load without optimizer state (``DistributedOptimizer._copy_model_params_to_main_params``
    dequantizes them), so the Hugging Face weights would start, and be exported, rounded to FP8. With
    BF16 parameters Transformer Engine keeps an FP8 copy of every FP8 layer's weight for the step
    (2 bytes per parameter, ``plan.memory.fp8_weight_cache_bytes``), cast in the step's first micro batch.
    ``disable_parameter_transpose_cache=true`` instead casts each weight in every forward and recomputed
    forward and keeps that copy for the layer's backward, one per micro batch in flight
    (``plan.memory.fp8_weight_copies``): less memory at recompute of few layers, slower."""
    from megatron.bridge.training.mixed_precision import bf16_with_fp8_current_scaling_mixed

    cfg.mixed_precision = bf16_with_fp8_current_scaling_mixed()
    cfg.mixed_precision.fp8_param_gather = False  # also clears fp8_param (the two are kept in step)
    # Transformer Engine's FP8 weight cache: each weight cast once per step, not in every forward
    cfg.model.disable_parameter_transpose_cache = False


def fp8_frozen_base(cfg: ConfigContainer, gemms: str = "bf16") -> None:
    """LoRA's frozen base weights stored in FP8, one byte per weight (``bridge_recipes.features.fp8_base``):
    every layer's Transformer Engine linears (the MTP layer's too) hold FP8 weights with one per-tensor
    scale and, with ``gemms="bf16"``, multiply in BF16 on the weight dequantized for each GEMM, so the
    adapters learn what they would on a BF16 base; ``gemms="fp8"`` multiplies in FP8 in the forward (no
    dequantized copies, the adapters' gradients further from FP32): ``features.fp8_base.gemms``. Embedding,
    output layer, norms and router stay BF16; the adapters and their optimizer state are not touched.
    Refused where the GPU has no FP8 (Ampere)."""
    from megatron.bridge.training.mixed_precision import bf16_with_fp8_current_scaling_mixed

    from bridge_recipes.features.fp8_base import GEMMS

    if gemms not in GEMMS:
        raise ValueError(f"gemms={gemms!r}: an FP8 base multiplies in one of {', '.join(GEMMS)}")
    cfg.features.fp8_base.gemms = gemms

    cfg.mixed_precision = bf16_with_fp8_current_scaling_mixed()
    # every layer in FP8: the preset's BF16 first and last layers would keep two bytes per weight
    cfg.mixed_precision.first_last_layers_bf16 = False
    # the parameters are the FP8 tensors (fp8_param, kept in step with fp8_param_gather)
    cfg.mixed_precision.fp8_param_gather = True


def bf16_adam_moments(cfg: ConfigContainer) -> None:
    """Adam's two moments kept in BF16 by the precision-aware optimizer (FP32 by default): 4 of the
    16 bytes per parameter of optimizer state saved."""
    import torch

    cfg.optimizer.exp_avg_dtype = torch.bfloat16
    cfg.optimizer.exp_avg_sq_dtype = torch.bfloat16


def cpu_optimizer_offload(cfg: ConfigContainer) -> None:
    """All optimizer state on the host, copies overlapped with compute (slime's
    --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d)."""
    cfg.optimizer.optimizer_cpu_offload = True
    cfg.optimizer.optimizer_offload_fraction = 1.0
    cfg.optimizer.overlap_cpu_optimizer_d2h_h2d = True


def set_layout(cfg: ConfigContainer, *, tp=1, pp=1, cp=1, ep=1, etp=1, sp=False, first=None, last=None) -> None:
    """Parallel sizes (ETP always explicit: unset it would inherit TP) and the pipeline split."""
    import torch

    m = cfg.model
    m.tensor_model_parallel_size = tp
    m.pipeline_model_parallel_size = pp
    m.context_parallel_size = cp
    m.expert_model_parallel_size = ep
    m.expert_tensor_parallel_size = etp
    m.sequence_parallel = sp
    m.virtual_pipeline_model_parallel_size = None
    m.num_layers_in_first_pipeline_stage = first
    m.num_layers_in_last_pipeline_stage = last
    m.pipeline_dtype = torch.bfloat16 if pp > 1 else None


# --- GB300 (NVL72) blocks, shared by the text and VL recipes ---------------------------------

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


def cuda_graphs_off(cfg: ConfigContainer) -> None:
    """No CUDA graphs, as Megatron-Bridge's GB300 VL benchmarks end up after their VL
    post-processing (variable-length image inputs)."""
    cfg.model.cuda_graph_impl = "none"
    cfg.model.cuda_graph_scope = []
