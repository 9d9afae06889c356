"""H200 recipes for Qwen3.5 / Qwen3.6 text models (real data; benchmark forms in perf_recipes).

The 8-GPU SFT layouts are the OpenRecipes H200 entries by ATTUNE (openrecipes-35b-h200 and
openrecipes-27b-h200 in docs/sources.md),
measured there on 8 x H200 (AWS p5en.48xlarge) with slime on megatron-core 0.16.0rc0 and
TE 2.10: 8,192-token SFT rows, global batch 128, BF16, precision-aware distributed Adam,
lr 1e-5 cosine to 1e-6, 10% warm-up, weight decay 0.1, betas 0.9/0.98, per-token loss,
flash attention. Their published tokens/s/GPU are the references below; our own measured
figures, when there are any, are the result files named by ``measured=``.

The 122B-A10B and 397B-A17B SFT layouts and every LoRA layout are this project's, sized by the
memory planner (``run_recipe.py --recipe NAME --plan``, bridge_recipes/plan/memory.py) at the
same workload; their docstrings give the planner's per-stage peaks. LoRA recipes put adapters on
:data:`bridge_recipes.recipes.base.LORA_TARGETS` through Megatron-Bridge's PEFT (bridge-qwen35-recipes
in docs/sources.md) and need starting weights (``--hf-checkpoint DIR`` or
``checkpoint.pretrained_checkpoint=DIR``): Megatron-Bridge refuses LoRA from random init.

Qwen3.6 checkpoints use these recipes unchanged (same architecture and tokenizer): the registry
lists each recipe of a size with a Qwen3.6 checkpoint also as ``qwen36_...``, which builds the same
config recording the Qwen3.6 checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import peft_config, pretrain_config, sft_config
from bridge_recipes.recipes.qwen.policy import (
    OPENRECIPES_GROUPED_GEMM_ENV,
    bf16_adam_moments,
    chunked_cross_entropy,
    cpu_optimizer_offload,
    fast_lora_kernels,
    fp8_current_scaling,
    full_recompute,
    fused_router,
    fused_swiglu,
    lora_one_gpu,
    openrecipes_execution,
    rows_per_micro_batch,
    set_layout,
    te_cross_entropy,
)
from bridge_recipes.recipes.recipe import recipe
from bridge_recipes.recipes.resilience import disable_resilience
from bridge_recipes.recipes.scaledown import scale_down

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config",
    "qwen35_27b_sft_8gpu_h200_bf16_config",
    "qwen35_27b_sft_8gpu_h200_bf16_fast_config",
    "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config",
    "qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config",
    "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config",
    "qwen35_122b_a10b_sft_24gpu_h200_bf16_config",
    "qwen35_397b_a17b_sft_64gpu_h200_bf16_config",
    "qwen35_27b_peft_1gpu_h200_bf16_config",
    "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config",
    "qwen35_27b_peft_8gpu_h200_bf16_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config",
    "qwen35_35b_a3b_peft_1gpu_h200_bf16_32k_config",
    "qwen35_27b_peft_1gpu_h200_bf16_32k_config",
    "qwen35_35b_a3b_peft_8gpu_h200_bf16_config",
    "qwen35_122b_a10b_peft_8gpu_h200_bf16_config",
    "qwen35_397b_a17b_peft_8gpu_h200_bf16_config",
]

OPENRECIPES_35B_H200 = (
    "OpenRecipes H200 leaderboard for Qwen3.6-35B-A3B SFT, ATTUNE, measured 2026-10-13"
    " (openrecipes-35b-h200, docs/sources.md)"
)
OPENRECIPES_27B_H200 = (
    "OpenRecipes YAML of ATTUNE's Qwen3.6-27B H200 recipe, measured 2026-10-18 (openrecipes-27b-h200, docs/sources.md)"
)

# --- Qwen3.5/3.6-35B-A3B ------------------------------------------------------------------


def _apply_qwen35_35b_a3b_8gpu_h200_execution_config(cfg: ConfigContainer) -> None:
    """ATTUNE's tuned 8 x H200 layout (openrecipes-35b-h200, #1): TP1 PP1 EP8 ETP1 DP8, one 8,192-token row
    per micro batch, full uniform recompute of 1 layer, alltoall dispatcher, precision-aware
    distributed Adam on the GPU (no offload)."""
    with openrecipes_execution(cfg):
        set_layout(cfg, ep=8)
        full_recompute(cfg)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="functional",
    reference={"tokens_per_s_per_gpu": 4663.1, "mfu": 0.083, "source": OPENRECIPES_35B_H200},
    evidence="results/h200_qwen35_35b_a3b_evidence.json",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B SFT on 8 x H200: EP8, 8,192 tokens per GPU, no offload (4,663.1 published)."""
    cfg = sft_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_h200_execution_config(cfg)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="functional",
    reference={"tokens_per_s_per_gpu": 4663.1, "mfu": 0.083, "source": OPENRECIPES_35B_H200},
    evidence="evidence/candidates/35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion_16_layers.log",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config() -> ConfigContainer:
    """The published EP8 layout with the memory it can free spent on recompute: Adam's moments in
    BF16 and Transformer Engine's cross entropy free the memory that buys block recompute of
    the first 5 of 40 layers instead of full recompute of all 40; the fused SwiGLU and router cut
    kernel launches. It is the published recipe with candidate
    ``35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion``'s overrides."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    _fast_35b_a3b_kernels(cfg)
    # the first 5 layers recompute their activations in the backward pass, the other 35 keep them
    full_recompute(cfg, method="block", num_layers=5)
    return cfg


def _fast_35b_a3b_kernels(cfg: ConfigContainer) -> None:
    """What both fast 35B-A3B policies change in the published one before spending the memory it frees:
    Adam's moments in BF16, Transformer Engine's cross entropy, the fused SwiGLU and the fused router."""
    bf16_adam_moments(cfg)
    te_cross_entropy(cfg)
    fused_swiglu(cfg)
    fused_router(cfg)


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="functional",
    reference={"tokens_per_s_per_gpu": 4663.1, "mfu": 0.083, "source": OPENRECIPES_35B_H200},
    evidence="evidence/candidates/35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers.log",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config() -> ConfigContainer:
    """The fast recipe's kernels and BF16 Adam moments, spending the memory they free on a second
    8,192-token row per micro batch (16,384 tokens per GPU) with the published full recompute. The step
    is bound by the host's kernel launches, and a launch that carries two rows halves them. Rows with
    conversation boundaries (``--packing boundaries``) run as one packed sequence of the two."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    _fast_35b_a3b_kernels(cfg)
    # two 8,192-token rows per micro batch: 16 rows per GPU per step in 8 micro batches, every layer recomputed
    # (one packed sequence of the two on rows with conversation boundaries)
    rows_per_micro_batch(cfg, 2)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="functional",
    reference={"tokens_per_s_per_gpu": 4663.1, "mfu": 0.083, "source": OPENRECIPES_35B_H200},
    evidence="evidence/candidates/35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4_16_layers.log",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config() -> ConfigContainer:
    """The two-rows recipe at four 8,192-token rows per micro batch (32,768 tokens per GPU), full
    recompute kept: the launches halve again and the step comes near the GPU's own time. Under full
    recompute only the layer being rebuilt holds its experts' tokens, so the memory left covers a hot
    expert rank. If a run stops out of memory, the two-rows recipe keeps more of the GPU free."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config()
    # four 8,192-token rows per micro batch: 16 rows per GPU per step in 4 micro batches, every layer recomputed
    # (one packed sequence of the four on rows with conversation boundaries)
    rows_per_micro_batch(cfg, 4)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 3466.8, "mfu": 0.062, "source": OPENRECIPES_35B_H200},
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config() -> ConfigContainer:
    """The EP8 layout at 16,384 tokens per GPU (two rows per micro batch) with the optimizer on
    the CPU, copies overlapped (openrecipes-35b-h200, #2: 3,466.8 published)."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    # two 8,192-token rows per micro batch (one packed sequence of the two on rows with conversation boundaries)
    rows_per_micro_batch(cfg, 2)
    cpu_optimizer_offload(cfg)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP2 EP4 DP4",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 3076.8, "mfu": 0.055, "source": OPENRECIPES_35B_H200},
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config() -> ConfigContainer:
    """The 16,384-token offloaded variant with two pipeline stages and EP4 (openrecipes-35b-h200, #3:
    3,076.8 published). 40 layers split 20/20."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config()
    set_layout(cfg, pp=2, ep=4)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP2 PP1 CP2 EP8 ETP1 DP2",
    status="unmeasured",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config() -> ConfigContainer:
    """Long-context layout of the on-policy-distillation example (opd-35b-h200) on one 8 x H200 node:
    TP2 (sequence parallel) PP1 CP2 EP8 ETP1, optimizer on the CPU, 32,768-token sequences. The
    example's two-node DP4 is re-tiled to one node as DP2. Gated DeltaNet with CP > 1 needs
    Megatron-Core 0.19.2 or later, which converts between context- and head-parallel layouts."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    set_layout(cfg, tp=2, cp=2, ep=8, etp=1, sp=True)
    cpu_optimizer_offload(cfg)
    cfg.model.seq_length = 32768
    cfg.dataset.seq_length = 32768
    return cfg


# --- Qwen3.6-27B ---------------------------------------------------------------------------


def _apply_qwen35_27b_8gpu_h200_execution_config(cfg: ConfigContainer) -> None:
    """ATTUNE's tuned 8 x H200 layout (openrecipes-27b-h200): TP1 PP4 with 16/17/17/14 layers, one
    8,192-token row per micro batch, full recompute of the first 12 layers of each stage
    (block), precision-aware distributed Adam on the GPU. Block 10 ran out of memory on the
    first stage; PP2 at TP1 ran out on the last stage (FP32 logits of the 248K vocabulary)."""
    with openrecipes_execution(cfg):
        set_layout(cfg, pp=4, first=16, last=14)
        full_recompute(cfg, "block", 12)


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP4 DP2",
    status="functional",
    reference={"tokens_per_s_per_gpu": 2499.5, "mfu": 0.3886, "source": OPENRECIPES_27B_H200},
    evidence="results/h200_qwen35_27b_evidence.json",
)
def qwen35_27b_sft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B SFT on 8 x H200: PP4 16/17/17/14, block recompute 12 (2,499.5 published)."""
    cfg = sft_config("qwen35_27b")
    _apply_qwen35_27b_8gpu_h200_execution_config(cfg)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP4 DP2",
    status="functional",
    reference={"tokens_per_s_per_gpu": 2499.5, "mfu": 0.3886, "source": OPENRECIPES_27B_H200},
    evidence="evidence/candidates/27b_te_ce_fused_swiglu_block10.log",
)
def qwen35_27b_sft_8gpu_h200_bf16_fast_config() -> ConfigContainer:
    """The published PP4 layout made faster for a run that trains Qwen3.5's MTP layer: the fused
    SwiGLU frees the memory for block recompute of 11 instead of 12 layers per stage, Transformer
    Engine's cross entropy shrinks the last stage's loss working set, and a 16/18/18/12 split moves
    two layers off the last stage, which also runs the output layer and the MTP layer. It is the
    published recipe with candidate ``27b_te_ce_fused_swiglu_block10``'s overrides and that split,
    one more layer recomputed per stage than the candidate (whose first stage plans over an H200)."""
    cfg = qwen35_27b_sft_8gpu_h200_bf16_config()
    te_cross_entropy(cfg)
    fused_swiglu(cfg)
    # 64 layers as 16/18/18/12: the last stage also runs the output layer, the MTP layer and its
    # second pass through the output layer (together about 6 layers' time)
    set_layout(cfg, pp=4, first=16, last=12)
    # the first 11 layers of each stage recompute their activations in the backward pass: with 10, the
    # first stage (four micro batches in flight) plans 150.7 GB, more than an H200's 150.1
    full_recompute(cfg, "block", 11)
    return cfg


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="fp8cs",
    layout="TP1 PP4 DP2",
    status="functional",
    reference={"tokens_per_s_per_gpu": 2499.5, "mfu": 0.3886, "source": OPENRECIPES_27B_H200},
    evidence="evidence/candidates/27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached_rows.log",
)
def qwen35_27b_sft_8gpu_h200_fp8cs_fast_config() -> ConfigContainer:
    """The fast 27B recipe with its layers' GEMMs in FP8 (per-tensor current scaling; the model's first
    and last layers stay BF16), parameters in BF16 so that a run from Hugging Face weights starts
    from and exports them unrounded, and Transformer Engine's FP8 weight cache, cast once per step.
    FP8 makes the layers cheaper but not the last stage's head, so the split moves two more layers
    off it (16/19/19/10), and the cache's memory is paid for by recomputing 14 layers per stage."""
    cfg = qwen35_27b_sft_8gpu_h200_bf16_fast_config()
    fp8_current_scaling(cfg)
    # 64 layers as 16/19/19/10: with the layers in FP8 the last stage's output layer, loss and MTP
    # (BF16 but for the MTP layer) are a larger share of a micro batch; the predictor's best split
    set_layout(cfg, pp=4, first=16, last=10)
    # the FP8 weight cache is held for the step: recomputing the first 14 layers of each stage keeps
    # 0-5 layers' activations
    full_recompute(cfg, "block", 14)
    return cfg


