"""Shrink a recipe to fit fewer GPUs while keeping its execution policy.

What is kept: precision, recompute granularity and method, MoE dispatcher and fusions,
fused kernels, optimizer settings (distributed, precision-aware, CPU offload), attention
backend, environment. What shrinks: layers (to a multiple of the GDN/attention period, with
the hybrid pattern rebuilt), optionally experts (routed top-k capped), the parallel layout
(to the world size), and the batch. Every change is reported as ``field: old -> new``.

This is the one way the project makes small versions of its recipes (smoke and GPU tests):
no separate hand-written tiny configs that drift from the recipes they stand for.
"""

from __future__ import annotations

from typing import Any

from bridge_recipes.layout import stage_layers


def _set(obj: Any, field: str, value: Any, changes: list[str], prefix: str) -> None:
    old = getattr(obj, field)
    if old != value:
        setattr(obj, field, value)
        changes.append(f"{prefix}{field}: {old} -> {value}")


def hybrid_pattern(num_layers: int, period: int = 4) -> list[int]:
    """Megatron-Core's per-layer list: 1 = Gated DeltaNet, 0 = attention every ``period``-th layer."""
    return [0 if (i + 1) % period == 0 else 1 for i in range(num_layers)]


def scale_down(
    cfg: Any,
    *,
    num_layers: int = 4,
    num_experts: int | None = None,
    global_batch_size: int = 8,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    train_iters: int | None = None,
) -> list[str]:
    """Shrink ``cfg`` in place for one GPU; returns the list of changes made."""
    m, changes = cfg.model, []
    period = 4
    old_stage = max(stage_layers(cfg) or [m.num_layers])
    if not isinstance(num_layers, int) or not period <= num_layers <= m.num_layers or num_layers % period:
        raise ValueError(
            f"--scale-down {num_layers}: layers must be a multiple of the GDN/attention period {period} "
            f"between {period} and the recipe's {m.num_layers}"
        )
    if num_experts is not None:
        if not m.num_moe_experts:
            raise ValueError(f"--scale-experts {num_experts}: the model is dense (no routed experts); drop the flag")
        if not 1 <= num_experts <= m.num_moe_experts:
            raise ValueError(
                f"--scale-experts {num_experts}: keep between 1 and the recipe's {m.num_moe_experts} routed experts"
            )
    _set(m, "num_layers", num_layers, changes, "model.")
    pattern = hybrid_pattern(num_layers, period)
    if isinstance(m.linear_attention_freq, list) and m.linear_attention_freq != pattern:
        m.linear_attention_freq = pattern
        changes.append(f"model.linear_attention_freq: rebuilt for {num_layers} layers")

    # One GPU: every parallel size to 1; stage splits and virtual stages no longer apply.
    for field in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    ):
        _set(m, field, 1, changes, "model.")
    for field in (
        "virtual_pipeline_model_parallel_size",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
    ):
        _set(m, field, None, changes, "model.")
    _set(m, "sequence_parallel", False, changes, "model.")
    if m.recompute_method == "block" and m.recompute_num_layers:
        # Keep the recomputed fraction of the (largest) stage: 12 of 16 becomes 3 of 4.
        kept = min(num_layers, max(1, round(m.recompute_num_layers * num_layers / old_stage)))
        _set(m, "recompute_num_layers", kept, changes, "model.")

    if num_experts is not None:
        _set(m, "num_moe_experts", num_experts, changes, "model.")
        _set(m, "moe_router_topk", min(m.moe_router_topk, num_experts), changes, "model.")
    # Flex dispatchers (DeepEP / HybridEP) need expert parallelism across GPUs.
    if getattr(m, "moe_token_dispatcher_type", None) == "flex":
        _set(m, "moe_token_dispatcher_type", "alltoall", changes, "model.")

    if seq_length is not None:
        _set(m, "seq_length", seq_length, changes, "model.")
        if hasattr(cfg.dataset, "seq_length"):
            _set(cfg.dataset, "seq_length", seq_length, changes, "dataset.")
    mbs = micro_batch_size or min(cfg.train.micro_batch_size, global_batch_size)
    _set(cfg.train, "micro_batch_size", mbs, changes, "train.")
    _set(cfg.train, "global_batch_size", global_batch_size, changes, "train.")
    if train_iters is not None:
        _set(cfg.train, "train_iters", train_iters, changes, "train.")
        warmup = max(1, train_iters // 10)
        _set(cfg.scheduler, "lr_warmup_iters", warmup, changes, "scheduler.")
    return changes
