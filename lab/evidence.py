"""The checks a run must pass to count as functional evidence, on loss curves (step -> loss).

One definition, applied both by the GPU suite to live runs (``lab/tests/gpu/test_h200_evidence.py``)
and by a CPU test to the logs committed under ``lab/evidence/``.

Tolerances, and why:
- training: at least 10 logged steps, every loss finite, the best of the last three below
  90% of the first (a few steps at a raised learning rate move a random-init model that much).
- policies: two execution policies of one model on the same data compute the same math; their
  curves are compared with Megatron-Bridge's validate_convergence rules
  (:func:`bridge_recipes.bench.convergence.compare`).
- resume: the first step after the restart runs from the checkpoint the killed run wrote, so
  it must reproduce the killed run's own loss at that step to the printed precision (7
  significant digits: 1e-6 relative) - the proof that weights, optimizer state, RNG and data
  position were restored. Against an uninterrupted run, every resumed step must agree to
  ``RESUME_RTOL``: backward kernels with atomics (TE, FLA) make two uninterrupted runs differ
  by up to ~1e-3 relative by step 6 on the H200, and the difference grows
  slowly as the loss falls, so 2e-2 is the run-to-run band, not a loose bound on a bug (a
  restart from the wrong step or fresh weights differs by orders of magnitude).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bridge_recipes.bench.convergence import compare
from lab import ROOT

# Megatron-Core's GatedDeltaNet parameters (a layer's ``self_attention`` in a Gated DeltaNet
# layer); every other ``self_attention`` parameter belongs to a gated-attention layer. Read by the
# packed-gradient probe's per-part report and by the CPU test of its committed result.
GDN_PARAMS = ("in_proj", "out_proj", "conv1d", "A_log", "dt_bias", "out_norm")


def mixer_of(name: str) -> str | None:
    """``"gdn"`` or ``"attention"`` for a parameter of a layer's mixer (Megatron names), else None."""
    if "self_attention" not in name:
        return None
    return "gdn" if any(f".{p}" in name for p in GDN_PARAMS) else "attention"


MIN_STEPS = 10
FALL_FRACTION = 0.9
SAME_STEP_RTOL = 1e-6
RESUME_RTOL = 2e-2
# A torch_dist checkpoint with the distributed optimizer holds, per parameter, the BF16 weight
# (2 bytes) and the FP32 main copy, Adam's first and second moments (3 x 4 bytes).
CHECKPOINT_BYTES_PER_PARAM = 14

# The GPU suite's resume arm: save every 5 steps of 10, kill once step 7 is logged (2 steps lost).
RESUME_SAVE_INTERVAL = 5
RESUME_KILL_AFTER = 7

Curve = Mapping[int, float]


@dataclass
class Check:
    passed: bool
    reasons: list[str]
    figures: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


def check_training(losses: Curve, min_steps: int = MIN_STEPS) -> Check:
    """The run logged ``min_steps``+ finite losses and the loss fell."""
    steps = sorted(losses)
    reasons = []
    if len(steps) < min_steps:
        reasons.append(f"{len(steps)} steps logged, need {min_steps}")
    bad = [s for s in steps if not math.isfinite(losses[s])]
    if bad:
        reasons.append(f"loss not finite at steps {bad}")
    if not steps:
        return Check(False, reasons or ["no loss logged"])
    first, last = losses[steps[0]], min(losses[s] for s in steps[-3:])
    if not bad and not last < FALL_FRACTION * first:
        reasons.append(f"loss did not fall: first {first:.4g}, best of the last three {last:.4g}")
    return Check(not reasons, reasons, {"steps": len(steps), "first": first, "last3_min": last})


def check_policies(reference: Curve, candidate: Curve) -> Check:
    """Two policies of one model on the same data: validate_convergence rules."""
    try:
        result = compare(reference, candidate)
    except ValueError as exc:  # fewer than 3 common steps, or a loss that is not finite
        return Check(False, [str(exc)])
    return Check(result.passed, list(result.reasons), result.as_dict())