def _apply_qwen35_27b_8gpu_h200_slime_reference_execution_config(cfg: ConfigContainer) -> None:
    """The reference ATTUNE compared against (openrecipes-27b-h200): slime's run-qwen3.5-27B.sh on one node,
    TP4 with sequence parallelism, PP2 with 34/30 layers, CP1, full uniform recompute,
    optimizer on the CPU, same optimizer settings."""
    with openrecipes_execution(cfg):
        set_layout(cfg, tp=4, pp=2, sp=True, first=34, last=30)
        full_recompute(cfg)
        cpu_optimizer_offload(cfg)


@recipe(
    task="sft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP4 PP2 DP1",
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 948.7, "source": OPENRECIPES_27B_H200},
)
def qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config() -> ConfigContainer:
    """slime's 27B layout on 8 x H200, the baseline of the tuned recipe (948.7 published)."""
    cfg = sft_config("qwen35_27b")
    _apply_qwen35_27b_8gpu_h200_slime_reference_execution_config(cfg)
    return cfg


# --- Qwen3.5-122B-A10B and 397B-A17B, multi-node -------------------------------------------


def _apply_qwen35_122b_a10b_24gpu_h200_execution_config(cfg: ConfigContainer) -> None:
    """3 nodes of 8 x H200: TP1 PP3 with 17/18/13 layers, EP8 ETP1, DP8, one 8,192-token row per micro
    batch, full uniform recompute of 1 layer, alltoall dispatcher, precision-aware distributed
    Adam on the GPU (no offload).

    What each choice buys (planner peaks per stage, GB of 150.1: 124.9 / 124.6 / 137.4):
    - EP8 inside a node: the 256 experts of a layer (256 x 3 x 3,072 x 1,024 = 2.42e9 parameters)
      split 32 per GPU over NVLink; the expert-data-parallel group is 24 / (PP3 x EP8) = 1, so each
      rank keeps all 18 bytes per expert parameter it holds (2 weight + 4 FP32 grad + 12 Adam):
      17 layers x 2.42e9 / 8 x 18 = 92 GB on the first stage.
    - PP3: the 116e9 expert parameters need at least 116e9 x 18 / 150.1 GB = 14 GPUs' worth of
      memory before activations; PP2 x EP8 on 2 nodes plans 170.0 / 209.1 GB (does not fit).
      The last stage carries the 248K-vocabulary output layer, its FP32 logits (native fused
      cross entropy: 10 bytes x 8,192 x 248,320 = 20 GB at its peak), the MTP layer and the
      embedding copy MTP needs (Megatron-Core builds one on the MTP stage), so it gets 13 layers
      and the middle stage 18 (an even 16/16/16 plans 157.0 GB on the last stage).
    - Full uniform recompute of 1 layer: each layer keeps only its input (8,192 x 3,072 BF16 =
      50 MB), as ATTUNE's 35B-A3B recipe (openrecipes-35b-h200).
    - No optimizer offload: two nodes fit with the optimizer on the host (PP2 EP8: 73.8 / 107.8 GB
      on the GPU) but each node's host would then hold 122e9 x 16 bytes / 2 nodes = 976 GB of FP32
      state and gradient copies, and the published H200 runs lose throughput to offload
      (openrecipes-35b-h200: 3,466.8 offloaded vs 4,663.1 tokens/s/GPU).
    Global batch 128 = 1 row x 16 micro batches x DP8.
    """
    with openrecipes_execution(cfg):
        set_layout(cfg, pp=3, ep=8, first=17, last=13)
        full_recompute(cfg)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="sft",
    gpus=24,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP3 EP8 DP8",
    status="unmeasured",
)
def qwen35_122b_a10b_sft_24gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5-122B-A10B SFT on 3 x 8 H200: PP3 17/18/13, EP8, full recompute, no offload."""
    cfg = sft_config("qwen35_122b_a10b")
    _apply_qwen35_122b_a10b_24gpu_h200_execution_config(cfg)
    return cfg


def _apply_qwen35_397b_a17b_64gpu_h200_execution_config(cfg: ConfigContainer) -> None:
    """8 nodes of 8 x H200: TP2 with sequence parallelism, PP4 with 15/16/16/13 layers, EP16 ETP1,
    DP8, one 8,192-token row per micro batch, full uniform recompute of 1 layer, alltoall
    dispatcher, precision-aware distributed Adam on the GPU (no offload).

    What each choice buys (planner peaks per stage, GB of 150.1: 132.9 / 136.6 / 136.0 / 140.8):
    - EP16 (two nodes per expert group): the 512 experts of a layer (512 x 3 x 4,096 x 1,024 =
      6.44e9 parameters) split 32 per GPU; with PP4 the expert-data-parallel group is
      64 / (PP4 x EP16) = 1, so a 16-layer stage holds 16 x 6.44e9 / 16 = 6.44e9 expert parameters
      at 18 bytes: 116 GB.
    - TP2 with sequence parallelism: halves the dense part of a rank (attention, Gated DeltaNet,
      shared expert, the 248,320 x 4,096 embedding and output layer) and the logits (vocabulary
      split over TP); at TP1 (no SP) the same PP4 EP16 plans 147.0 / 147.4 / 146.3 / 169.6 GB (does
      not fit), and TP2 with an even 15/15/15/15 split plans 157.1 GB on the last stage.
    - PP4: 386e9 expert parameters x 18 bytes need 46 GPUs' worth of memory at least; EP64 at
      PP1 (170.4 GB) and PP2 x EP32 (138.7 / 159.2 GB) do not fit on 8 nodes. The last stage
      (output layer, logits, MTP layer and its embedding copy) gets 13 layers, the first
      (embedding) 15.
    - Full uniform recompute of 1 layer; no optimizer offload: four nodes would fit with the
      optimizer on the host (PP4 EP8: 92.5 / 94.3 / 93.7 / 102.2 GB) but each node's host would
      hold 397e9 x 16 bytes / 4 nodes = 1.59 TB of FP32 state and gradient copies.
    Global batch 128 = 1 row x 16 micro batches x DP8.
    """
    with openrecipes_execution(cfg):
        set_layout(cfg, tp=2, sp=True, pp=4, ep=16, first=15, last=13)
        full_recompute(cfg)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="sft",
    gpus=64,
    gpu="h200",
    precision="bf16",
    layout="TP2 PP4 EP16 DP8",
    status="unmeasured",
)
def qwen35_397b_a17b_sft_64gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5-397B-A17B SFT on 8 x 8 H200: TP2 SP, PP4 15/16/16/13, EP16, full recompute, no offload."""
    cfg = sft_config("qwen35_397b_a17b")
    _apply_qwen35_397b_a17b_64gpu_h200_execution_config(cfg)
    return cfg


