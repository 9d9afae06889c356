"""A pre-wrap hook runs the Gated DeltaNet kernels once, forward and backward, before training
(``bridge_recipes.gdn_warmup`` holds the warm-up and says why)."""

from __future__ import annotations

from typing import Any

from bridge_recipes import gdn_warmup
from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once

RULE = "megatron.core.ssm.gated_delta_net.gdn.chunk_gated_delta_rule"


def wanted(cfg: Any, **run: Any) -> bool:
    """The environment (``BRIDGE_RECIPES_GDN_WARMUP``) switches it on, for a model with Gated DeltaNet."""
    return gdn_warmup.enabled(getattr(cfg, "env_vars", None)) and gdn_warmup.shape(cfg.model) is not None


def pre_wrap_hook(chunks: list) -> list:
    """Megatron-Bridge pre-wrap hook: warm the rule Megatron-Core's Gated DeltaNet layers call, at the
    first chunk's shape, on this rank's GPU."""
    import torch

    from bridge_recipes.patches.contract import resolve

    s = gdn_warmup.shape(chunks[0].config)
    if s is not None:
        gdn_warmup.warm(resolve(RULE), s, torch.device("cuda", torch.cuda.current_device()))
    return chunks


def install(cfg: Any) -> str:
    """Register :func:`pre_wrap_hook` on ``cfg.model`` (once)."""
    check(PATCH)
    register_pre_wrap_hook_once(cfg, pre_wrap_hook)
    s = gdn_warmup.shape(cfg.model)
    if s is None:  # not wanted: a model without Gated DeltaNet layers
        return "Gated DeltaNet: no layers to warm"
    return (
        f"Gated DeltaNet: kernels compiled and tuned at model build ({s.heads} heads of {s.key_dim} x "
        f"{s.value_dim}; {gdn_warmup.ENV}=1; bridge_recipes.gdn_warmup)"
    )


PATCH = Patch(
    name="gdn_warmup",
    what="the Gated DeltaNet kernels' first calls (compile, tuning) at model build, not in the first step",
    written_for={"megatron-core": ">=0.19,<0.20", "megatron-bridge": ">=0.6,<0.7", "fla-core": ">=0.6,<0.7"},
    targets={
        RULE: (
            "q",
            "k",
            "v",
            "g",
            "beta",
            "scale",
            "initial_state",
            "output_final_state",
            "use_qk_l2norm_in_kernel",
            "use_beta_sigmoid_in_kernel",
            "allow_neg_eigval",
            "state_v_first",
            "cu_seqlens",
            "cu_seqlens_cpu",
            "chunk_indices",
            "cp_context",
            "kwargs",
        ),
        "megatron.bridge.models.model_provider.ModelProviderMixin.register_pre_wrap_hook": ("self", "hook", "prepend"),
    },
    install=install,
    wanted=wanted,
)