def check_continuation(reference: Curve, candidate: Curve, *, fork_step: int) -> Check:
    """Two runs continued from one checkpoint (of step ``fork_step``), at two layouts: the same
    weights, optimizer state and rows, so every step after the fork must agree to
    ``RESUME_RTOL`` (the run-to-run band of the backward kernels' atomics), over the same steps."""
    reasons = []
    if not candidate:
        return Check(False, ["the continued run logged no step"])
    first, last = min(candidate), max(candidate)
    if first != fork_step + 1:
        reasons.append(f"the continued run began at step {first}, not {fork_step + 1} (after the fork)")
    if last != max(reference, default=0):
        reasons.append(f"the continued run ended at step {last}, the reference at {max(reference, default=0)}")
    rel = _stepwise(reference, candidate, "losses differ from the reference's", reasons)
    return Check(not reasons, reasons, {"fork_step": fork_step, "first_step": first, "relative_diff": rel})


def _stepwise(reference: Curve, candidate: Curve, what: str, reasons: list[str]) -> dict[int, float]:
    """Relative difference at every common step; a reason is added past ``RESUME_RTOL``."""
    rel = {s: _rel(candidate[s], reference[s]) for s in candidate if s in reference}
    worst = max(rel.values(), default=math.inf)
    if worst > RESUME_RTOL:
        reasons.append(f"{what} by up to {worst:.2e} > {RESUME_RTOL}")
    return rel


def check_resume(
    uninterrupted: Curve, killed: Curve, resumed: Curve, *, save_interval: int, same_layout: bool = True
) -> Check:
    """A run killed after its checkpoint of step ``save_interval`` and started again resumed from
    that checkpoint, lost only the steps since, and matches the uninterrupted run. Resumed at
    another layout (``same_layout=False``), the first step is not held to the killed run's own
    value to 1e-6: another layout reduces in another order."""
    reasons = []
    if not resumed:
        return Check(False, ["the restarted run logged no step"])
    first, last, killed_after = min(resumed), max(resumed), max(killed, default=0)
    if killed_after <= save_interval:
        reasons.append(f"the run was killed at step {killed_after}, before its checkpoint of step {save_interval}")
    if first != save_interval + 1:
        reasons.append(f"the restart began at step {first}, not {save_interval + 1} (after the last checkpoint)")
    if same_layout and first in killed and _rel(resumed[first], killed[first]) > SAME_STEP_RTOL:
        reasons.append(
            f"step {first} after the restart gives {resumed[first]:.7g}, the killed run gave "
            f"{killed[first]:.7g}: the restored state differs"
        )
    if last != max(uninterrupted, default=0):
        reasons.append(f"the restarted run ended at step {last}, the uninterrupted run at {max(uninterrupted)}")
    rel = _stepwise(uninterrupted, resumed, "resumed losses differ from the uninterrupted run", reasons)
    return Check(
        not reasons,
        reasons,
        {
            "saved_at": save_interval,
            "killed_after": killed_after,
            "steps_lost": killed_after - save_interval,
            "first_step_after_restart": first,
            "same_step_as_killed_run": killed.get(first),
            "relative_diff_to_uninterrupted": rel,
        },
    )


def checkpoint_gb(total_params: int) -> float:
    """Size on disk of a checkpoint of a model with ``total_params`` parameters (GB of 1e9 bytes),
    to know before a resume test whether the host's disk holds it. The 4-layer 35B-A3B policy
    with 32 experts (1.70 B parameters) gives 23.8 GB (22.2 GiB)."""
    return total_params * CHECKPOINT_BYTES_PER_PARAM / 1e9


def run_checkpoint_gb(recipe: str, **request: Any) -> float:
    """:func:`checkpoint_gb` of the model :func:`bridge_recipes.build` makes of ``recipe`` with
    the keywords ``request`` (scale-down, flags, overrides; builds the config, no GPU needed)."""
    from bridge_recipes.bench.harness import build_config, model_spec
    from bridge_recipes.models.params import count_parameters

    return checkpoint_gb(count_parameters(model_spec(build_config(recipe, **request))).total)