# --- LoRA ------------------------------------------------------------------------------------
# Adapters (rank 32, alpha 32; lr 1e-4 cosine to 1e-5) on every module named in
# common.LORA_TARGETS: attention linear_qkv / linear_proj, Gated DeltaNet in_proj / out_proj,
# MLP, shared-expert and routed-expert linear_fc1 / linear_fc2 (one adapter per rank shared by its
# local experts, Megatron-Bridge's default). The base weights are frozen: BF16 weights only, no
# gradients or optimizer state, which is what lets a whole model sit on fewer GPUs than its SFT.


def _apply_qwen35_27b_1gpu_h200_lora_execution_config(cfg: ConfigContainer) -> None:
    """One H200 per model replica: TP1 PP1 (the 27B's 54 GB of BF16 weights fit one GPU), full
    uniform recompute of 1 layer, one 8,192-token row per micro batch. Planner: 99.0 GB of 150.1
    (recomputing only the first 32 layers plans 187.9 GB). On N GPUs it is DP N."""
    lora_one_gpu(cfg)


@recipe(
    task="peft",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_vs_peft/qwen35_27b_peft_1gpu_h200_bf16_fast_config.yaml"},
)
def qwen35_27b_peft_1gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on 1 x H200 (adapters on LORA_TARGETS), the memory its frozen base leaves
    spent on speed. With the base weights frozen, the backward has no weight gradients to compute, so
    recomputing a layer's forward costs about a third of its step instead of a quarter: Transformer
    Engine's cross entropy (BF16 logits) and the fused SwiGLU free the room for 24 of the 64 layers to
    keep their activations: as many as leave a tenth of the GPU free by the planner."""
    cfg = qwen35_27b_peft_1gpu_h200_bf16_lowmem_config()
    fast_lora_kernels(cfg)
    # the first 40 layers recompute their forward in the backward; the last 24 keep activations
    full_recompute(cfg, "block", 40)
    return cfg


@recipe(
    task="peft",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_vs_peft/qwen35_27b_peft_1gpu_h200_bf16_config.yaml"},
)
def qwen35_27b_peft_1gpu_h200_bf16_lowmem_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on 1 x H200 leaving about 50 GB of it free (a GPU shared with an evaluation
    or a server): every layer's forward recomputed, no fused kernels; slower than the plain recipe."""
    cfg = peft_config("qwen35_27b")
    _apply_qwen35_27b_1gpu_h200_lora_execution_config(cfg)
    return cfg


