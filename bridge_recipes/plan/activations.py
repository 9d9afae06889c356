"""Activations each decoder layer, the MTP block and the output layer keep for the backward, per micro
batch on one rank, and what recompute (full, block, selective) keeps of them. Element counts are BF16
elements; FP32 tensors count twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.models.dims import ModelDims
from bridge_recipes.models.flops import FLA_CHUNK_SIZE
from bridge_recipes.plan.dims import BF16, Tokens
from bridge_recipes.plan.layout import Layout


def gdn_activation_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """Gated DeltaNet mixer (megatron/core/ssm/gated_delta_net, FLA chunk kernel). Inside the
    mixer features are split by TP; CP's all-to-all trades sequence for heads, so a rank holds
    seq/CP tokens' worth of features / TP."""
    local = tok.seq / par.tp
    qk_heads = max(d.gdn_value_heads, d.gdn_key_heads)  # q, k repeated to the value heads
    terms = (
        2 * d.gdn_qk + 2 * d.gdn_v + 2 * d.gdn_value_heads,  # in_proj output, kept by the conv's saved input view
        2 * d.gdn_qk,  # L2-normalised q, k (l2norm output)
        2 * qk_heads * d.gdn_key_dim,  # q, k as the chunk kernel saves them
        2 * d.gdn_v,  # v and the output gate z, made contiguous
        FLA_CHUNK_SIZE * d.gdn_value_heads,  # chunk-local WY matrix A [tokens, value heads, chunk] (BF16)
        3 * d.gdn_value_heads,  # decay g (FP32 cumsum) and beta
        2 * d.gdn_v,  # kernel output (gated norm input) and gated-norm output (out_proj input)
    )
    return d.hidden * tok.resid + sum(terms) * local  # + norm output saved by the fused norm+in_proj


def gdn_backward_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """What one Gated DeltaNet layer's backward allocates (FLA's ``chunk_gated_delta_rule_bwd`` and the
    layer around it): the chunk states recomputed and their gradient (h, dh: per chunk, value heads x
    key dim x value dim), seven tensors of the key width (q, k as the kernel takes them, w recomputed,
    dq, dk twice, dw) and seven of the value width (v, u recomputed, the new values, dv three times, the
    gated norm's gradient), the chunk-local WY matrix, and six hidden-state tensors (the layer's input,
    its two residual outputs and three input gradients)."""
    local = tok.seq / par.tp
    qk_heads = max(d.gdn_value_heads, d.gdn_key_heads)
    states = 2 * d.gdn_v * d.gdn_key_dim / FLA_CHUNK_SIZE
    widths = 7 * qk_heads * d.gdn_key_dim + 7 * d.gdn_v
    return (states + widths + FLA_CHUNK_SIZE * d.gdn_value_heads) * local + 6 * d.hidden * tok.resid


def attention_activation_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """Gated attention with flash / cuDNN fused attention: no s x s matrix is saved."""
    local = tok.seq / par.tp
    gate = d.q_dim if d.output_gate else 0
    terms = (
        d.q_dim + gate + 2 * d.kv_dim,  # QKV(+gate) output, kept by its views (Q/K norm inputs, v, gate)
        d.q_dim + d.kv_dim,  # q, k after QK norm and RoPE (attention inputs)
        d.kv_dim,  # v made contiguous for the kernel
        d.q_dim,  # attention output
        2 * d.heads,  # softmax log-sum-exp, FP32
        gate,  # gated output (linear_proj input)
    )
    return d.hidden * tok.resid + sum(terms) * local  # + norm output (fused norm+QKV)


def glu_activation_elems(d: ModelDims, ffn: int) -> int:
    """SwiGLU as Megatron runs it without bias_activation_fusion: fc1 output (2f), silu output
    (f), the linear half plus the GLU offset (a new tensor, f), their product (f)."""
    if not d.gated_linear_unit:
        return 2 * ffn
    return 3 * ffn if d.fused_swiglu else 5 * ffn


def dense_mlp_activation_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    return d.hidden * tok.resid + glu_activation_elems(d, d.ffn) * tok.seq / par.tp  # + fused norm output


def routed_tokens(d: ModelDims, tok: Tokens) -> float:
    """Token copies a rank sends to its experts: top-k per token (capacity = tokens x top-k
    without a capacity factor; padded to the capacity factor when padding is on)."""
    pad = d.capacity_factor if d.capacity_factor and d.pad_to_capacity else 1.0
    return tok.resid * d.topk * pad