# The GPU suite's families (lab/tests/gpu/test_h200_evidence.py): each 8-GPU recipe scaled down to
# one GPU, 4 layers (policy kept) and the experts one GPU of its layout holds, 10 steps at a
# learning rate raised so that the loss moves in so few steps. ``request``: the
# bridge_recipes.build keywords.
EVIDENCE_TRAIN_FLAGS = {"gb": 4, "max_steps": 10, "lr": 3e-4, "min_lr": 3e-5, "warmup_iters": 1}
EVIDENCE_ROWS = "lab/evidence/sft_rows_synthetic/rows"
GPU_FAMILIES: dict[str, dict[str, Any]] = {
    "qwen35_35b_a3b": {
        "recipe": "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
        "request": {"scale_down": 4, "scale_experts": 32, "flags": EVIDENCE_TRAIN_FLAGS},
    },
    "qwen35_vl_35b_a3b": {
        # the 16-GB300 VL policy on one H200 (EP4 -> the 64 experts one GPU holds), mock image
        # conversations through the offline processor (no download), 4,096-token samples
        "recipe": "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
        "request": {"scale_down": 4, "scale_experts": 64, "flags": EVIDENCE_TRAIN_FLAGS},
        "vl": True,
    },
    "qwen35_27b": {
        "recipe": "qwen35_27b_sft_8gpu_h200_bf16_config",
        "request": {
            "scale_down": 4,
            "flags": EVIDENCE_TRAIN_FLAGS,
            "dataset": "sft-rows",
            "overrides": [f"dataset.path={ROOT / EVIDENCE_ROWS}"],
        },
    },
}


# --- two GPUs: every parallel dimension the recipes use, against one GPU ---------------------
# Each family's model scaled to TWO_GPU_LAYERS layers (two stages, virtual stages) and, for MoE,
# 64 routed experts, global batch 8, 10 steps: the one-GPU run is the reference, and each
# two-GPU layout trains the same model on the same rows (``different_training`` finds nothing
# between them), so their loss curves must agree by the policies rule. Flags are the runner's.
TWO_GPU_TRAIN_FLAGS = {**EVIDENCE_TRAIN_FLAGS, "gb": 8}
# Layers per family: 8 where the one-GPU reference fits with them; the 27B's 248K-vocabulary
# embedding and head with its dense layers, and the VL model's vision tower, plan over one H200
# at 8 layers (lab/evidence/two_gpu_predictions.md), so those two run 4 (two stages of 2).
TWO_GPU_LAYERS = {"qwen35_35b_a3b": 8, "qwen35_27b": 4, "qwen35_vl_35b_a3b": 4}
TWO_GPU_EXPERTS = 64
# Megatron's phase timers at level 2 in every run's log (forward-backward, pipeline send and
# receive, gradient reduction, optimizer): where each layout's step time goes.
TWO_GPU_TIMERS = ["logger.timing_log_level=2"]
# One step of each continued run under the torch profiler, its trace summarized by
# bench.trace_summary (GEMMs, attention, Gated DeltaNet, MoE permute, NCCL hidden or exposed).
TWO_GPU_PROFILE_STEPS = (8, 9)


def two_gpu_profile_overrides(folder: str) -> list[str]:
    """Overrides that trace TWO_GPU_PROFILE_STEPS on every rank into ``folder``/torch_profile
    (Megatron-Bridge writes the trace beside its TensorBoard folder)."""
    start, end = TWO_GPU_PROFILE_STEPS
    return [
        "profiling.use_pytorch_profiler=true",
        f"profiling.profile_step_start={start}",
        f"profiling.profile_step_end={end}",
        "profiling.profile_ranks=[0,1]",
        f"logger.tensorboard_dir={folder}/tb",
    ]


