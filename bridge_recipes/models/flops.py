"""Training FLOPs per token of the Qwen3.5 architecture, and OpenRecipes' ``6 x N``.

Two figures are reported for every run:

- :func:`six_n_flops_per_token`: ``6 x N`` with N = ``count_parameters(spec).matmul_active``,
  the convention OpenRecipes uses for its MFU (2,946,252,800 for 35B-A3B, 25,623,920,640 for
  27B). It ignores the attention core, the DeltaNet recurrence and MTP.
- :func:`model_flops_per_token`: the architecture itself at a given sequence length, module by
  module, returned as a :class:`FlopsPerToken` breakdown.

Conventions (all counts are per token; one multiply-add is 2 FLOPs):

- Forward only is counted per module; training = 3 x forward (backward = 2 x forward: the
  gradients with respect to the inputs and to the weights each cost one forward), applied to
  every term, the attention core and the recurrence included. Activation recomputation is not
  counted (these are model FLOPs, not hardware FLOPs). Element-wise work (norms, RoPE, softmax,
  gates, activations, the DeltaNet decay and L2 norm) and the embedding lookup are not counted.
- A weight matrix of P entries costs 2 P per token. The weight terms are therefore exactly
  2 x the matrices of :mod:`bridge_recipes.models.params`, so without MTP they sum to
  ``2 x matmul_active`` forward and ``6 x matmul_active`` in training: 6N is this counter
  minus the attention core, the recurrence and MTP.

Per module (h hidden, a attention heads, d head_dim, g query groups, s sequence length,
Hk/Hv DeltaNet key/value heads, dk/dv their head dims, K conv kernel, V vocabulary):

- gated attention projections: Q and its output gate 2 h (2 a d), K and V 2 h (2 g d), output
  2 (a d) h.
- attention core, causal: the token at position i (1-based) attends to i keys, QK^T and AV
  each cost 2 a d i; averaged over the s positions of a causal sequence,
  ``4 a d (s + 1) / 2 = 2 a d (s + 1)`` forward per token. The full (non-causal) matrix costs
  ``4 a d s``; causal = (full + the diagonal 4 a d) / 2. Rows are taken as one causal sequence
  of s tokens (no per-document masking).
- Gated DeltaNet projections: in_proj to Q, K (Hk dk each), V and Z (Hv dv each)
  ``2 h (2 Hk dk + 2 Hv dv)``, beta/alpha ``2 h (2 Hv)``, out_proj ``2 (Hv dv) h``.
- DeltaNet depthwise causal conv over Q, K, V: ``2 (2 Hk dk + Hv dv) K``.
- DeltaNet chunked recurrence, :func:`gdn_recurrence_terms`: the matrix products of FLA's
  ``chunk_gated_delta_rule`` at chunk size C = 64, per value head (Megatron-Core repeats Q and
  K to the Hv value heads before the kernel, and beta and the decay are per value head):

  ==================  ============  ===============================================
  term                per token     kernel step
  ==================  ============  ===============================================
  kkt                 2 C dk        A = beta K K^T within the chunk (full C x C block)
  solve_tril          C^2 / 3       T = (I + A)^-1, unit lower-triangular, C^3/3 per chunk
  wy_w                2 C dk        W = T (beta K decay)   (WY / UT transform)
  wy_u                2 C dv        U = T (beta V)
  state_correction    2 dk dv       V' = U - W S           (chunk_gated_delta_rule_fwd_h)
  state_update        2 dk dv       S <- decay S + K^T V'
  output_inter        2 dk dv       O  = Q S               (chunk_fwd_o)
  output_intra_qk     2 C dk        Q K^T within the chunk (full C x C block)
  output_intra_av     2 C dv        (Q K^T masked) V'
  ==================  ============  ===============================================

  Sum per value head: ``6 C dk + 4 C dv + 6 dk dv + C^2 / 3``. This approximates the
  kernels' work, counted once: intra-chunk products are counted as full C x C blocks (FLA
  0.6 builds K K^T from the 10 lower-triangular 16 x 16 sub-blocks of the 64 x 64 block, i.e.
  5/8 of it, and solves the triangle blockwise), every chunk is taken as full (s a multiple
  of C), and backward is 2 x forward like every other term (the backward kernels also recompute
  W, U and the chunk states; that recomputation is not counted).
- MLP, dense: SwiGLU ``2 (3 h F)``. MoE: router ``2 h E``, top-k routed experts
  ``2 k (3 h F_moe)``, shared expert and its sigmoid gate ``2 (3 h F_shared + h)``.
- LM head ``2 h V`` (the vocabulary is 248,320, already a multiple of 128: no padding).
- MTP, per MTP layer: the 2h -> h projection ``2 (2 h h)``, one gated-attention layer
  (projections and core as above) and MLP, and a second LM head pass ``2 h V``.

The vision tower of the VL specs is not counted (text tokens only).

Megatron-Bridge's own estimate (``training/utils/flop_utils.py``, the "throughput per GPU"
of its log) differs in two conventions: attention core ``a d s / 2`` per product instead of
``(s + 1) / 2``, and ``8 Hv dv^2`` for the whole recurrence (no chunk terms); it also counts
the MTP norms.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_recipes.models import params as P
from bridge_recipes.models.dims import spec_dims
from bridge_recipes.models.qwen35 import Qwen35Spec, get_spec

FLA_CHUNK_SIZE = 64  # chunk_gated_delta_rule's default, the one Megatron-Core 0.19.2 calls
TRAINING_TO_FORWARD = 3  # forward + backward (2 x forward)

# Components of the breakdown, in report order.
WEIGHT_COMPONENTS = (  # 2 x weights per token: sum to 2N forward (6N in training)
    "attention_projections",
    "gdn_projections",
    "gdn_conv",
    "mlp",
    "moe_router",
    "moe_routed_experts",
    "moe_shared_expert",
    "lm_head",
)
SEQUENCE_COMPONENTS = ("attention_core", "gdn_recurrence")  # grow with, or depend on, s and C
MTP_COMPONENTS = (
    "mtp_projection",
    "mtp_attention_projections",
    "mtp_attention_core",
    "mtp_mlp",
    "mtp_lm_head",
)
COMPONENTS = WEIGHT_COMPONENTS + SEQUENCE_COMPONENTS + MTP_COMPONENTS


# --- per-module forward FLOPs per token ------------------------------------------------------


def attention_projection_flops(s: Qwen35Spec) -> int:
    """Q + output gate, K, V and output projections of one gated-attention layer."""
    return 2 * P.attention_projections(spec_dims(s))


def attention_core_flops(s: Qwen35Spec, seq_length: int, causal: bool = True) -> int:
    """QK^T and AV of one attention layer, per token, averaged over the sequence's positions:
    causal ``2 a d (s + 1)``, full matrix ``4 a d s``."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    width = s.num_attention_heads * s.head_dim
    return 2 * width * (seq_length + 1) if causal else 4 * width * seq_length


