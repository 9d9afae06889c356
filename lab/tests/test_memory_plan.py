"""The memory planner against the measured H200 peaks of the committed logs (docs/memory_plan.md)
and the published 8 x H200 layouts (docs/sources.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_recipes.plan import memory as M
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.scaledown import scale_down
from lab import memory_table as TABLE

REPO = Path(__file__).resolve().parents[2]
SFT_35B = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
SFT_27B = "qwen35_27b_sft_8gpu_h200_bf16_config"


def build(name: str, **shrink):
    cfg = registry.load(name)()
    if shrink:
        scale_down(cfg, **shrink)
    return cfg


@pytest.fixture(scope="module")
def rows():
    return TABLE.rows()


@pytest.fixture(scope="module")
def facts():
    return TABLE.fact_plans()


def test_measured_peaks_are_the_logged_ones():
    peaks = [round(TABLE.measured_peak_gb(r), 2) for r in TABLE.MEASURED_RUNS]
    assert peaks == [100.63, 59.65, 67.09, 114.96, 123.29]


@pytest.mark.parametrize("index", range(len(TABLE.MEASURED_RUNS)))
def test_measured_peak_predicted_within_15_percent(rows, index):
    r = rows[index]
    assert abs(r.error) <= TABLE.TOLERANCE, (
        f"{r.run.recipe} [{r.run.scaling}]: predicted {r.predicted_gb:.2f} GB, measured {r.measured_gb:.2f} GB"
    )


@pytest.mark.parametrize("index, logged", [(0, 5_226_110_528), (1, 1_700_601_408), (3, 4_489_576_096)])
def test_local_parameters_equal_megatrons_count(index, logged):
    """'number of parameters on (tensor, gtp_remat, pipeline) model parallel rank (0, 0, 0)' in each log."""
    run = TABLE.MEASURED_RUNS[index]
    cfg = TABLE.build(run.recipe, run.request)
    par = M.parallel_layout(cfg, 1)
    params = M.stage_params(M.model_dims(cfg.model), par, list(range(cfg.model.num_layers)), 0)
    assert params.total == logged


def test_committed_table_is_regenerated(rows, facts):
    assert (REPO / "docs" / "memory_plan.md").read_text() == TABLE.render(rows, facts), (
        "docs/memory_plan.md is stale: run python -m lab.memory_page"
    )


def test_27b_pp2_tp1_runs_out_of_memory_on_the_last_stage(facts):
    """openrecipes-27b-h200: 'PP 2 at TP 1 ran out of memory on the last stage, which holds the FP32 logits'."""
    plan = TABLE.fact_plan(facts, "PP2 32/32, recompute of every layer (block 32)")
    assert not plan.fits
    assert plan.peak_stage == 1 and plan.stages_over() == [1]
    assert plan.stages[1].logits_gb > 20  # the FP32 logits are what tips it over


def test_27b_pp2_keeping_block_12_is_out_of_memory_on_both_stages(facts):
    plan = TABLE.fact_plan(facts, "PP2 32/32, block recompute 12 kept")
    assert plan.stages_over() == [0, 1]


def test_27b_pp4_block_12_fits_and_block_10_runs_out_on_the_first_stage(facts):
    """openrecipes-27b-h200: the first stage is at its limit with block 12; block 10 ran out there."""
    assert TABLE.fact_plan(facts, "as built: PP4 16/17/17/14, block 12").fits
    plan = TABLE.fact_plan(facts, "block recompute 10")
    # stage 0 is the one far over (the last stage, with the MTP embedding, is at the edge: 151.4)
    assert not plan.fits and plan.peak_stage == 0 and plan.stages_over()[0] == 0
    assert plan.stages[0].total_gb - plan.gpu_memory_gb > 10


def test_35b_ep8_fits_without_offload(facts):
    assert not build(SFT_35B).optimizer.optimizer_cpu_offload
    plan = TABLE.fact_plan(facts, "as built: EP8, 8,192 tokens, no offload")
    assert plan.fits and plan.stages[0].optimizer_gb > 40  # the optimizer state is on the GPU


def test_opd_35b_h200_layout_as_built_plans_far_below_the_reported_124_gb(facts):
    """opd-35b-h200's ~124 GB is its on-policy-distillation job (student and teacher in memory,
    colocated rollout engine), not this SFT recipe with the optimizer on the host: the plan is
    honestly outside a 15% band of it (see docs/memory_plan.md)."""
    plan = TABLE.fact_plan(facts, "as built: TP2 SP CP2 EP8, seq 32,768, CPU offload")
    assert plan.fits and plan.stages[0].optimizer_gb == 0
    assert plan.peak_gb < 0.85 * 124


def test_plan_report_flags_the_stage_that_does_not_fit():
    text, fits = M.plan_report(TABLE.build(SFT_27B, TABLE.pp2("block", 32)), 8, "h200")
    assert fits is False
    stage_lines = [line for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert "OVER" not in stage_lines[0] and "OVER" in stage_lines[1]
    assert "DOES NOT FIT: stage 1" in text and "GB = 1e9 bytes" in text

    text, fits = M.plan_report(build(SFT_27B), 8, None)
    assert fits is True and "OVER" not in text and "(fits)" in text


def test_selective_saving_against_its_one_measured_pair():
    """The VL 35B-A3B GB300 policy (selective moe_act and layernorm) against recompute off on one
    H200: 121.51 -> 120.89 GB measured (0.62 GB); the plan counts 1.01 GB, more than measured but
    within 2x."""
    sel = TABLE.selective_saving()
    assert (sel["measured_off_gb"], sel["measured_selective_gb"]) == (121.51, 120.89)
    assert sel["measured_saving_gb"] < sel["planned_saving_gb"] < 2 * sel["measured_saving_gb"]


def test_the_measured_runs_are_planned_with_the_fusion_their_logs_show():
    """Every run measured here predates the stand-in: its config asked for fusion and its log says the runner
    turned it off, so it is planned without fusion's placeholder gradients."""
    from bridge_recipes.features import te_wgrad

    for run in (*TABLE.MEASURED_RUNS, *TABLE.SELECTIVE_PAIR):
        asked = TABLE.build(run.recipe, run.request)
        assert asked.model.gradient_accumulation_fusion and te_wgrad.turned_off_in(TABLE.run_text(run))
        assert run.config().model.gradient_accumulation_fusion is False


