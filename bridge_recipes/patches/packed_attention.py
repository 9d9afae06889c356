"""Megatron-Core's ``TEDotProductAttention.forward`` routes packed (THD) calls through one call of
PyTorch's variable-length flash attention, or one conversation at a time through Transformer Engine's
dense attention (``bridge_recipes.packed_attention`` holds the logic and the modes; the environment,
else the GPU, picks one at install); every other call goes through the original forward."""

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


HOW = {
    "per_conversation": "one conversation at a time",
    "flash_varlen": "one variable-length flash-attention call",
    "varlen": "Transformer Engine's THD kernel",
}


def _capability() -> tuple[int, int] | None:
    """The compute capability of this rank's GPU (``LOCAL_RANK``, read before Megatron sets the device;
    the first visible GPU where a launcher shows each rank only its own); None without one."""
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    index = int(os.environ.get("LOCAL_RANK", "0"))
    major, minor = torch.cuda.get_device_capability(index if index < torch.cuda.device_count() else 0)
    return major, minor


def install(cfg: Any = None) -> str:
    """Route THD calls of Megatron-Core's TE attention through the mode the environment picks
    (``packed_attention.ENV``), else the GPU's default (``packed_attention.default_for``); idempotent,
    the mode set each call."""
    env_vars = getattr(cfg, "env_vars", None) if cfg is not None else None
    if found := packed_attention.problems(env_vars):
        raise ValueError("; ".join(found))
    capability = _capability()
    mode = packed_attention.mode_from(env_vars, capability=capability)
    packed_attention.set_mode(mode)
    line = f"packed rows: attention runs {HOW[mode]} (bridge_recipes.packed_attention"
    if mode == packed_attention.FALLBACK_MODE and packed_attention.default_for(capability) == mode:
        line += f"; {packed_attention.default_rule()}"
    line += ")"
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
        mode = packed_attention.mode()
        if not thd or mode == "varlen":
            return original(
                self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params, num_splits
            )
        if attention_bias is not None or attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"{mode} attention supports causal self-attention only, got {attn_mask_type}")
        if getattr(packed_seq_params, "cp_group", None) is not None or self.config.context_parallel_size > 1:
            raise ValueError(f"{mode} attention does not support context parallelism")
        if mode == "flash_varlen" and packed_attention.flash_varlen_takes(query.dtype):
            return packed_attention.flash_varlen(
                query,
                key,
                value,
                packed_attention.boundaries(packed_seq_params),
                packed_seq_params.cu_seqlens_q,
                self.softmax_scale,
            )
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
    what="packed rows' attention in one variable-length flash-attention call, or one conversation at a time "
    "through TE's dense kernel",
    written_for={"megatron-core": ">=0.19,<0.20", "transformer-engine": ">=2.20,<2.21", "torch": ">=2.11,<2.12"},
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
        "torch.nn.attention.varlen.varlen_attn": (
            "query",
            "key",
            "value",
            "cu_seq_q",
            "cu_seq_k",
            "max_q",
            "max_k",
            "return_aux",
            "scale",
            "window_size",
        ),
        "megatron.core.transformer.enums.AttnMaskType.causal": None,
        "megatron.core.transformer.enums.AttnMaskType.padding_causal": None,
    },
    install=install,
    wanted=wanted,
)
