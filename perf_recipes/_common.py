"""Benchmark settings shared by every perf recipe (one definition, used by all of them).

A perf recipe is its real-data recipe (same execution policy, built by the same
``_apply_*_execution_config`` helper) with mock data and measurement settings: a fixed number
of steps (20, so OpenRecipes' window of steps 5-19 fits), no evaluation, no checkpoints, every
step logged, NaN checks off, resilience monitors off. Numerics are left as the real-data recipe has them, so a
benchmark measures the recipe users train with.
"""

from __future__ import annotations

from bridge_recipes.datasets import use_mock
from bridge_recipes.resilience import disable_resilience

BENCHMARK_STEPS = 20


def benchmark_settings(cfg, steps: int = BENCHMARK_STEPS) -> None:
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