def routed_activation_elems(d: ModelDims, par: Layout, routed: float) -> float:
    """What a MoE layer keeps for ``routed`` token copies received by its rank's experts: the part of its
    saved activations that grows with the tokens routing sends there."""
    act = glu_activation_elems(d, d.moe_ffn) + (1 if not d.fused_swiglu else 0) * d.moe_ffn  # x probs -> BF16 copy
    return (
        d.hidden * routed * par.expert_tp  # dispatched tokens (fc1 input; ETP all-gathers them)
        + 2 * routed  # permuted routing probs, FP32
        + act * routed  # expert fc1 output and SwiGLU intermediates (ETP splits features, not copies)
    )


def moe_activation_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """MoE block (alltoall dispatcher, TE grouped GEMM, shared expert with sigmoid gate).
    Balanced routing: every expert-parallel rank receives as many token copies as it sends."""
    terms = (
        d.hidden * tok.resid,  # pre-MLP norm output (router and shared-expert input)
        2 * d.hidden * tok.resid,  # router input cast to FP32
        2 * 3 * d.experts * tok.resid,  # FP32 [tokens, experts]: scores, routing probs, aux-loss scores
        routed_activation_elems(d, par, routed_tokens(d, tok)),
    )
    shared = 0.0
    if d.shared_ffn:
        shared = glu_activation_elems(d, d.shared_ffn) * tok.seq / par.tp + d.hidden * tok.resid  # + gated output
    return sum(terms) + shared


def layer_activation_bytes(
    d: ModelDims, par: Layout, tok: Tokens, index: int, selective: frozenset[str] = frozenset()
) -> float:
    """Everything one decoder layer keeps for its backward: its input, the residual after the
    mixer, the mixer's and the MLP's saved tensors, less what the ``selective`` recompute
    modules discard."""
    gdn, moe = d.layer_kinds(index)
    residuals = 2 * d.hidden * tok.resid
    mixer = (gdn_activation_elems if gdn else attention_activation_elems)(d, par, tok)
    mlp = (moe_activation_elems if moe else dense_mlp_activation_elems)(d, par, tok)
    return BF16 * (residuals + mixer + mlp - selective_saving_elems(d, par, tok, gdn, moe, selective))


# Selective recompute: Megatron-Core 0.19.2's ``recompute_modules`` (TransformerConfig and the
# modules that read it). "moe_act", "layernorm" and "gdn_norm_out" discard their output after the
# forward and rebuild it before the backward; "core_attn", "mlp", "moe" and "shared_experts" are
# checkpointed (their inputs and outputs stay, what is inside goes).
SELECTIVE_MODULES = frozenset({"core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts", "gdn_norm_out"})


def selective_saving_elems(
    d: ModelDims, par: Layout, tok: Tokens, gdn: bool, moe: bool, modules: frozenset[str]
) -> float:
    """BF16 elements a layer stops keeping under selective recompute of ``modules``, term by
    term against the ``*_activation_elems`` functions above."""
    if not modules:
        return 0.0
    local = tok.seq / par.tp
    save = 0.0
    if gdn and "gdn_norm_out" in modules:
        save += d.gdn_v * local  # the gated norm's output (out_proj input)
    if not gdn and "core_attn" in modules:
        save += 2 * d.heads * local  # the kernel's FP32 softmax statistics; q, k, v and its output stay
    if not moe:
        # The dense MLP's norm is fused into fc1 (its input_layernorm / pre_mlp_layernorm are
        # IdentityOp), so "layernorm" finds nothing to discard; "mlp" keeps only the residual input.
        return save + (dense_mlp_activation_elems(d, par, tok) if "mlp" in modules else 0.0)
    norm_out = d.hidden * tok.resid  # the MoE layer's separate pre-MLP norm output (its input)
    if "layernorm" in modules:
        save += norm_out
    if "moe" in modules:  # the whole block checkpointed: its input (the norm output) stays
        return save + moe_activation_elems(d, par, tok) - norm_out
    if "moe_act" in modules:  # the fused SwiGLU keeps its input (fc1 output), its output goes
        act = glu_activation_elems(d, d.moe_ffn) + (0 if d.fused_swiglu else d.moe_ffn)
        save += (act - (2 if d.gated_linear_unit else 1) * d.moe_ffn) * routed_tokens(d, tok)
    if "shared_experts" in modules and d.shared_ffn:
        save += glu_activation_elems(d, d.shared_ffn) * local
    return save


