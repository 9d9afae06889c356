"""H200 recipes for Qwen3.5 / Qwen3.6 text models (real data; benchmark forms in perf_recipes).

The 8-GPU SFT layouts are the OpenRecipes H200 entries by ATTUNE (openrecipes-35b-h200 and
openrecipes-27b-h200 in docs/sources.md),
measured there on 8 x H200 (AWS p5en.48xlarge) with slime on megatron-core 0.16.0rc0 and
TE 2.10: 8,192-token SFT rows, global batch 128, BF16, precision-aware distributed Adam,
lr 1e-5 cosine to 1e-6, 10% warm-up, weight decay 0.1, betas 0.9/0.98, per-token loss,
flash attention. Their published tokens/s/GPU are the references below; our own measured
figures, when there are any, live in results/ and are named by ``measured=``.

Qwen3.6 checkpoints use these recipes unchanged (same architecture and tokenizer): point
``checkpoint.pretrained_checkpoint`` at the converted Qwen3.6 weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.common import pretrain_config, sft_config
from bridge_recipes.qwen.policy import (
    OPENRECIPES_ENV,
    cpu_optimizer_offload,
    full_recompute,
    set_layout,
    set_openrecipes_numerics,
    shard_optimizer_precision_aware,
)
from bridge_recipes.recipe import recipe
from bridge_recipes.resilience import disable_resilience
from bridge_recipes.scaledown import scale_down

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_pp2_ep4_config",
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config",
    "qwen35_27b_sft_8gpu_h200_bf16_config",
    "qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config",
    "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config",
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
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    set_layout(cfg, ep=8)
    full_recompute(cfg)
    cfg.model.moe_token_dispatcher_type = "alltoall"
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**OPENRECIPES_ENV}


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
    status="unmeasured",
    reference={"tokens_per_s_per_gpu": 3466.8, "mfu": 0.062, "source": OPENRECIPES_35B_H200},
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_mt16k_config() -> ConfigContainer:
    """The EP8 layout at 16,384 tokens per GPU (two rows per micro batch) with the optimizer on
    the CPU, copies overlapped (openrecipes-35b-h200, #2: 3,466.8 published)."""
    cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
    cfg.train.micro_batch_size = 2
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
    notes="opd-35b-h200: peak ~124 GB of 143 reported by its authors, not by us",
)
def qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config() -> ConfigContainer:
    """Long-context layout of the on-policy-distillation example (opd-35b-h200) on one 8 x H200 node:
    TP2 (sequence parallel) PP1 CP2 EP8 ETP1, optimizer on the CPU, 32,768-token sequences.

    The example was written for 2 nodes (DP4) and re-tiled to one node by halving DP, which is
    what 8 GPUs give here: DP2. Its authors report a peak near 124 GB of 143 GB per GPU.

    Gated DeltaNet with CP > 1: megatron-core 0.19.2 implements it (``ssm/gated_delta_net``
    converts between context- and head-parallel layouts with all-to-all, and TransformerConfig
    has no check rejecting CP with GDN); earlier releases rejected or broke it. Unmeasured:
    it has not been run at CP2 by this project.
    """
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
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    set_layout(cfg, pp=4, first=16, last=14)
    full_recompute(cfg, "block", 12)
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**OPENRECIPES_ENV}


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


def _apply_qwen35_27b_8gpu_h200_slime_reference_execution_config(cfg: ConfigContainer) -> None:
    """The reference ATTUNE compared against (openrecipes-27b-h200): slime's run-qwen3.5-27B.sh on one node,
    TP4 with sequence parallelism, PP2 with 34/30 layers, CP1, full uniform recompute,
    optimizer on the CPU, same optimizer settings."""
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    set_layout(cfg, tp=4, pp=2, sp=True, first=34, last=30)
    full_recompute(cfg)
    cpu_optimizer_offload(cfg)
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**OPENRECIPES_ENV}


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


# --- one-GPU smoke run ---------------------------------------------------------------------


@recipe(
    task="pretrain",
    gpus=1,
    gpu="h200",
    precision="bf16",
    layout="TP1 PP1 DP1",
    status="functional",
    evidence="docs/evidence/smoke_qwen35_35b_a3b_1gpu_h200.log",
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
