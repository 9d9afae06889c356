"""Megatron-Bridge's JIT warm-up (``initialize._warmup_jit_function``) keeps the CUDA random state.

``setup()`` seeds the generators, then warms the fused kernels up on ``torch.rand`` tensors of
``model.seq_length`` x ``train.micro_batch_size`` tokens, then builds the model. Left alone, the initial
weights of one seed change with the sequence length and micro batch, so two layouts of the same rows
cannot be compared from the same start; with the state restored they depend on the seed alone."""

from __future__ import annotations

import functools
from typing import Any

from bridge_recipes.patches.contract import Patch, check

TARGET = "megatron.bridge.training.initialize._warmup_jit_function"


def wanted(cfg: Any = None, **run: Any) -> bool:
    return True


def install(cfg: Any = None) -> None:
    """Wrap the warm-up so it restores the CUDA random state (idempotent)."""
    check(PATCH)
    import torch
    from megatron.bridge.training import initialize

    warmup = initialize._warmup_jit_function
    if getattr(warmup, "keeps_rng", False):
        return None

    @functools.wraps(warmup)
    def keeping_rng(*args: Any, **kwargs: Any) -> None:
        state = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        try:
            warmup(*args, **kwargs)
        finally:
            if state is not None:
                torch.cuda.set_rng_state(state)

    keeping_rng.keeps_rng = True  # type: ignore[attr-defined]
    initialize._warmup_jit_function = keeping_rng
    return None


PATCH = Patch(
    name="warmup_rng",
    what="the JIT warm-up leaves the CUDA random state as it found it",
    written_for={"megatron-bridge": ">=0.6,<0.7"},
    targets={TARGET: ("model_config", "micro_batch_size")},
    install=install,
    wanted=wanted,
)
