"""Gated DeltaNet kernels compiled and tuned before the first step.

flash-linear-attention compiles its Gated DeltaNet backward kernels (TileLang, on Hopper) and tunes
its Triton kernels at their first call, which falls in the first step's backward: the compile takes
seconds inside that step, and the first step's peak holds a second layer's backward set beside the
layer being differentiated. Run once at model build, forward and backward on two short sequences of
the model's Gated DeltaNet shape on this rank (its value heads and head widths), the first calls
happen before training. ``ENV`` in the environment (a recipe's ``env_vars`` or the process's)
switches it on; ``bridge_recipes.patches.gdn_warmup`` runs it from a pre-wrap hook.
"""

from __future__ import annotations

from typing import Any, NamedTuple

ENV = "BRIDGE_RECIPES_GDN_WARMUP"
SEQUENCE_TOKENS = 64  # one chunk of flash-linear-attention's chunked kernels per sequence


class Shape(NamedTuple):
    heads: int  # value heads on this rank (query and key heads are repeated to them)
    key_dim: int
    value_dim: int


def enabled(env_vars: dict | None, environ: dict | None = None) -> bool:
    from bridge_recipes.env_settings import switched_on

    return switched_on(ENV, env_vars, environ)


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
