"""Per-GPU memory of a recipe, predicted before launch.

Units: GB = 1e9 bytes, the unit Megatron-Bridge logs (``mem-max-allocated-gigabytes`` is
torch's byte count / 1.0e9, ``megatron/bridge/training/utils/train_utils.py``).

For every pipeline stage the plan takes the rank that holds the most (balanced expert
routing assumed) and adds, at its peak moment:

- weights: BF16, 2 bytes per local parameter. The stage holds its decoder layers, the
  embedding on the first stage, the final norm, output layer and MTP block on the last.
  Attention / GDN / dense-MLP / shared-expert matrices and the vocabulary are divided by TP,
  norms and the MoE router are replicated, routed experts are divided by EP and then ETP.
- main gradients: Megatron's DDP grad buffer covers every local parameter: 4 bytes when
  ``grad_reduce_in_fp32`` (the ``bf16_mixed`` preset sets it and overrides ``ddp``), else 2.
- optimizer state (Adam): master copy + exp_avg + exp_avg_sq. The distributed optimizer
  shards dense parameters over DP x CP and expert parameters over the expert-data-parallel
  group world / (PP x EP x ETP). The master copy is 4 bytes (FP32), except when Transformer
  Engine's FusedAdam owns it (precision-aware optimizer with ``main_params_dtype`` BF16, no
  FP8 recipe, or CPU offload: ``OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8``):
  with FP32 ``main_params_dtype`` and ``store_param_remainders`` TE keeps only a 16-bit
  remainder, the other 16 bits being the BF16 weight already counted above (2 bytes here,
  4 together); with BF16 main params the master is a 2-byte copy. NOTE: ``bf16_mixed`` leaves
  ``fp8_recipe="tensorwise"`` in the optimizer config even without FP8, so on the GPU the
  recipes get Megatron's FP32 masters (12 bytes per parameter; the H200 logs confirm 18 bytes
  per parameter in all: 2 weight + 4 grad + 12 optimizer). With CPU offload Megatron's
  HybridDeviceOptimizer keeps FP32 copies and moments (12 bytes); the fraction f of them, with
  FP32 gradient copies, lives on the host (reported, not counted on the GPU).
- LoRA (``cfg.peft``): the base weights are frozen and keep only their BF16 copy; gradients
  and optimizer state cover the adapters alone. An adapter on a linear of input n and output m
  adds ``dim x (n + m)`` parameters (A: n -> dim, B: dim -> m), with the side TP splits divided
  by TP; grouped MoE experts share one adapter per rank (Megatron-Bridge's
  ``share_expert_adapters``). Activations are counted as for full fine-tuning (an upper bound:
  the frozen weights need no saved inputs for their weight gradients). A base stored in FP8
  (``fp8_frozen_base``) keeps its linear weights at one byte and dequantizes one at a time in the
  backward (``bridge_recipes.fp8_base``).
- activations: bytes each decoder layer saves for its backward, summed tensor by tensor in
  the ``*_activation_elems`` functions below (BF16 elements; FP32 tensors count twice), for a
  micro batch of ``seq_length / CP`` tokens (``/ TP`` more in the residual stream under
  sequence parallelism). Full recompute keeps only the input of each checkpointed chunk and
  rebuilds one chunk during the backward; block recompute of N checkpoints the first N layers
  of every stage (or virtual stage) and the rest keep everything (a rebuild then adds only what
  exceeds the activations the backward has already released); selective recompute keeps each
  layer's activations less what its ``recompute_modules`` discard (``selective_saving_elems``)
  and rebuilds one layer's share during the backward; no recompute keeps all. The
  MTP block is checkpointed under uniform full recompute only (Megatron-Core skips MTP under
  the block method). 1F1B keeps min(PP - stage, micro batches) micro batches in flight on a
  stage; the interleaved schedule (PP - stage - 1) x 2 + (VPP - 1) x PP + 1 model chunks.
- logits (last stage): L = (seq / CP) x vocab / TP elements per loss, one loss per MTP layer
  plus the LM loss. The LM loss is computed while the MTP losses keep what their backward
  needs. Transformer Engine's fused cross entropy keeps a BF16 copy (2L bytes per loss) and
  peaks at one more 2L while the logits and the copy coexist. Megatron's native fused kernel
  (``fused_vocab_parallel_cross_entropy``) keeps the FP32 softmax (4L per loss) and peaks at
  BF16 logits 2L + FP32 copy 4L + 4L, the last being the out-of-place result that
  ``torch.compile`` (Megatron's ``jit_fuser``) makes of the in-place updates of its input.
  The unfused path has no compiled helper: 2L + 4L. The inferred term is the compiled
  temporary: it is how ``torch.compile`` functionalises input mutation, and the two native
  runs measured on the H200 need it while the TE run does not (docs/memory_plan.md). The loss a
  chunk of tokens at a time (``bridge_recipes.chunked_loss``) keeps one chunk's logits, gradient
  and FP32 copy (8 bytes a logit) and a few floats a token a loss.
- overhead: CUDA context, cuBLAS/TE workspaces and NCCL buffers live outside torch's
  allocator (a constant), and the caching allocator reserves more than it allocates (a
  fraction of the allocated peak). See ``FRAMEWORK_CONSTANT_GB`` and ``FRAMEWORK_FRACTION``.
- backward working set: the largest group of layers a recompute rebuilds at once and two
  [tokens x top-k, hidden] MoE dispatch buffers; it never coexists with the logits (the loss is
  done before the backward reaches the decoder), so the larger of the two is counted.

What is compared with Megatron's ``mem-max-allocated-gigabytes`` is ``allocated_gb`` (no
overhead); what must fit the GPU is ``total_gb``. Measured checks: ``docs/memory_plan.md``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import ceil
from typing import Any

from bridge_recipes.common import is_vlm
from bridge_recipes.gpus import GB, GPUS
from bridge_recipes.layout import Layout, layout_of, stage_layers
from bridge_recipes.models.flops import FLA_CHUNK_SIZE

# Device memory in GB (1e9 bytes) of the GPU types the recipes are written for, from the one
# GPU table (bridge_recipes.gpus: the H200's is the test host's measured figure); the H200
# first, the planner's default.
DEFAULT_GPU = "h200"
GPU_MEMORY_GB = {
    key: GPUS[key.upper()].usable_memory_gb for key in (DEFAULT_GPU, "h100", "a100", "l40s", "b200", "gb300")
}

# Outside torch's allocator: CUDA context (~0.6 GB on Hopper with lazy module loading),
# cuBLAS / Transformer Engine workspaces (~0.2 GB) and NCCL communicator buffers of the
# model's process groups (~1.2 GB). The H200 runs show the caching allocator reserving
# 0.7%, 0.8% and 2.6% above the allocated peak for the 35B-A3B runs, and 13% for the 27B
# run (its max-active exceeds its max-allocated by as much: freed blocks not yet reusable).
# 5% is the one global fudge term; it decides fits, not the measured comparison.
FRAMEWORK_CONSTANT_GB = 2.0
FRAMEWORK_FRACTION = 0.05

BF16 = 2
FP32 = 4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


# --------------------------------------------------------------------------------------------
# Inputs: model dimensions, parallel layout, tokens per rank
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDims:
    """The Megatron-Core fields the plan reads (``cfg.model``)."""

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


# --------------------------------------------------------------------------------------------
# Parameters per rank (one rank holding all sums to models/params.py; a test checks it)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    dense: float = 0.0  # sharded by the optimizer over DP x CP
    expert: float = 0.0  # sharded over the expert-data-parallel group

    def __add__(self, other: Params) -> Params:
        return Params(self.dense + other.dense, self.expert + other.expert)

    @property
    def total(self) -> float:
        return self.dense + self.expert


def attention_params(d: ModelDims, par: Layout) -> Params:
    qkv = d.hidden * (d.q_dim * (2 if d.output_gate else 1) + 2 * d.kv_dim)
    proj = d.q_dim * d.hidden
    norms = d.hidden + (2 * d.head_dim if d.qk_norm else 0)  # fused input norm, Q/K norms
    return Params(dense=(qkv + proj) / par.tp + norms)


def gdn_params(d: ModelDims, par: Layout) -> Params:
    in_proj = d.hidden * (2 * d.gdn_qk + 2 * d.gdn_v + 2 * d.gdn_value_heads)  # q, k, v, z, beta, alpha
    conv = (2 * d.gdn_qk + d.gdn_v) * d.conv_kernel
    out_proj = d.gdn_v * d.hidden
    per_head = 2 * d.gdn_value_heads  # A_log, dt_bias
    norms = d.hidden + d.gdn_value_dim  # fused input norm, gated output norm
    return Params(dense=(in_proj + conv + out_proj + per_head) / par.tp + norms)


def dense_mlp_params(d: ModelDims, par: Layout) -> Params:
    fc1 = d.hidden * d.ffn * (2 if d.gated_linear_unit else 1)
    return Params(dense=(fc1 + d.ffn * d.hidden) / par.tp + d.hidden)  # + fused pre-MLP norm


def moe_params(d: ModelDims, par: Layout) -> Params:
    glu = 2 if d.gated_linear_unit else 1
    expert = d.hidden * d.moe_ffn * (glu + 1)
    shared = d.hidden * d.shared_ffn * (glu + 1)
    replicated = d.hidden + d.hidden * d.experts + (d.hidden if d.shared_gate else 0)  # norm, router, gate
    return Params(dense=shared / par.tp + replicated, expert=d.experts / par.ep * expert / par.expert_tp)


def layer_params(d: ModelDims, par: Layout, index: int) -> Params:
    mixer = gdn_params(d, par) if d.layer_pattern[index] else attention_params(d, par)
    mlp = moe_params(d, par) if d.moe_pattern[index] else dense_mlp_params(d, par)
    return mixer + mlp


def padded_vocab(d: ModelDims, par: Layout) -> int:
    multiple = d.vocab_multiple * par.tp
    return ceil(d.vocab / multiple) * multiple


def embedding_params(d: ModelDims, par: Layout) -> Params:
    return Params(dense=padded_vocab(d, par) * d.hidden / par.tp)


def output_params(d: ModelDims, par: Layout) -> Params:
    """Final norm and the (untied) output layer."""
    head = 0 if d.tied_embeddings and par.pp == 1 else padded_vocab(d, par) * d.hidden / par.tp
    return Params(dense=head + d.hidden)


def mtp_params(d: ModelDims, par: Layout) -> Params:
    """One MTP layer: two input norms, the 2h -> h projection, an attention layer with the
    model's MLP kind, a final norm (the embedding and output layer are shared)."""
    mlp = moe_params(d, par) if d.experts else dense_mlp_params(d, par)
    own = Params(dense=3 * d.hidden + 2 * d.hidden * d.hidden / par.tp)
    return own + attention_params(d, par) + mlp


