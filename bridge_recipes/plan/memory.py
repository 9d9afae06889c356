"""Per-GPU memory of a recipe, predicted before launch.

Units: GB = 1e9 bytes, the unit Megatron-Bridge logs (``mem-max-allocated-gigabytes`` is
torch's byte count / 1.0e9, ``megatron/bridge/training/utils/train_utils.py``).

For every pipeline stage the plan takes the rank that holds the most (balanced expert
routing assumed) and adds, at its peak moment:

- weights (:mod:`.params`, :mod:`.weights`): BF16, 2 bytes per local parameter. The stage holds its decoder layers, the
  embedding on the first stage, the final norm, output layer and MTP block on the last.
  Attention / GDN / dense-MLP / shared-expert matrices and the vocabulary are divided by TP,
  norms and the MoE router are replicated, routed experts are divided by EP and then ETP.
- main gradients: Megatron's DDP grad buffer covers every local parameter: 4 bytes when
  ``grad_reduce_in_fp32`` (the ``bf16_mixed`` preset sets it and overrides ``ddp``), else 2.
- optimizer state (Adam, :mod:`.optimizer`): master copy + exp_avg + exp_avg_sq. The distributed optimizer
  shards dense parameters over DP x CP and expert parameters over the expert-data-parallel
  group world / (PP x EP x ETP). The master copy is 4 bytes (FP32), except when Transformer
  Engine's FusedAdam owns it (precision-aware optimizer with ``main_params_dtype`` BF16, no
  FP8 recipe, or CPU offload: ``OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8``):
  with FP32 ``main_params_dtype`` and ``store_param_remainders`` TE keeps only a 16-bit
  remainder, the other 16 bits being the BF16 weight already counted above (2 bytes here,
  4 together); with BF16 main params the master is a 2-byte copy. NOTE: ``bf16_mixed`` leaves
  ``fp8_recipe="tensorwise"`` in the optimizer config even without FP8, so on the GPU the
  recipes get Megatron's FP32 masters (12 bytes per parameter; the H200 logs confirm 18 bytes
  per parameter in all: 2 weight + 4 grad + 12 optimizer). With CPU offload Megatron's
  HybridDeviceOptimizer keeps FP32 copies and moments (12 bytes); the fraction f of them, with
  FP32 gradient copies, lives on the host (reported, not counted on the GPU).
- LoRA (``cfg.peft``): the base weights are frozen and keep only their BF16 copy; gradients
  and optimizer state cover the adapters alone. An adapter on a linear of input n and output m
  adds ``dim x (n + m)`` parameters (A: n -> dim, B: dim -> m), with the side TP splits divided
  by TP; grouped MoE experts share one adapter per rank (Megatron-Bridge's
  ``share_expert_adapters``). Activations are counted as for full fine-tuning (an upper bound:
  the frozen weights need no saved inputs for their weight gradients). A base stored in FP8
  (``fp8_frozen_base``) keeps its linear weights at one byte and dequantizes one at a time in the
  backward (``bridge_recipes.features.fp8_base``).
- activations (:mod:`.activations`, :mod:`.schedule`): bytes each decoder layer saves for its
  backward, summed tensor by tensor in the ``*_activation_elems`` functions (BF16 elements; FP32
  tensors count twice), for a micro batch of ``seq_length / CP`` tokens (``/ TP`` more in the residual stream under
  sequence parallelism). Full recompute keeps only the input of each checkpointed chunk and
  rebuilds one chunk during the backward; block recompute of N checkpoints the first N layers
  of every stage (or virtual stage) and the rest keep everything (a rebuild then adds only what
  exceeds the activations the backward has already released); selective recompute keeps each
  layer's activations less what its ``recompute_modules`` discard (``selective_saving_elems``)
  and rebuilds one layer's share during the backward; no recompute keeps all. The
  MTP block is checkpointed under uniform full recompute only (Megatron-Core skips MTP under
  the block method). 1F1B keeps min(PP - stage, micro batches) micro batches in flight on a
  stage; the interleaved schedule (PP - stage - 1) x 2 + (VPP - 1) x PP + 1 model chunks.
- logits (last stage, :mod:`.logits`): L = (seq / CP) x vocab / TP elements per loss, one loss per MTP layer
  plus the LM loss. The LM loss is computed while the MTP losses keep what their backward
  needs. Transformer Engine's fused cross entropy keeps a BF16 copy (2L bytes per loss) and
  peaks at one more 2L while the logits and the copy coexist. Megatron's native fused kernel
  (``fused_vocab_parallel_cross_entropy``) keeps the FP32 softmax (4L per loss) and peaks at
  BF16 logits 2L + FP32 copy 4L + 4L, the last being the out-of-place result that
  ``torch.compile`` (Megatron's ``jit_fuser``) makes of the in-place updates of its input.
  The unfused path has no compiled helper: 2L + 4L. The inferred term is the compiled
  temporary: it is how ``torch.compile`` functionalises input mutation, and the two native
  runs measured on the H200 need it while the TE run does not (docs/memory_plan.md). The loss a
  chunk of tokens at a time (``bridge_recipes.features.chunked_loss``) keeps one chunk's logits, gradient
  and FP32 copy (8 bytes per logit) and a few floats per token per loss.
- overhead: CUDA context, cuBLAS/TE workspaces and NCCL buffers live outside torch's
  allocator (a constant), and the caching allocator reserves more than it allocates (a
  fraction of the allocated peak). See ``FRAMEWORK_CONSTANT_GB`` and ``FRAMEWORK_FRACTION``.
- backward working set: the largest group of layers a recompute rebuilds at once and two
  [tokens x top-k, hidden] MoE dispatch buffers; it never coexists with the logits (the loss is
  done before the backward reaches the decoder), so the larger of the two is counted.

Each stage's sum and the fit verdict: :mod:`.peak`; the runner's ``--plan`` text and the changes
that would fit: :mod:`.report`. This module gathers their public names.

What is compared with Megatron's ``mem-max-allocated-gigabytes`` is ``allocated_gb`` (no
overhead); what must fit the GPU is ``total_gb``. Measured checks: ``docs/memory_plan.md``.
"""

