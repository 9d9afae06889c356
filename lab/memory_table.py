"""docs/memory_plan.md: the memory planner against the measured H200 peaks and the published facts.

Each measured run's config is rebuilt as the runner built it (recipe, scale-down, flags and
overrides of its log's '===== run' header, as :func:`bridge_recipes.build` keywords), planned
with :func:`bridge_recipes.plan.memory.plan_memory` on one GPU, and compared with the run's peak:
the largest ``mem-max-allocated-gigabytes`` (GB = 1e9 bytes) in its committed log. The
published facts (8-GPU layouts of the sources in docs/sources.md) are planned the same
way. Nothing is fitted here: this only reads.
``scripts/memory_table.py`` writes (or checks) the page from :func:`render`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import bridge_recipes
from bridge_recipes.hardware.gpus import GPUS
from bridge_recipes.logs.megatron_log import peak_allocated_gb
from bridge_recipes.logs.run_log import split_runs
from bridge_recipes.plan.memory import (
    FRAMEWORK_CONSTANT_GB,
    FRAMEWORK_FRACTION,
    GPU_MEMORY_GB,
    ONE_GPU_CONSTANT_GB,
    ONE_GPU_FRACTION,
    ONE_GPU_MIN_SLACK_GB,
    MemoryPlan,
    plan_memory,
)
from lab import ROOT

REPO = ROOT
DOC = REPO / "docs" / "memory_plan.md"
TOLERANCE = 0.15


NO_RECOMPUTE = ("model.recompute_granularity=null", "model.recompute_method=null", "model.recompute_num_layers=null")


@dataclass(frozen=True)
class MeasuredRun:
    recipe: str
    scaling: str  # what was changed from the recipe, as run
    log: str
    run: str | None = None  # run name inside a multi-run log
    # the bridge_recipes.build keywords of the runner arguments it ran with (its log's '===== run' header)
    request: Mapping[str, Any] = field(default_factory=dict)

    def config(self) -> Any:
        """The config as the run had it: gradient-accumulation fusion as its log shows (the runs here
        predate ``bridge_recipes.features.te_wgrad``; on the GPU host without APEX the runner turned it off)."""
        from bridge_recipes.features import te_wgrad

        cfg = build(self.recipe, self.request)
        cfg.model.gradient_accumulation_fusion = te_wgrad.ran_fused(cfg, run_text(self))
        return cfg


SCALED_35B = {"scale_down": 4, "scale_experts": 32, "flags": {"gb": 4}}
SCALED_27B = {"scale_down": 4, "flags": {"gb": 4}}
MEASURED_RUNS = (
    MeasuredRun(
        "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config",
        "as built (4 layers, 256 experts, seq 4096, full uniform 1), TE cross entropy as in its log",
        # the smoke run's log shows cross_entropy_fusion_impl 'te' (the recipe later moved to 'native')
        "lab/evidence/smoke_qwen35_35b_a3b_1gpu_h200.log",
        request={"overrides": ("model.cross_entropy_fusion_impl=te",)},
    ),
    MeasuredRun(
        "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
        "scale_down(num_layers=4, num_experts=32, global_batch_size=4); seq 8192, full uniform 1",
        "lab/evidence/h200_qwen35_35b_a3b_policies.log",
        run="reference",
        request=SCALED_35B,
    ),
    MeasuredRun(
        "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
        "same, recompute off",
        "lab/evidence/h200_qwen35_35b_a3b_policies.log",
        run="no_recompute",
        request={**SCALED_35B, "overrides": NO_RECOMPUTE},
    ),
    MeasuredRun(
        "qwen35_27b_sft_8gpu_h200_bf16_config",
        "scale_down(num_layers=4, global_batch_size=4); seq 8192, block recompute 3 of 4",
        "lab/evidence/h200_qwen35_27b_sft_rows.log",
        request=SCALED_27B,
    ),
    MeasuredRun(
        "qwen35_27b_sft_8gpu_h200_bf16_config",
        "same, recompute off",
        "lab/evidence/h200_qwen35_27b_policies.log",
        run="no_recompute",
        request={**SCALED_27B, "overrides": NO_RECOMPUTE},
    ),
)


# The one measured pair that isolates selective recompute: the VL family's GB300 policy
# (selective recompute of moe_act and layernorm) and the same run with recompute off, from the
# VL evidence suite. The planner does not count the vision tower, so the
# pair is compared by its difference. The policy's run is the suite's "killed" one (the same
# config as its "reference" run, stopped at step 7): the suite's first run, "reference", holds
# 2.5 GB more static memory after its first step than every later run (50.51 against 48.02 GB
# allocated) and peaks at 123.38 GB.
SCALED_VL = {"scale_down": 4, "scale_experts": 64, "flags": {"gb": 4}}
VL_SUITE_LOG = "lab/evidence/h200_qwen35_vl_35b_a3b_suite.log"
SELECTIVE_PAIR = (
    MeasuredRun(
        "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
        "scale_down(num_layers=4, num_experts=64, global_batch_size=4); selective recompute of moe_act, layernorm",
        VL_SUITE_LOG,
        run="killed",
        request=SCALED_VL,
    ),
    MeasuredRun(
        "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
        "same, recompute off",
        VL_SUITE_LOG,
        run="no_recompute",
        request={**SCALED_VL, "overrides": NO_RECOMPUTE},
    ),
)


def selective_saving() -> dict[str, float]:
    """What selective recompute saves on the measured pair: measured and planned, GB."""
    measured_selective, measured_off = (measured_peak_gb(r) for r in SELECTIVE_PAIR)
    planned_selective, planned_off = (plan_memory(r.config(), 1).peak_allocated_gb for r in SELECTIVE_PAIR)
    return {
        "measured_selective_gb": measured_selective,
        "measured_off_gb": measured_off,
        "measured_saving_gb": measured_off - measured_selective,
        "planned_saving_gb": planned_off - planned_selective,
    }


def build(recipe: str, request: Mapping[str, Any] | None = None) -> Any:
    """The config the runner builds for ``recipe`` and the bridge_recipes.build keywords ``request``."""
    return bridge_recipes.build(recipe, **(request or {}))


@cache
def _log_text(log: str) -> str:
    return (REPO / log).read_text()


@cache
def _log_runs(log: str) -> dict[str, str]:
    return split_runs(_log_text(log))


def run_text(run: MeasuredRun) -> str:
    """The run's part of its log (read and split once a log: its peak and its fusion both come from it)."""
    if run.run is None:
        return _log_text(run.log)
    runs = _log_runs(run.log)
    if run.run not in runs:
        raise KeyError(f"no run {run.run!r} in {run.log}")
    return runs[run.run]


