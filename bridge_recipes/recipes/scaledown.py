"""Shrink a recipe to fit fewer GPUs while keeping its execution policy.

What is kept: precision, recompute granularity and method, MoE dispatcher and fusions,
fused kernels, optimizer settings (distributed, precision-aware, CPU offload), attention
backend, environment. What shrinks: layers (to a multiple of the GDN/attention period, with
the hybrid pattern rebuilt), optionally experts (routed top-k capped), the parallel layout
(to ``gpus`` GPUs: as much of the recipe's own layout as fits, see :func:`fit_layout`), and the
batch. Every change is reported as ``field: old -> new``.

This is the one way the project makes small versions of its recipes (smoke and GPU tests):
no separate hand-written tiny configs that drift from the recipes they stand for.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from bridge_recipes.plan.layout import Layout, model_shape, rule_problems, stage_layers

# What a smaller layout keeps first when not all of the recipe's fits: expert parallelism (the
# dispatch the MoE policies are built around), then pipeline stages, tensor parallelism (with
# sequence parallelism), context parallelism, expert tensor parallelism, virtual stages.
LAYOUT_PRIORITY = ("ep", "pp", "tp", "cp", "etp", "vpp")


def _set(obj: Any, field: str, value: Any, changes: list[str], prefix: str) -> None:
    old = getattr(obj, field)
    if old != value:
        setattr(obj, field, value)
        changes.append(f"{prefix}{field}: {old} -> {value}")


def hybrid_pattern(num_layers: int, period: int = 4) -> list[int]:
    """Megatron-Core's per-layer list: 1 = Gated DeltaNet, 0 = attention every ``period``-th layer."""
    return [0 if (i + 1) % period == 0 else 1 for i in range(num_layers)]


def _divisors(n: int | None) -> list[int]:
    n = n or 1
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class FittedLayout:
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None
    first: int | None  # layers of the first / last pipeline stage when uneven
    last: int | None