def gdn_projection_flops(s: Qwen35Spec) -> int:
    """in_proj (Q, K, V, Z and beta/alpha) and out_proj of one Gated DeltaNet layer."""
    return 2 * P.gdn_projections(spec_dims(s))


def gdn_conv_flops(s: Qwen35Spec) -> int:
    """Depthwise causal conv over the Q, K, V channels: one multiply-add per channel and tap."""
    return 2 * P.gdn_conv(spec_dims(s))


def gdn_recurrence_terms(s: Qwen35Spec, chunk_size: int = FLA_CHUNK_SIZE) -> dict[str, float]:
    """The chunked gated delta rule's products per token, summed over the value heads (table in
    the module docstring)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    c, dk, dv = chunk_size, s.linear_key_head_dim, s.linear_value_head_dim
    per_head = {
        "kkt": 2 * c * dk,
        "solve_tril": c * c / 3,
        "wy_w": 2 * c * dk,
        "wy_u": 2 * c * dv,
        "state_correction": 2 * dk * dv,
        "state_update": 2 * dk * dv,
        "output_inter": 2 * dk * dv,
        "output_intra_qk": 2 * c * dk,
        "output_intra_av": 2 * c * dv,
    }
    return {name: s.linear_num_value_heads * flops for name, flops in per_head.items()}


def gdn_recurrence_flops(s: Qwen35Spec, chunk_size: int = FLA_CHUNK_SIZE) -> float:
    """Per token, one Gated DeltaNet layer: Hv (6 C dk + 4 C dv + 6 dk dv + C^2 / 3)."""
    return sum(gdn_recurrence_terms(s, chunk_size).values())


def mlp_flops(s: Qwen35Spec) -> dict[str, int]:
    """One layer's MLP split as in the breakdown (dense SwiGLU, or router / routed / shared)."""
    d = spec_dims(s)
    if not s.is_moe:
        return {"mlp": 2 * P.mlp_matrices(d, d.ffn), "moe_router": 0, "moe_routed_experts": 0, "moe_shared_expert": 0}
    gate = d.hidden if d.shared_gate else 0  # the shared expert's sigmoid gate (h x 1)
    return {
        "mlp": 0,
        "moe_router": 2 * d.hidden * d.experts,
        "moe_routed_experts": 2 * d.topk * P.mlp_matrices(d, d.moe_ffn),
        "moe_shared_expert": 2 * (P.mlp_matrices(d, d.shared_ffn) + gate),
    }


