"""GB300 recipes for the large Qwen3.5 / Qwen3.6 text models: SFT of 122B-A10B and 397B-A17B on
the expert-parallel layouts of Megatron-Bridge's GB300 benchmarks for the same backbones.

Megatron-Bridge 0.6.2 publishes GB300 layouts for these sizes only for the VL models'
pretraining (bridge-perf-recipes in docs/sources.md): 122B-A10B on 32 GPUs at TP1 PP1 EP32 ETP1,
397B-A17B on 64 at EP64 ETP1, both with the flex dispatcher's HybridEP backend over one NVL72
domain. The text model is the VL model's language backbone, so its SFT takes the same layout; what
changes is the workload (8,192-token SFT rows, global batch 128, the text recipes' numerics) and
what that costs in memory (``--plan`` gives each recipe's figures against GB300's 288 GiB):

- 122B-A10B, EP32 (8 of 256 experts per GPU), no recompute (the benchmark does not recompute
  either); full recompute would fit too and cost about a quarter more forward work.
- 397B-A17B, EP64 (8 of 512 experts per GPU): without recompute it does not fit (the benchmark's
  rows are half as long); block recompute of 40 of the 60 layers leaves a margin like the 122B's,
  and fewer recomputed layers come within a few GB of the capacity or over it.

Each plan counts gradient-accumulation fusion's placeholder gradients (one BF16 tensor per weight
shape, the output layer's the largest).

CUDA graphs stay off: the benchmarks capture the MoE router and preprocessing, which no run here
has checked against packed SFT rows. Neither recipe has run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.recipes.base import sft_config
from bridge_recipes.recipes.qwen.policy import (
    GB300_ENV,
    cuda_graphs_off,
    full_recompute,
    hybridep_env,
    set_layout,
    set_openrecipes_numerics,
    shard_optimizer_precision_aware,
    use_hybridep_dispatcher,
)
from bridge_recipes.recipes.recipe import recipe

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "qwen35_122b_a10b_sft_32gpu_gb300_bf16_config",
    "qwen35_397b_a17b_sft_64gpu_gb300_bf16_config",
]


def _expert_parallel_over_one_nvl72(cfg: ConfigContainer, ep: int) -> None:
    """What both layouts share: TP1 PP1 EP ``ep`` ETP1 DP ``ep`` within one NVL72 domain, HybridEP,
    no CUDA graphs, one 8,192-token row per micro batch, the text recipes' numerics and
    precision-aware distributed Adam on the GPU, the GB300 benchmarks' environment."""
    set_openrecipes_numerics(cfg)
    shard_optimizer_precision_aware(cfg)
    set_layout(cfg, ep=ep)
    cuda_graphs_off(cfg)
    use_hybridep_dispatcher(cfg)
    cfg.train.micro_batch_size = 1
    cfg.env_vars = {**GB300_ENV, **hybridep_env(ep)}


def _apply_qwen35_122b_a10b_32gpu_gb300_execution_config(cfg: ConfigContainer) -> None:
    """32 GB300: EP32 (128 rows = 1 row x 4 micro batches x 32 GPUs), no recompute."""
    _expert_parallel_over_one_nvl72(cfg, ep=32)
    # every layer keeps its activations: the memory is there, so no forward is repeated
    cfg.model.recompute_granularity = None
    cfg.model.recompute_method = None
    cfg.model.recompute_num_layers = None


@recipe(
    task="sft",
    gpus=32,
    gpu="gb300",
    precision="bf16",
    layout="TP1 PP1 EP32 DP32",
    status="unmeasured",
)
def qwen35_122b_a10b_sft_32gpu_gb300_bf16_config() -> ConfigContainer:
    """Qwen3.5-122B-A10B SFT on 32 x GB300: EP32, HybridEP, no recompute."""
    cfg = sft_config("qwen35_122b_a10b")
    _apply_qwen35_122b_a10b_32gpu_gb300_execution_config(cfg)
    return cfg


def _apply_qwen35_397b_a17b_64gpu_gb300_execution_config(cfg: ConfigContainer) -> None:
    """64 GB300: EP64 (128 rows = 1 row x 2 micro batches x 64 GPUs), block recompute of the first
    40 of 60 layers."""
    _expert_parallel_over_one_nvl72(cfg, ep=64)
    # the first 40 layers recompute their activations in the backward pass, the last 20 keep them
    full_recompute(cfg, "block", 40)


@recipe(
    task="sft",
    gpus=64,
    gpu="gb300",
    precision="bf16",
    layout="TP1 PP1 EP64 DP64",
    status="unmeasured",
)
def qwen35_397b_a17b_sft_64gpu_gb300_bf16_config() -> ConfigContainer:
    """Qwen3.5-397B-A17B SFT on 64 x GB300: EP64, HybridEP, block recompute 40."""
    cfg = sft_config("qwen35_397b_a17b")
    _apply_qwen35_397b_a17b_64gpu_gb300_execution_config(cfg)
    return cfg