TWO_GPU_LAYOUTS: dict[str, dict[str, Any]] = {
    "ep2": {"flags": {"ep": 2}},
    "pp2": {"flags": {"pp": 2}},
    # the 27B's uneven split (first stage heavier, last lighter), at 8 layers
    "pp2_uneven": {
        "flags": {"pp": 2},
        "overrides": ["model.num_layers_in_first_pipeline_stage=3", "model.num_layers_in_last_pipeline_stage=1"],
    },
    "vpp2": {"flags": {"pp": 2, "vp": 2}},
    "tp2_sp": {"flags": {"tp": 2}, "overrides": ["model.sequence_parallel=true"]},
    "cp2": {"flags": {"cp": 2}},
    "etp2": {"flags": {"etp": 2}},
}
# Which layouts each family's recipes use (EP and ETP only for MoE models).
TWO_GPU_FAMILY_LAYOUTS = {
    "qwen35_35b_a3b": ("ep2", "pp2", "tp2_sp", "cp2", "etp2", "vpp2"),
    "qwen35_27b": ("pp2", "pp2_uneven", "vpp2", "tp2_sp", "cp2"),
    "qwen35_vl_35b_a3b": ("ep2", "pp2", "tp2_sp"),
}
# The layouts start from the same state: a one-GPU run (FORK_RUN) trains TWO_GPU_FORK_STEP steps
# and saves; the one-GPU reference and every layout continue from that checkpoint to step 10.
# Started from random initialization instead, the layouts do not train the same model: Megatron
# seeds each pipeline rank's initialization differently, and expert and tensor-parallel shards
# from their own streams (lab/evidence/two_gpu/README.md measured the step-1 losses apart).
TWO_GPU_FORK_STEP = 5
FORK_RUN = "fork"
# Resume across layouts from the fork: the first run continues at one layout, saves at step 7 and
# is killed after step 8; the second resumes at the other layout from step 7 (optimizer state
# fully reshardable, as the fork's) and must follow the one-GPU continuation within RESUME_RTOL.
TWO_GPU_RESUME_SAVE = 7
TWO_GPU_RESUME_KILL_AFTER = 8
TWO_GPU_RESUMES = (("dp2", "dp1"), ("pp2", "dp1"), ("ep2", "dp1"), ("tp2_sp", "dp1"), ("dp1", "ep2"))


def two_gpu_request(family: str, layout: str | None) -> dict[str, Any]:
    """The bridge_recipes.build keywords of ``family``'s scaled model at ``layout`` (None: one
    GPU; ``dp2``: the one-GPU layout replicated on two)."""
    base = GPU_FAMILIES[family]["request"]
    experts = TWO_GPU_EXPERTS if base.get("scale_experts") else None
    flags = {**base.get("flags", {}), **TWO_GPU_TRAIN_FLAGS}
    overrides = [*base.get("overrides", ()), *TWO_GPU_TIMERS]
    request = {
        **base,
        "scale_down": TWO_GPU_LAYERS[family],
        "scale_experts": experts,
        "flags": flags,
        "overrides": overrides,
    }
    if layout in (None, "dp1", "dp2"):
        return request
    spec = TWO_GPU_LAYOUTS[layout]
    return {**request, "flags": {**flags, **spec["flags"]}, "overrides": [*overrides, *spec.get("overrides", ())]}


# The long-context policy (TP2 with sequence parallelism, CP2, 32,768-token rows) needs four GPUs
# for both splits at once; on two, each half runs: the scale-down's own choice (TP2 SP, which it
# keeps before CP) and CP2 alone. 4 layers, 32 routed experts (EP2: 16 per GPU), 10 steps.
LONG_CONTEXT_RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config"
LONG_CONTEXT_HALVES: dict[str, dict[str, Any]] = {
    "tp2_sp": {},
    "cp2": {"flags": {"tp": 1, "cp": 2}, "overrides": ["model.sequence_parallel=false"]},
}


def long_context_request(half: str) -> dict[str, Any]:
    """The bridge_recipes.build keywords of one half of the long-context policy on two GPUs."""
    spec = LONG_CONTEXT_HALVES[half]
    return {
        "scale_down": 4,
        "scale_experts": 32,
        "gpus": 2,
        "flags": {**EVIDENCE_TRAIN_FLAGS, **spec.get("flags", {})},
        "overrides": [*TWO_GPU_TIMERS, *spec.get("overrides", ())],
    }


def two_gpu_world(layout: str | None) -> int:
    return 1 if layout in (None, "dp1") else 2


