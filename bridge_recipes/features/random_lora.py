"""Benchmark only: a LoRA recipe trained from random base weights, for its speed and memory.

Megatron-Bridge 0.6.2 refuses LoRA without starting weights in three places:
``ConfigContainer.validate`` asserts that ``checkpoint.pretrained_checkpoint`` is set (and
``CheckpointConfig.finalize`` that it exists), ``finetune()`` asserts that a checkpoint is named,
and setup's PEFT pre-wrap hook (``_create_peft_pre_wrap_hook``) loads the base weights from
``checkpoint.pretrained_checkpoint`` before it adds the adapters. A benchmark host has no room for
a released size's checkpoint (the 35B-A3B's does not fit its disk), and a step's work does not
depend on what the weights hold (but for the experts a random router picks).

``features.random_lora.enabled`` (the runner's :data:`OPTION` sets it) makes the launch name an empty
stand-in folder as ``checkpoint.pretrained_checkpoint`` before it prints what runs
(:func:`launch_change`: the config checks only ask that one is named and exists; nothing reads it);
:data:`PATCH` swaps setup's pre-wrap hook for one that adds the recipe's adapters to the randomly
initialized model without loading anything, and the run starts ``pretrain()``, which asks for no
checkpoint (with ``checkpoint.load`` null, setup loads nothing later either). It never applies to a real
run: :func:`problems` refuses it where the run would keep anything (``checkpoint.save``,
``--export-hf``) or names starting weights, and the run's log and result file say that the base
weights were random (:data:`NOTE`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from bridge_recipes.patches.contract import Patch, check

OPTION = "--lora-from-random-init"
KEY = "features.random_lora.enabled"
TARGET = "megatron.bridge.training.setup._create_peft_pre_wrap_hook"
NOTE = (
    "base weights: random (--lora-from-random-init, benchmark only): the LoRA recipe's speed and memory, "
    "not its training"
)
_state: dict[str, Any] = {"stand_in": None}


@dataclass
class Config:
    """Benchmark only: train the recipe's adapters on random base weights, reading no checkpoint
    (``enabled``; the runner's ``--lora-from-random-init``)."""

    enabled: bool = False


def problems(cfg: Any, *, hf_checkpoint: str | None = None, export_hf: str | None = None) -> list[str]:
    """Why LoRA from random weights cannot apply to the run ``cfg`` describes: it is for a LoRA benchmark
    that keeps nothing and starts from no weights. Each problem names the setting and the fix."""
    out = []
    if getattr(cfg, "peft", None) is None:
        out.append(f"{OPTION}: the run trains no LoRA adapters (peft is unset); pass a LoRA recipe or drop {OPTION}")
    ckpt = cfg.checkpoint
    kept = [f"checkpoint.{field}" for field in ("save", "load") if getattr(ckpt, field)]
    if kept:
        out.append(
            f"{OPTION} is for benchmarks, which keep and resume nothing: set "
            + " ".join(f"{k}=null" for k in kept)
            + (" checkpoint.async_save=false" if ckpt.async_save else "")
        )
    stand_in = _state["stand_in"]
    if (ckpt.pretrained_checkpoint and ckpt.pretrained_checkpoint != stand_in) or hf_checkpoint:
        given = f"--hf-checkpoint {hf_checkpoint}" if hf_checkpoint else "checkpoint.pretrained_checkpoint"
        out.append(f"{OPTION} and {given} both say where the base weights come from; pass one")
    if export_hf:
        out.append(f"{OPTION}: --export-hf would export random weights; drop one of them")
    return out


def wanted(cfg: Any, **run: Any) -> bool:
    return bool(cfg.features.random_lora.enabled)


def log_line(stand_in: str) -> str:
    """What the run's log says once :func:`install` has run."""
    return (
        f"LoRA from random base weights ({OPTION}, benchmark only): no checkpoint is read or written; "
        f"checkpoint.pretrained_checkpoint names the empty stand-in {stand_in} because Megatron-Bridge's config "
        "check asks for one; starting pretrain() with the recipe's adapters"
    )


def launch_change(cfg: Any) -> str | None:
    """Before the launch prints what it runs: name the empty stand-in folder (one per process) as
    ``checkpoint.pretrained_checkpoint``; the line that says so, or None when the feature is off."""
    if not wanted(cfg):
        return None
    if _state["stand_in"] is None:
        _state["stand_in"] = tempfile.mkdtemp(prefix="lora-random-init-")
    cfg.checkpoint.pretrained_checkpoint = _state["stand_in"]
    return f"checkpoint.pretrained_checkpoint: the empty stand-in {_state['stand_in']} ({KEY}=true, benchmark only)"


def install(cfg: Any) -> str:
    """Swap setup's PEFT pre-wrap hook (after :func:`launch_change`); returns the log line. Call in the
    training process, then start ``pretrain()``."""
    check(PATCH)
    import megatron.bridge.training.setup as setup

    if _state["stand_in"] is None or cfg.checkpoint.pretrained_checkpoint != _state["stand_in"]:
        raise RuntimeError(f"{KEY}=true: the launch names the stand-in checkpoint folder first (launch_change)")

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
    module=__name__,
)