@recipe(
    task="peft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 DP8",
    status="unmeasured",
)
def qwen35_27b_peft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on 8 x H200: the one-GPU layout, DP8 (128 = 1 row x 16 micro batches x 8)."""
    cfg = peft_config("qwen35_27b")
    _apply_qwen35_27b_1gpu_h200_lora_execution_config(cfg)
    return cfg


def _apply_qwen35_35b_a3b_1gpu_h200_lora_execution_config(cfg: ConfigContainer) -> None:
    """All 256 experts on one H200 (EP1: 35e9 x 2 bytes = 70 GB of frozen BF16 weights), full
    uniform recompute of 1 layer, alltoall dispatcher, one 8,192-token row per micro batch.
    Planner: 108.8 GB of 150.1."""
    lora_one_gpu(cfg, moe=True)


@recipe(
    task="peft",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_vs_peft/qwen35_35b_a3b_peft_1gpu_h200_bf16_fast_config.yaml"},
)
def qwen35_35b_a3b_peft_1gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on 1 x H200 (adapters on LORA_TARGETS), the memory its frozen base
    leaves spent on speed. Its step is bound by the host's launches per micro batch, not by the GPU:
    the 256 experts' GEMMs run as one CUTLASS grouped GEMM per layer, with the fused router, SwiGLU and
    Transformer Engine's cross entropy, and a micro batch carries four 8,192-token rows (on rows with
    conversation boundaries, one packed sequence of the four), a quarter of the launches per row. Every
    layer recomputes its forward to make room for the four rows' logits; the planner fits four, not five."""
    cfg = qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config()
    fast_lora_kernels(cfg, router=True)
    # one grouped kernel for the 256 experts instead of 256 cuBLAS launches from the host
    cfg.env_vars = {**OPENRECIPES_GROUPED_GEMM_ENV}
    # four rows per micro batch: the host's work per micro batch is spread over four times the tokens (one
    # packed sequence of the four on rows with conversation boundaries)
    rows_per_micro_batch(cfg, 4)
    # fewer launches outweigh the recompute: every layer rebuilds its forward in the backward
    full_recompute(cfg, "block", cfg.model.num_layers)
    return cfg


