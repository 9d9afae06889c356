"""Gated DeltaNet kernels compiled and tuned before the first step.

flash-linear-attention compiles its Gated DeltaNet backward kernels (TileLang, on Hopper) and tunes
its Triton kernels at their first call, which falls in the first step's backward: the compile takes
seconds inside that step, and the first step's peak holds a second layer's backward set beside the
layer being differentiated. Run once at model build, forward and backward on two short sequences of
the model's Gated DeltaNet shape on this rank (its value heads and head widths), the first calls
happen before training. ``features.gdn_warmup.enabled`` switches it on (:class:`Config`); :data:`PATCH`
runs it from a pre-wrap hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once

KEY = "features.gdn_warmup.enabled"
REPLACES_ENV = ("BRIDGE_RECIPES_GDN_WARMUP", KEY)  # the environment variable this key replaced
RULE = "megatron.core.ssm.gated_delta_net.gdn.chunk_gated_delta_rule"
SEQUENCE_TOKENS = 64  # one chunk of flash-linear-attention's chunked kernels per sequence


class Shape(NamedTuple):
    heads: int  # value heads on this rank (query and key heads are repeated to them)
    key_dim: int
    value_dim: int


@dataclass
class Config:
    """The Gated DeltaNet kernels compiled and tuned at model build (``enabled``)."""

    enabled: bool = False


def shape(config: Any) -> Shape | None:
    """The Gated DeltaNet shape a rank of a model of ``config`` computes (Megatron-Core splits the
    value heads over tensor and context parallel ranks), or None for a model without it."""
    heads = getattr(config, "linear_num_value_heads", None)
    if not heads:
        return None
    ranks = (getattr(config, "tensor_model_parallel_size", 1) or 1) * (
        getattr(config, "context_parallel_size", 1) or 1
    )
    return Shape(heads // ranks, config.linear_key_head_dim, config.linear_value_head_dim)


def warm(rule: Any, s: Shape, device: Any, dtype: Any = None) -> None:
    """Forward and backward of ``rule`` (Megatron-Core's chunked gated delta rule) on two packed
    sequences of :data:`SEQUENCE_TOKENS` tokens, its inputs as Megatron-Core prepares them: unit-norm
    queries and keys, BF16 values, FP32 log decays, sigmoid betas, int32 boundaries. Random numbers
    come from a generator of its own: the run's random state is untouched."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or torch.bfloat16
    tokens = 2 * SEQUENCE_TOKENS
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*dims: int, dt: Any = dtype) -> Any:
        return torch.randn(1, tokens, s.heads, *dims, generator=gen, device=device, dtype=dt)

    q, k = (F.normalize(rand(s.key_dim, dt=torch.float32), dim=-1).to(dtype).requires_grad_() for _ in range(2))
    v = rand(s.value_dim).requires_grad_()
    g = F.logsigmoid(rand(dt=torch.float32)).requires_grad_()
    beta = rand().sigmoid().requires_grad_()
    cu = torch.tensor([0, SEQUENCE_TOKENS, tokens], dtype=torch.int32, device=device)
    out, _ = rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=cu,
    )
    out.float().sum().backward()


def wanted(cfg: Any, **run: Any) -> bool:
    """``features.gdn_warmup.enabled``, for a model with Gated DeltaNet."""
    return cfg.features.gdn_warmup.enabled and shape(cfg.model) is not None


def pre_wrap_hook(chunks: list) -> list:
    """Megatron-Bridge pre-wrap hook: warm the rule Megatron-Core's Gated DeltaNet layers call, at the
    first chunk's shape, on this rank's GPU."""
    import torch

    from bridge_recipes.patches.contract import resolve

    s = shape(chunks[0].config)
    if s is not None:
        warm(resolve(RULE), s, torch.device("cuda", torch.cuda.current_device()))
    return chunks


def install(cfg: Any) -> str:
    """Register :func:`pre_wrap_hook` on ``cfg.model`` (once)."""
    check(PATCH)
    register_pre_wrap_hook_once(cfg, pre_wrap_hook)
    s = shape(cfg.model)
    if s is None:  # not wanted: a model without Gated DeltaNet layers
        return "Gated DeltaNet: no layers to warm"
    return (
        f"Gated DeltaNet: kernels compiled and tuned at model build ({s.heads} heads of {s.key_dim} x "
        f"{s.value_dim}; {KEY}=true)"
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
    module=__name__,
)
