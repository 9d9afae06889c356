"""Attention over packed rows: one variable-length call, or one conversation at a time.

A packed (THD) row reaches Transformer Engine's attention with ``cu_seqlens``; TE then runs its
variable-length kernel, whose cuDNN backward is wrong at the family's head dim of 256. This module
adds two ways for the same call:

- ``flash_varlen`` (the default on the GPUs of ``FLASH_VARLEN_GPUS``): the whole row in one call of
  PyTorch's bundled flash-attention variable-length kernel (``torch.nn.attention.varlen``), causal
  within each conversation: one launch per layer pass and no host loop, which is what a host-bound
  LoRA step needs.
- ``per_conversation`` (the default on other GPUs, and the fallback): the row is cut at its
  boundaries and each conversation goes through TE's dense (``sbhd``) attention on its own, the kernel
  a conversation takes when it is the only one in its row. Each conversation is padded at its end to a
  multiple of ``PAD_TO`` tokens before the call: under the causal mask its own tokens never see the
  padding, and the kernels meet a few dozen sequence lengths instead of one per conversation length.

``varlen`` leaves the call to TE's own THD kernel, so the three can be compared in one process. Each
conversation's output is the one it would have alone, forward and backward, with one small host read
of the boundaries per micro batch. ``ENV`` in the environment (a recipe's ``env_vars`` or the
process's) picks the mode at launch, else :func:`default_for` the GPU;
``bridge_recipes.patches.packed_attention`` patches Megatron-Core's ``TEDotProductAttention.forward``
once per process, and calls without packed-sequence parameters go through the original forward.
"""

from __future__ import annotations

from typing import Any

MODES = ("per_conversation", "flash_varlen", "varlen")
DEFAULT_MODE = "flash_varlen"
FALLBACK_MODE = "per_conversation"
# The compute capabilities whose flash-attention kernels the FP32 gradient-parity test has passed:
# FA2's head-dim-256 backward is built for sm80 (A100), and Hopper (sm90: H100, H200) runs the same
# kernels. Other GPUs keep the per-conversation loop until the test has run on them.
FLASH_VARLEN_GPUS = ((8, 0), (9, 0))
ENV = "BRIDGE_RECIPES_PACKED_ATTENTION"
PAD_TO = 128
_state: dict[str, Any] = {"mode": DEFAULT_MODE}


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"packed attention mode {mode!r} is not one of {', '.join(MODES)}")
    _state["mode"] = mode


def mode() -> str:
    return _state["mode"]


def default_for(capability: tuple[int, int] | None) -> str:
    """The mode of a run whose environment names none: ``DEFAULT_MODE`` on a GPU of
    ``FLASH_VARLEN_GPUS`` (or where no GPU is known, as in a dry run), ``FALLBACK_MODE`` on another."""
    if capability is None or tuple(capability) in FLASH_VARLEN_GPUS:
        return DEFAULT_MODE
    return FALLBACK_MODE


def default_rule() -> str:
    """:func:`default_for` in words, for the messages that name it."""
    gpus = ", ".join(f"{major}.{minor}" for major, minor in FLASH_VARLEN_GPUS)
    return f"{DEFAULT_MODE} is the default on compute capabilities {gpus}, {FALLBACK_MODE} on others"


def mode_from(env_vars: dict | None, environ: dict | None = None, capability: tuple[int, int] | None = None) -> str:
    """The mode the environment asks for: the process's ``ENV`` over the recipe's ``env_vars``,
    :func:`default_for` the GPU's compute capability when neither sets it (not checked: see
    :func:`problems`)."""
    from bridge_recipes.env_settings import setting

    return setting(ENV, env_vars, environ) or default_for(capability)


def problems(env_vars: dict | None, environ: dict | None = None) -> list[str]:
    """Why the environment's packed-attention mode cannot run, with the fix."""
    value = mode_from(env_vars, environ)
    if value in MODES:
        return []
    from bridge_recipes.env_settings import env_advice

    return [
        f"env_vars.{ENV}={value!r} is not a packed-attention mode; set {env_advice(ENV, 'MODE', environ)}, "
        f"MODE one of {', '.join(MODES)} ({default_rule()})"
    ]


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
