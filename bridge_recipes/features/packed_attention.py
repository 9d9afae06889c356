"""Attention over packed rows: one conversation at a time, or one variable-length call.

A packed (THD) row reaches Transformer Engine's attention with ``cu_seqlens``; TE then runs its
variable-length kernel, whose cuDNN backward is wrong at the family's head dim of 256. This feature
routes the same call another way, as ``features.packed_attention.mode`` says (:class:`Config`):

- ``per_conversation`` (the default on every GPU): the row is cut at its boundaries and each
  conversation goes through TE's dense (``sbhd``) attention on its own, the kernel a conversation takes
  when it is the only one in its row. Each conversation is padded at its end to a multiple of
  ``PAD_TO`` tokens before the call: under the causal mask its own tokens never see the padding, and
  the kernels meet a few dozen sequence lengths instead of one per conversation length.
- ``flash_varlen`` (opt-in, on the GPUs of ``FLASH_VARLEN_GPUS`` only): the whole row in one call of
  PyTorch's bundled flash-attention variable-length kernel (``torch.nn.attention.varlen``), causal
  within each conversation: one launch per layer pass and no host loop. Its gradient parity is tested
  at reduced depth; it becomes a default only once full-size runs of the recipes it touches pass.
- ``varlen``: TE's own THD kernel, so the three can be compared in one process.

Each conversation's output is the one it would have alone, forward and backward, with one small host
read of the boundaries per micro batch. :data:`PATCH` replaces Megatron-Core's
``TEDotProductAttention.forward`` once per process; calls without packed-sequence parameters go
through the original forward.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from bridge_recipes.patches.contract import Patch, check

MODES = ("per_conversation", "flash_varlen", "varlen")
DEFAULT_MODE = "per_conversation"
# The compute capabilities whose flash-attention kernels the FP32 gradient-parity test has passed:
# FA2's head-dim-256 backward is built for sm80 (A100), and Hopper (sm90: H100, H200) runs the same
# kernels. flash_varlen is refused on other GPUs.
FLASH_VARLEN_GPUS = ((8, 0), (9, 0))
KEY = "features.packed_attention.mode"
REPLACES_ENV = ("BRIDGE_RECIPES_PACKED_ATTENTION", KEY)  # the environment variable this key replaced
PAD_TO = 128
TARGET = "megatron.core.extensions.transformer_engine.TEDotProductAttention.forward"
HOW = {
    "per_conversation": "one conversation at a time through Transformer Engine's dense kernel",
    "flash_varlen": "one variable-length flash-attention call",
    "varlen": "Transformer Engine's THD kernel",
}
_state: dict[str, Any] = {"mode": DEFAULT_MODE, "original": None}


@dataclass
class Config:
    """How attention runs over rows with conversation boundaries: one of :data:`MODES`."""

    mode: str = DEFAULT_MODE


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"packed attention mode {mode!r} is not one of {', '.join(MODES)}")
    _state["mode"] = mode


def mode() -> str:
    return _state["mode"]


def _capability_text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def proven_text() -> str:
    """The GPUs flash_varlen may run on, in words, for the messages that name them."""
    return "compute capability " + " or ".join(_capability_text(c) for c in FLASH_VARLEN_GPUS)


def _choices() -> str:
    return f"choose one of {', '.join(MODES)} (default {DEFAULT_MODE})"


def mode_problem(mode: Any) -> str | None:
    """Why ``mode`` is not one of :data:`MODES`, with the choices; None when it is."""
    return None if mode in MODES else f"{KEY}={mode!r} is not a packed-attention mode; {_choices()}"


def problems(config: Config, capability: tuple[int, int] | None = None, gpu: str | None = None) -> list[str]:
    """Why ``config`` cannot run on a GPU of ``capability`` (``gpu``: its name, for the message; None when
    no GPU is known), with the choices."""
    if problem := mode_problem(config.mode):
        return [problem]
    if config.mode == "flash_varlen" and capability is not None and tuple(capability) not in FLASH_VARLEN_GPUS:
        on = f"compute capability {_capability_text(capability)}" + (f" ({gpu})" if gpu else "")
        return [
            f"{KEY}=flash_varlen is proven on {proven_text()} only, not on {on}; set {KEY}={DEFAULT_MODE} "
            f"({_choices()})"
        ]
    return []


def wanted(cfg: Any, **run: Any) -> bool:
    """Rows with conversation boundaries (offline packing) of a text model."""
    from bridge_recipes.models.qwen35 import is_vlm

    return bool(getattr(cfg.dataset, "enable_offline_packing", False)) and not is_vlm(cfg)


def describe(cfg: Any) -> str:
    """The summary's line: the mode, and whether this run's data uses it."""
    m = cfg.features.packed_attention.mode
    if not wanted(cfg):
        return f"{m} (unused: no rows with conversation boundaries)"
    return f"{m}: {HOW.get(m, 'unknown')}"


_BOUNDS = "_per_conversation_bounds"  # the host copy kept on a micro batch's packed-sequence parameters


def boundaries(packed_seq_params: Any) -> list[int]:
    """The row's conversation boundaries on the host; refuses padding between conversations. Read
    once per micro batch: every attention layer, and the recompute and backward, get the same
    parameters object, which keeps the host copy (one device read, not one per layer call)."""
    kept = getattr(packed_seq_params, _BOUNDS, None)
    if kept is not None and kept[0] is packed_seq_params.cu_seqlens_q:
        return kept[1]
    cu = packed_seq_params.cu_seqlens_q
    padded = getattr(packed_seq_params, "cu_seqlens_q_padded", None)
    bounds = [int(x) for x in cu.tolist()]
    if padded is not None and padded is not cu and [int(x) for x in padded.tolist()] != bounds:
        raise ValueError(
            "packed-row attention needs rows without padding between conversations "
            "(cu_seqlens_q_padded differs from cu_seqlens_q)"
        )
    kv = getattr(packed_seq_params, "cu_seqlens_kv", None)
    if kv is not None and kv is not cu and [int(x) for x in kv.tolist()] != bounds:
        raise ValueError("packed-row attention needs the same boundaries for queries and keys")
    setattr(packed_seq_params, _BOUNDS, (cu, bounds))
    return bounds


def per_conversation(call, query, key, value, bounds: list[int]):
    """``call(q, k, v)`` on each ``[start, end)`` of the packed ``[t, heads, dim]`` tensors as a
    causal ``[s, 1, heads, dim]`` sequence padded at its end to a multiple of ``PAD_TO``; the outputs
    of the real tokens joined back into ``[t, heads * dim]``."""
    import torch

    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        n = end - start
        if n == 0:
            continue
        pad = -n % PAD_TO
        # fresh tensors: a view into the fused QKV projection has a layout TE does not take
        q, k, v = (
            torch.cat([x[start:end], x.new_zeros(pad, *x.shape[1:])]) if pad else x[start:end].clone()
            for x in (query, key, value)
        )
        out = call(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))
        outs.append(out.reshape(n + pad, -1)[:n])
    return torch.cat(outs, dim=0)


def flash_varlen_takes(dtype) -> bool:
    """Whether the flash-attention kernel takes tensors of ``dtype`` (16-bit only); a packed call in
    another precision (an FP32 reference model) runs one conversation at a time instead."""
    import torch

    return dtype in (torch.bfloat16, torch.float16)


def flash_varlen(query, key, value, bounds: list[int], cu_seqlens, scale: float | None):
    """The packed ``[t, heads, dim]`` tensors (keys and values may have fewer heads) through one
    causal variable-length flash-attention call over the conversations ``cu_seqlens`` delimits
    (int32 on the GPU; ``bounds`` is its host copy); the output as ``[t, heads * dim]``."""
    import torch
    from torch.nn.attention.varlen import varlen_attn

    longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    cu = cu_seqlens.to(torch.int32)  # the tensor itself when it is int32 already
    out = varlen_attn(
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        cu,
        cu,
        longest,
        longest,
        scale=scale,
        window_size=(-1, 0),  # causal: each token sees its own conversation's earlier tokens
    )
    return out.reshape(out.shape[0], -1)


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


def installed() -> bool:
    return _state["original"] is not None


def install(cfg: Any) -> str:
    """Route THD calls of Megatron-Core's TE attention through ``cfg.features.packed_attention.mode``,
    refused on a GPU where the mode is not proven; idempotent, the mode set each call."""
    config = cfg.features.packed_attention
    if found := problems(config, _capability()):
        raise ValueError("; ".join(found))
    set_mode(config.mode)
    line = f"packed rows: attention runs {HOW[config.mode]} ({KEY}={config.mode})"
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
        how = mode()
        if not thd or how == "varlen":
            return original(
                self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params, num_splits
            )
        if attention_bias is not None or attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"{how} attention supports causal self-attention only, got {attn_mask_type}")
        if getattr(packed_seq_params, "cp_group", None) is not None or self.config.context_parallel_size > 1:
            raise ValueError(f"{how} attention does not support context parallelism")
        if how == "flash_varlen" and flash_varlen_takes(query.dtype):
            return flash_varlen(
                query,
                key,
                value,
                boundaries(packed_seq_params),
                packed_seq_params.cu_seqlens_q,
                self.softmax_scale,
            )
        return per_conversation(
            lambda q, k, v: original(self, q, k, v, None, AttnMaskType.causal, None, None, num_splits),
            query,
            key,
            value,
            boundaries(packed_seq_params),
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
    module=__name__,
)
