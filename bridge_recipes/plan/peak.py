"""Each pipeline stage's peak memory on its busiest rank, and whether it fits the GPU: the sum of the
parts the other ``bridge_recipes.plan`` modules count, plus the framework's overhead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.hardware.gpus import GB, GPUS
from bridge_recipes.models.dims import ModelDims
from bridge_recipes.models.qwen35 import is_vlm
from bridge_recipes.plan.activations import (
    SELECTIVE_MODULES,
    chunk_activations,
    dispatch_buffer_bytes,
    gdn_backward_elems,
    head_activation_bytes,
    mtp_activation_bytes,
    mtp_recomputed,
    recompute_groups,
    selective_modules,
)
from bridge_recipes.plan.dims import BF16, FP32, Tokens, micro_batch_tokens, model_dims, parallel_layout
from bridge_recipes.plan.layout import Layout
from bridge_recipes.plan.logits import cross_entropy_kind, logits_peak_bytes
from bridge_recipes.plan.optimizer import (
    moment_bytes_per_param,
    offload_fraction,
    optimizer_bytes_per_param,
    optimizer_shard_params,
)
from bridge_recipes.plan.params import Params, layer_linears, lora_params, lora_targets, stage_params
from bridge_recipes.plan.precision import (
    caches_fp8_weights,
    casts_fp8_weights_per_use,
    effective_precision,
    fp8_base_gemms,
    fp8_frozen_base,
)
from bridge_recipes.plan.schedule import micro_batches_in_flight, num_microbatches, stage_chunks
from bridge_recipes.plan.weights import (
    fp8_base_dequantized_bytes,
    fp8_base_saving_bytes,
    fp8_weight_cache_bytes,
    fp8_weight_copies,
    fused_wgrad_placeholder_bytes,
)

# Device memory in GB (1e9 bytes) of the GPU types the recipes are written for, from the one
# GPU table (bridge_recipes.hardware.gpus: the H200's is the test host's measured figure); the H200
# first, the planner's default.
DEFAULT_GPU = "h200"
GPU_MEMORY_GB = {
    key: GPUS[key.upper()].usable_memory_gb for key in (DEFAULT_GPU, "h100", "a100", "l40s", "b200", "gb300")
}

# Outside torch's allocator: the CUDA context, cuBLAS / Transformer Engine workspaces and the NCCL
# communicator buffers of the model's process groups (the constant); the caching allocator reserves
# more than it allocates (the fraction of the allocated peak, one global term: it decides fits, not
# the comparison with the measured peaks). The measured reserves: docs/memory_plan.md.
FRAMEWORK_CONSTANT_GB = 2.0
FRAMEWORK_FRACTION = 0.05
# One GPU: no NCCL communicator buffers. The project's one-GPU runs measured 1.0-1.5 GB
# outside the allocator and a reserve 0.2-3.6% (at most 2.9 GB) above the allocated peak: the largest
# of each, with the slack at least the 1.1 GB the small runs reserved.
ONE_GPU_CONSTANT_GB = 1.5
ONE_GPU_FRACTION = 0.04
ONE_GPU_MIN_SLACK_GB = 1.1


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
    first_step_retained_gb: float = 0.0  # a layer's backward working set the first step keeps beside it
    moments_gb: float = 0.0  # the optimizer's moments, allocated by the first optimizer step
    one_gpu: bool = False  # a one-GPU run: its own framework overhead (framework_overhead_gb)

    @property
    def peak_extra_gb(self) -> float:
        """Logits and backward working set do not coexist: the loss ends before the backward
        reaches the decoder layers."""
        return max(self.logits_gb, self.backward_gb)

    @property
    def kept_gb(self) -> float:
        """What a later step holds throughout: weights, gradients, optimizer state, saved activations."""
        return self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb

    @property
    def first_step_gb(self) -> float:
        """The first step's peak: no optimizer moments yet, and the backward working set of the layer
        :func:`first_step_retained_bytes` names beside the one being differentiated."""
        return self.kept_gb - self.moments_gb + max(self.logits_gb, self.backward_gb + self.first_step_retained_gb)

    @property
    def allocated_gb(self) -> float:
        """Comparable with Megatron's ``mem-max-allocated-gigabytes``: the larger of a later step's peak
        and the first step's."""
        return max(self.kept_gb + self.peak_extra_gb, self.first_step_gb)

    @property
    def overhead_gb(self) -> float:
        return framework_overhead_gb(self.allocated_gb, self.one_gpu)

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


def framework_overhead_gb(allocated_gb: float, one_gpu: bool = False) -> float:
    if one_gpu:
        return ONE_GPU_CONSTANT_GB + max(ONE_GPU_FRACTION * allocated_gb, ONE_GPU_MIN_SLACK_GB)
    return FRAMEWORK_CONSTANT_GB + FRAMEWORK_FRACTION * allocated_gb


def first_step_retained_bytes(cfg: Any, d: ModelDims, par: Layout, tok: Tokens, chunks: list[list[int]]) -> float:
    """With the loss a chunk at a time and recomputed Gated DeltaNet layers, the first step keeps one such
    layer's backward working set (:func:`gdn_backward_elems`, and its MLP's dequantized weights when an
    FP8 base multiplies in BF16) allocated through the next layer's backward and past the step's end; a
    later step does not. Measured, not derived from the code that holds it (docs/memory_plan.md)."""
    if cross_entropy_kind(cfg) != "chunked":
        return 0.0
    rebuilt = [i for c in chunks for g in recompute_groups(cfg.model, c) for i in g if d.layer_kinds(i)[0]]
    if not rebuilt:
        return 0.0
    mlp = 0.0
    if fp8_frozen_base(cfg) and fp8_base_gemms(cfg) == "bf16":
        linears = [layer_linears(d, par, *d.layer_kinds(i)) for i in rebuilt]
        mlp = max(sum(n * m * c for name, n, m, c in ls if name.startswith("linear_fc")) for ls in linears)
    return BF16 * (gdn_backward_elems(d, par, tok) + mlp)


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
        logits = logits_peak_bytes(d, par, tok, cross_entropy_kind(cfg), cfg.features.chunked_loss.chunk_tokens)
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
    moments = opt_params * moment_bytes_per_param(cfg) * (1 - host)
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
        first_step_retained_gb=first_step_retained_bytes(cfg, d, par, tok, chunks) / GB,
        moments_gb=moments / GB,
        one_gpu=par.world == 1,
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
        copies = (
            "a recomputed layer's dequantized weights"
            if fp8_base_gemms(cfg) == "bf16"
            else "the backward's dequantized copy of the largest one"
        )
        notes.append(
            f"FP8 base: the frozen linear weights counted at one byte (row-wise FP8), {copies} in bwd; "
            "activations counted in BF16 (an upper bound)"
        )
    elif effective_precision(cfg)["fp8"]:
        notes.append("FP8: activations and weights counted in BF16 (an upper bound)")
        if caches_fp8_weights(cfg):
            notes.append(
                "FP8 with BF16 parameters: Transformer Engine's cached FP8 weight copies counted (2 bytes per "
                "parameter of the FP8 layers; model.disable_parameter_transpose_cache=true casts each weight when "
                "used instead)"
            )
        if casts_fp8_weights_per_use(cfg):
            notes.append(
                "FP8 with BF16 parameters cast when used: the FP8 weight each micro batch keeps for its backward "
                "counted (2 bytes per parameter of the FP8 layers that keep their activations, per micro batch in "
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
