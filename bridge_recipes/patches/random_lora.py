"""Benchmark only (``--lora-from-random-init``, ``bridge_recipes.bench.random_lora``): Megatron-Bridge's
setup adds the recipe's adapters to the randomly initialized model and loads nothing.

Setup's PEFT pre-wrap hook (``setup._create_peft_pre_wrap_hook``) loads the base weights from
``checkpoint.pretrained_checkpoint`` before it adds the adapters; it is swapped for one that only adds
them, and ``checkpoint.pretrained_checkpoint`` names an empty stand-in folder because Megatron-Bridge's
config check asks for one. The run then starts ``pretrain()``, which asks for no checkpoint."""

from __future__ import annotations

import tempfile
from typing import Any

from bridge_recipes.patches.contract import Patch, check

OPTION = "--lora-from-random-init"
TARGET = "megatron.bridge.training.setup._create_peft_pre_wrap_hook"
_state: dict[str, Any] = {"stand_in": None}


def wanted(cfg: Any, lora_from_random_init: bool = False, **run: Any) -> bool:
    return bool(lora_from_random_init)


def log_line(stand_in: str) -> str:
    """What the run's log says once :func:`install` has run."""
    return (
        f"LoRA from random base weights ({OPTION}, benchmark only): no checkpoint is read or written; "
        f"checkpoint.pretrained_checkpoint names the empty stand-in {stand_in} because Megatron-Bridge's config "
        "check asks for one; starting pretrain() with the recipe's adapters"
    )


def install(cfg: Any) -> str:
    """Swap setup's PEFT pre-wrap hook and name the stand-in folder in ``cfg`` (one folder per process);
    returns the log line. Call in the training process, then start ``pretrain()``."""
    check(PATCH)
    import megatron.bridge.training.setup as setup

    if _state["stand_in"] is None:
        _state["stand_in"] = tempfile.mkdtemp(prefix="lora-random-init-")
    cfg.checkpoint.pretrained_checkpoint = _state["stand_in"]

    def create_hook(cfg: Any, state: Any):
        def adapters_on_random_weights(model: list) -> list:
            if cfg.peft is None:
                return model
            return setup._apply_peft_transformation(cfg.peft, model)

        return adapters_on_random_weights

    setup._create_peft_pre_wrap_hook = create_hook
    return log_line(_state["stand_in"])


PATCH = Patch(
    name="random_lora",
    what="benchmark only: LoRA adapters on random base weights, no checkpoint read",
    written_for={"megatron-bridge": ">=0.6,<0.7"},
    targets={
        TARGET: ("cfg", "state"),
        "megatron.bridge.training.setup._apply_peft_transformation": ("peft", "base_model"),
    },
    install=install,
    wanted=wanted,
)
