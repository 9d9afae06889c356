"""Parameter counts of a Qwen3.5 spec: total, active per token, and the matmul count N.

Counted module by module from the layer structure Megatron-Core builds for Qwen3.5 (and
that the HF checkpoint stores):

- gated attention: Q and its output gate (2 x heads x head_dim), K and V (query groups x
  head_dim each), output projection, Q/K RMSNorm (head_dim each);
- Gated DeltaNet: fused in-projection to Q, K (key heads x key dim), V and the output gate Z
  (value heads x value dim), the beta/alpha projection (value heads each), a depthwise causal
  conv over Q, K, V (kernel 4, no bias), A_log and dt_bias (value heads each), a gated RMSNorm
  over value head dim, output projection;
- MLP: SwiGLU (3 x hidden x ffn); MoE adds a router (hidden x experts), routed experts, a
  shared expert and its sigmoid gate (hidden x 1);
- two RMSNorms per layer, a final norm, untied input embedding and LM head;
- MTP (one layer): two RMSNorms on the embedding and hidden state, a 2h -> h projection, one
  attention + MLP layer, a final norm (the MTP layer shares the embedding and LM head).

``matmul_active`` is the N in "6 x N FLOPs per token" as OpenRecipes counts it for MFU: the
weight matrices a token multiplies (attention and GDN projections, conv, router, active
experts, shared expert and its gate, LM head), without the input embedding (a lookup), 1-D
vectors (norms, A_log, dt_bias) and the MTP head. It reproduces their published N exactly:
2,946,252,800 for 35B-A3B and 25,623,920,640 for 27B.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_recipes.models.qwen35 import Qwen35Spec, VisionSpec


@dataclass(frozen=True)
class LayerParams:
    matrices: int  # weight matrices (and the conv kernel)
    vectors: int  # norms and other 1-D parameters


@dataclass(frozen=True)
class ParameterCount:
    embedding: int
    output_layer: int
    decoder_total: int
    decoder_active: int
    decoder_matmul_active: int
    mtp_total: int
    mtp_active: int
    vision: int

    @property
    def total(self) -> int:
        """Every parameter of the checkpoint (MTP and vision tower included)."""
        return self.embedding + self.output_layer + self.decoder_total + self.mtp_total + self.vision

    @property
    def active(self) -> int:
        """Parameters a token touches: all but the routed experts it is not sent to."""
        return self.embedding + self.output_layer + self.decoder_active + self.mtp_active + self.vision

    @property
    def matmul_active(self) -> int:
        """OpenRecipes' N for MFU (see the module docstring)."""
        return self.decoder_matmul_active + self.output_layer


def attention_params(s: Qwen35Spec) -> LayerParams:
    q_gate = s.hidden_size * s.num_attention_heads * s.head_dim * 2
    kv = 2 * s.hidden_size * s.num_query_groups * s.head_dim
    out = s.num_attention_heads * s.head_dim * s.hidden_size
    return LayerParams(q_gate + kv + out, 2 * s.head_dim)


def gdn_params(s: Qwen35Spec) -> LayerParams:
    key_dim = s.linear_num_key_heads * s.linear_key_head_dim
    value_dim = s.linear_num_value_heads * s.linear_value_head_dim
    in_qkvz = s.hidden_size * (2 * key_dim + 2 * value_dim)
    in_ba = s.hidden_size * 2 * s.linear_num_value_heads
    conv = (2 * key_dim + value_dim) * s.linear_conv_kernel_dim
    out = value_dim * s.hidden_size
    vectors = 2 * s.linear_num_value_heads + s.linear_value_head_dim  # A_log, dt_bias, gated norm
    return LayerParams(in_qkvz + in_ba + conv + out, vectors)


def mlp_params(s: Qwen35Spec, active: bool) -> int:
    if not s.is_moe:
        return 3 * s.hidden_size * s.ffn_hidden_size
    expert = 3 * s.hidden_size * s.moe_ffn_hidden_size
    experts = (s.moe_router_topk if active else s.num_experts) * expert
    router = s.hidden_size * s.num_experts
    shared = 3 * s.hidden_size * s.moe_shared_expert_ffn_hidden_size + s.hidden_size  # + sigmoid gate
    return router + experts + shared


def vision_params(v: VisionSpec, out_hidden: int) -> int:
    """Vision tower: Conv3d patch embed, learned position table, pre-LN ViT blocks with biases,
    and the 2x2 patch merger (LayerNorm, two linears) projecting to the LM hidden size."""
    h, f = v.hidden_size, v.intermediate_size
    patch = v.in_channels * v.temporal_patch_size * v.patch_size**2 * h + h
    pos = v.num_position_embeddings * h
    block = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    merged = h * v.spatial_merge_size**2
    merger = 2 * h + (merged * merged + merged) + (merged * out_hidden + out_hidden)
    return patch + pos + v.depth * block + merger


def count_parameters(s: Qwen35Spec) -> ParameterCount:
    attn, gdn = attention_params(s), gdn_params(s)
    layer_norms = 2 * s.hidden_size
    mixers_m = s.num_attention_layers * attn.matrices + s.num_gdn_layers * gdn.matrices
    mixers_v = s.num_attention_layers * attn.vectors + s.num_gdn_layers * gdn.vectors
    vectors = mixers_v + s.num_layers * layer_norms + s.hidden_size  # + final norm
    mlp_total, mlp_active = mlp_params(s, active=False), mlp_params(s, active=True)
    mtp_base = 3 * s.hidden_size + 2 * s.hidden_size * s.hidden_size + attn.matrices + attn.vectors + layer_norms
    return ParameterCount(
        embedding=s.vocab_size * s.hidden_size,
        output_layer=s.vocab_size * s.hidden_size,
        decoder_total=mixers_m + s.num_layers * mlp_total + vectors,
        decoder_active=mixers_m + s.num_layers * mlp_active + vectors,
        decoder_matmul_active=mixers_m + s.num_layers * mlp_active,
        mtp_total=s.mtp_num_layers * (mtp_base + mlp_total),
        mtp_active=s.mtp_num_layers * (mtp_base + mlp_active),
        vision=vision_params(s.vision, s.hidden_size) if s.is_vl else 0,
    )
