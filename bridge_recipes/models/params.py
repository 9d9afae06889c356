"""Parameter counts of the Qwen3.5 architecture: one definition per module, used by the catalog's
counts (total, active per token, the matmul count N) and by the memory plan's per-rank counts
(``bridge_recipes.plan.params``), which splits each module by tensor and expert parallelism.

Counted module by module from the layer structure Megatron-Core builds for Qwen3.5 (and
that the HF checkpoint stores), on :class:`~bridge_recipes.models.dims.ModelDims`:

- gated attention: Q and its output gate (2 x heads x head_dim), K and V (query groups x
  head_dim each), output projection, Q/K RMSNorm (head_dim each);
- Gated DeltaNet: fused in-projection to Q, K (key heads x key dim), V and the output gate Z
  (value heads x value dim), the beta/alpha projection (value heads each), a depthwise causal
  conv over Q, K, V (kernel 4, no bias), A_log and dt_bias (value heads each), a gated RMSNorm
  over value head dim, output projection;
- MLP: SwiGLU (3 x hidden x ffn); MoE adds a router (hidden x experts), routed experts, a
  shared expert and its sigmoid gate (hidden x 1);
- two RMSNorms per layer (each counted with the mixer or MLP it feeds), a final norm, untied
  input embedding and LM head;
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
from math import ceil

from bridge_recipes.models.dims import ModelDims, spec_dims
from bridge_recipes.models.qwen35 import Qwen35Spec, VisionSpec


@dataclass(frozen=True)
class ModuleParams:
    """One module's parameters, by how model parallelism splits them."""

    split: int = 0  # split by TP: weight matrices, the GDN conv kernel, its per-head A_log and dt_bias
    replicated: int = 0  # whole on every TP rank: norms, the MoE router and the shared expert's gate
    expert: int = 0  # one routed expert's matrices (EP spreads the experts, ETP splits each one)
    experts: int = 0  # routed experts
    vectors: int = 0  # how many of split + replicated are 1-D (norms, A_log, dt_bias): no matmul

    def total(self, routed: int | None = None) -> int:
        """Every parameter, or those a token touches when it is sent to ``routed`` experts."""
        return self.split + self.replicated + (self.experts if routed is None else routed) * self.expert

    def matrices(self, routed: int | None = None) -> int:
        """The weights a token multiplies (:meth:`total` less the 1-D parameters)."""
        return self.total(routed) - self.vectors


def attention_projections(d: ModelDims) -> int:
    """Q (and its output gate), K, V and the output projection of a gated-attention layer."""
    return d.hidden * (d.q_dim * (2 if d.output_gate else 1) + 2 * d.kv_dim) + d.q_dim * d.hidden


def gdn_projections(d: ModelDims) -> int:
    """A Gated DeltaNet layer's in_proj (Q, K, V, Z, beta, alpha) and out_proj."""
    return d.hidden * (2 * d.gdn_qk + 2 * d.gdn_v + 2 * d.gdn_value_heads) + d.gdn_v * d.hidden


def gdn_conv(d: ModelDims) -> int:
    """The depthwise causal conv kernel over the Q, K, V channels (no bias)."""
    return (2 * d.gdn_qk + d.gdn_v) * d.conv_kernel


def mlp_matrices(d: ModelDims, ffn: int) -> int:
    """fc1 (two halves under SwiGLU) and fc2 of an MLP of width ``ffn``."""
    return d.hidden * ffn * (2 if d.gated_linear_unit else 1) + ffn * d.hidden


def attention_params(d: ModelDims) -> ModuleParams:
    """A gated-attention mixer and the input norm fused into its QKV projection."""
    norms = d.hidden + (2 * d.head_dim if d.qk_norm else 0)  # fused input norm, Q/K norms
    return ModuleParams(split=attention_projections(d), replicated=norms, vectors=norms)


