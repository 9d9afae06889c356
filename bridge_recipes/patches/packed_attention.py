"""Megatron-Core's ``TEDotProductAttention.forward`` routes packed (THD) calls one conversation at a
time through Transformer Engine's dense attention (``bridge_recipes.packed_attention`` holds the
logic and the mode); every other call goes through the original forward."""

from __future__ import annotations

import functools
from typing import Any

from bridge_recipes import packed_attention
from bridge_recipes.patches.contract import Patch, check

TARGET = "megatron.core.extensions.transformer_engine.TEDotProductAttention.forward"
_state: dict[str, Any] = {"original": None}


def installed() -> bool:
    return _state["original"] is not None


def wanted(cfg: Any, **run: Any) -> bool:
    """Rows with conversation boundaries (offline packing) of a text model."""
    from bridge_recipes.common import is_vlm

    return bool(getattr(cfg.dataset, "enable_offline_packing", False)) and not is_vlm(cfg)


def install(cfg: Any = None) -> str:
    """Route THD calls of Megatron-Core's TE attention through ``packed_attention.per_conversation``
    (idempotent)."""
    line = "packed rows: attention runs one conversation at a time (bridge_recipes.packed_attention)"
    if installed():
        return line
    check(PATCH)
    from megatron.core.extensions.transformer_engine import TEDotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    original = TEDotProductAttention.forward

    @functools.wraps(original)
    def forward(self, query, key, value, attention_mask, attn_mask_type, attention_bias=None,
                packed_seq_params=None, num_splits=None):  # fmt: skip
        thd = packed_seq_params is not None and getattr(packed_seq_params, "qkv_format", None) == "thd"
        if not thd or packed_attention.mode() != "per_conversation":
            return original(
                self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params, num_splits
            )
        if attention_bias is not None or attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"per-conversation attention supports causal self-attention only, got {attn_mask_type}")
        if getattr(packed_seq_params, "cp_group", None) is not None or self.config.context_parallel_size > 1:
            raise ValueError("per-conversation attention does not support context parallelism")
        return packed_attention.per_conversation(
            lambda q, k, v: original(self, q, k, v, None, AttnMaskType.causal, None, None, num_splits),
            query,
            key,
            value,
            packed_attention.boundaries(packed_seq_params),
        )

    TEDotProductAttention.forward = forward
    _state["original"] = original
    return line


PATCH = Patch(
    name="packed_attention",
    what="packed rows' attention one conversation at a time through TE's dense kernel",
    written_for={"megatron-core": ">=0.19,<0.20", "transformer-engine": ">=2.20,<2.21"},
    targets={
        TARGET: (
            "self",
            "query",
            "key",
            "value",
            "attention_mask",
            "attn_mask_type",
            "attention_bias",
            "packed_seq_params",
            "num_splits",
        ),
        "megatron.core.transformer.enums.AttnMaskType.causal": None,
        "megatron.core.transformer.enums.AttnMaskType.padding_causal": None,
    },
    install=install,
    wanted=wanted,
)
