"""Range checks of a built config's values, run before the layout checks and before launch.

Megatron accepts some values it cannot train with (a NaN learning rate, a warm-up longer than
the run, a top-k above the expert count) and fails late or misleadingly on others (a zero
global batch is reported as a learning-rate-decay problem; a zero parallel size divides by
zero). Each check here names the field, its value and the fix. The layout checks divide by the
parallel sizes, so they run only when these pass.
"""

from __future__ import annotations

import math
from typing import Any

# Megatron-Core keeps iteration counts and token counters in 64-bit integers and the data
# samplers index rows with them; a run longer than a billion steps is a typo, not a plan.
MAX_TRAIN_ITERS = 10**9
# torch.manual_seed and numpy take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1

# Sizes Megatron divides by or allocates with: each must be an integer >= 1.
POSITIVE_SIZES = (
    ("model.tensor_model_parallel_size", "-tp"),
    ("model.pipeline_model_parallel_size", "-pp"),
    ("model.context_parallel_size", "-cp"),
    ("model.expert_model_parallel_size", "-ep"),
    ("model.num_layers", "model.num_layers="),
    ("model.hidden_size", "model.hidden_size="),
    ("model.num_attention_heads", "model.num_attention_heads="),
    ("model.seq_length", "-sl"),
    ("train.global_batch_size", "-gb"),
    ("train.micro_batch_size", "-mb"),
    ("train.train_iters", "--max-steps"),
)
# Sizes that may be unset (None) but otherwise must be >= 1.
OPTIONAL_POSITIVE_SIZES = (
    ("model.expert_tensor_parallel_size", "-etp"),
    ("model.virtual_pipeline_model_parallel_size", "-vp"),
    ("model.ffn_hidden_size", "model.ffn_hidden_size="),
    ("model.num_query_groups", "model.num_query_groups="),
    ("model.num_moe_experts", "model.num_moe_experts="),
    ("dataset.seq_length", "-sl"),
    ("checkpoint.save_interval", "--save-interval"),
)


def _get(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def size_problems(cfg: Any) -> list[str]:
    """Sizes that are not integers >= 1. The layout checks need all of these to hold."""
    out = []
    for key, flag in POSITIVE_SIZES + OPTIONAL_POSITIVE_SIZES:
        v = _get(cfg, key)
        optional = (key, flag) in OPTIONAL_POSITIVE_SIZES
        if v is None and optional:
            continue
        if not _is_int(v) or v < 1:
            how = f"{flag} N" if flag.startswith("-") else f"{flag}N"
            out.append(f"{key}={v!r} must be an integer >= 1{' (or null)' if optional else ''}; set it with {how}")
    return out


def value_problems(cfg: Any, world_size: int) -> list[str]:
    """Every value range problem of ``cfg`` for ``world_size`` GPUs, each naming field, value, fix."""
    out = []
    if not _is_int(world_size) or world_size < 1:
        out.append(f"world size {world_size!r} must be an integer >= 1; set --world-size N or WORLD_SIZE=N")
    out += size_problems(cfg)
    m, t, o, s = cfg.model, cfg.train, cfg.optimizer, cfg.scheduler

    iters = t.train_iters
    if _is_int(iters) and iters > MAX_TRAIN_ITERS:
        out.append(
            f"train.train_iters={iters} is over {MAX_TRAIN_ITERS:,} steps; set --max-steps to the steps you mean"
        )

    # Learning rates: finite, the peak positive, the floor in [0, peak].
    lr, min_lr = o.lr, o.min_lr
    if not _finite_number(lr) or lr <= 0:
        out.append(f"optimizer.lr={lr!r} must be a finite number > 0; set --lr, e.g. --lr 1e-5")
    if min_lr is not None and (not _finite_number(min_lr) or min_lr < 0):
        out.append(f"optimizer.min_lr={min_lr!r} must be a finite number >= 0; set --min-lr, e.g. --min-lr 1e-6")
    elif min_lr is not None and _finite_number(lr) and lr > 0 and min_lr > lr:
        out.append(f"optimizer.min_lr={min_lr:g} is above optimizer.lr={lr:g}; set --min-lr at most --lr")

    # Warm-up: non-negative and shorter than the decay (which defaults to the whole run).
    warmup = s.lr_warmup_iters
    decay = s.lr_decay_iters if s.lr_decay_iters is not None else iters
    if warmup is not None:
        if not _is_int(warmup) or warmup < 0:
            out.append(f"scheduler.lr_warmup_iters={warmup!r} must be an integer >= 0; set --warmup-iters N")
        elif _is_int(decay) and decay >= 1 and warmup >= decay:
            out.append(
                f"scheduler.lr_warmup_iters={warmup} is not shorter than the {decay} decay steps "
                f"(train.train_iters unless scheduler.lr_decay_iters is set); set --warmup-iters below {decay}"
            )

    # Routing: top-k within the experts.
    experts, topk = m.num_moe_experts, m.moe_router_topk
    if _is_int(experts) and experts >= 1 and (not _is_int(topk) or not 1 <= topk <= experts):
        out.append(f"model.moe_router_topk={topk!r} must be between 1 and the {experts} experts")

    seed = cfg.rng.seed
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        out.append(f"rng.seed={seed!r} must be an integer in [0, {MAX_SEED}]; set rng.seed=N")

    # Selective recompute rebuilds named modules; a method (uniform/block) applies only to full.
    if m.recompute_granularity == "selective" and m.recompute_method is not None:
        out.append(
            f"model.recompute_granularity=selective with model.recompute_method={m.recompute_method!r}: "
            "a method applies to full recompute only; also set model.recompute_method=null "
            "model.recompute_num_layers=null"
        )
    return out
