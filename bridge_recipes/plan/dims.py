"""The plan's inputs: the model's dimensions from its Megatron-Core config, the parallel layout, and
the tokens of one micro batch on one rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.models.dims import ModelDims
from bridge_recipes.plan.layout import Layout, layout_of

BF16 = 2  # bytes per element
FP32 = 4


def _layer_patterns(m: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-layer (Gated DeltaNet = 1, MoE = 1) patterns, read the way Megatron-Core builds the
    layers from ``linear_attention_freq`` and ``moe_layer_freq``."""
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_linear_attention_pattern,
        get_moe_layer_pattern,
    )

    off = (0,) * m.num_layers
    gdn = tuple(get_linear_attention_pattern(m)) if m.experimental_attention_variant == "gated_delta_net" else off
    return gdn, tuple(get_moe_layer_pattern(m)) if m.num_moe_experts else off


def model_dims(m: Any) -> ModelDims:
    experts = m.num_moe_experts or 0
    layer_pattern, moe_pattern = _layer_patterns(m)
    return ModelDims(
        hidden=m.hidden_size,
        heads=m.num_attention_heads,
        query_groups=m.num_query_groups or m.num_attention_heads,
        head_dim=m.kv_channels or m.hidden_size // m.num_attention_heads,
        gdn_key_heads=getattr(m, "linear_num_key_heads", 0) or 0,
        gdn_value_heads=getattr(m, "linear_num_value_heads", 0) or 0,
        gdn_key_dim=getattr(m, "linear_key_head_dim", 0) or 0,
        gdn_value_dim=getattr(m, "linear_value_head_dim", 0) or 0,
        conv_kernel=getattr(m, "linear_conv_kernel_dim", 0) or 0,
        ffn=m.ffn_hidden_size or 0,
        experts=experts,
        topk=m.moe_router_topk or 0,
        moe_ffn=m.moe_ffn_hidden_size or 0,
        shared_ffn=m.moe_shared_expert_intermediate_size or 0,
        shared_gate=bool(getattr(m, "moe_shared_expert_gate", False)),
        output_gate=bool(getattr(m, "attention_output_gate", False)),
        qk_norm=bool(m.qk_layernorm),
        gated_linear_unit=bool(m.gated_linear_unit),
        fused_swiglu=bool(m.bias_activation_fusion),
        mtp_layers=m.mtp_num_layers or 0,
        vocab=m.vocab_size,
        vocab_multiple=getattr(m, "make_vocab_size_divisible_by", 1) or 1,
        tied_embeddings=bool(m.share_embeddings_and_output_weights),
        layer_pattern=layer_pattern,
        moe_pattern=moe_pattern,
        capacity_factor=getattr(m, "moe_expert_capacity_factor", None),
        pad_to_capacity=bool(getattr(m, "moe_pad_expert_input_to_capacity", False)),
    )


def parallel_layout(cfg: Any, world_size: int) -> Layout:
    """The layout the plan is made for; the world size must be divisible by TP x PP x CP."""
    lay = layout_of(cfg, world_size)
    if lay.dp is None:
        raise ValueError(f"world size {world_size} is not divisible by TP x PP x CP = {lay.model_parallel}")
    return lay


@dataclass(frozen=True)
class Tokens:
    """Tokens of one micro batch on one rank."""

    seq: int  # in head/feature-parallel regions (attention, GDN, MLP inside TP): seq / CP x micro batch
    resid: int  # in the residual stream: seq / CP, and / TP under sequence parallelism


def micro_batch_tokens(cfg: Any, par: Layout) -> Tokens:
    seq = cfg.model.seq_length // par.cp * cfg.train.micro_batch_size
    return Tokens(seq=seq, resid=seq // par.tp if par.sp else seq)