def measured_peak_gb(run: MeasuredRun) -> float:
    """The largest mem-max-allocated-gigabytes over the run's memory lines and ranks."""
    peak = peak_allocated_gb(run_text(run))
    if peak is None:
        raise ValueError(f"no memory lines in {run.log} (run {run.run})")
    return peak


@dataclass(frozen=True)
class Row:
    run: MeasuredRun
    measured_gb: float
    plan: MemoryPlan

    @property
    def predicted_gb(self) -> float:
        return self.plan.peak_allocated_gb

    @property
    def error(self) -> float:
        return self.predicted_gb / self.measured_gb - 1


def rows() -> list[Row]:
    return [Row(r, measured_peak_gb(r), plan_memory(r.config(), 1, gpu="h200")) for r in MEASURED_RUNS]


# --- published facts (8 x H200) --------------------------------------------------------------


def pp2(method: str, layers: int) -> dict[str, Any]:
    """The 27B recipe at PP2 with an even split and the given recompute (build keywords)."""
    return {
        "flags": {"pp": 2},
        "overrides": (
            "model.num_layers_in_first_pipeline_stage=null",
            "model.num_layers_in_last_pipeline_stage=null",
            f"model.recompute_method={method}",
            f"model.recompute_num_layers={layers}",
        ),
    }


@dataclass(frozen=True)
class Fact:
    label: str
    recipe: str
    change: str
    request: Mapping[str, Any] = field(default_factory=dict)  # bridge_recipes.build keywords