from __future__ import annotations

from bridge_recipes.models.dims import ModelDims
from bridge_recipes.plan.activations import (
    SELECTIVE_MODULES,
    moe_activation_elems,
    routed_tokens,
    selective_modules,
    selective_saving_elems,
)
from bridge_recipes.plan.dims import Tokens, micro_batch_tokens, model_dims, parallel_layout
from bridge_recipes.plan.optimizer import optimizer_bytes_per_param
from bridge_recipes.plan.params import (
    Params,
    layer_params,
    linear_params,
    lora_params,
    mtp_linear_params,
    stage_params,
)
from bridge_recipes.plan.peak import (
    DEFAULT_GPU,
    FRAMEWORK_CONSTANT_GB,
    FRAMEWORK_FRACTION,
    GPU_MEMORY_GB,
    ONE_GPU_CONSTANT_GB,
    ONE_GPU_FRACTION,
    ONE_GPU_MIN_SLACK_GB,
    MemoryPlan,
    StageMemory,
    gpu_memory,
    plan_memory,
    plan_notes,
)
from bridge_recipes.plan.precision import effective_precision, fp8_frozen_base, fp8_parameters, mixed_precision_config
from bridge_recipes.plan.report import changes_that_fit, format_plan, plan_report
from bridge_recipes.plan.schedule import micro_batches_in_flight, stage_chunks
from bridge_recipes.plan.weights import (
    fp8_base_saving_bytes,
    fp8_weight_cache_bytes,
    fp8_weight_copies,
    fused_wgrad_placeholder_bytes,
)

__all__ = [
    "DEFAULT_GPU",
    "FRAMEWORK_CONSTANT_GB",
    "FRAMEWORK_FRACTION",
    "ONE_GPU_CONSTANT_GB",
    "ONE_GPU_FRACTION",
    "ONE_GPU_MIN_SLACK_GB",
    "GPU_MEMORY_GB",
    "MemoryPlan",
    "ModelDims",
    "Params",
    "SELECTIVE_MODULES",
    "StageMemory",
    "Tokens",
    "changes_that_fit",
    "effective_precision",
    "format_plan",
    "fp8_base_saving_bytes",
    "fp8_frozen_base",
    "fp8_parameters",
    "fp8_weight_cache_bytes",
    "fp8_weight_copies",
    "fused_wgrad_placeholder_bytes",
    "gpu_memory",
    "layer_params",
    "linear_params",
    "lora_params",
    "micro_batch_tokens",
    "micro_batches_in_flight",
    "mixed_precision_config",
    "model_dims",
    "moe_activation_elems",
    "mtp_linear_params",
    "optimizer_bytes_per_param",
    "parallel_layout",
    "plan_memory",
    "plan_notes",
    "plan_report",
    "routed_tokens",
    "selective_modules",
    "selective_saving_elems",
    "stage_chunks",
    "stage_params",
]