def _split(orig_stages: list[int], num_layers: int, pp: int) -> tuple[int | None, int | None] | None:
    """First/last stage sizes for ``num_layers`` over ``pp`` stages in the proportions of the
    recipe's own stages (merged in groups when there are fewer stages): None when they cannot be
    kept, (None, None) for an even split."""
    if pp == 1:
        return None, None
    total, k = sum(orig_stages), len(orig_stages) // pp
    if len(orig_stages) % pp or len(set(orig_stages)) == 1:
        return (None, None) if num_layers % pp == 0 else None
    first = max(1, round(num_layers * sum(orig_stages[:k]) / total))
    last = max(1, round(num_layers * sum(orig_stages[-k:]) / total))
    rest, middle = num_layers - first - last, pp - 2
    if middle and rest > 0 and rest % middle:
        first, rest = first + rest % middle, rest - rest % middle  # the remainder joins the first stage
    if rest < 0 or (middle == 0 and rest) or (middle and (rest % middle or rest // middle < 1)):
        return (None, None) if num_layers % pp == 0 else None
    if first == last and (middle == 0 or rest // middle == first):
        return None, None
    return first, last


def fit_layout(
    cfg: Any, gpus: int, num_layers: int, num_experts: int | None, stages: list[int] | None = None
) -> FittedLayout:
    """The largest part of ``cfg``'s parallel layout that runs ``num_layers`` layers on ``gpus``
    GPUs, preferring the dimensions in :data:`LAYOUT_PRIORITY` order. Each size is a divisor of
    the recipe's own (1 when the recipe does not use the dimension) that the layout rules allow
    (:func:`bridge_recipes.plan.layout.rule_problems`, the runner's checks too); VPP is kept where it
    divides every stage's layers. Raises ValueError when even the one-GPU layout cannot be placed."""
    m = cfg.model
    shape = model_shape(m, num_experts)
    orig_stages = stages or stage_layers(cfg) or [m.num_layers]  # the recipe's own split
    best, best_key = None, None
    for tp, pp, cp, ep, etp in itertools.product(
        _divisors(m.tensor_model_parallel_size),
        _divisors(m.pipeline_model_parallel_size),
        _divisors(m.context_parallel_size),
        _divisors(m.expert_model_parallel_size),
        _divisors(m.expert_tensor_parallel_size),
    ):
        mp = tp * pp * cp
        dp = gpus // mp if gpus % mp == 0 else None
        sp = tp > 1 and bool(m.sequence_parallel)  # the scale-down keeps it where TP is
        lay = Layout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=None, dp=dp, world=gpus, sp=sp, moe=bool(shape.experts))
        if num_layers < pp or rule_problems(shape, lay, None):
            continue
        split = _split(orig_stages, num_layers, pp)
        if split is None:
            continue
        first, last = split
        if first is None:
            stages = [num_layers // pp] * pp
        else:
            middle = [(num_layers - first - last) // (pp - 2)] * (pp - 2) if pp > 2 else []
            stages = [first, *middle, last]
        vpp = m.virtual_pipeline_model_parallel_size
        if not vpp or pp == 1 or any(x % vpp for x in stages):
            vpp = None
        sizes = {"ep": ep, "pp": pp, "tp": tp, "cp": cp, "etp": etp, "vpp": vpp or 0}
        key = tuple(sizes[d] for d in LAYOUT_PRIORITY)
        if best_key is None or key > best_key:
            best, best_key = FittedLayout(tp, pp, cp, ep, etp, vpp, first, last), key
    if best is None:
        raise ValueError(f"scale_down={num_layers}: no layout of the recipe fits {gpus} GPU(s)")
    return best


def scaled_block_recompute(recomputed: int, old_stage: int, new_stage: int) -> int:
    """Block recompute of a scaled-down stage: the recomputed fraction of the (largest) stage is
    kept, at least one layer: 12 of 16 becomes 3 of 4, 30 of 40 becomes 3 of 4."""
    return min(new_stage, max(1, round(recomputed * new_stage / old_stage)))


def scale_down(
    cfg: Any,
    *,
    num_layers: int = 4,
    num_experts: int | None = None,
    global_batch_size: int = 8,
    micro_batch_size: int | None = None,
    seq_length: int | None = None,
    train_iters: int | None = None,
    gpus: int = 1,
) -> list[str]:
    """Shrink ``cfg`` in place for ``gpus`` GPUs (one by default); returns the list of changes made."""
    m, changes = cfg.model, []
    period = 4
    old_stages = stage_layers(cfg) or [m.num_layers]
    _check_sizes(m, num_layers, num_experts, period)
    _set(m, "num_layers", num_layers, changes, "model.")
    pattern = hybrid_pattern(num_layers, period)
    if isinstance(m.linear_attention_freq, list) and m.linear_attention_freq != pattern:
        m.linear_attention_freq = pattern
        changes.append(f"model.linear_attention_freq: rebuilt for {num_layers} layers")

    # The parallel layout: as much of the recipe's own as fits the GPUs (all 1 on one GPU).
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus={gpus}: at least 1")
    fit = fit_layout(cfg, gpus, num_layers, num_experts, stages=old_stages)
    _take_layout(cfg, fit, max(old_stages), num_layers, changes)
    _take_experts(m, fit, num_experts, changes)
    if seq_length is not None:
        _set(m, "seq_length", seq_length, changes, "model.")
        if hasattr(cfg.dataset, "seq_length"):
            _set(cfg.dataset, "seq_length", seq_length, changes, "dataset.")
    _take_batch(cfg, fit, gpus, global_batch_size, micro_batch_size, changes)
    if train_iters is not None:
        _set(cfg.train, "train_iters", train_iters, changes, "train.")
        warmup = max(1, train_iters // 10)
        _set(cfg.scheduler, "lr_warmup_iters", warmup, changes, "scheduler.")
    return changes


def _check_sizes(m: Any, num_layers: int, num_experts: int | None, period: int) -> None:
    """The layers a whole number of GDN/attention periods within the recipe's, the experts within its."""
    if not isinstance(num_layers, int) or not period <= num_layers <= m.num_layers or num_layers % period:
        raise ValueError(
            f"scale_down={num_layers}: layers must be a multiple of the GDN/attention period {period} "
            f"between {period} and the recipe's {m.num_layers}"
        )
    if num_experts is not None:
        if not m.num_moe_experts:
            raise ValueError(
                f"scale_experts={num_experts}: the model is dense (no routed experts); drop scale_experts"
            )
        if not 1 <= num_experts <= m.num_moe_experts:
            raise ValueError(
                f"scale_experts={num_experts}: keep between 1 and the recipe's {m.num_moe_experts} routed experts"
            )


def _take_layout(cfg: Any, fit: FittedLayout, old_stage: int, num_layers: int, changes: list[str]) -> None:
    """The fitted parallel sizes and stages, sequence parallelism where TP is, block recompute rescaled."""
    m = cfg.model
    for field, value in (
        ("tensor_model_parallel_size", fit.tp),
        ("pipeline_model_parallel_size", fit.pp),
        ("context_parallel_size", fit.cp),
        ("expert_model_parallel_size", fit.ep),
        ("expert_tensor_parallel_size", fit.etp),
        ("virtual_pipeline_model_parallel_size", fit.vpp),
        ("num_layers_in_first_pipeline_stage", fit.first),
        ("num_layers_in_last_pipeline_stage", fit.last),
    ):
        _set(m, field, value, changes, "model.")
    # Sequence parallelism splits the residual stream over TP: kept where TP is.
    _set(m, "sequence_parallel", bool(m.sequence_parallel) and fit.tp > 1, changes, "model.")
    if m.recompute_method == "block" and m.recompute_num_layers:
        new_stage = max(stage_layers(cfg) or [num_layers])
        kept = scaled_block_recompute(m.recompute_num_layers, old_stage, new_stage)
        _set(m, "recompute_num_layers", kept, changes, "model.")


def _take_experts(m: Any, fit: FittedLayout, num_experts: int | None, changes: list[str]) -> None:
    """The kept routed experts (top-k within them), and a dispatcher that works without expert parallelism."""
    if num_experts is not None:
        _set(m, "num_moe_experts", num_experts, changes, "model.")
        _set(m, "moe_router_topk", min(m.moe_router_topk, num_experts), changes, "model.")
    # Flex dispatchers (DeepEP / HybridEP) need expert parallelism across GPUs.
    if getattr(m, "moe_token_dispatcher_type", None) == "flex" and fit.ep == 1:
        _set(m, "moe_token_dispatcher_type", "alltoall", changes, "model.")


def _take_batch(
    cfg: Any, fit: FittedLayout, gpus: int, global_batch_size: int, micro_batch_size: int | None, changes: list[str]
) -> None:
    """The global batch, and the largest micro batch up to the recipe's that the data-parallel ranks
    divide it by (``micro_batch_size`` when given)."""
    dp = gpus // (fit.tp * fit.pp * fit.cp)
    per_rank = global_batch_size // dp if global_batch_size % dp == 0 else global_batch_size
    mbs = micro_batch_size or max(
        d for d in range(1, min(cfg.train.micro_batch_size, per_rank) + 1) if per_rank % d == 0
    )
    _set(cfg.train, "micro_batch_size", mbs, changes, "train.")
    _set(cfg.train, "global_batch_size", global_batch_size, changes, "train.")