def gdn_params(d: ModelDims) -> ModuleParams:
    """A Gated DeltaNet mixer and the input norm fused into its in_proj."""
    per_head = 2 * d.gdn_value_heads  # A_log, dt_bias
    norms = d.hidden + d.gdn_value_dim  # fused input norm, gated output norm
    split = gdn_projections(d) + gdn_conv(d) + per_head
    return ModuleParams(split=split, replicated=norms, vectors=per_head + norms)


def dense_mlp_params(d: ModelDims) -> ModuleParams:
    """A dense MLP and the pre-MLP norm fused into fc1."""
    return ModuleParams(split=mlp_matrices(d, d.ffn), replicated=d.hidden, vectors=d.hidden)


def moe_params(d: ModelDims) -> ModuleParams:
    """A MoE block: pre-MLP norm, router, routed experts, shared expert and its sigmoid gate."""
    replicated = d.hidden + d.hidden * d.experts + (d.hidden if d.shared_gate else 0)  # norm, router, gate
    return ModuleParams(
        split=mlp_matrices(d, d.shared_ffn),
        replicated=replicated,
        expert=mlp_matrices(d, d.moe_ffn),
        experts=d.experts,
        vectors=d.hidden,
    )


def mixer_params(d: ModelDims, index: int) -> ModuleParams:
    return gdn_params(d) if d.layer_pattern[index] else attention_params(d)


def mlp_params(d: ModelDims, index: int) -> ModuleParams:
    return moe_params(d) if d.moe_pattern[index] else dense_mlp_params(d)


def padded_vocab(d: ModelDims, tp: int = 1) -> int:
    """The vocabulary padded to a multiple of ``make_vocab_size_divisible_by`` x TP."""
    multiple = d.vocab_multiple * tp
    return ceil(d.vocab / multiple) * multiple


def embedding_params(d: ModelDims, tp: int = 1) -> ModuleParams:
    return ModuleParams(split=padded_vocab(d, tp) * d.hidden)


def output_params(d: ModelDims, tp: int = 1, tied: bool = False) -> ModuleParams:
    """The final norm and the output layer (none of its own when ``tied`` to the embedding)."""
    return ModuleParams(split=0 if tied else padded_vocab(d, tp) * d.hidden, replicated=d.hidden, vectors=d.hidden)


def mtp_own_params(d: ModelDims) -> ModuleParams:
    """What an MTP layer adds to its attention layer and MLP: two input norms, the 2h -> h
    projection and a final norm (the embedding and output layer are shared)."""
    return ModuleParams(split=2 * d.hidden * d.hidden, replicated=3 * d.hidden, vectors=3 * d.hidden)


def mtp_layer_params(d: ModelDims) -> tuple[ModuleParams, ...]:
    """One MTP layer's modules: its own, an attention layer and the model's MLP kind."""
    return mtp_own_params(d), attention_params(d), moe_params(d) if d.experts else dense_mlp_params(d)


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
    """The parameters of a catalog model (its vision tower too, for a VL one)."""
    return count_dims(spec_dims(s), vision_params(s.vision, s.hidden_size) if s.is_vl else 0)


def count_dims(d: ModelDims, vision: int = 0) -> ParameterCount:
    """The parameters of a model of dimensions ``d`` (a recipe's ``cfg.model`` through
    :func:`bridge_recipes.plan.dims.model_dims`), with ``vision`` those of its vision tower."""
    layers = [m for i in range(len(d.layer_pattern)) for m in (mixer_params(d, i), mlp_params(d, i))]
    mtp = mtp_layer_params(d)
    output = output_params(d)
    return ParameterCount(
        embedding=embedding_params(d).split,
        output_layer=output.split,
        decoder_total=sum(m.total() for m in layers) + output.replicated,  # + final norm
        decoder_active=sum(m.total(d.topk) for m in layers) + output.replicated,
        decoder_matmul_active=sum(m.matrices(d.topk) for m in layers),
        mtp_total=d.mtp_layers * sum(m.total() for m in mtp),
        mtp_active=d.mtp_layers * sum(m.total(d.topk) for m in mtp),
        vision=vision,
    )