def _plan_of(recipe: str, request: dict[str, Any], world: int, log: str | None = None) -> tuple[Any, Any]:
    """(the layout, the H200 memory plan) of ``recipe`` built with ``request`` on ``world`` GPUs; with a
    run's ``log``, gradient-accumulation fusion as that run had it (``te_wgrad.ran_fused``)."""
    import bridge_recipes
    from bridge_recipes.features import te_wgrad
    from bridge_recipes.plan.layout import layout_of
    from bridge_recipes.plan.memory import plan_memory

    cfg = bridge_recipes.build(recipe, **request)
    if log is not None:
        cfg.model.gradient_accumulation_fusion = te_wgrad.ran_fused(cfg, log)
    return layout_of(cfg, world), plan_memory(cfg, world, gpu="h200")


def _planned(family: str, layout: str | None, log: str | None = None) -> tuple[Any, Any]:
    """(the layout, the memory plan) of one run of the two-GPU plan (as the run had it, given its log)."""
    return _plan_of(GPU_FAMILIES[family]["recipe"], two_gpu_request(family, layout), two_gpu_world(layout), log)


# A process's logged steps averaged for its step time: all but its first three, which hold kernel
# compilation, autotuning and the allocator's growth.
WARMUP_STEPS = 3
# A planner prediction "holds" within this fraction of the measured peak.
PLAN_TOLERANCE = 0.05


def two_gpu_results(family: str, log_text: str) -> list[dict[str, Any]]:
    """The runs of a two-GPU layouts log (``lab/tests/gpu/test_h200x2_layouts.py``): per layout the
    steady step time, per-GPU throughput relative to the one-GPU run (same model, same global
    batch: t_1 / (2 x t_2)), measured peak allocation per rank against the planner's per stage,
    Megatron's phase timers (seconds per step, where the log has them) and the loss-curve check
    against the one-GPU run."""
    from bridge_recipes.logs.megatron_log import (
        parse_megatron_log,
        parse_megatron_timers,
        peak_allocated_gb_per_rank,
    )
    from bridge_recipes.logs.run_log import loss_curve, split_runs

    runs = split_runs(log_text)
    forked = FORK_RUN in runs
    ref_name = "one_gpu"
    ref_losses = loss_curve(parse_megatron_log(runs[ref_name]))
    ref_time = None
    rows = []
    for name in (ref_name, *TWO_GPU_FAMILY_LAYOUTS[family]):
        if name not in runs:
            continue
        iterations = parse_megatron_log(runs[name])
        steady = iterations[WARMUP_STEPS:]
        step_s = sum(it.time_s for it in steady) / len(steady) if steady else None
        layout = None if name == ref_name else name
        world = two_gpu_world(layout)
        if name == ref_name:
            ref_time = step_s
        per_rank = peak_allocated_gb_per_rank(runs[name])
        shape, plan = _planned(family, layout, log=runs[name])
        predicted = [st.allocated_gb for st in plan.stages]
        # ranks are stage-major when the pipeline is split (two GPUs: rank r holds stage r)
        measured = (
            [per_rank.get(r) for r in range(len(predicted))]
            if len(predicted) > 1
            else [max(per_rank.values(), default=None)]
        )
        misses = [
            i for i, (p, m) in enumerate(zip(predicted, measured)) if m is not None and abs(p - m) > PLAN_TOLERANCE * m
        ]
        # Megatron's phase timers (TWO_GPU_TIMERS) over the same steady steps, seconds per step
        timers = parse_megatron_timers(runs[name])
        steady_steps = [it.step for it in steady]
        names = sorted({t for s in steady_steps for t in timers.get(s, {})})
        phases = {
            t: sum(timers[s][t] for s in steady_steps if t in timers.get(s, {})) / len(steady_steps) / 1000
            for t in names
        }
        losses = loss_curve(iterations)
        if name == ref_name:
            check = None
        elif forked:  # both continued from the fork's checkpoint
            check = check_continuation(ref_losses, losses, fork_step=TWO_GPU_FORK_STEP).as_dict()
        else:  # each from its own random initialization
            check = check_policies(ref_losses, losses).as_dict()
        rows.append(
            {
                "layout": name,
                "parallel": shape.label(show_sp=True),
                "world": world,
                "step_s": step_s,
                "per_gpu_vs_one_gpu": (ref_time / (world * step_s)) if ref_time and step_s else None,
                "measured_gb": measured,
                "predicted_gb": predicted,
                "plan_misses": misses,
                "phases_s": phases,
                "first_loss": losses.get(min(losses)) if losses else None,
                "last_loss": losses.get(max(losses)) if losses else None,
                "check": check,
            }
        )
    return rows