@recipe(
    task="peft",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP1 DP1",
    status="measured",
    measured={"result": "evidence/lora_vs_peft/qwen35_35b_a3b_peft_1gpu_h200_bf16_config.yaml"},
    evidence="evidence/hf/hf_lora_summary.json",
)
def qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on 1 x H200 leaving about 40 GB of it free (a GPU shared with an
    evaluation or a server): one row per micro batch, no fused kernels; slower than the plain recipe."""
    cfg = peft_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_1gpu_h200_lora_execution_config(cfg)
    return cfg


# Long rows for reasoning data: a 32,768-token row holds a whole long chain of thought, so the
# longest conversations are trained whole instead of skipped or split (build the rows with
# --row-tokens 32768). One row per micro batch, the loss a chunk of tokens at a time (the logits
# of 32,768 tokens are 16 GB for each of the two heads), every layer recomputed.
LONG_ROW_TOKENS = 32768


def _long_rows(cfg: ConfigContainer) -> None:
    cfg.model.seq_length = LONG_ROW_TOKENS
    cfg.dataset.seq_length = LONG_ROW_TOKENS
    rows_per_micro_batch(cfg, 1)
    chunked_cross_entropy(cfg)
    full_recompute(cfg, "block", cfg.model.num_layers)


@recipe(task="peft", gpus=1, gpu="h200", precision="bf16", layout="TP1 PP1 EP1 DP1", status="unmeasured")
def qwen35_35b_a3b_peft_1gpu_h200_bf16_32k_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on one H200 over 32,768-token rows (reasoning data): the plain recipe's
    kernels, one row per micro batch, the loss a chunk of tokens at a time, every layer recomputed."""
    cfg = qwen35_35b_a3b_peft_1gpu_h200_bf16_config()
    _long_rows(cfg)
    return cfg


