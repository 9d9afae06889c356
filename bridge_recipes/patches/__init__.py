"""The run-time patches of Megatron-Core, Megatron-Bridge, Transformer Engine, transformers and Jinja that
are no feature of a run, each under a contract (``contract.Patch``: the upstream versions it was written
for, the symbols it touches and their parameters); docs/patches.md says what each does and why. A
run-time feature's patch lives in its module of ``bridge_recipes.features``, whose ``AT_LAUNCH`` lists
every patch a launch installs (this package's ``dataset_helpers`` and ``warmup_rng`` among them).

Two patches are installed where they are used: ``flex_check`` within the dry run's validation and
``jinja_sandbox`` by the chat-template renderer.
"""

from __future__ import annotations

from bridge_recipes.patches import (
    dataset_helpers,
    flex_check,
    jinja_sandbox,
    warmup_rng,
)
from bridge_recipes.patches.contract import Patch, PatchError

ALL: tuple[Patch, ...] = (
    dataset_helpers.PATCH,
    warmup_rng.PATCH,
    flex_check.PATCH,
    jinja_sandbox.PATCH,
)

__all__ = ["ALL", "Patch", "PatchError", "by_name"]


def by_name(name: str) -> Patch:
    for patch in ALL:
        if patch.name == name:
            return patch
    raise KeyError(f"no patch named {name!r}; patches: {', '.join(p.name for p in ALL)}")