def test_fusion_placeholders_are_what_fusion_added_to_the_measured_peaks():
    """Transformer Engine keeps one BF16 placeholder gradient per weight shape under fusion: on the 35B-A3B
    proxy 1.1285 GB (the output layer's 248,320 x 2,048 is 1.017 of it), the same at 4 and 16 layers (no new
    shapes); the published policy's proxies measured 1.129 and 1.128 GB more with fusion than without
    (lab/results/candidates: 35b_router_fusion_against without, 35b_block30_against with, at 4 layers; the fusion
    pair's two arms at 16)."""
    from bridge_recipes.bench.result import read_result

    results = REPO / "lab/results/candidates"

    def peak(name):
        return read_result(results / f"{name}.yaml")["result"]["peak_allocated_gb"]

    measured = [
        peak("35b_block30_against") - peak("35b_router_fusion_against"),
        peak("35b_grad_accum_fusion_16_layers") - peak("35b_grad_accum_fusion_16_layers_against"),
    ]
    planned = []
    for layers in (4, 16):
        cfg = build(SFT_35B, num_layers=layers, num_experts=32, global_batch_size=8)
        d, par = M.model_dims(cfg.model), M.parallel_layout(cfg, 1)
        planned.append(M.fused_wgrad_placeholder_bytes(cfg, d, par, list(range(layers)), 0) / 1e9)
    assert [round(p, 4) for p in planned] == [1.1285, 1.1285]
    assert planned == pytest.approx(measured, abs=0.002)
    cfg.model.gradient_accumulation_fusion = False
    assert M.fused_wgrad_placeholder_bytes(cfg, d, par, list(range(16)), 0) == 0


def test_over_budget_the_report_names_changes_that_fit_and_they_do():
    import copy
    import re

    from bridge_recipes.config.overrides import apply_all

    cfg = TABLE.build(SFT_27B, TABLE.pp2("block", 32))
    text, fits = M.plan_report(cfg, 8, "h200")
    assert not fits
    fixes = text.split("changes that fit (each planned):\n")[1].splitlines()
    assert fixes
    for line in fixes:
        name, _, rest = line.strip().partition(": ")
        if name == "more GPUs":
            world = int(rest.split()[0])
            assert M.plan_memory(cfg, world, gpu="h200").fits and not M.plan_memory(cfg, world // 2, gpu="h200").fits
            continue
        tokens = rest.rsplit(" (peak", 1)[0].split()
        flags = {"mb": int(tokens[tokens.index("-mb") + 1])} if "-mb" in tokens else {}
        tokens = [t for t in tokens if "=" in t]
        changed = copy.deepcopy(cfg)
        apply_all(changed, flags, tokens)
        assert M.plan_memory(changed, 8, gpu="h200").fits, line
        planned = float(re.search(r"peak ([\d.]+) of", line).group(1))
        assert planned == pytest.approx(M.plan_memory(changed, 8, gpu="h200").peak_gb, abs=0.05)