def lora_targets(cfg: Any) -> tuple[frozenset[str], int] | None:
    """The module names and rank of a LoRA ``cfg.peft`` (None without one)."""
    peft = getattr(cfg, "peft", None)
    if peft is None:
        return None
    return frozenset(peft.target_modules or ()), int(peft.dim)


def layer_linears(d: ModelDims, par: Layout, gdn: bool, moe: bool) -> list[tuple[str, int, int, int]]:
    """(module name, local input, local output, how many a rank holds) of a decoder layer's linears, its
    mixer (Gated DeltaNet or attention) and its MLP (routed experts and shared expert, or dense):
    column-parallel ones split their output by TP, row-parallel ones their input; the routed experts'
    two matrices, split by ETP, count once an expert on the rank (Transformer Engine's grouped linear
    keeps one weight an expert)."""
    glu = 2 if d.gated_linear_unit else 1
    if gdn:
        qkvz = 2 * d.gdn_qk + 2 * d.gdn_v + 2 * d.gdn_value_heads
        out = [("in_proj", d.hidden, qkvz // par.tp, 1), ("out_proj", d.gdn_v // par.tp, d.hidden, 1)]
    else:
        qkv = d.q_dim * (2 if d.output_gate else 1) + 2 * d.kv_dim
        out = [("linear_qkv", d.hidden, qkv // par.tp, 1), ("linear_proj", d.q_dim // par.tp, d.hidden, 1)]
    mlps = (
        ((d.moe_ffn, par.expert_tp, d.experts // par.ep), (d.shared_ffn, par.tp, 1)) if moe else ((d.ffn, par.tp, 1),)
    )
    for ffn, tp, count in mlps:
        if ffn:
            out += [("linear_fc1", d.hidden, glu * ffn // tp, count), ("linear_fc2", ffn // tp, d.hidden, count)]
    return out


def _layer_kinds(d: ModelDims, index: int) -> tuple[bool, bool]:
    """(Gated DeltaNet, MoE) of decoder layer ``index``."""
    return bool(d.layer_pattern[index]), bool(d.moe_pattern[index])


def lora_params(d: ModelDims, par: Layout, layers: list[int], targets: frozenset[str], dim: int) -> float:
    """Adapter parameters a rank holds for ``layers`` (trained; the base stays frozen): one adapter a
    targeted linear, the routed experts' shared by all the rank's experts."""
    return sum(
        dim * (n + m)
        for i in layers
        for name, n, m, _ in layer_linears(d, par, *_layer_kinds(d, i))
        if name in targets
    )


# --------------------------------------------------------------------------------------------
# Activations saved for the backward (BF16 elements per micro batch; FP32 tensors count 2)
# --------------------------------------------------------------------------------------------


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
    gdn, moe = bool(d.layer_pattern[index]), bool(d.moe_pattern[index])
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


# --------------------------------------------------------------------------------------------
# Logits on the last stage
# --------------------------------------------------------------------------------------------


def logits_elems(d: ModelDims, par: Layout, tok: Tokens) -> float:
    """L: one loss's logits on one rank, [seq / CP, vocab / TP] (the output layer gathers the
    sequence-parallel tokens)."""
    return tok.seq * padded_vocab(d, par) / par.tp


def cross_entropy_kind(m: Any, env_vars: dict | None = None) -> str:
    from bridge_recipes import chunked_loss

    if chunked_loss.enabled(env_vars) and chunked_loss.problem(m) is None:
        return "chunked"
    if not m.cross_entropy_loss_fusion:
        return "unfused"
    return "te" if getattr(m, "cross_entropy_fusion_impl", "native") == "te" else "native"


def logits_peak_bytes(d: ModelDims, par: Layout, tok: Tokens, kind: str) -> float:
    """Peak of the loss computation: the MTP losses' kept tensors plus the LM loss's working
    set (see the module docstring for the per-kind terms)."""
    L = logits_elems(d, par, tok)
    earlier = d.mtp_layers  # MTP losses are computed first and keep their backward tensors
    if kind == "chunked":  # one chunk's working set, and a few floats a token a loss
        from bridge_recipes.chunked_loss import chunk_tokens

        vocab = L / tok.seq
        return min(tok.seq, chunk_tokens(int(vocab))) * vocab * 8 + (1 + earlier) * tok.seq * 3 * FP32
    if kind == "te":
        return L * (BF16 * earlier + BF16 + BF16)  # kept copies, BF16 logits + TE's saved copy
    kept = FP32 * earlier  # FP32 softmax per earlier loss
    working = BF16 + FP32 + (FP32 if kind == "native" else 0)  # logits, FP32 copy, compiled temporary
    return L * (kept + working)


# --------------------------------------------------------------------------------------------
# Pipeline stages and recompute
# --------------------------------------------------------------------------------------------


def stage_chunks(cfg: Any, par: Layout) -> list[list[list[int]]]:
    """Global decoder-layer indices per stage, split into model chunks (one without VPP).
    With VPP and no uneven first/last stage, chunk c of stage r is Megatron's interleaved
    assignment; with uneven stages the stage's own layers are split in VPP parts."""

    counts = stage_layers(cfg)
    if counts is None:
        raise ValueError("the layers do not split over the pipeline stages (see the layout checks)")
    vpp = par.vpp or 1
    m = cfg.model
    if vpp > 1 and m.num_layers_in_first_pipeline_stage is None and m.num_layers_in_last_pipeline_stage is None:
        size = m.num_layers // (par.pp * vpp)
        return [
            [list(range((c * par.pp + r) * size, (c * par.pp + r + 1) * size)) for c in range(vpp)]
            for r in range(par.pp)
        ]
    starts = [sum(counts[:r]) for r in range(par.pp)]
    stages = [list(range(s, s + n)) for s, n in zip(starts, counts)]
    return [[layers[c * len(layers) // vpp : (c + 1) * len(layers) // vpp] for c in range(vpp)] for layers in stages]


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


def num_microbatches(cfg: Any, par: Layout) -> int:
    return max(1, cfg.train.global_batch_size // (cfg.train.micro_batch_size * par.dp))


def micro_batches_in_flight(stage: int, par: Layout, microbatches: int) -> float:
    """Micro batches whose activations a stage holds at once (1F1B: the warm-up forwards plus
    one; interleaved: Megatron's warm-up count of model chunks plus one, in micro batches)."""
    if not par.vpp or par.vpp == 1:
        return min(par.pp - stage, microbatches)
    chunks = (par.pp - stage - 1) * 2 + (par.vpp - 1) * par.pp + 1
    return min(chunks, microbatches * par.vpp) / par.vpp


# --------------------------------------------------------------------------------------------
# Optimizer state
# --------------------------------------------------------------------------------------------


def _dtype_bytes(dtype: Any, default: int = 4) -> int:
    name = str(dtype).replace("torch.", "") if dtype is not None else ""
    return DTYPE_BYTES.get(name, default)


def mixed_precision_config(cfg: Any) -> Any:
    """The recipe's mixed-precision preset as an object (None when it cannot be resolved)."""
    mp = cfg.mixed_precision
    if isinstance(mp, str):
        try:
            from megatron.bridge.training.mixed_precision import get_mixed_precision_config

            return get_mixed_precision_config(mp)
        except (ImportError, KeyError, ValueError):
            return None
    return mp


def effective_precision(cfg: Any) -> dict[str, Any]:
    """Fields the mixed-precision preset overwrites on the optimizer and DDP configs at
    setup (``MixedPrecisionConfig.setup``): it wins over what the recipe set there."""
    out = {
        "fp8_recipe": getattr(cfg.optimizer, "fp8_recipe", None),
        "grad_reduce_in_fp32": getattr(cfg.ddp, "grad_reduce_in_fp32", True),
        "fp8": getattr(getattr(cfg, "model", None), "fp8", None),
    }
    mp = mixed_precision_config(cfg)
    for key in out:
        if mp is not None and hasattr(mp, key):
            out[key] = getattr(mp, key)
    return out


def te_owns_master(opt: Any, fp8_recipe: str | None) -> bool:
    """Megatron's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: TE's FusedAdam keeps the
    master weights; otherwise Megatron keeps FP32 shards itself."""
    main = _dtype_bytes(getattr(opt, "main_params_dtype", None))
    return bool(opt.use_precision_aware_optimizer) and (
        main != 4 or fp8_recipe in (None, "delayed") or bool(getattr(opt, "optimizer_cpu_offload", False))
    )


def optimizer_bytes_per_param(cfg: Any) -> float:
    """Master copy + exp_avg + exp_avg_sq, before sharding (see the module docstring)."""
    opt = cfg.optimizer
    if getattr(opt, "optimizer_cpu_offload", False) or not opt.use_precision_aware_optimizer:
        return 3 * FP32  # FP32 master + moments (HybridDeviceOptimizer keeps FP32 copies on both sides)
    moments = _dtype_bytes(opt.exp_avg_dtype) + _dtype_bytes(opt.exp_avg_sq_dtype)
    main = _dtype_bytes(getattr(opt, "main_params_dtype", None))
    if not te_owns_master(opt, effective_precision(cfg)["fp8_recipe"]):
        return FP32 + moments
    if main == 4:
        return (2 if getattr(opt, "store_param_remainders", True) else 4) + moments
    return main + moments


def optimizer_shard_params(p: Params, par: Layout, distributed: bool) -> float:
    if not distributed:
        return p.total
    return p.dense / par.dense_dp + p.expert / par.expert_dp


def offload_fraction(cfg: Any) -> float:
    opt = cfg.optimizer
    if not getattr(opt, "optimizer_cpu_offload", False):
        return 0.0
    return float(getattr(opt, "optimizer_offload_fraction", 0.0) or 0.0)


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's busiest rank at its peak, in GB (1e9 bytes)."""

    stage: int
    layers: int
    in_flight: float  # micro batches whose activations the stage holds
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    host_optimizer_gb: float  # offloaded optimizer state + its FP32 grad copies, on the CPU (not in the totals)
    activations_gb: float  # saved activations of the in-flight micro batches
    logits_gb: float  # loss working set (last stage), on top of the saved activations
    backward_gb: float  # layers rebuilt at once and MoE dispatch buffers during the backward

    @property
    def peak_extra_gb(self) -> float:
        """Logits and backward working set do not coexist: the loss ends before the backward
        reaches the decoder layers."""
        return max(self.logits_gb, self.backward_gb)

    @property
    def allocated_gb(self) -> float:
        """Comparable with Megatron's ``mem-max-allocated-gigabytes``."""
        return self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb + self.peak_extra_gb

    @property
    def overhead_gb(self) -> float:
        return framework_overhead_gb(self.allocated_gb)

    @property
    def total_gb(self) -> float:
        return self.allocated_gb + self.overhead_gb


@dataclass(frozen=True)
class MemoryPlan:
    layout: str
    gpu: str | None
    gpu_memory_gb: float
    stages: tuple[StageMemory, ...]
    notes: tuple[str, ...] = ()

    @property
    def peak_stage(self) -> int:
        return max(self.stages, key=lambda s: s.total_gb).stage

    @property
    def peak_gb(self) -> float:
        return self.stages[self.peak_stage].total_gb

    @property
    def peak_allocated_gb(self) -> float:
        return max(s.allocated_gb for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_gb <= self.gpu_memory_gb

    def stages_over(self) -> list[int]:
        return [s.stage for s in self.stages if s.total_gb > self.gpu_memory_gb]


def gpu_memory(gpu: str | None) -> float:
    key = (gpu or DEFAULT_GPU).lower().removeprefix("nvidia-")
    try:
        return GPU_MEMORY_GB[key]
    except KeyError:
        raise KeyError(f"unknown GPU {gpu!r}; known: {', '.join(GPU_MEMORY_GB)} (or pass gpu_memory_gb)") from None


def framework_overhead_gb(allocated_gb: float) -> float:
    return FRAMEWORK_CONSTANT_GB + FRAMEWORK_FRACTION * allocated_gb


def stage_params(d: ModelDims, par: Layout, layers: list[int], stage: int) -> Params:
    p = Params()
    for i in layers:
        p = p + layer_params(d, par, i)
    if stage == 0:
        p = p + embedding_params(d, par)
    elif stage == par.pp - 1 and d.mtp_layers:
        # Megatron-Core builds an embedding on every stage that runs MTP (GPTModel: pre_process
        # or mtp_process), its gradients tied to the first stage's: a trained copy with its own
        # gradients and optimizer state (measured: the 35B-A3B's PP2 last stage, +9.5 GB)
        p = p + embedding_params(d, par)
    if stage == par.pp - 1:
        mtp = mtp_params(d, par)
        p = p + output_params(d, par) + Params(mtp.dense * d.mtp_layers, mtp.expert * d.mtp_layers)
    return p


def fp8_parameters(mp: Any) -> bool:
    """Whether a mixed-precision config trains in FP8 with the parameters stored in FP8 (``fp8_param``,
    which ``fp8_param_gather`` sets at finalize)."""
    return bool(getattr(mp, "fp8", None)) and bool(getattr(mp, "fp8_param", None) or mp.fp8_param_gather)


def fp8_frozen_base(cfg: Any) -> bool:
    """LoRA on a base stored in FP8 (``bridge_recipes.fp8_base``): every TE linear's frozen weight is one
    byte, row-wise only, and the backward dequantizes one GEMM's weight at a time."""
    if lora_targets(cfg) is None:
        return False
    mp = mixed_precision_config(cfg)
    return mp is not None and fp8_parameters(mp)


def linear_params(d: ModelDims, par: Layout, layers: list[int]) -> float:
    """The decoder layers' linear weights a rank holds (what Transformer Engine's linears keep)."""
    return sum(n * m * count for i in layers for _, n, m, count in layer_linears(d, par, *_layer_kinds(d, i)))


def mtp_linear_params(d: ModelDims, par: Layout) -> float:
    """The MTP layers' linear weights: each one's 2h -> h projection, its attention and its MLP."""
    own = 2 * d.hidden * d.hidden / par.tp
    return d.mtp_layers * (own + sum(n * m * c for _, n, m, c in layer_linears(d, par, False, bool(d.experts))))


def fp8_base_saving_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int], stage: int) -> float:
    """What storing the frozen base's linear weights in FP8 saves on a stage: one of their two bytes
    (the norms, router, convolution, embedding and output layer stay BF16)."""
    if not fp8_frozen_base(cfg):
        return 0.0
    mtp = mtp_linear_params(d, par) if stage == par.pp - 1 else 0.0
    return linear_params(d, par, layers) + mtp


def fp8_base_dequantized_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int]) -> float:
    """The backward's BF16 copy of one GEMM's FP8 weight (all of a grouped linear's experts at once):
    the largest linear of the stage."""
    if not fp8_frozen_base(cfg):
        return 0.0
    return BF16 * max(
        (n * m * count for i in layers for _, n, m, count in layer_linears(d, par, *_layer_kinds(d, i))), default=0
    )


def _fp8_bf16_parameters(cfg: Any) -> bool:
    """FP8 GEMMs on BF16 parameters: Transformer Engine makes the FP8 weights it multiplies with."""
    mp = mixed_precision_config(cfg)
    return mp is not None and bool(getattr(mp, "fp8", None)) and not fp8_parameters(mp)


def caches_fp8_weights(cfg: Any) -> bool:
    """Transformer Engine keeps FP8 copies of BF16 weights between micro batches: FP8 GEMMs, BF16
    parameters and Megatron-Core's parameter transpose cache on (its default). With FP8 parameters the
    parameter is that copy, and with ``disable_parameter_transpose_cache`` each weight is cast when used."""
    return _fp8_bf16_parameters(cfg) and not getattr(cfg.model, "disable_parameter_transpose_cache", False)


def casts_fp8_weights_per_use(cfg: Any) -> bool:
    """FP8 GEMMs on BF16 parameters with the transpose cache off: each TE linear casts its weight in
    every forward and keeps that copy for the backward."""
    return _fp8_bf16_parameters(cfg) and bool(getattr(cfg.model, "disable_parameter_transpose_cache", False))


def _fp8_weight_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int]) -> dict[int, float]:
    """An FP8 copy of each layer's weights, data and transpose (2 bytes a parameter), by global layer
    index; none for the layers the preset keeps in BF16 (``num_layers_at_start_in_bf16`` and
    ``num_layers_at_end_in_bf16`` when ``first_last_layers_bf16`` is set)."""
    mp = mixed_precision_config(cfg)
    bf16_ends = getattr(mp, "first_last_layers_bf16", False)
    start = mp.num_layers_at_start_in_bf16 if bf16_ends else 0
    end = len(d.layer_pattern) - (mp.num_layers_at_end_in_bf16 if bf16_ends else 0)
    return {i: 2 * layer_params(d, par, i).total if start <= i < end else 0.0 for i in layers}


def _mtp_layer_params(d: ModelDims, par: Layout) -> Params:
    mtp = mtp_params(d, par)
    return Params(mtp.dense * d.mtp_layers, mtp.expert * d.mtp_layers)


def fp8_weight_cache_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int], stage: int) -> float:
    """What :func:`caches_fp8_weights` keeps on a stage: each TE linear of an FP8 layer caches its
    weight's FP8 data and FP8 transpose (``_fp8_workspaces``, 2 bytes a parameter) from the first micro
    batch of a step. Layers the preset keeps in BF16 (``first_last_layers_bf16``, by global index) hold
    none; MTP layers run FP8. From Transformer Engine 2.20's ``Linear.forward`` and Megatron-Core
    0.19.2's TE wrappers; measured on the 27B's 4-layer proxy, 101.55 GB
    allocated against 101.87 planned."""
    if not caches_fp8_weights(cfg):
        return 0.0
    mtp = 2 * _mtp_layer_params(d, par).total if stage == par.pp - 1 else 0.0
    return sum(_fp8_weight_bytes(cfg, d, par, layers).values()) + mtp


def fp8_weight_copies(cfg: Any, d: ModelDims, par: Layout, chunks: list[list[int]], stage: int) -> ChunkActivations:
    """What :func:`casts_fp8_weights_per_use` adds to a stage's activations: each TE linear of an FP8 layer
    saves the FP8 weight it cast, data and transpose (2 bytes a parameter), for its backward, a new copy
    every micro batch (Transformer Engine 2.20's ``Linear.forward`` saves ``weightmat``; Megatron-Core
    0.19.2 passes ``is_first_microbatch=None`` with the cache off). A layer that keeps its activations
    holds one a micro batch in flight (``saved``); a recomputed layer holds one while the backward
    rebuilds it (``rebuilt``: one layer at a time under block recompute, n under uniform recompute of
    n). Measured on the 27B's 4-layer proxy: 100.78 GB allocated against 99.48
    planned without it, 1.3 GB for its 2 FP8 layers that keep their activations."""
    if not casts_fp8_weights_per_use(cfg):
        return ChunkActivations(saved=0.0, rebuilt=0.0)
    m = cfg.model
    saved, rebuilt = 0.0, 0.0
    for chunk in chunks:
        copy, groups = _fp8_weight_bytes(cfg, d, par, chunk), recompute_groups(m, chunk)
        again = {i for g in groups for i in g}
        saved += sum(b for i, b in copy.items() if i not in again)
        rebuilt = max([rebuilt, *(sum(copy[i] for i in g) for g in groups)])
    if stage == par.pp - 1 and d.mtp_layers:
        b = 2 * _mtp_layer_params(d, par).total
        if mtp_recomputed(m):
            rebuilt = max(rebuilt, b / d.mtp_layers)
        else:
            saved += b
    return ChunkActivations(saved=saved, rebuilt=rebuilt)


def stage_weight_gemms(d: ModelDims, par: Layout, layers: list[int], stage: int) -> Counter[tuple[int, int]]:
    """The weights on a stage whose gradient a GEMM computes, counted by (out, in) shape on one rank: each
    layer's two mixer projections, each routed expert's two matrices (Transformer Engine's grouped
    linear keeps one weight an expert), the shared expert's or the dense MLP's two; on the last stage
    the output layer (tied to the embedding or not) and each MTP layer's 2h -> h projection, attention
    and MLP. The 35B-A3B's 16-layer proxy with 32 experts has 1,158 (its log lists them among the 1,289
    parameters)."""
    weights: Counter[tuple[int, int]] = Counter()

    def layer(gdn: bool, moe: bool) -> None:
        for _, inp, out, count in layer_linears(d, par, gdn, moe):  # a shared expert's shape may be the experts'
            weights[(out, inp)] += count

    for i in layers:
        layer(*_layer_kinds(d, i))
    if stage == par.pp - 1:
        # the output layer's GEMM computes a weight gradient even when it borrows the embedding's weight
        weights[(padded_vocab(d, par) // par.tp, d.hidden)] += 1
        for _ in range(d.mtp_layers):  # the 2h -> h projection, an attention layer and the model's MLP kind
            weights[(d.hidden // par.tp, 2 * d.hidden)] += 1
            layer(gdn=False, moe=bool(d.experts))
    return weights


def fused_wgrad_placeholder_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int], stage: int) -> float:
    """What gradient-accumulation fusion keeps on a stage: a weight-gradient GEMM that accumulates into
    ``main_grad`` hands autograd a placeholder instead of the gradient, and Transformer Engine's
    ``get_dummy_wgrad`` (2.20, ``module/base.py``) keeps one such BF16 tensor for every distinct weight
    shape (:func:`stage_weight_gemms`), for the life of the process: Transformer Engine's own layers and
    Megatron-Core 0.19.2's ``ColumnParallelLinear`` (the output layer) alike. The output layer's is the
    big one (248,320 x 2,048 on the 35B-A3B, 1.02 GB); with the decoder's, MTP's and the experts'
    shapes 1.128 GB, which is what the 35B-A3B's proxies measured over the same run without fusion at 4
    and at 16 layers (1 x H200: 60.776 against 59.647 GB, 90.592 against 89.464). None with
    LoRA (the frozen base weights have no ``main_grad``; the adapters' placeholders are small)."""
    if not getattr(cfg.model, "gradient_accumulation_fusion", False) or lora_targets(cfg) is not None:
        return 0.0
    return BF16 * sum(out * inp for out, inp in stage_weight_gemms(d, par, layers, stage).keys())


def mtp_recomputed(m: Any) -> bool:
    """Megatron-Core checkpoints MTP layers under uniform full recompute only."""
    return m.recompute_granularity == "full" and m.recompute_method == "uniform"


def plan_stage(cfg: Any, d: ModelDims, par: Layout, tok: Tokens, stage: int, chunks: list[list[int]]) -> StageMemory:
    m, last = cfg.model, stage == par.pp - 1
    layers = [i for c in chunks for i in c]
    params = stage_params(d, par, layers, stage)
    prec = effective_precision(cfg)
    trained = params
    lora = lora_targets(cfg)
    if lora is not None:  # frozen base: gradients and optimizer state for the adapters only
        trained = Params(dense=lora_params(d, par, layers, *lora))
        params = params + trained
    opt_params = optimizer_shard_params(trained, par, bool(cfg.optimizer.use_distributed_optimizer))
    opt_bytes = opt_params * optimizer_bytes_per_param(cfg)
    host = offload_fraction(cfg)
    host_grads = host * opt_params * FP32  # the host optimizer's FP32 gradient copies

    acts = [chunk_activations(d, par, tok, m, c) for c in chunks]
    saved = sum(a.saved for a in acts)
    rebuilt = max((a.rebuilt for a in acts), default=0.0)
    logits = 0.0
    if last:
        mtp = mtp_activation_bytes(d, par, tok, mtp_recomputed(m), selective_modules(m))
        saved += head_activation_bytes(d, tok) + d.mtp_layers * mtp
        if d.mtp_layers:  # the backward rebuilds what a recomputed or selective MTP layer did not keep
            rebuilt = max(
                rebuilt, mtp_activation_bytes(d, par, tok, recomputed=False) - (0.0 if mtp_recomputed(m) else mtp)
            )
        logits = logits_peak_bytes(d, par, tok, cross_entropy_kind(m, getattr(cfg, "env_vars", None)))
    copies = fp8_weight_copies(cfg, d, par, chunks, stage)
    saved += copies.saved
    in_flight = micro_batches_in_flight(stage, par, num_microbatches(cfg, par))

    weights = (
        BF16 * params.total
        - fp8_base_saving_bytes(cfg, d, par, layers, stage)
        + fp8_weight_cache_bytes(cfg, d, par, layers, stage)
        + fused_wgrad_placeholder_bytes(cfg, d, par, layers, stage)
    )
    grads = (FP32 if prec["grad_reduce_in_fp32"] else BF16) * trained.total
    return StageMemory(
        stage=stage,
        layers=len(layers),
        in_flight=in_flight,
        weights_gb=weights / GB,
        grads_gb=grads / GB,
        optimizer_gb=opt_bytes * (1 - host) / GB,
        host_optimizer_gb=(opt_bytes * host + host_grads) / GB,
        activations_gb=in_flight * saved / GB,
        logits_gb=logits / GB,
        backward_gb=(
            rebuilt
            + copies.rebuilt
            + dispatch_buffer_bytes(d, par, tok)
            + fp8_base_dequantized_bytes(cfg, d, par, layers)
        )
        / GB,
    )


def plan_notes(cfg: Any, par: Layout) -> tuple[str, ...]:
    m, notes = cfg.model, []
    modules = selective_modules(m)
    if modules:
        unknown = sorted(modules - SELECTIVE_MODULES)
        notes.append(
            f"selective recompute of {', '.join(sorted(modules))}: counted module by module; on the one measured "
            "pair the plan counted more saving than was measured (docs/memory_plan.md)"
            + (f"; {', '.join(unknown)} not modelled (counted as kept)" if unknown else "")
        )
    if fp8_frozen_base(cfg):
        notes.append(
            "FP8 base: the frozen linear weights counted at one byte (row-wise FP8), the backward's dequantized copy "
            "of the largest one in bwd; activations counted in BF16 (an upper bound)"
        )
    elif effective_precision(cfg)["fp8"]:
        notes.append("FP8: activations and weights counted in BF16 (an upper bound)")
        if caches_fp8_weights(cfg):
            notes.append(
                "FP8 with BF16 parameters: Transformer Engine's cached FP8 weight copies counted (2 bytes a "
                "parameter of the FP8 layers; model.disable_parameter_transpose_cache=true casts each weight when "
                "used instead)"
            )
        if casts_fp8_weights_per_use(cfg):
            notes.append(
                "FP8 with BF16 parameters cast when used: the FP8 weight each micro batch keeps for its backward "
                "counted (2 bytes a parameter of the FP8 layers that keep their activations, per micro batch in "
                "flight)"
            )
    if is_vlm(cfg):
        notes.append("vision tower not counted (language model only)")
    if par.ep > 1:
        notes.append("expert routing assumed balanced; a hot expert-parallel rank holds more")
    if lora_targets(cfg) is not None:
        notes.append("LoRA: base weights frozen (no gradients or optimizer state); activations as full fine-tuning")
    if offload_fraction(cfg):
        notes.append(f"optimizer offload {offload_fraction(cfg):g}: that share of the optimizer state is on the host")
    return tuple(notes)


def plan_memory(cfg: Any, world_size: int, gpu_memory_gb: float | None = None, gpu: str | None = None) -> MemoryPlan:
    """Per-stage peak memory of ``cfg`` on ``world_size`` GPUs. ``gpu_memory_gb`` defaults to
    the memory of ``gpu`` (``h200`` when not given), see :data:`GPU_MEMORY_GB`."""
    par = parallel_layout(cfg, world_size)
    d, tok = model_dims(cfg.model), micro_batch_tokens(cfg, par)
    stages = tuple(plan_stage(cfg, d, par, tok, r, chunks) for r, chunks in enumerate(stage_chunks(cfg, par)))
    if gpu_memory_gb is None:
        gpu, gpu_memory_gb = gpu or DEFAULT_GPU, gpu_memory(gpu)
    elif gpu is not None:
        gpu = f"{gpu} capped at {gpu_memory_gb:g} GB"
    return MemoryPlan(
        layout=par.label(show_sp=True), gpu=gpu, gpu_memory_gb=gpu_memory_gb, stages=stages, notes=plan_notes(cfg, par)
    )


# --------------------------------------------------------------------------------------------
# Text for the runner's --plan
# --------------------------------------------------------------------------------------------

_COLUMNS = ("stage", "layers", "mb", "weights", "grads", "optim", "activ", "logits", "bwd", "alloc", "+ovh", "total")


def _row(s: StageMemory, capacity: float) -> str:
    cells = (
        f"{s.stage}",
        f"{s.layers}",
        f"{s.in_flight:g}",
        *(
            f"{v:.1f}"
            for v in (
                s.weights_gb,
                s.grads_gb,
                s.optimizer_gb,
                s.activations_gb,
                s.logits_gb,
                s.backward_gb,
                s.allocated_gb,
                s.overhead_gb,
                s.total_gb,
            )
        ),
    )
    flag = "" if s.total_gb <= capacity else f"  OVER by {s.total_gb - capacity:.1f}"
    return "  ".join(f"{c:>7}" for c in cells) + flag


def format_plan(plan: MemoryPlan) -> str:
    """A short table: one row per pipeline stage, GB = 1e9 bytes."""
    lines = [
        f"memory plan, GB = 1e9 bytes: {plan.layout} on {plan.gpu or 'a GPU'} ({plan.gpu_memory_gb:.1f} GB per GPU)",
        "  ".join(f"{c:>7}" for c in _COLUMNS),
    ]
    lines += [_row(s, plan.gpu_memory_gb) for s in plan.stages]
    host = max(s.host_optimizer_gb for s in plan.stages)
    if host:
        lines.append(f"optimizer state on the host: up to {host:.1f} GB per rank")
    verdict = "fits" if plan.fits else f"DOES NOT FIT: stage {', '.join(map(str, plan.stages_over()))} over"
    lines.append(
        f"peak: stage {plan.peak_stage}, {plan.peak_gb:.1f} of {plan.gpu_memory_gb:.1f} GB ({verdict}); "
        f"logits and bwd do not coexist, alloc counts the larger"
    )
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


# The usual levers for a config that does not fit, in the order they cost least throughput: each
# is the override tokens that set it and the change itself; a lever the config already pulls is
# skipped. More GPUs (the same layout, more data-parallel ranks sharding the distributed
# optimizer) are tried after them.
def _chunked_loss(cfg: Any) -> bool:
    from bridge_recipes.chunked_loss import ENV, enabled, problem

    if enabled(cfg.env_vars) or is_vlm(cfg) or problem(cfg.model):
        return False
    cfg.env_vars = {**(cfg.env_vars or {}), ENV: 1}
    return True


def _full_recompute(cfg: Any) -> bool:
    m = cfg.model
    if (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == ("full", "uniform", 1):
        return False
    m.recompute_granularity, m.recompute_method, m.recompute_num_layers = "full", "uniform", 1
    return True


def _micro_batch_1(cfg: Any) -> bool:
    if cfg.train.micro_batch_size == 1:
        return False
    cfg.train.micro_batch_size = 1
    return True


def _optimizer_on_host(cfg: Any) -> bool:
    opt = cfg.optimizer
    if getattr(opt, "optimizer_cpu_offload", False) and getattr(opt, "optimizer_offload_fraction", 0) == 1.0:
        return False
    opt.optimizer_cpu_offload, opt.optimizer_offload_fraction = True, 1.0
    return True


LEVERS: tuple[tuple[str, tuple[str, ...], Any], ...] = (
    ("the loss a chunk of tokens at a time", ("+env_vars.BRIDGE_RECIPES_CHUNKED_LOSS=1",), _chunked_loss),
    (
        "full recompute",
        ("model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1"),
        _full_recompute,
    ),
    ("micro batch 1", ("-mb 1",), _micro_batch_1),
    (
        "optimizer state on the host",
        ("optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=1.0"),
        _optimizer_on_host,
    ),
)
MORE_GPUS = (2, 4, 8)  # multiples of the world size tried


def changes_that_fit(
    cfg: Any, world_size: int, gpu: str | None = None, gpu_memory_gb: float | None = None
) -> list[str]:
    """For a config that does not fit: the smallest sets of :data:`LEVERS` that fit (each lever
    alone, else pairs, ...), then the fewest more GPUs that fit; each line names the change
    (override tokens or a world size) and the peak it plans. Empty when nothing fits."""
    import copy
    import itertools

    def plan(changed: Any, world: int) -> MemoryPlan | None:
        try:
            return plan_memory(changed, world, gpu_memory_gb=gpu_memory_gb, gpu=gpu)
        except (ValueError, ZeroDivisionError):
            return None

    def peak(p: MemoryPlan) -> str:
        return f"peak {p.peak_gb:.1f} of {p.gpu_memory_gb:.1f} GB"

    usable = [lever for lever in LEVERS if lever[2](copy.deepcopy(cfg))]  # those not pulled already
    out = []
    for size in range(1, len(usable) + 1):
        for levers in itertools.combinations(usable, size):
            changed = copy.deepcopy(cfg)
            for _, _, pull in levers:
                pull(changed)
            if (p := plan(changed, world_size)) and p.fits:
                names = " + ".join(name for name, _, _ in levers)
                out.append(f"{names}: {' '.join(t for _, tokens, _ in levers for t in tokens)} ({peak(p)})")
        if out:
            break
    for factor in MORE_GPUS:
        if (p := plan(cfg, world_size * factor)) and p.fits:
            out.append(
                f"more GPUs: {world_size * factor} instead of {world_size}, the same layout with more data-parallel "
                f"ranks sharding the optimizer ({p.layout}; {peak(p)})"
            )
            break
    return out


def plan_report(
    cfg: Any, world_size: int, gpu: str | None = None, gpu_memory_gb: float | None = None
) -> tuple[str, bool]:
    """The runner's ``--plan`` text and whether every stage fits ``gpu``'s memory (or ``gpu_memory_gb``);
    over budget, the text ends with the changes that would fit (:func:`changes_that_fit`)."""
    plan = plan_memory(cfg, world_size, gpu_memory_gb=gpu_memory_gb, gpu=gpu)
    text = format_plan(plan)
    if not plan.fits:
        fixes = changes_that_fit(cfg, world_size, gpu, gpu_memory_gb)
        if fixes:
            text += "\nchanges that fit (each planned):\n" + "\n".join(f"  {f}" for f in fixes)
        else:
            text += (
                f"\nno usual change fits: {', '.join(name for name, _, _ in LEVERS)} (alone and together) and up "
                f"to {MORE_GPUS[-1]}x the GPUs were planned; a deeper pipeline (-pp) or larger-memory GPUs remain"
            )
    return text, plan.fits