def lm_head_flops(s: Qwen35Spec) -> int:
    return 2 * P.output_params(spec_dims(s)).split


# --- the whole model -------------------------------------------------------------------------


@dataclass(frozen=True)
class FlopsPerToken:
    """Forward FLOPs per token by component (:data:`COMPONENTS`, summed over layers); training
    figures are :data:`TRAINING_TO_FORWARD` x forward."""

    model: str
    seq_length: int
    chunk_size: int
    mtp_num_layers: int
    forward: dict[str, float]

    @property
    def training(self) -> dict[str, float]:
        return {name: TRAINING_TO_FORWARD * flops for name, flops in self.forward.items()}

    @property
    def forward_total(self) -> float:
        return sum(self.forward.values())

    @property
    def training_total(self) -> float:
        """The model FLOPs per trained token: the numerator of MFU."""
        return TRAINING_TO_FORWARD * self.forward_total


def model_flops_per_token(
    spec: Qwen35Spec | str,
    seq_length: int,
    *,
    mtp_num_layers: int | None = None,
    chunk_size: int = FLA_CHUNK_SIZE,
) -> FlopsPerToken:
    """Training FLOPs per token of ``spec`` at ``seq_length`` (module docstring for the formulas).

    ``mtp_num_layers`` defaults to the spec's (1); pass the recipe's ``cfg.model.mtp_num_layers
    or 0`` when a recipe trains without MTP. For a scaled-down recipe pass
    ``dataclasses.replace(spec, num_layers=cfg.model.num_layers)``.
    """
    s = get_spec(spec) if isinstance(spec, str) else spec
    mtp = s.mtp_num_layers if mtp_num_layers is None else mtp_num_layers
    if mtp < 0:
        raise ValueError(f"mtp_num_layers must be >= 0, got {mtp}")
    attn_layers, gdn_layers = s.num_attention_layers, s.num_gdn_layers
    mlp = mlp_flops(s)
    forward: dict[str, float] = {
        "attention_projections": attn_layers * attention_projection_flops(s),
        "gdn_projections": gdn_layers * gdn_projection_flops(s),
        "gdn_conv": gdn_layers * gdn_conv_flops(s),
        **{name: s.num_layers * flops for name, flops in mlp.items()},
        "lm_head": lm_head_flops(s),
        "attention_core": attn_layers * attention_core_flops(s, seq_length),
        "gdn_recurrence": gdn_layers * gdn_recurrence_flops(s, chunk_size),
        # The MTP layer is a gated-attention layer (as params.py counts it) with the same MLP.
        "mtp_projection": mtp * 2 * P.mtp_own_params(spec_dims(s)).matrices(),
        "mtp_attention_projections": mtp * attention_projection_flops(s),
        "mtp_attention_core": mtp * attention_core_flops(s, seq_length),
        "mtp_mlp": mtp * sum(mlp.values()),
        "mtp_lm_head": mtp * lm_head_flops(s),
    }
    return FlopsPerToken(
        model=s.name,
        seq_length=seq_length,
        chunk_size=chunk_size,
        mtp_num_layers=mtp,
        forward={name: forward[name] for name in COMPONENTS},
    )


def six_n_flops_per_token(spec: Qwen35Spec | str) -> int:
    """OpenRecipes' MFU numerator: 6 x the active matmul parameters N."""
    s = get_spec(spec) if isinstance(spec, str) else spec
    return 6 * P.count_parameters(s).matmul_active
