"""The runner's ``--plan`` text: the per-stage table, the verdict, and for a config that does not fit
the usual changes that would (each planned)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bridge_recipes.models.qwen35 import is_vlm
from bridge_recipes.plan.peak import MemoryPlan, StageMemory, plan_memory

_COLUMNS = ("stage", "layers", "mb", "weights", "grads", "optim", "activ", "logits", "bwd", "alloc", "+ovh", "total")


def _row(s: StageMemory, capacity: float) -> str:
    cells = (
        f"{s.stage}",
        f"{s.layers}",
        f"{s.in_flight:g}",
        *(
            f"{v:.1f}"
            for v in (
                s.weights_gb,
                s.grads_gb,
                s.optimizer_gb,
                s.activations_gb,
                s.logits_gb,
                s.backward_gb,
                s.allocated_gb,
                s.overhead_gb,
                s.total_gb,
            )
        ),
    )
    flag = "" if s.total_gb <= capacity else f"  OVER by {s.total_gb - capacity:.1f}"
    return "  ".join(f"{c:>7}" for c in cells) + flag


def format_plan(plan: MemoryPlan) -> str:
    """A short table: one row per pipeline stage, GB = 1e9 bytes."""
    lines = [
        f"memory plan, GB = 1e9 bytes: {plan.layout} on {plan.gpu or 'a GPU'} ({plan.gpu_memory_gb:.1f} GB per GPU)",
        "  ".join(f"{c:>7}" for c in _COLUMNS),
    ]
    lines += [_row(s, plan.gpu_memory_gb) for s in plan.stages]
    host = max(s.host_optimizer_gb for s in plan.stages)
    if host:
        lines.append(f"optimizer state on the host: up to {host:.1f} GB per rank")
    verdict = "fits" if plan.fits else f"DOES NOT FIT: stage {', '.join(map(str, plan.stages_over()))} over"
    lines.append(
        f"peak: stage {plan.peak_stage}, {plan.peak_gb:.1f} of {plan.gpu_memory_gb:.1f} GB ({verdict}); "
        f"logits and bwd do not coexist, alloc counts the larger"
    )
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


# The usual levers for a config that does not fit, in the order they cost least throughput: each
# is the override tokens that set it and the change itself; a lever the config already pulls is
# skipped. More GPUs (the same layout, more data-parallel ranks sharding the distributed
# optimizer) are tried after them.
def _chunked_loss(cfg: Any) -> bool:
    chunked = cfg.features.chunked_loss
    if chunked.enabled or is_vlm(cfg) or not replace(chunked, enabled=True).applies_to(cfg.model):
        return False
    chunked.enabled = True
    return True


def _full_recompute(cfg: Any) -> bool:
    m = cfg.model
    if (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == ("full", "uniform", 1):
        return False
    m.recompute_granularity, m.recompute_method, m.recompute_num_layers = "full", "uniform", 1
    return True


def _micro_batch_1(cfg: Any) -> bool:
    if cfg.train.micro_batch_size == 1:
        return False
    cfg.train.micro_batch_size = 1
    return True


def _optimizer_on_host(cfg: Any) -> bool:
    opt = cfg.optimizer
    if getattr(opt, "optimizer_cpu_offload", False) and getattr(opt, "optimizer_offload_fraction", 0) == 1.0:
        return False
    opt.optimizer_cpu_offload, opt.optimizer_offload_fraction = True, 1.0
    return True


LEVERS: tuple[tuple[str, tuple[str, ...], Any], ...] = (
    ("the loss a chunk of tokens at a time", ("features.chunked_loss.enabled=true",), _chunked_loss),
    (
        "full recompute",
        ("model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1"),
        _full_recompute,
    ),
    ("micro batch 1", ("-mb 1",), _micro_batch_1),
    (
        "optimizer state on the host",
        ("optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"),
        _optimizer_on_host,
    ),
)


MORE_GPUS = (2, 4, 8)  # multiples of the world size tried


def changes_that_fit(
    cfg: Any, world_size: int, gpu: str | None = None, gpu_memory_gb: float | None = None
) -> list[str]:
    """For a config that does not fit: the smallest sets of :data:`LEVERS` that fit (each lever
    alone, else pairs, ...), then the fewest more GPUs that fit; each line names the change
    (override tokens or a world size) and the peak it plans. Empty when nothing fits."""
    import copy
    import itertools

    def plan(changed: Any, world: int) -> MemoryPlan | None:
        try:
            return plan_memory(changed, world, gpu_memory_gb=gpu_memory_gb, gpu=gpu)
        except (ValueError, ZeroDivisionError):
            return None

    def peak(p: MemoryPlan) -> str:
        return f"peak {p.peak_gb:.1f} of {p.gpu_memory_gb:.1f} GB"

    usable = [lever for lever in LEVERS if lever[2](copy.deepcopy(cfg))]  # those not pulled already
    out = []
    for size in range(1, len(usable) + 1):
        for levers in itertools.combinations(usable, size):
            changed = copy.deepcopy(cfg)
            for _, _, pull in levers:
                pull(changed)
            if (p := plan(changed, world_size)) and p.fits:
                names = " + ".join(name for name, _, _ in levers)
                out.append(f"{names}: {' '.join(t for _, tokens, _ in levers for t in tokens)} ({peak(p)})")
        if out:
            break
    for factor in MORE_GPUS:
        if (p := plan(cfg, world_size * factor)) and p.fits:
            out.append(
                f"more GPUs: {world_size * factor} instead of {world_size}, the same layout with more data-parallel "
                f"ranks sharding the optimizer ({p.layout}; {peak(p)})"
            )
            break
    return out


def plan_report(
    cfg: Any, world_size: int, gpu: str | None = None, gpu_memory_gb: float | None = None
) -> tuple[str, bool]:
    """The runner's ``--plan`` text and whether every stage fits ``gpu``'s memory (or ``gpu_memory_gb``);
    over budget, the text ends with the changes that would fit (:func:`changes_that_fit`)."""
    plan = plan_memory(cfg, world_size, gpu_memory_gb=gpu_memory_gb, gpu=gpu)
    text = format_plan(plan)
    if not plan.fits:
        fixes = changes_that_fit(cfg, world_size, gpu, gpu_memory_gb)
        if fixes:
            text += "\nchanges that fit (each planned):\n" + "\n".join(f"  {f}" for f in fixes)
        else:
            text += (
                f"\nno usual change fits: {', '.join(name for name, _, _ in LEVERS)} (alone and together) and up "
                f"to {MORE_GPUS[-1]}x the GPUs were planned; a deeper pipeline (-pp) or larger-memory GPUs remain"
            )
    return text, plan.fits
