"""Every run-time patch of Megatron-Core, Megatron-Bridge, Transformer Engine, transformers and Jinja,
each under a contract (``contract.Patch``: the upstream versions it was written for, the symbols it
touches and their parameters); docs/patches.md says what each does and why.

The runner calls :func:`problems` before a run (dry run and launch: a patch the run would install whose
upstream moved or is of another version refuses the run) and :func:`apply` in the training process.
Two patches are installed where they are used: ``flex_check`` within the dry run's validation and
``jinja_sandbox`` by the chat-template renderer.
"""

from __future__ import annotations

from typing import Any

from bridge_recipes.patches import (
    chunked_loss,
    dataset_helpers,
    flex_check,
    fp8_base,
    gdn_warmup,
    jinja_sandbox,
    packed_attention,
    random_lora,
    te_wgrad,
    warmup_rng,
)
from bridge_recipes.patches.contract import Patch, PatchError, check

# in the order apply() installs them
AT_LAUNCH: tuple[Patch, ...] = (
    te_wgrad.PATCH,
    dataset_helpers.PATCH,
    warmup_rng.PATCH,
    packed_attention.PATCH,
    chunked_loss.PATCH,
    gdn_warmup.PATCH,
    fp8_base.PATCH,
    random_lora.PATCH,
)
ALL: tuple[Patch, ...] = (*AT_LAUNCH, flex_check.PATCH, jinja_sandbox.PATCH)

__all__ = ["ALL", "AT_LAUNCH", "Patch", "PatchError", "apply", "by_name", "problems", "wanted"]


def by_name(name: str) -> Patch:
    for patch in ALL:
        if patch.name == name:
            return patch
    raise KeyError(f"no patch named {name!r}; patches: {', '.join(p.name for p in ALL)}")


def wanted(cfg: Any, *, lora_from_random_init: bool = False) -> list[Patch]:
    """The patches a run of ``cfg`` installs at launch, in their order."""
    return [p for p in AT_LAUNCH if p.wanted(cfg, lora_from_random_init=lora_from_random_init)]


def problems(cfg: Any, *, lora_from_random_init: bool = False, dry_run: bool = False) -> list[str]:
    """Why a patch the run needs cannot be trusted on the installed upstream: a version outside its range
    or a symbol gone or changed (each names the patch, the package and both versions)."""
    from bridge_recipes.patches.contract import problems as contract_problems

    needed = wanted(cfg, lora_from_random_init=lora_from_random_init)
    if dry_run and flex_check.wanted(cfg):
        needed.append(flex_check.PATCH)
    return [msg for patch in needed for msg in contract_problems(patch)]


def apply(cfg: Any, *, lora_from_random_init: bool = False) -> list[str]:
    """Install, in the training process, the patches a run of ``cfg`` asks for (idempotent); the lines
    the runner logs. Raises :class:`PatchError` before installing anything when one cannot be trusted."""
    needed = wanted(cfg, lora_from_random_init=lora_from_random_init)
    for patch in needed:
        check(patch)
    lines = []
    for patch in needed:
        if patch.install is not None and (line := patch.install(cfg)) is not None:
            lines.append(line)
    return lines