def selective_modules(m: Any) -> frozenset[str]:
    """The recompute modules of a selective policy (empty for none or full recompute)."""
    if m.recompute_granularity != "selective":
        return frozenset()
    return frozenset(m.recompute_modules if m.recompute_modules is not None else ["core_attn"])


def layer_input_bytes(d: ModelDims, tok: Tokens) -> float:
    """What a checkpointed chunk keeps: its input hidden states."""
    return BF16 * d.hidden * tok.resid


def dispatch_buffer_bytes(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """Working copies of the dispatched tokens while one MoE layer runs (permute output,
    all-to-all output / its gradient): two [tokens x top-k, hidden] buffers."""
    return BF16 * 2 * d.hidden * routed_tokens(d, tok) * par.expert_tp if d.experts else 0.0


def mtp_activation_bytes(
    d: ModelDims, par: Layout, tok: Tokens, recomputed: bool, selective: frozenset[str] = frozenset()
) -> float:
    """MTP layer: embedding of the shifted tokens, the concatenated normed pair (eh_proj
    input, 2h), an attention layer with the model's MLP (selective recompute applies to it as
    to the decoder's layers), its final norm input."""
    if recomputed:
        return BF16 * 2 * d.hidden * tok.resid  # checkpoint inputs: hidden states and embedding
    moe = bool(d.experts)
    residuals = 2 * d.hidden * tok.resid
    mlp = moe_activation_elems(d, par, tok) if moe else dense_mlp_activation_elems(d, par, tok)
    layer = residuals + attention_activation_elems(d, par, tok) + mlp
    layer -= selective_saving_elems(d, par, tok, False, moe, selective)
    return BF16 * (layer + 4 * d.hidden * tok.resid)


def head_activation_bytes(d: ModelDims, tok: Tokens) -> float:
    """Last stage: the final norm's input and the output layer's input (the LM hidden states
    concatenated with one per MTP layer)."""
    return BF16 * d.hidden * tok.resid * (2 + d.mtp_layers)


@dataclass(frozen=True)
class ChunkActivations:
    saved: float  # bytes kept per micro batch
    rebuilt: float  # bytes a backward rebuild adds on top of ``saved`` at its worst


def recompute_groups(m: Any, chunk: list[int]) -> list[list[int]]:
    """The layers of a model chunk that full recompute checkpoints, in the groups its backward rebuilds
    at once: block recompute of n, the chunk's first n one by one; uniform recompute of n, every layer in
    groups of n; none under selective recompute or no recompute."""
    if m.recompute_granularity != "full" or selective_modules(m):
        return []
    n = m.recompute_num_layers or 0
    if m.recompute_method == "block":
        return [[i] for i in chunk[:n]]
    size = max(n, 1)
    return [chunk[g : g + size] for g in range(0, len(chunk), size)]


def chunk_activations(d: ModelDims, par: Layout, tok: Tokens, m: Any, layers: list[int]) -> ChunkActivations:
    """Saved activations of one model chunk under its recompute policy (:func:`recompute_groups`).
    Uniform recompute of n checkpoints groups of n layers and rebuilds a whole group at once. Block
    recompute of n checkpoints the chunk's first n layers one by one; the backward reaches them after
    the layers behind them have released their activations, so a rebuild only adds what it exceeds
    those by."""
    full = [layer_activation_bytes(d, par, tok, i) for i in layers]
    modules = selective_modules(m)
    if modules and layers:  # each layer keeps less; its backward rebuilds what it discarded
        kept = [layer_activation_bytes(d, par, tok, i, modules) for i in layers]
        return ChunkActivations(saved=sum(kept), rebuilt=max(f - k for f, k in zip(full, kept)))
    groups = recompute_groups(m, layers)
    if not groups:  # none
        return ChunkActivations(saved=sum(full), rebuilt=0.0)
    if m.recompute_method == "block":
        k = len(groups)
        rebuilt = max(max(full[:k], default=0.0) - sum(full[k:]), 0.0)
        return ChunkActivations(saved=k * layer_input_bytes(d, tok) + sum(full[k:]), rebuilt=rebuilt)
    by_layer = dict(zip(layers, full))
    rebuilt = max(sum(by_layer[i] for i in g) for g in groups)
    return ChunkActivations(saved=len(groups) * layer_input_bytes(d, tok), rebuilt=rebuilt)


def mtp_recomputed(m: Any) -> bool:
    """Megatron-Core checkpoints MTP layers under uniform full recompute only."""
    return m.recompute_granularity == "full" and m.recompute_method == "uniform"
