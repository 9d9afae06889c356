"""Dry run only: Megatron-Bridge's flex-dispatcher GPU-architecture check
(``config.validate_flex_dispatcher_backend``) is skipped during the runner's pre-launch validation on a
machine without a GPU; it runs again at launch. Restored when the validation ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bridge_recipes.patches.contract import Patch, check

TARGET = "megatron.bridge.training.config.validate_flex_dispatcher_backend"
NOTE = "note: the flex dispatcher's GPU-architecture check needs a GPU; skipped here, it runs at launch"


def wanted(cfg: Any, **run: Any) -> bool:
    """The config uses the flex dispatcher and this machine has no GPU."""
    import torch

    return not torch.cuda.is_available() and getattr(cfg.model, "moe_token_dispatcher_type", None) == "flex"


@contextlib.contextmanager
def skipped(cfg: Any) -> Iterator[bool]:
    """Within the block, the check is skipped where :func:`wanted` (yields whether it is)."""
    if not wanted(cfg):
        yield False
        return
    check(PATCH)
    import megatron.bridge.training.config as mb_config

    probe_gpu = mb_config.validate_flex_dispatcher_backend
    mb_config.validate_flex_dispatcher_backend = lambda model_config: None
    try:
        yield True
    finally:
        mb_config.validate_flex_dispatcher_backend = probe_gpu


PATCH = Patch(
    name="flex_check",
    what="dry run without a GPU: skip the flex dispatcher's GPU-architecture check",
    written_for={"megatron-bridge": ">=0.6,<0.7"},
    targets={TARGET: ("model_config",), "megatron.bridge.training.config.runtime_config_update": ("cfg",)},
)
