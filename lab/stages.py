"""Training FLOPs per token of each pipeline stage of a recipe: how evenly a layer split and a
recompute policy spread the work, the basis of the stage-split predictions.

A 1F1B pipeline runs at the pace of its slowest stage (every stage handles every micro batch, and
the bubble depends only on the stage and micro-batch counts), so for two splits of the same model
at the same PP and micro-batch count the predicted step-time ratio is the ratio of their largest
stage costs. Per stage, with the module formulas of :mod:`bridge_recipes.models.flops` (forward
FLOPs per token; training = 3 x forward):

- each decoder layer: its mixer (Gated DeltaNet or gated attention, projections and core) and MLP;
- block recompute of N: the stage's first N layers run their forward once more (+1 x forward);
  full uniform recompute: every layer once more;
- the last stage: the output layer and each MTP layer (its projection, attention layer, MLP and
  second output-layer pass); Megatron-Core does not recompute MTP under the block method;
- the embedding lookup costs no FLOPs (the first stage holds only layers).

What FLOPs leave out: kernels below GEMM efficiency (the DeltaNet recurrence, the attention core)
and memory-bound work (the cross entropy over the vocabulary, norms, the MoE permutation).
"""

from __future__ import annotations

from typing import Any

from bridge_recipes.models import flops as F
from bridge_recipes.models.qwen35 import Qwen35Spec
from bridge_recipes.plan.layout import stage_layers
from bridge_recipes.plan.memory import model_dims


def layer_forward_flops(spec: Qwen35Spec, cfg: Any) -> list[float]:
    """Forward FLOPs per token of each decoder layer of ``cfg`` (its layer pattern)."""
    d, seq = model_dims(cfg.model), cfg.model.seq_length
    attention = F.attention_projection_flops(spec) + F.attention_core_flops(spec, seq)
    gdn = F.gdn_projection_flops(spec) + F.gdn_conv_flops(spec) + F.gdn_recurrence_flops(spec)
    mlp = sum(F.mlp_flops(spec).values())
    return [(gdn if d.layer_pattern[i] else attention) + mlp for i in range(cfg.model.num_layers)]


def head_forward_flops(spec: Qwen35Spec, cfg: Any) -> float:
    """Forward FLOPs per token of the last stage's output layer and MTP layers."""
    mtp = cfg.model.mtp_num_layers or 0
    f = F.model_flops_per_token(spec, cfg.model.seq_length, mtp_num_layers=mtp)
    return f.forward["lm_head"] + sum(f.forward[name] for name in F.MTP_COMPONENTS)


def stage_training_flops(spec: Qwen35Spec, cfg: Any) -> list[float]:
    """Training FLOPs per token of each pipeline stage, recompute included."""
    m = cfg.model
    sizes = stage_layers(cfg)
    if sizes is None:
        raise ValueError("the layers do not split over the pipeline stages (see the layout checks)")
    layers = layer_forward_flops(spec, cfg)
    out, start = [], 0
    for stage, n in enumerate(sizes):
        own = layers[start : start + n]
        if m.recompute_granularity == "full" and m.recompute_method == "block":
            again = sum(own[: min(m.recompute_num_layers or 0, n)])
        elif m.recompute_granularity == "full":
            again = sum(own)
        else:
            again = 0.0
        cost = F.TRAINING_TO_FORWARD * sum(own) + again
        if stage == len(sizes) - 1:
            cost += F.TRAINING_TO_FORWARD * head_forward_flops(spec, cfg)
        out.append(cost)
        start += n
    return out


def balance_ratio(spec: Qwen35Spec, published: Any, candidate: Any) -> float:
    """Predicted step-time ratio, published over candidate: their slowest stages' FLOPs."""
    return max(stage_training_flops(spec, published)) / max(stage_training_flops(spec, candidate))