@recipe(task="peft", gpus=1, gpu="h200", precision="bf16", layout="TP1 PP1 DP1", status="unmeasured")
def qwen35_27b_peft_1gpu_h200_bf16_32k_config() -> ConfigContainer:
    """Qwen3.5/3.6-27B LoRA on one H200 over 32,768-token rows (reasoning data): the plain recipe's
    kernels, one row per micro batch, the loss a chunk of tokens at a time, every layer recomputed."""
    cfg = qwen35_27b_peft_1gpu_h200_bf16_config()
    _long_rows(cfg)
    return cfg


@recipe(
    task="peft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="unmeasured",
)
def qwen35_35b_a3b_peft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5/3.6-35B-A3B LoRA on 8 x H200 with the SFT recipe's EP8 layout."""
    cfg = peft_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_h200_execution_config(cfg)
    return cfg


def _apply_qwen35_122b_a10b_8gpu_h200_lora_execution_config(cfg: ConfigContainer) -> None:
    """One node: TP1 PP1 EP8 DP8 (32 experts per GPU; frozen BF16 experts 116e9 x 2 / 8 = 29 GB
    a GPU), full uniform recompute of 1 layer, alltoall dispatcher. Planner: 79.6 GB of 150.1;
    4 GPUs (EP4) would also fit (110.8 GB) but a node is the unit these recipes are written for."""
    with openrecipes_execution(cfg):
        set_layout(cfg, ep=8)
        full_recompute(cfg)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="peft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 EP8 DP8",
    status="unmeasured",
)
def qwen35_122b_a10b_peft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5-122B-A10B LoRA on one 8 x H200 node: EP8."""
    cfg = peft_config("qwen35_122b_a10b")
    _apply_qwen35_122b_a10b_8gpu_h200_lora_execution_config(cfg)
    return cfg


def _apply_qwen35_397b_a17b_8gpu_h200_lora_execution_config(cfg: ConfigContainer) -> None:
    """One node: TP2 with sequence parallelism, PP1, EP8 ETP1, DP4, full uniform recompute of 1
    layer, alltoall dispatcher. The frozen BF16 experts are 386e9 x 2 / 8 = 97 GB per GPU; TP2
    halves the dense part and the logits. Planner: 133.8 GB of 150.1; TP1 EP8 plans 161.4 GB and
    PP2 EP4 152.5 GB on its last stage (does not fit), so TP2 it is."""
    with openrecipes_execution(cfg):
        set_layout(cfg, tp=2, sp=True, ep=8)
        full_recompute(cfg)
        cfg.model.moe_token_dispatcher_type = "alltoall"


@recipe(
    task="peft",
    gpus=8,
    gpu="h200",
    precision="bf16",
    layout="TP2 PP1 EP8 DP4",
    status="unmeasured",
)
def qwen35_397b_a17b_peft_8gpu_h200_bf16_config() -> ConfigContainer:
    """Qwen3.5-397B-A17B LoRA on one 8 x H200 node: TP2 SP, EP8."""
    cfg = peft_config("qwen35_397b_a17b")
    _apply_qwen35_397b_a17b_8gpu_h200_lora_execution_config(cfg)
    return cfg


# --- one-GPU smoke run ---------------------------------------------------------------------


@recipe(
    task="pretrain",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 DP1",
    status="functional",
    evidence="evidence/smoke_qwen35_35b_a3b_1gpu_h200.log",
)
def qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config() -> ConfigContainer:
    """The 35B-A3B H200 execution policy scaled down to one GPU: 4 layers (3 GDN + 1 gated
    attention) of the 35B-A3B shape with all 256 experts, MTP, mock data, random init, 20 steps.

    The run that shows the stack works end to end with no download:
    ``torchrun --nproc-per-node 1 scripts/run_recipe.py --recipe qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config``.
    """
    cfg = pretrain_config("qwen35_35b_a3b")
    _apply_qwen35_35b_a3b_8gpu_h200_execution_config(cfg)
    scale_down(cfg, num_layers=4, global_batch_size=8, seq_length=4096, train_iters=20)
    # pretraining from random init
    cfg.optimizer.lr = 3e-4
    cfg.optimizer.min_lr = 3e-5
    disable_resilience(cfg)  # a 20-step smoke run: nothing to resume
    cfg.validation.eval_iters = 0
    return cfg