FACTS = (
    Fact(
        "1", "qwen35_27b_sft_8gpu_h200_bf16_config", "PP2 32/32, recompute of every layer (block 32)", pp2("block", 32)
    ),
    Fact("1", "qwen35_27b_sft_8gpu_h200_bf16_config", "PP2 32/32, block recompute 12 kept", pp2("block", 12)),
    Fact("2", "qwen35_27b_sft_8gpu_h200_bf16_config", "as built: PP4 16/17/17/14, block 12"),
    Fact(
        "2",
        "qwen35_27b_sft_8gpu_h200_bf16_config",
        "block recompute 10",
        {"overrides": ("model.recompute_num_layers=10",)},
    ),
    Fact("3", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "as built: EP8, 8,192 tokens, no offload"),
    Fact("4", "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config", "as built: TP2 SP CP2 EP8, seq 32,768, CPU offload"),
)


def fact_plans() -> list[tuple[Fact, MemoryPlan]]:
    return [(f, plan_memory(build(f.recipe, f.request), 8, gpu="h200")) for f in FACTS]


def fact_plan(fps: list[tuple[Fact, MemoryPlan]], change: str) -> MemoryPlan:
    """The plan of the fact whose change is ``change``."""
    return next(p for f, p in fps if f.change == change)


# --- markdown --------------------------------------------------------------------------------


def _measured_table(rs: list[Row]) -> str:
    lines = ["| recipe | scaling | measured GB | predicted GB | error | source log |", "|---|---|---:|---:|---:|---|"]
    for r in rs:
        src = f"`{r.run.log}`" + (f" (run `{r.run.run}`)" if r.run.run else "")
        lines.append(
            f"| `{r.run.recipe}` | {r.run.scaling} | {r.measured_gb:.2f} | {r.predicted_gb:.2f} | "
            f"{100 * r.error:+.1f}% | {src} |"
        )
    return "\n".join(lines)


