"""The dimensions a parameter count reads: :class:`ModelDims`, one form for the catalog's specs and for
a recipe's Megatron-Core model config (``bridge_recipes.plan.dims.model_dims`` builds it from the latter).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_recipes.models.qwen35 import Qwen35Spec


@dataclass(frozen=True)
class ModelDims:
    """The Megatron-Core model fields that parameter counts and the memory plan read."""

    hidden: int
    heads: int
    query_groups: int
    head_dim: int
    gdn_key_heads: int
    gdn_value_heads: int
    gdn_key_dim: int
    gdn_value_dim: int
    conv_kernel: int
    ffn: int
    experts: int
    topk: int
    moe_ffn: int
    shared_ffn: int
    shared_gate: bool
    output_gate: bool
    qk_norm: bool
    gated_linear_unit: bool
    fused_swiglu: bool
    mtp_layers: int
    vocab: int
    vocab_multiple: int
    tied_embeddings: bool
    layer_pattern: tuple[int, ...]  # 1 = Gated DeltaNet, 0 = gated attention
    moe_pattern: tuple[int, ...]  # 1 = MoE, 0 = dense MLP
    capacity_factor: float | None
    pad_to_capacity: bool

    @property
    def gdn_qk(self) -> int:
        return self.gdn_key_heads * self.gdn_key_dim

    @property
    def gdn_v(self) -> int:
        return self.gdn_value_heads * self.gdn_value_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.query_groups * self.head_dim

    def layer_kinds(self, index: int) -> tuple[bool, bool]:
        """(Gated DeltaNet, MoE) of decoder layer ``index``."""
        return bool(self.layer_pattern[index]), bool(self.moe_pattern[index])


def spec_dims(s: Qwen35Spec) -> ModelDims:
    """A catalog spec's dimensions: the checkpoint's own (vocabulary not padded, SwiGLU, gated
    attention with Q/K norms, a gated shared expert on the MoE sizes, untied embeddings)."""
    experts = s.num_experts or 0
    return ModelDims(
        hidden=s.hidden_size,
        heads=s.num_attention_heads,
        query_groups=s.num_query_groups,
        head_dim=s.head_dim,
        gdn_key_heads=s.linear_num_key_heads,
        gdn_value_heads=s.linear_num_value_heads,
        gdn_key_dim=s.linear_key_head_dim,
        gdn_value_dim=s.linear_value_head_dim,
        conv_kernel=s.linear_conv_kernel_dim,
        ffn=s.ffn_hidden_size or 0,
        experts=experts,
        topk=s.moe_router_topk or 0,
        moe_ffn=s.moe_ffn_hidden_size or 0,
        shared_ffn=s.moe_shared_expert_ffn_hidden_size or 0,
        shared_gate=s.is_moe,
        output_gate=True,
        qk_norm=True,
        gated_linear_unit=True,
        fused_swiglu=False,
        mtp_layers=s.mtp_num_layers,
        vocab=s.vocab_size,
        vocab_multiple=1,
        tied_embeddings=False,
        layer_pattern=tuple(s.layer_pattern),
        moe_pattern=(1 if s.is_moe else 0,) * s.num_layers,
        capacity_factor=None,
        pad_to_capacity=False,
    )
