"""Benchmark only: a LoRA recipe trained from random base weights, for its speed and memory.

Megatron-Bridge 0.6.2 refuses LoRA without starting weights in three places:
``ConfigContainer.validate`` asserts that ``checkpoint.pretrained_checkpoint`` is set (and
``CheckpointConfig.finalize`` that it exists), ``finetune()`` asserts that a checkpoint is named,
and setup's PEFT pre-wrap hook (``_create_peft_pre_wrap_hook``) loads the base weights from
``checkpoint.pretrained_checkpoint`` before it adds the adapters. A benchmark host has no room for
a released size's checkpoint (the 35B-A3B's does not fit its disk), and a step's work does not
depend on what the weights hold (but for the experts a random router picks).

With :data:`OPTION` the runner (``bridge_recipes.patches.random_lora``, in the training process)
names an empty stand-in folder as ``checkpoint.pretrained_checkpoint`` (the config checks only ask
that one is named and exists; nothing reads it), swaps the pre-wrap hook for one that adds the
recipe's adapters to the randomly initialized model without loading anything, and starts
``pretrain()``, which asks for no checkpoint (with ``checkpoint.load`` null, setup loads nothing
later either). It never applies to a real run: :func:`problems` refuses it where the run would keep
anything (``checkpoint.save``, ``--export-hf``) or names starting weights, and the run's log and
result file say that the base weights were random (:data:`NOTE`).
"""

from __future__ import annotations

from typing import Any

from bridge_recipes.patches.random_lora import OPTION

__all__ = ["NOTE", "OPTION", "problems"]
NOTE = (
    "base weights: random (--lora-from-random-init, benchmark only): the LoRA recipe's speed and memory, "
    "not its training"
)


def problems(cfg: Any, *, hf_checkpoint: str | None = None, export_hf: str | None = None) -> list[str]:
    """Why :data:`OPTION` cannot apply to the run ``cfg`` describes: it is for a LoRA benchmark that keeps
    nothing and starts from no weights. Each problem names the setting and the fix."""
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
    if ckpt.pretrained_checkpoint or hf_checkpoint:
        given = f"--hf-checkpoint {hf_checkpoint}" if hf_checkpoint else "checkpoint.pretrained_checkpoint"
        out.append(f"{OPTION} and {given} both say where the base weights come from; pass one")
    if export_hf:
        out.append(f"{OPTION}: --export-hf would export random weights; drop one of them")
    return out