def two_gpu_results_table(family: str, log_text: str) -> str:
    """:func:`two_gpu_results` as a Markdown table (lab/evidence/two_gpu/README.md; a test rebuilds it)."""

    def gb(values: list) -> str:
        return " / ".join("-" if v is None else f"{v:.1f}" for v in values)

    def gb4(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    lines = [
        "| layout | parallel layout | steady s/step | per-GPU vs one GPU | peak GB measured | planned | "
        "loss first / last | curve vs one GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in two_gpu_results(family, log_text):
        check = r["check"]
        figures = check["figures"] if check else {}
        outcome = "agrees" if check and check["passed"] else "DIFFERS"
        if check is None:
            verdict = "reference"
        elif "relative_diff" in figures:  # continued from the fork
            verdict = f"{outcome}: worst step {max(figures['relative_diff'].values(), default=float('nan')):.2e}"
        else:
            verdict = (
                f"{outcome}: corr {figures.get('correlation', 0):.5f}, "
                f"final {figures.get('final_loss_difference', 0):.2%}, "
                f"{figures.get('pointwise_failures', '?')}/{figures.get('points_checked', '?')} points out"
            )
        miss = " (miss)" if r["plan_misses"] else ""
        ratio = "-" if r["per_gpu_vs_one_gpu"] is None else f"{r['per_gpu_vs_one_gpu']:.2f}"
        lines.append(
            f"| {r['layout']} | {r['parallel']} | {r['step_s']:.2f} | {ratio} | {gb(r['measured_gb'])} | "
            f"{gb(r['predicted_gb'])}{miss} | {gb4(r['first_loss'])} / {gb4(r['last_loss'])} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def two_gpu_predictions() -> str:
    """The memory planner's per-stage peak allocation for every run of the two-GPU plan and the
    long-context halves (lab/evidence/two_gpu_predictions.md; a test rebuilds it from the current
    planner): what the measured ``mem-max-allocated-gigabytes`` of each run is compared with."""
    lines = [
        "# Two-GPU runs: the memory planner's predictions",
        "",
        "Peak allocated GB per rank (1e9 bytes) of each pipeline stage, by",
        "`bridge_recipes.plan.memory.plan_memory`, for the runs of `lab/tests/gpu/test_h200x2_layouts.py`",
        "(`lab.evidence.TWO_GPU_*`). Rebuilt by `two_gpu_predictions()` from the",
        "current planner. Written first before any two-GPU run; the 35B-A3B runs measured since",
        "(`two_gpu/README.md`) found one miss, the embedding the last pipeline stage holds for MTP,",
        "which the planner now counts (the PP and VPP rows' last stage grew by it). Planned with",
        "gradient-accumulation fusion on, as runs now have it (the measured runs, which",
        "ran without it, are planned without it in `two_gpu/README.md`).",
        "",
        "| family | layout | parallel layout | predicted allocated GB per stage | fits (with overhead) |",
        "|---|---|---|---|---|",
    ]

    def row(family: str, layout: str, shape: Any, plan: Any) -> str:
        stages = " / ".join(f"{s.allocated_gb:.1f}" for s in plan.stages)
        fits = f"{'yes' if plan.fits else 'NO'} ({plan.peak_gb:.1f} of {plan.gpu_memory_gb:.1f})"
        return f"| {family} | {layout} | {shape.label(show_sp=True)} | {stages} | {fits} |"

    for family, layouts in TWO_GPU_FAMILY_LAYOUTS.items():
        for layout in (None, *layouts):
            lines.append(row(family, layout or "one GPU", *_planned(family, layout)))
    for half in LONG_CONTEXT_HALVES:
        lines.append(row("long context, 32K", half, *_planned_long_context(half)))
    return "\n".join(lines) + "\n"


def _planned_long_context(half: str) -> tuple[Any, Any]:
    return _plan_of(LONG_CONTEXT_RECIPE, long_context_request(half), 2)
