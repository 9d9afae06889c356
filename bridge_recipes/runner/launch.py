"""Hand a checked config to Megatron-Bridge's pretrain / finetune with the right forward step.

What this machine makes of the config (a registry install without flash-attn or ft_launcher, a missing
APEX kernel, the stand-in folder of LoRA on random weights) is changed by :func:`prepare`, which the
runner calls before it prints what runs, each change in one line; :func:`run` then installs the run-time
patches the config asks for (``bridge_recipes.features.apply``: among them the dataset helpers the
megatron-core wheel ships compiled, docs/patches.md) and starts training, changing nothing.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

from bridge_recipes import features
from bridge_recipes.models.qwen35 import is_vlm
from bridge_recipes.training import watchdog

LOG = "[run_recipe]"


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def attention_backend_change(cfg: Any) -> str | None:
    """TE's flash backend needs the flash-attn package; without it TE's own (cuDNN) attention runs: the
    change made, in words, or None."""
    from megatron.core.transformer.enums import AttnBackend

    if getattr(cfg.model, "attention_backend", None) != AttnBackend.flash or flash_attn_available():
        return None
    cfg.model.attention_backend = AttnBackend.auto
    return (
        "attention_backend: flash -> auto (flash-attn is not installed; Transformer Engine picks its fused attention)"
    )


def fault_tolerance_change(cfg: Any) -> str | None:
    """NVRx fault tolerance talks to the rank monitors ft_launcher starts; under plain torchrun there are
    none, so it is turned off rather than failing at setup: the change made, in words, or None."""
    from bridge_recipes.recipes.resilience import launched_by_ft_launcher

    if not (cfg.ft and cfg.ft.enable_ft_package) or launched_by_ft_launcher():
        return None
    cfg.ft.enable_ft_package = False
    return (
        "fault tolerance: off (not launched by ft_launcher; launch with ft_launcher to enable heartbeats and timeouts)"
    )


def prepare(cfg: Any) -> list[str]:
    """Make the changes this machine needs (each one line, returned): fault tolerance without
    ft_launcher, the attention backend without flash-attn, and the features' (:func:`features.launch_changes`)."""
    return [
        line
        for line in (fault_tolerance_change(cfg), attention_backend_change(cfg), *features.launch_changes(cfg))
        if line
    ]


def flash_attn_available() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("flash_attn", "flash_attn_interface"))


def forward_step_for(cfg: Any) -> Callable:
    """VL models feed images through vlm_step; text models use gpt_step's step with the loss mask
    also given to the model, so their MTP loss counts only supervised tokens (bridge_recipes.training.train_step)."""
    if is_vlm(cfg):
        from megatron.bridge.training.vlm_step import forward_step
    else:
        from bridge_recipes.training.train_step import forward_step
    return forward_step


def entry_point_name(cfg: Any, task: str) -> str:
    """``finetune`` for SFT/PEFT starting from weights; ``pretrain`` otherwise (random init, and a
    LoRA benchmark from random weights: ``features.random_lora``)."""
    if cfg.features.random_lora.enabled:
        return "pretrain"
    if task in ("sft", "peft") and (cfg.checkpoint.pretrained_checkpoint or cfg.peft is not None):
        return "finetune"
    return "pretrain"


def entry_point_for(cfg: Any, task: str) -> Callable:
    name = entry_point_name(cfg, task)
    if name == "finetune":
        from megatron.bridge.training.finetune import finetune

        return finetune
    if not cfg.features.random_lora.enabled and task in ("sft", "peft"):
        _log("no checkpoint.pretrained_checkpoint: fine-tuning recipe runs from random init through pretrain()")
    from megatron.bridge.training.pretrain import pretrain

    return pretrain


def watched(step: Callable, budgets: watchdog.Budgets, line: watchdog.StepLine | None = None) -> tuple[Callable, Any]:
    """``step`` reporting its micro-batches to a :class:`watchdog.Watchdog` of ``budgets``, and the
    Megatron-Bridge callbacks that start it with the training loop, tell it of each finished step and
    print ``line`` for it."""
    from megatron.bridge.training.callbacks import CallbackManager

    dog = watchdog.Watchdog(budgets)
    manager = CallbackManager()
    for event, fn in watchdog.callbacks(dog, line).items():
        manager.register(event, fn)
    return watchdog.watched_forward_step(step, dog), manager


def step_line(cfg: Any, world: int) -> watchdog.StepLine:
    """The line of each step of ``cfg`` on ``world`` GPUs: its steps, the tokens it reads per step and, on SFT
    rows, their non-padding share (the rows' manifest)."""
    from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

    t = cfg.train
    share = 1.0
    if type(cfg.dataset).__name__ == "PackedSFTRowsConfig" and cfg.dataset.path:
        try:
            m = read_manifest(cfg.dataset.path)
            share = 1.0 - m["padding_tokens"] / (m["rows"] * m["row_tokens"])
        except (RowsIntegrityError, KeyError, TypeError, ValueError, ZeroDivisionError):
            share = 1.0
    return watchdog.StepLine(int(t.train_iters or 0), t.global_batch_size * cfg.model.seq_length, share, world)


def run(cfg: Any, task: str, budgets: watchdog.Budgets | None = None) -> None:
    """Install the run-time patches ``cfg`` asks for (after :func:`prepare`) and start training under the
    progress watch of ``budgets`` (:mod:`bridge_recipes.training.watchdog`)."""
    budgets = budgets or watchdog.Budgets()
    for line in features.apply(cfg):
        _log(line)
    step = forward_step_for(cfg)
    entry = entry_point_for(cfg, task)
    _log(f"starting {entry.__name__}() with {step.__module__}.forward_step")
    _log(f"progress watch: {budgets.describe()}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    step, callbacks = watched(step, budgets, step_line(cfg, world))
    entry(cfg, step, callbacks=callbacks)
