"""Benchmark settings shared by every perf recipe (one definition, used by all of them).

A perf recipe is its real-data recipe (same execution policy, built by the same
``_apply_*_execution_config`` helper) with mock data and measurement settings: a fixed number
of steps (20, so OpenRecipes' window of steps 5-19 fits), no evaluation, no checkpoints, every
step logged, NaN checks off, resilience monitors off. Its metadata is the real-data recipe's too
(``@benchmark_of(real.<recipe>, ...)``, :func:`bridge_recipes.recipes.recipe.twin_meta`).

Numerics (the model's fields and the mixed-precision preset) are the real-data recipe's, so a
benchmark measures the recipe users train with, with exactly these declared differences:

- VL benchmarks set :data:`VL_BENCHMARK_MODEL_SETTINGS`, the conventions of Megatron-Bridge's
  Qwen3.5-VL benchmark family (bridge-perf-recipes in docs/sources.md): forced load-balanced
  routing, so that throughput does not depend on where a randomly initialised router happens to
  send tokens and layouts compare at equal expert load; and TE's fused cross entropy in place
  of Megatron-Core's native kernel.
- A benchmark whose real-data recipe does not share its layout declares so in its module
  (``OWN_LAYOUT``) and may also differ in :data:`LAYOUT_FIELDS`: the 8-GPU MXFP8 GB300
  benchmark has Megatron-Bridge's 8-GPU benchmark layout (EP8, CUDA graphs and recompute off),
  while its real-data counterpart keeps the 16-GPU layout.

``tests/unit/test_recipes.py`` compares every benchmark's numerics with its real-data
counterpart and fails on any other difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge_recipes.config.datasets import use_mock
from bridge_recipes.recipes.resilience import disable_resilience

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

BENCHMARK_STEPS = 20

# The model settings in which a VL benchmark differs from its real-data recipe (see above).
VL_BENCHMARK_MODEL_SETTINGS = {
    # Forced load-balanced routing: throughput independent of the random router.
    "moe_router_force_load_balancing": True,
    # TE's fused cross entropy (Megatron-Bridge's _benchmark_common default); the real recipes
    # keep Megatron-Core's native fused kernel.
    "cross_entropy_fusion_impl": "te",
}

# Execution-layout fields a benchmark listed in its module's OWN_LAYOUT may set differently.
LAYOUT_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "cuda_graph_impl",
    "cuda_graph_scope",
    "use_te_rng_tracker",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
)


def benchmark_settings(cfg: ConfigContainer, steps: int = BENCHMARK_STEPS) -> None:
    use_mock(cfg)  # random-token text, or synthetic image conversations for VL models
    cfg.train.train_iters = steps
    cfg.scheduler.lr_decay_iters = steps
    cfg.scheduler.lr_warmup_iters = max(1, steps // 10)
    cfg.validation.eval_iters = 0
    cfg.validation.eval_interval = steps + 1
    cfg.checkpoint.pretrained_checkpoint = None
    disable_resilience(cfg)
    cfg.logger.log_interval = 1
    cfg.logger.tensorboard_dir = None
    cfg.ddp.check_for_nan_in_grad = False
    cfg.rerun_state_machine.check_for_nan_in_loss = False


def vl_benchmark_settings(cfg: ConfigContainer, steps: int = BENCHMARK_STEPS) -> None:
    """:func:`benchmark_settings` plus the VL benchmark family's model settings."""
    benchmark_settings(cfg, steps)
    for name, value in VL_BENCHMARK_MODEL_SETTINGS.items():
        setattr(cfg.model, name, value)
