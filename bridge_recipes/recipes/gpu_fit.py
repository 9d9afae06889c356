"""Whether a recipe can run on the GPU at hand, checked before launch, and the recipe that can.

Four things stop a run on a GPU other than the one a recipe is written for, minutes into its start:
FP8 (a base stored in FP8, FP8 training) on a GPU without FP8 support (Ampere and older), MXFP8 on a
GPU other than a data-center Blackwell, a packed-attention mode not proven on the GPU
(``features.packed_attention``), and a plan larger than the GPU's memory, or than ``--gpu-memory-gb``,
when that is less than the memory of the recipe's GPU. Each is refused with the reason and the recipes
of the same model and task that the GPU can run, the largest GPU class first (the one that uses most of
the memory). A card named with ``--gpu`` is checked for the first three at ``--plan`` and the dry run
(:func:`architecture_problems`); the plan answers for its memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge_recipes.hardware.gpu_memory import Device
from bridge_recipes.hardware.gpus import class_memory_gb
from bridge_recipes.recipes import registry

# a GPU within 1% of a recipe's GPU memory is of its class (the devices of one card report a little
# more or less than its table figure)
SAME_MEMORY = 0.01


def uses_fp8(cfg: Any) -> bool:
    from bridge_recipes.plan.memory import effective_precision

    return bool(effective_precision(cfg)["fp8"])


def uses_mxfp8(cfg: Any) -> bool:
    """FP8 training with the block-scaled MXFP8 recipe (Blackwell only)."""
    from bridge_recipes.plan.memory import effective_precision

    precision = effective_precision(cfg)
    return bool(precision["fp8"]) and precision["fp8_recipe"] == "mxfp8"


def plan_fits(cfg: Any, world: int, memory_gb: float) -> tuple[bool, float]:
    """Whether the memory plan of ``cfg`` on ``world`` GPUs fits ``memory_gb`` per GPU, and its peak (GB)."""
    from bridge_recipes.plan.memory import plan_memory

    plan = plan_memory(cfg, world, gpu_memory_gb=memory_gb)
    return plan.fits, plan.peak_gb


def recipes_that_fit(
    entry: registry.RecipeEntry,
    memory_gb: float,
    world: int,
    fp8: bool = True,
    mxfp8: bool = True,
    build: Callable[[str], Any] | None = None,
) -> list[str]:
    """Recipes of ``entry``'s model, task and GPU count that a GPU with ``memory_gb`` to use (and FP8
    tensor cores, or not) can run: written for a GPU of no more memory, planned to fit, FP8 only where
    ``fp8``, MXFP8 only where ``mxfp8``; the largest GPU class first. ``build`` makes a recipe's config by
    name (the user's overrides applied, so a recipe listed fits as the user would run it; one they do not
    apply to is left out); default: the recipe as written."""
    candidates = []
    for other in registry.entries().values():
        m = other.meta
        if (other.tree, other.model, m.task, m.gpus) != (entry.tree, entry.model, entry.meta.task, entry.meta.gpus):
            continue
        if other.alias_of or other.name == entry.name:
            continue
        size = class_memory_gb(m.gpu)
        if size is None or size > memory_gb * (1 + SAME_MEMORY):
            continue
        candidates.append((size, other.name))
    out = []
    for _, name in sorted(candidates, reverse=True):
        try:
            cfg = build(name) if build is not None else registry.load(name)()
        except (ValueError, KeyError, TypeError):  # overrides this recipe does not take
            continue
        if (fp8 or not uses_fp8(cfg)) and (mxfp8 or not uses_mxfp8(cfg)) and plan_fits(cfg, world, memory_gb)[0]:
            out.append(name)
    return out


def architecture_problems(entry: registry.RecipeEntry, cfg: Any, device: Device) -> list[str]:
    """Why ``cfg`` (recipe ``entry`` as configured) cannot run on ``device``'s architecture: FP8 or MXFP8 it
    has no support for, a packed-attention mode not proven on it; empty when none."""
    from bridge_recipes.features import packed_attention

    cc = f"compute capability {device.capability[0]}.{device.capability[1]}"
    out = packed_attention.problems(cfg.features.packed_attention, device.capability, f"this {device.name}")
    if uses_fp8(cfg) and not device.fp8:
        out.append(
            f"{entry.name} uses FP8 (weights stored or multiplied in FP8), which {device.name} ({cc}) has no support "
            "for: Transformer Engine's FP8 needs Ada, Hopper or later"
        )
    elif uses_mxfp8(cfg) and not device.mxfp8:
        out.append(
            f"{entry.name} trains in MXFP8 (block-scaled FP8, fp8_recipe mxfp8), which {device.name} ({cc}) has no "
            "support for: Transformer Engine's MXFP8 needs a data-center Blackwell GPU (compute capability 10.x)"
        )
    return out


def problems(entry: registry.RecipeEntry, cfg: Any, device: Device, cap_gb: float | None, world: int) -> list[str]:
    """Why ``cfg`` (recipe ``entry`` as configured) cannot run on ``device`` with ``cap_gb`` (the
    ``--gpu-memory-gb`` cap, or None), each naming the recipes that can; empty when it can."""
    memory = cap_gb if cap_gb is not None else device.memory_gb
    where = f"this {device.name}" + (f" capped at {cap_gb:g} GB" if cap_gb is not None else f" ({memory:.1f} GB)")
    out = architecture_problems(entry, cfg, device)
    size = class_memory_gb(entry.meta.gpu)
    if size is not None and memory < size * (1 - SAME_MEMORY):
        try:
            fits, peak = plan_fits(cfg, world, memory)
        except (ValueError, ZeroDivisionError, KeyError):  # a layout the planner cannot size: the launch says why
            fits, peak = True, 0.0
        if not fits:
            out.append(
                f"{entry.name} is written for {entry.meta.gpu} ({size:.1f} GB) and plans {peak:.1f} GB per GPU, more "
                f"than {where}"
            )
    return with_recipes_that_fit(entry, out, memory, world, device)


def with_recipes_that_fit(
    entry: registry.RecipeEntry, found: list[str], memory_gb: float, world: int, device: Device
) -> list[str]:
    """``found`` (why a recipe cannot run on ``device``), the last naming the recipes that can."""
    if found:
        fitting = recipes_that_fit(entry, memory_gb, world, device.fp8, device.mxfp8)
        found[-1] += (
            f"; recipes for it: {', '.join(fitting)}"
            if fitting
            else f"; no recipe of {entry.model} for {entry.meta.gpus} GPU(s) fits it (--list --filter {entry.model})"
        )
    return found
