"""Hand a checked config to Megatron-Bridge's pretrain / finetune with the right forward step.

Differences between a registry install and an NGC container are handled here when they apply,
each reported in one log line; the run-time patches of upstream code the config asks for (among them
the dataset helpers the megatron-core wheel ships compiled, and Transformer Engine's GEMM in place of
APEX's weight-gradient kernel) are installed by ``bridge_recipes.patches.apply`` (docs/patches.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from bridge_recipes import patches, watchdog
from bridge_recipes.common import is_vlm

LOG = "[run_recipe]"


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def flash_attn_available() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("flash_attn", "flash_attn_interface"))


def fall_back_from_flash_without_flash_attn(cfg: Any) -> bool:
    """TE's flash backend needs the flash-attn package; without it TE's own (cuDNN) attention runs."""
    from megatron.core.transformer.enums import AttnBackend

    if getattr(cfg.model, "attention_backend", None) != AttnBackend.flash or flash_attn_available():
        return False
    cfg.model.attention_backend = AttnBackend.auto
    _log(
        "attention_backend: flash -> auto (flash-attn is not installed; Transformer Engine picks its fused attention)"
    )
    return True


def fault_tolerance_off_without_ft_launcher(cfg: Any) -> bool:
    """NVRx fault tolerance talks to the rank monitors ft_launcher starts; under plain torchrun
    there are none, so it is turned off rather than failing at setup."""
    from bridge_recipes.resilience import launched_by_ft_launcher

    if not (cfg.ft and cfg.ft.enable_ft_package) or launched_by_ft_launcher():
        return False
    cfg.ft.enable_ft_package = False
    _log(
        "fault tolerance: off (not launched by ft_launcher; launch with ft_launcher to enable heartbeats and timeouts)"
    )
    return True


def prepare_for_registry_install(cfg: Any) -> None:
    """Apply the registry-install adjustments that apply (each logs one line)."""
    fault_tolerance_off_without_ft_launcher(cfg)
    fall_back_from_flash_without_flash_attn(cfg)


def forward_step_for(cfg: Any) -> Callable:
    """VL models feed images through vlm_step; text models use gpt_step's step with the loss mask
    also given to the model, so their MTP loss counts only supervised tokens (bridge_recipes.train_step)."""
    if is_vlm(cfg):
        from megatron.bridge.training.vlm_step import forward_step
    else:
        from bridge_recipes.train_step import forward_step
    return forward_step


def entry_point_name(cfg: Any, task: str, lora_from_random_init: bool = False) -> str:
    """``finetune`` for SFT/PEFT starting from weights; ``pretrain`` otherwise (random init, and a
    LoRA benchmark from random weights: ``bridge_recipes.patches.random_lora``)."""
    if lora_from_random_init:
        return "pretrain"
    if task in ("sft", "peft") and (cfg.checkpoint.pretrained_checkpoint or cfg.peft is not None):
        return "finetune"
    return "pretrain"


def entry_point_for(cfg: Any, task: str, lora_from_random_init: bool = False) -> Callable:
    name = entry_point_name(cfg, task, lora_from_random_init)
    if name == "finetune":
        from megatron.bridge.training.finetune import finetune

        return finetune
    if not lora_from_random_init and task in ("sft", "peft"):
        _log("no checkpoint.pretrained_checkpoint: fine-tuning recipe runs from random init through pretrain()")
    from megatron.bridge.training.pretrain import pretrain

    return pretrain


def watched(step: Callable, budgets: watchdog.Budgets) -> tuple[Callable, Any]:
    """``step`` reporting its micro-batches to a :class:`watchdog.Watchdog` of ``budgets``, and the
    Megatron-Bridge callbacks that start it with the training loop and tell it of each finished step."""
    from megatron.bridge.training.callbacks import CallbackManager

    dog = watchdog.Watchdog(budgets)
    manager = CallbackManager()
    for event, fn in watchdog.callbacks(dog).items():
        manager.register(event, fn)
    return watchdog.watched_forward_step(step, dog), manager


def run(cfg: Any, task: str, lora_from_random_init: bool = False, budgets: watchdog.Budgets | None = None) -> None:
    """Train ``cfg``: the registry-install adjustments, the patches it asks for, then Megatron-Bridge's
    entry point under the progress watch of ``budgets`` (:mod:`bridge_recipes.watchdog`)."""
    budgets = budgets or watchdog.Budgets()
    prepare_for_registry_install(cfg)
    for line in patches.apply(cfg, lora_from_random_init=lora_from_random_init):
        _log(line)
    step = forward_step_for(cfg)
    entry = entry_point_for(cfg, task, lora_from_random_init)
    _log(f"starting {entry.__name__}() with {step.__module__}.forward_step")
    _log(f"progress watch: {budgets.describe()}")
    step, callbacks = watched(step, budgets)
    entry(cfg, step, callbacks=callbacks)
