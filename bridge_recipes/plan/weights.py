"""Weight memory beyond the BF16 parameters: a frozen base stored in FP8, Transformer Engine's FP8
weight copies (cached between micro batches or cast when used), and the placeholders gradient
accumulation fusion keeps."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bridge_recipes.models.dims import ModelDims
from bridge_recipes.plan.activations import ChunkActivations, mtp_recomputed, recompute_groups
from bridge_recipes.plan.dims import BF16
from bridge_recipes.plan.layout import Layout
from bridge_recipes.plan.params import (
    layer_linears,
    layer_params,
    linear_params,
    lora_targets,
    mtp_layers_params,
    mtp_linear_params,
    padded_vocab,
)
from bridge_recipes.plan.precision import (
    caches_fp8_weights,
    casts_fp8_weights_per_use,
    fp8_base_gemms,
    fp8_frozen_base,
    mixed_precision_config,
)


def fp8_base_saving_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int], stage: int) -> float:
    """What storing the frozen base's linear weights in FP8 saves on a stage: one of their two bytes
    (the norms, router, convolution, embedding and output layer stay BF16)."""
    if not fp8_frozen_base(cfg):
        return 0.0
    mtp = mtp_linear_params(d, par) if stage == par.pp - 1 else 0.0
    return linear_params(d, par, layers) + mtp


def fp8_base_dequantized_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int]) -> float:
    """The backward's BF16 copies of FP8 weights: with BF16 compute, every linear of the recomputed layer
    being differentiated keeps its dequantized weight for that layer's backward (the stage's largest
    layer); with FP8 compute, one GEMM's weight at a time (all of a grouped linear's experts at once)."""
    if not fp8_frozen_base(cfg):
        return 0.0
    per_layer = [[n * m * count for _, n, m, count in layer_linears(d, par, *d.layer_kinds(i))] for i in layers]
    if fp8_base_gemms(cfg) == "bf16":
        return BF16 * max((sum(sizes) for sizes in per_layer), default=0)
    return BF16 * max((size for sizes in per_layer for size in sizes), default=0)


def _fp8_weight_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int]) -> dict[int, float]:
    """An FP8 copy of each layer's weights, data and transpose (2 bytes per parameter), by global layer
    index; none for the layers the preset keeps in BF16 (``num_layers_at_start_in_bf16`` and
    ``num_layers_at_end_in_bf16`` when ``first_last_layers_bf16`` is set)."""
    mp = mixed_precision_config(cfg)
    bf16_ends = getattr(mp, "first_last_layers_bf16", False)
    start = mp.num_layers_at_start_in_bf16 if bf16_ends else 0
    end = len(d.layer_pattern) - (mp.num_layers_at_end_in_bf16 if bf16_ends else 0)
    return {i: 2 * layer_params(d, par, i).total if start <= i < end else 0.0 for i in layers}


def fp8_weight_cache_bytes(cfg: Any, d: ModelDims, par: Layout, layers: list[int], stage: int) -> float:
    """What :func:`caches_fp8_weights` keeps on a stage: each TE linear of an FP8 layer caches its
    weight's FP8 data and FP8 transpose (``_fp8_workspaces``, 2 bytes per parameter) from the first micro
    batch of a step. Layers the preset keeps in BF16 (``first_last_layers_bf16``, by global index) hold
    none; MTP layers run FP8. From Transformer Engine 2.20's ``Linear.forward`` and Megatron-Core
    0.19.2's TE wrappers."""
    if not caches_fp8_weights(cfg):
        return 0.0
    mtp = 2 * mtp_layers_params(d, par).total if stage == par.pp - 1 else 0.0
    return sum(_fp8_weight_bytes(cfg, d, par, layers).values()) + mtp


def fp8_weight_copies(cfg: Any, d: ModelDims, par: Layout, chunks: list[list[int]], stage: int) -> ChunkActivations:
    """What :func:`casts_fp8_weights_per_use` adds to a stage's activations: each TE linear of an FP8 layer
    saves the FP8 weight it cast, data and transpose (2 bytes per parameter), for its backward, a new copy
    every micro batch (Transformer Engine 2.20's ``Linear.forward`` saves ``weightmat``; Megatron-Core
    0.19.2 passes ``is_first_microbatch=None`` with the cache off). A layer that keeps its activations
    holds one per micro batch in flight (``saved``); a recomputed layer holds one while the backward
    rebuilds it (``rebuilt``: one layer at a time under block recompute, n under uniform recompute of
    n)."""
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
        b = 2 * mtp_layers_params(d, par).total
        if mtp_recomputed(m):
            rebuilt = max(rebuilt, b / d.mtp_layers)
        else:
            saved += b
    return ChunkActivations(saved=saved, rebuilt=rebuilt)


def stage_weight_gemms(d: ModelDims, par: Layout, layers: list[int], stage: int) -> Counter[tuple[int, int]]:
    """The weights on a stage whose gradient a GEMM computes, counted by (out, in) shape on one rank: each
    layer's two mixer projections, each routed expert's two matrices (Transformer Engine's grouped
    linear keeps one weight per expert), the shared expert's or the dense MLP's two; on the last stage
    the output layer (tied to the embedding or not) and each MTP layer's 2h -> h projection, attention
    and MLP."""
    weights: Counter[tuple[int, int]] = Counter()

    def layer(gdn: bool, moe: bool) -> None:
        for _, inp, out, count in layer_linears(d, par, gdn, moe):  # a shared expert's shape may be the experts'
            weights[(out, inp)] += count

    for i in layers:
        layer(*d.layer_kinds(i))
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
    Megatron-Core 0.19.2's ``ColumnParallelLinear`` (the output layer) alike; the output layer's
    (vocabulary x hidden) is the big one; the measured check is in docs/memory_plan.md. None with LoRA
    (the frozen base weights have no ``main_grad``; the adapters' placeholders are small)."""
    if not getattr(cfg.model, "gradient_accumulation_fusion", False) or lora_targets(cfg) is not None:
        return 0.0
    return BF16 * sum(out * inp for out, inp in stage_weight_gemms(d, par, layers, stage).keys())