def _breakdown_table(rs: list[Row]) -> str:
    lines = [
        "| run | weights | grads | optimizer | saved activations | logits | backward | allocated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        s = r.plan.stages[0]
        name = r.run.run or r.run.recipe.replace("_config", "")
        lines.append(
            f"| {name} | {s.weights_gb:.2f} | {s.grads_gb:.2f} | {s.optimizer_gb:.2f} | {s.activations_gb:.2f} | "
            f"{s.logits_gb:.2f} | {s.backward_gb:.2f} | {s.allocated_gb:.2f} |"
        )
    return "\n".join(lines)


TWO_GPU_LOG = "lab/evidence/two_gpu/h200x2_qwen35_35b_a3b_layouts.log"


def _two_gpu_table() -> str:
    from lab.evidence import two_gpu_results

    lines = ["| layout | parallel layout | measured | predicted | error |", "|---|---|---|---|---|"]
    for r in two_gpu_results("qwen35_35b_a3b", (REPO / TWO_GPU_LOG).read_text()):
        pairs = [(m, p) for m, p in zip(r["measured_gb"], r["predicted_gb"]) if m is not None]
        lines.append(
            f"| {r['layout']} | {r['parallel']} | {' / '.join(f'{m:.1f}' for m, _ in pairs)} | "
            f"{' / '.join(f'{p:.1f}' for _, p in pairs)} | {' / '.join(f'{100 * (p / m - 1):+.1f}%' for m, p in pairs)} |"
        )
    return "\n".join(lines)


def _facts_table(fps: list[tuple[Fact, MemoryPlan]]) -> str:
    lines = [
        f"| fact | recipe | change | per-stage total GB (allocated) | peak stage | fits {GPU_MEMORY_GB['h200']:.1f} GB |",
        "|---|---|---|---|---:|---|",
    ]
    for f, p in fps:
        stages = ", ".join(f"{s.total_gb:.1f} ({s.allocated_gb:.1f})" for s in p.stages)
        lines.append(
            f"| {f.label} | `{f.recipe}` | {f.change} | {stages} | {p.peak_stage} | "
            f"{'yes' if p.fits else 'no: stage ' + ', '.join(map(str, p.stages_over()))} |"
        )
    return "\n".join(lines)


def card_table() -> str:
    """The cards ``--gpu`` plans for, smallest memory first: the names it takes, the memory sold and
    reported, the compute capability and whether the card has FP8 tensor cores."""
    lines = [
        "| `--gpu` | sold as, GB | CUDA reports, GB (1e9 bytes) | compute capability | FP8 |",
        "|---|---|---|---|---|",
    ]
    for gpu in sorted(GPUS.values(), key=lambda g: (g.usable_memory_gb, g.name)):
        names = ", ".join(f"`{n}`" for n in (gpu.name.lower(), *(c.lower() for c in gpu.same_class)))
        major, minor = gpu.capability
        fp8 = "yes" if gpu.fp8 else "no"
        lines.append(f"| {names} | {gpu.memory_gb} | {gpu.usable_memory_gb:.1f} | {major}.{minor} | {fp8} |")
    return "\n".join(lines)


def render(rs: list[Row] | None = None, fps: list[tuple[Fact, MemoryPlan]] | None = None) -> str:
    rs = rows() if rs is None else rs
    fps = fact_plans() if fps is None else fps
    smoke_native = plan_memory(replace(MEASURED_RUNS[0], request={}).config(), 1).peak_allocated_gb
    sel = selective_saving()
    capacities = ", ".join(f"{k} {v:.1f}" for k, v in GPU_MEMORY_GB.items())
    return f"""# Memory plan: per-GPU memory of a recipe before launch

`bridge_recipes.plan.memory.plan_memory(cfg, world_size, gpu_memory_gb=None, gpu=None)` predicts,
per pipeline stage, the memory of the busiest rank; `plan_report(cfg, world_size, gpu)` gives the
runner's `--plan` text and whether every stage fits. This page is written by
`scripts/memory_table.py` (do not edit by hand; rerun it).

Units: **GB = 1e9 bytes**, as Megatron-Bridge logs memory (`mem-max-allocated-gigabytes` is
torch's byte count / 1.0e9). GPU memory in the same unit: {capacities}: what each device reports
to CUDA, less than the card's name and than nvidia-smi's total (the test host's H200 lists 143,771 MiB
and reports 139.80 GiB = 150.1 GB; its H100 80GB HBM3 reports 79.18 GiB = 85.0 GB); the A100's and
L40S's are the figures their owners' out-of-memory messages print (79.15 and 44.42 GiB), the others
nominal, read as GiB.
The choice matters at the margin: read as 141e9 bytes, the H200 would not hold the shipped 27B
PP4 layout (fact 2, {fact_plan(fps, "as built: PP4 16/17/17/14, block 12").peak_gb:.1f} GB with overhead), which ran on it.

## Formulas (per rank of a stage)

| component | bytes |
|---|---|
| weights | 2 x local parameters (BF16). Stage = its decoder layers, + embedding on the first stage, + final norm, output layer and MTP on the last (with PP > 1, also the embedding copy Megatron-Core builds for MTP there). Attention, GDN, dense MLP, shared expert, vocabulary: / TP; norms and router replicated; routed experts / EP / ETP. With FP8 GEMMs on BF16 parameters and the parameter transpose cache on, + 2 x the parameters of the FP8 layers (Transformer Engine's cached FP8 weight and transpose; the preset's first and last layers stay BF16, MTP layers count): measured on the 27B's 4-layer proxy (1 x H200), 101.55 GB allocated against 101.87 planned. With gradient-accumulation fusion (`gradient_accumulation_fusion`, on unless turned off), + 2 x the elements of each distinct weight shape of the stage (Transformer Engine's `get_dummy_wgrad` keeps one BF16 placeholder gradient a shape for the life of the process; the output layer's is the largest): 1.128 GB on the 35B-A3B, measured as the difference between its proxies with and without fusion at 4 and at 16 layers (1 x H200). The earlier runs measured here ran without fusion and are planned so. LoRA on a base stored in FP8 (`policy.fp8_frozen_base`): the decoder's and MTP's linear weights at 1 byte (row-wise FP8, no transpose kept; embedding, output layer, norms and router stay 2), and in the backward working set the BF16 copies of the dequantized weights: with BF16 compute (the default) every linear of the recomputed layer being differentiated (the largest layer), with FP8 compute the largest linear alone (a grouped linear's experts together). |
| gradients | Megatron DDP grad buffer over every local parameter: 4 (FP32, `grad_reduce_in_fp32`, set by the `bf16_mixed` preset) or 2. |
| optimizer | (master + exp_avg + exp_avg_sq) / sharding group: dense params over DP x CP, expert params over world / (PP x EP x ETP). Master = 4 (FP32, Megatron's own shard; this is what `bf16_mixed` recipes get, because the preset leaves `fp8_recipe="tensorwise"` in the optimizer config), or, when TE's FusedAdam owns it (`use_precision_aware_optimizer_no_fp8_or_ds_fp8`), a 2-byte remainder next to the BF16 weight (FP32 main params) or a 2-byte copy (BF16 main params). CPU offload fraction f moves f of it (and FP32 copies of params and grads) to the host. |
| saved activations | per layer, the tensors its backward keeps (below), for a micro batch of seq / CP tokens (/ TP in the residual stream under sequence parallelism), times the micro batches in flight: 1F1B min(PP - stage, micro batches), interleaved (PP - stage - 1) x 2 + (VPP - 1) x PP + 1 model chunks. Full uniform recompute of n: one input per n layers; block n: the first n layers of each (virtual) stage keep their input, the others everything; none: everything. MTP is checkpointed under uniform full recompute only. With FP8 GEMMs on BF16 parameters and the transpose cache off (`disable_parameter_transpose_cache`, each weight cast when used), + 2 x the parameters of each FP8 layer that keeps its activations (the FP8 weight and transpose its TE linears cast and save for the backward, a new copy every micro batch), and the copies of the recomputed layers being rebuilt in the backward working set (one layer under block recompute, n under uniform recompute of n): measured on the 27B's 4-layer proxy (1 x H200), 100.78 GB allocated against 101.1 planned with the copies, 99.48 without. |
| logits (last stage) | L = seq / CP x vocab / TP elements per loss (LM + one per MTP layer). TE fused cross entropy: 2L kept per loss, peak 2L x (MTP losses) + 4L. Megatron's native fused kernel: 4L (FP32 softmax) kept per loss, peak 4L x (MTP losses) + 2L (BF16 logits) + 4L (FP32 copy) + 4L (out-of-place result of the `torch.compile`d in-place updates). Unfused: 4L x (MTP losses) + 6L. The loss a chunk of tokens at a time (`features.chunked_loss.enabled=true`, tensor parallel size 1): one chunk's BF16 logits, FP32 copy and gradient (8 bytes per logit, about 2 GB) and a few floats per token per loss. |
| backward working set | the largest group of layers a recompute rebuilds at once, less what the backward has already released (block recompute), plus two [tokens x top-k, hidden] dispatch buffers of a MoE layer. Not simultaneous with the logits: the larger of the two counts. |
| first step | with the loss a chunk at a time and recomputed Gated DeltaNet layers, the first step keeps one such layer's backward working set (FLA's chunk backward: h and dh per chunk, seven key-width and seven value-width tensors, the WY matrix, six hidden-state tensors; its MLP's dequantized weights when an FP8 base multiplies in BF16) allocated beside the layer being differentiated and past the step's end, while the optimizer's moments do not exist yet (the first optimizer step allocates them). The planned peak is the larger of that step's and a later one's. Measured, not traced to the code that holds it: the allocator snapshot after the first step of the 27B's 80 GB recipe (`lab/evidence/lora_memory_classes/qwen35_27b_h100_first_step_snapshot.json`, 1 x H100, the run's log beside it: `qwen35_27b_h100_first_step_snapshot.log`) sums the kept blocks to 5.30 GB against 5.27 planned; the 35B-A3B's 80 GB run kept 1.46 GB (1.44 planned). |
| overhead | {FRAMEWORK_CONSTANT_GB:g} GB (CUDA context ~0.6, cuBLAS/TE workspaces ~0.2, NCCL communicator buffers ~1.2) + {100 * FRAMEWORK_FRACTION:g}% of the allocated peak (caching-allocator slack; the H200 runs reserved 0.7-2.6% above the allocated peak for the 35B-A3B runs, 13% for the 27B run). One GPU (no NCCL communicator buffers): {ONE_GPU_CONSTANT_GB:g} GB + {100 * ONE_GPU_FRACTION:g}% of the allocated peak, at least {ONE_GPU_MIN_SLACK_GB:g} GB: the most the one-GPU logs measured outside the allocator (1.0-1.5 GB) and reserved above the allocated peak (0.2-3.6%, 0.8-1.0 GB on the small runs). Outside torch's allocated count, so not in the measured comparison; counted for `fits`. |

Per-layer saved tensors (BF16 elements per token; FP32 tensors count twice; "/TP" marks features
split by tensor parallelism):

- every layer: its input and the residual after the mixer (2h).
- Gated DeltaNet: norm output (h, fused norm + in_proj), in_proj output kept alive by the conv's
  saved view ((2 qk + 2 v + 2 Hv)/TP), L2-normalised q, k (2 qk/TP), q and k repeated to the
  value heads (2 Hv dk/TP), v and gate z (2 v/TP), the chunk-local WY matrix A (64 Hv/TP), decay
  g (FP32) and beta (3 Hv/TP), kernel output and gated-norm output (2 v/TP).
- gated attention (flash / cuDNN fused, no s x s matrix): norm output (h), QKV+gate output
  ((2 q + 2 kv)/TP), q and k after QK norm and RoPE ((q + kv)/TP), contiguous v (kv/TP),
  attention output (q/TP), log-sum-exp (FP32, 2 heads/TP), gated output (q/TP).
- dense MLP (SwiGLU, `bias_activation_fusion` off): norm output (h), fc1 output, silu output,
  linear half + offset, product (5 ffn/TP; 3 ffn/TP when fused).
- MoE (alltoall, grouped GEMM): norm output (h), FP32 router input (2h), three FP32 [tokens,
  experts] tensors (6E), dispatched tokens (top-k x h, x ETP), FP32 permuted probs (2 top-k),
  expert SwiGLU intermediates and the probability-weighted copy (6 ffn x top-k), shared expert
  (5 ffn_shared/TP) and its gated output (h). Routing is assumed balanced.
- MTP layer: an attention layer with the model's MLP, plus the shifted-token embedding, the
  concatenated normed pair and its final-norm input (4h); checkpointed: its two inputs (2h).
- last stage: final-norm input and the output layer's input (LM + MTP hidden states).

Where the terms come from: the per-tensor terms are read off the Megatron-Core 0.19.2,
Transformer Engine 2.20.2 and flash-linear-attention 0.6.0 code paths these recipes take
(`ssm/gated_delta_net`, `transformer/attention.py`, `transformer/moe/*`, `fusions/fused_cross_entropy.py`,
`transformer_engine/pytorch/cross_entropy.py`, `fla/ops/gated_delta_rule/chunk.py`). One term is
inferred rather than read: the native cross entropy's extra 4L, which is how `torch.compile`
functionalises the in-place updates of an input; the 27B and 35B-A3B runs (native) need it and
the smoke run (TE) does not, and it is the same term in both native runs. No constant was fitted
to the measurements; the overhead fraction is the one global fudge term and does not enter the
measured comparison.

## Measured peaks (1 x H200, torch max allocated)

{_measured_table(rs)}

Tolerance {100 * TOLERANCE:g}% (`tests/unit/test_memory_plan.py`). The smoke run's log shows
`cross_entropy_fusion_impl: 'te'`; the recipe now builds `'native'`, for which the plan gives
{smoke_native:.2f} GB (not measured). Static memory in these runs is 18 bytes per parameter
(2 weight + 4 FP32 grad + 12 optimizer): the logged allocated memory after a step is within
0.1-0.7 GB of it.

Breakdown of the predictions (GB):

{_breakdown_table(rs)}

## Two H200s (GB per pipeline stage, torch max allocated)

{_two_gpu_table()}

From `lab/evidence/two_gpu/h200x2_qwen35_35b_a3b_layouts.log` (the 35B-A3B SFT
policy scaled to 8 layers and 64 experts, global batch 8 x 8,192 tokens; `lab/evidence/two_gpu/`).
Before these runs the planner put the PP2 last stage at 59.3 GB: it did not count the embedding
copy Megatron-Core builds on the MTP stage. It does now.

## Published facts (8 x H200, GB per rank, total = allocated + overhead)

{_facts_table(fps)}

1. openrecipes-27b-h200 (docs/sources.md): "PP 2 at TP 1 ran out of memory on the last stage, which holds the FP32 logits".
   With every layer recomputed the last stage is over (weights + FP32 grads + a quarter of the
   optimizer state are already ~125 GB, then the 28.5 GB loss working set) and the first stage
   fits. Keeping block recompute 12 at PP2 leaves 20 layers per stage un-recomputed: both stages
   are far over and the first (two micro batches in flight) is the larger: the source's account
   fits a run that recomputed (nearly) every layer.
2. openrecipes-27b-h200: block 12 fits with little room, on the first stage (four micro batches in
   flight) and on the last (output layer, logits, MTP with its embedding copy); block 10 is over on
   the first stage.
3. openrecipes-35b-h200: EP8 at 8,192 tokens per GPU fits with the optimizer on the GPU.
4. opd-35b-h200 reports a peak near 124 GB of 143 for its on-policy-distillation job. The recipe as
   built (plain SFT, optimizer state on the host, no teacher model, no colocated rollout engine)
   plans at about a half of that, outside a 15% band: the source's figure measures a different
   job (student and teacher models in memory, an SGLang engine sharing the GPU, 24-32k-token
   rollouts) and is not a check of this recipe. The same layout with the optimizer state on the
   GPU plans near 123 GB; that agreement is not evidence either, since the source states the offload.

## Selective recompute (one measured pair)

Selective recompute is counted module by module (`selective_saving_elems`: what each of
Megatron-Core's `recompute_modules` stops keeping per layer, and one layer's share rebuilt during
the backward). The one measured pair (`{VL_SUITE_LOG}`, runs `killed` and `no_recompute`: the VL
35B-A3B GB300 policy at 4 layers, 64 experts, 16,384-token micro batches, selective recompute of
moe_act and layernorm, against recompute off): measured {sel["measured_off_gb"]:.2f} -> {sel["measured_selective_gb"]:.2f} GB,
a saving of {sel["measured_saving_gb"]:.2f} GB; planned saving {sel["planned_saving_gb"]:.2f} GB. The plan counts
more saving than was measured ({sel["planned_saving_gb"] / sel["measured_saving_gb"]:.1f}x): a selective layout that
fits by less than that margin is not known to fit.

## Limits

Balanced expert routing (a hot EP rank holds more dispatched tokens); FP8 recipes counted in
BF16 (besides the FP8 weight cache and weight copies above); selective recompute checked on one measured pair (above); VL recipes: the vision tower is not counted; VPP with uneven first/last stages approximated by
splitting each stage's layers evenly; the first iteration (optimizer state created lazily,
kernel autotuning) is not modelled.

## A smaller card on a larger GPU

`run_recipe.py --plan --gpu-memory-gb GB` plans for GB instead of the recipe's GPU and, when it does
not fit, names the recipes of the same model and task planned to fit GB. At launch the same option
caps PyTorch's caching allocator so that it, plus what the process holds outside it, stays within GB
(`bridge_recipes.hardware.gpu_memory`): an allocation past the cap fails as on the card, and the run's log
ends with its peak against the cap. A recipe started on a GPU with less memory than its own, where
the plan does not fit, or FP8 on a GPU without FP8 tensor cores, is refused before launch with the
recipes that fit (`bridge_recipes.recipes.gpu_fit`).

`--gpu NAME` plans for a card by name instead: the memory its CUDA runtime reports (what torch's
out-of-memory message prints as its total, below the size it is sold as), and, at `--plan` and the dry
run, its architecture: an FP8 recipe on a card without FP8 (Ampere: A100, A6000) exits 2 naming the
recipes the card can run. Case, spaces, hyphens and a leading `nvidia` are ignored (`"RTX 6000 Ada"`,
`NVIDIA-H100-PCIe`, `4090`); `bridge_recipes/hardware/gpus.py` says where each figure comes from.

{card_table()}
"""
