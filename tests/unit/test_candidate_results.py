"""The committed side-by-side candidate measurements (results/candidates/) are what their committed
logs give, and the full-scale estimate of the best one follows from them.

Each candidate command ran the candidate and its published policy on the same one-GPU proxy
(4 layers, or 16 where the file says so; the 35B-A3B with the 32 experts of its EP8 shard; 8 micro
batches of 8,192 tokens) on 1 x H200 on 2026-12-01."""

import dataclasses
import json
from pathlib import Path

import pytest

from bridge_recipes.bench.candidates import RESULTS, find, measured, parse_stem
from bridge_recipes.bench.harness import comparison
from bridge_recipes.bench.megatron_log import step_records_from_log
from bridge_recipes.bench.predict import Prediction, SideBySide, candidate_estimate, split_saving
from bridge_recipes.bench.result import read_result
from bridge_recipes.bench.runs import log_losses
from bridge_recipes.bench.stats import summarize

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "docs/evidence/candidates"
MEASURED = sorted(p.name.removesuffix("_ratio.json") for p in RESULTS.glob("*_ratio.json"))
ARMS = ("", "_against")  # the candidate, then its published policy


def test_the_measured_candidates():
    assert MEASURED == [
        "27b_fp8_current",
        "27b_te_ce_fused_swiglu_block10",
        "27b_te_ce_fused_swiglu_block10_fp8_current",
        "35b_bf16_moments_te_ce_block10",
        "35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers",
        "35b_router_fusion",
        "35b_te_ce_block20",
    ]


@pytest.mark.parametrize("name", MEASURED)
@pytest.mark.parametrize("arm", ARMS)
def test_result_file_matches_its_log(name, arm):
    doc = read_result(RESULTS / f"{name}{arm}.yaml")
    r = doc["result"]
    log = (LOGS / f"{name}{arm}.log").read_text()
    assert f"--recipe {doc['recipe']} " in log and "exit status 0" in log
    stats = summarize(
        step_records_from_log(log, doc["workload"]["row_tokens"]),
        tuple(r["window"]),
        1,
        r["flops_per_token"]["model"],
        doc["gpu"]["type"],
    )
    assert stats.tokens_per_s_per_gpu == pytest.approx(r["tokens_per_s_per_gpu"], abs=0.01)
    assert stats.step_time_cv_percent == pytest.approx(r["step_time_cv_percent"], abs=0.01)
    assert stats.peak_allocated_gb == pytest.approx(r["peak_allocated_gb"], abs=1e-3)


@pytest.mark.parametrize("name", MEASURED)
def test_each_run_is_its_candidate_or_the_published_policy(name):
    """The candidate's run carries exactly the candidate's proxy overrides; the other none of them."""
    candidate, layers = parse_stem(name)
    overrides = find(candidate).proxy_overrides(layers)
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml") for arm in ARMS)
    cand_cmd, ref_cmd = (" ".join(d["command"].split()) for d in (cand, ref))
    assert all(o in cand_cmd.split() for o in overrides)
    assert not any(o in ref_cmd.split() for o in overrides)
    assert cand["recipe"] == ref["recipe"] == find(candidate).mock_recipe
    assert f"--scale-down {layers} " in cand_cmd and f"--scale-down {layers} " in ref_cmd
    assert cand["workload"] == ref["workload"] and cand["result"]["window"] == ref["result"]["window"]


@pytest.mark.parametrize("name", MEASURED)
def test_ratio_file_is_the_ratio_of_the_two_results(name):
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml") for arm in ARMS)
    losses = tuple(log_losses((LOGS / f"{name}{arm}.log").read_text()) for arm in ARMS)
    assert measured(*parse_stem(name)) == comparison(cand, ref, proxy=True, losses=losses)


def test_measured_ratios_and_loss_checks():
    """Pinned (1 x H200, 2026-12-01), against the predictions written before they ran: the 35B-A3B's
    1.17x and 1.11x, beaten (Transformer Engine's cross entropy, taken as equally fast, is faster);
    the 27B's 1.18x, missed (1.12x: it saved 50.2 ms a micro batch of the 72.8 predicted); the fused
    router's 1.01x, beaten (1.05x); FP8 with current scaling, 1.10x and 1.22x, missed (1.08x and
    1.20x). The 16-layer pair has no prediction at its depth (its 1.41x was for 4 layers)."""
    got = {n: measured(*parse_stem(n))["tokens_per_s_ratio"] for n in MEASURED}
    assert got == {
        "27b_fp8_current": 1.0761,
        "27b_te_ce_fused_swiglu_block10": 1.1196,
        "27b_te_ce_fused_swiglu_block10_fp8_current": 1.2041,
        "35b_bf16_moments_te_ce_block10": 1.4006,
        "35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers": 1.2095,
        "35b_router_fusion": 1.0524,
        "35b_te_ce_block20": 1.3288,
    }
    at_4_layers = [n for n in MEASURED if parse_stem(n)[1] == 4]
    assert {n: find(n).predicted_ratio for n in at_4_layers} == pytest.approx(
        {
            "27b_fp8_current": 1.1,
            "27b_te_ce_fused_swiglu_block10": 1.18,
            "27b_te_ce_fused_swiglu_block10_fp8_current": 1.22,
            "35b_bf16_moments_te_ce_block10": 1.173,
            "35b_router_fusion": 1.01,
            "35b_te_ce_block20": 1.109,
        },
        abs=5e-4,
    )
    saved = _pair("27b_te_ce_fused_swiglu_block10").saved_s
    assert round(saved * 1000, 1) == 50.2
    fp8 = [n for n in MEASURED if "fp8" in n]
    for n in MEASURED:
        curves = measured(*parse_stem(n))["loss_curves"]
        assert curves["compared"]
        if n in fp8:
            continue
        assert curves["passed"] and curves["pointwise_failures"] == 0


def test_fp8_fails_the_loss_check_by_tracking_above_bf16():
    """Both FP8 runs fail the same way: their loss stays above the BF16 run's at every step from the
    fifth (by 0.4-5.8%), and at the mock rows' last steps, where the loss is near 0.2, the relative
    gap exceeds the 2% point-wise and 3% final tolerances (final 3.25%); the curves' shape agrees
    (correlation above 0.99998). So FP8 does not become a recipe on this check."""
    for name in ("27b_fp8_current", "27b_te_ce_fused_swiglu_block10_fp8_current"):
        curves = measured(name)["loss_curves"]
        assert not curves["passed"] and curves["correlation"] > 0.99998
        assert curves["pointwise_failures"] == 5 and round(curves["final_loss_difference"], 4) == 0.0325
        fp8, bf16 = (log_losses((LOGS / f"{name}{arm}.log").read_text()) for arm in ARMS)
        above = [fp8[s] - bf16[s] for s in sorted(bf16) if s >= 5]
        assert all(d > 0 for d in above) and round(bf16[16], 2) == 0.2


def _pair(name: str) -> SideBySide:
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml") for arm in ARMS)
    recomputed = cand["layout"]["recompute"]["num_layers"]
    return SideBySide(
        ref["result"]["step_time_mean_s"],
        cand["result"]["step_time_mean_s"],
        parse_stem(name)[1] - recomputed,
        ref["workload"]["global_batch"],
    )


def _router_pass_s() -> float:
    """The fused router's saving a router pass: its 4 fully recomputed proxy layers run 3 passes each
    (forward, recomputed forward, backward)."""
    return _pair("35b_router_fusion").saved_s / (4 * 3)


def _prediction(path: str) -> Prediction:
    doc = json.loads((ROOT / path).read_text())
    return Prediction(**{f.name: doc[f.name] for f in dataclasses.fields(Prediction) if f.name in doc})


def test_full_scale_estimate_of_the_best_candidate():
    """The saving split into a fixed part (Transformer Engine's cross entropy; BF16 moments taken as
    free) and a part a layer no longer recomputed, from the two candidates (2 and 3 of 4 proxy layers
    not recomputed); then on the calibrated 35B-A3B prediction (40 layers, 30 not recomputed)."""
    base = _prediction("results/h200_predict_qwen35_35b_a3b_sft_8gpu.json")
    a, b = _pair("35b_te_ce_block20"), _pair("35b_bf16_moments_te_ce_block10")
    assert (a.layers_not_recomputed, b.layers_not_recomputed) == (2, 3)
    fixed, per_layer = split_saving(a, b)
    # 15.0 ms a layer a micro batch: the recompute pair of 2026-11-30 (2.74 vs 2.20 s over 4 layers
    # x 8 micro batches) gives 16.9 ms, an independent check
    assert round(fixed * 1000, 1) == 54.2 and round(per_layer * 1000, 1) == 15.0
    best = candidate_estimate(base, 4, b, fixed, per_layer, 30)
    assert round(best, 1) == 6424.8 and round(best / 4663.1, 3) == 1.378
    assert round(candidate_estimate(base, 4, a, fixed, per_layer, 20), 1) == 5812.9
    # 35b_bf16_moments_te_ce_block8 (not measured: on the 4-layer proxy it is block 10's run), 32 freed
    assert round(candidate_estimate(base, 4, b, fixed, per_layer, 32), 1) == 6569.6
    assert "about 6,570" in find("35b_bf16_moments_te_ce_block8").basis
    # 35b_bf16_moments_te_ce_fused_swiglu_block5: 35 freed (the fused SwiGLU's own ~1% not counted)
    assert round(candidate_estimate(base, 4, b, fixed, per_layer, 35), -2) == 6800
    assert "about 6,800" in find("35b_bf16_moments_te_ce_fused_swiglu_block5").basis


def test_the_16_layer_pair_revises_the_full_scale_estimate():
    """The 16-layer pair (14 of 16 layers freed of recompute in one command) saved 125.8 ms a micro batch,
    where the 4-layer split above (54.2 ms fixed + 15.0 a layer) says 264: the 4-layer pairs overstated
    the saving a layer. Split again from the two pairs that share BF16 moments and TE's cross entropy
    (4 layers 3 freed, 16 layers 14 freed): 91.8 ms fixed, 2.4 ms a layer. On the calibrated prediction
    (35 of 40 layers freed): about 5,275 tokens/s/GPU (block 10: about 5,230); with the fused router's
    1.36 ms a router pass (16.3 ms over 4 layers x 3 passes, 35b_router_fusion) over 5 x 3 + 35 x 2
    passes: about 5,745, 1.23x the published 4,663.1, the fast recipe's estimate."""
    import bridge_recipes

    base = _prediction("results/h200_predict_qwen35_35b_a3b_sft_8gpu.json")
    four, sixteen = (
        _pair("35b_bf16_moments_te_ce_block10"),
        _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers"),
    )
    assert (four.layers_not_recomputed, sixteen.layers_not_recomputed) == (3, 14)
    assert round(sixteen.saved_s * 1000, 1) == 125.8
    old_fixed, old_per_layer = split_saving(_pair("35b_te_ce_block20"), four)
    assert round((old_fixed + 14 * old_per_layer) * 1000) == 264
    fixed, per_layer = split_saving(four, sixteen)
    assert round(fixed * 1000, 1) == 91.8 and round(per_layer * 1000, 1) == 2.4
    assert round(candidate_estimate(base, 16, sixteen, fixed, per_layer, 35), -1) == 5280
    assert round(candidate_estimate(base, 16, sixteen, fixed, per_layer, 30), -1) == 5230
    router = _router_pass_s()
    assert round(router * 1000, 2) == 1.36
    best = candidate_estimate(base, 16, sixteen, fixed + (5 * 3 + 35 * 2) * router, per_layer, 35)
    assert round(best, -1) == 5750 and round(best / 4663.1, 2) == 1.23
    doc = bridge_recipes.registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config").__doc__
    assert "about 5,745" in doc and "1.23x" in doc


def test_the_router_candidates_16_layer_prediction_follows_from_the_measurements():
    """1.31x: the 16-layer pair's 600.6 ms a micro batch less 46.2 ms of router passes (2 layers x 3 + 14
    x 2 at 1.36 ms), against its published 726.4."""
    c = find("35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion")
    pair, per_pass = _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers"), _router_pass_s()
    candidate = pair.candidate_step_s / pair.micro_batches - (2 * 3 + 14 * 2) * per_pass
    assert round(candidate * 1000, 1) == 554.4 and round((2 * 3 + 14 * 2) * per_pass * 1000, 1) == 46.2
    assert round(pair.reference_step_s / pair.micro_batches / candidate, 2) == c.predicted_ratio == 1.31


def _fast_recipe_is_published_with(candidate: str, extra: tuple[str, ...] = ()):
    """The fast recipe of a candidate's published recipe equals that recipe with the candidate's
    overrides (and ``extra``) applied, part by part; returns the fast config."""
    from bridge_recipes import overrides, registry

    c = find(candidate)
    published = registry.load(c.recipe)()
    for token in (*c.overrides, *extra):
        overrides.apply(published, overrides.parse(token))
    fast = registry.load(c.recipe.replace("_config", "_fast_config"))()
    for part in ("model", "optimizer", "ddp", "train"):
        assert repr(getattr(fast, part)) == repr(getattr(published, part)), part
    return fast


def test_the_fast_recipe_is_the_published_one_with_the_candidates_overrides():
    """One definition of the winning policy: the fast recipe builds what the candidate names, at full
    scale (5 of 40 layers recomputed; the 16-layer proxy's 2 of 16)."""
    c = find("35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion")
    assert c.recipe == "qwen35_35b_a3b_sft_8gpu_h200_bf16_config" and c.proxy_layers == 16
    assert c.proxy_overrides(16)[-1] == "model.recompute_num_layers=2"
    fast = _fast_recipe_is_published_with(c.name)
    assert fast.model.recompute_num_layers == 5 and fast.model.cross_entropy_fusion_impl == "te"
    assert fast.model.moe_router_fusion and fast.model.bias_activation_fusion


def test_te_cross_entropy_rebuilds_its_gradient_in_fp32():
    """The premise of te_cross_entropy: the installed Transformer Engine's fused cross entropy keeps
    FP32 softmax statistics from the forward and rebuilds the derivative from them in FP32 (the form
    that fixed the divergence Megatron-LM disabled it for), not a BF16 gradient made in the forward."""
    import inspect

    from transformer_engine.pytorch.triton import cross_entropy as te_ce

    assert "stats" in inspect.signature(te_ce.cross_entropy_backward).parameters
    assert "FP32" in inspect.getdoc(te_ce.cross_entropy_backward)
    assert "stats = torch.empty((n_rows, 2), dtype=torch.float32" in inspect.getsource(te_ce.cross_entropy_forward)


def test_the_27b_block10_prediction_follows_from_the_committed_figures():
    """27b_te_ce_fused_swiglu_block10's 1.18x: the 27B proxy's micro batch and one layer's recompute
    from its committed result (2026-12-01), the cross entropy's saving from the 35B-A3B pair."""
    doc = read_result(ROOT / "results/h200_proxy_qwen35_27b_h200_policy_repeat.yaml")
    r, b = doc["result"], doc["result"]["flops_per_token"]["breakdown"]
    layer_keys = ("attention_projections", "gdn_projections", "gdn_conv", "mlp", "attention_core", "gdn_recurrence")
    forward_per_layer = sum(b[k] for k in layer_keys) / 4 / 3  # training FLOPs are 3 x forward
    recompute_s = forward_per_layer * doc["workload"]["row_tokens"] / (r["tflops_per_s_per_gpu"] * 1e12)
    micro = r["step_time_mean_s"] / doc["workload"]["global_batch"]
    fixed, _ = split_saving(_pair("35b_te_ce_block20"), _pair("35b_bf16_moments_te_ce_block10"))
    c = find("27b_te_ce_fused_swiglu_block10")
    assert round(recompute_s * 1000, 1) == 13.8 and "13.8 ms" in c.basis
    assert round(micro * 1000) == 479 and round(fixed * 1000, 1) == 54.2
    assert round(micro / (micro - fixed - 0.01 * micro - recompute_s), 2) == c.predicted_ratio == 1.18


@pytest.mark.parametrize("name", MEASURED)
@pytest.mark.parametrize("arm", ARMS)
def test_the_planner_predicts_each_measured_peak_within_one_percent(name, arm):
    """The full-scale verdicts rest on the planner: on these proxies (BF16 or FP32 moments, TE's or the
    native cross entropy, fused SwiGLU or not, FP8 or BF16, 4 or 16 layers, some or all recomputed) its
    allocated peak is the measured one within 1% (e.g. 79.08 planned against 79.07 measured for the
    fast policy's 16-layer run); FP8, which it counts as BF16, measured at most 0.4% under the plan."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    candidate, layers = parse_stem(name)
    doc = read_result(RESULTS / f"{name}{arm}.yaml")
    overrides = find(candidate).proxy_overrides(layers) if arm == "" else []
    experts = {"scale_experts": 32} if find(candidate).model == "qwen35_35b_a3b" else {}
    cfg = bridge_recipes.build(doc["recipe"], scale_down=layers, flags={"gb": 8}, overrides=overrides, **experts)
    assert cfg.model.recompute_num_layers == doc["layout"]["recompute"]["num_layers"]
    planned = plan_memory(cfg, 1, gpu="h200").peak_allocated_gb
    assert planned == pytest.approx(doc["result"]["peak_allocated_gb"], rel=0.01)


def test_the_fast_recipes_evidence_is_a_reduced_scale_run_that_trained():
    """Its status is functional: the candidate's 16-layer proxy run (the recipe without the fused router
    at 16 layers on one H200) logged 16 finite losses that fell (12.83 -> 3.42), by the same check as
    every recipe's evidence."""
    from bridge_recipes import registry
    from bridge_recipes.bench.evidence import check_training

    meta = registry.find("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config").meta
    assert meta.status == "functional"
    losses = log_losses((ROOT / meta.evidence).read_text())
    check = check_training(losses)
    assert check.passed and check.figures["steps"] == 16
    assert round(check.figures["first"], 2) == 12.83 and round(check.figures["last3_min"], 2) == 3.42


def test_the_27b_fast_recipe_is_the_candidate_with_the_predictors_split():
    split = ("model.num_layers_in_first_pipeline_stage=16", "model.num_layers_in_last_pipeline_stage=12")
    fast = _fast_recipe_is_published_with("27b_te_ce_fused_swiglu_block10", split)
    assert fast.model.recompute_num_layers == 10 and fast.model.bias_activation_fusion
    from bridge_recipes import registry
    from bridge_recipes.bench.evidence import check_training

    meta = registry.find("qwen35_27b_sft_8gpu_h200_bf16_fast_config").meta
    losses = log_losses((ROOT / meta.evidence).read_text())
    assert meta.status == "functional" and check_training(losses).passed and len(losses) == 16


def _fast_27b_parts():
    """What both 27B full-scale estimates start from: the calibrated prediction of the recipe with MTP,
    the three proxies it came from (small-head slope, real-head intercept), and the measured 50.2 ms
    a micro batch split as one layer's recompute at the predictor's forward third, the fused SwiGLU's
    1% of the 4 layers and the rest on the loss."""
    from bridge_recipes.bench.predict import RECOMPUTE_FORWARD_SHARE, proxy_point

    base = _prediction("results/h200_predict_qwen35_27b_sft_8gpu_with_mtp.json")
    slope = [proxy_point(ROOT / f"results/h200_proxy_qwen35_27b_small_head_{n}_layers.yaml") for n in (4, 8)]
    head = proxy_point(RESULTS / "27b_te_ce_fused_swiglu_block10_against.yaml")
    rho = RECOMPUTE_FORWARD_SHARE
    recompute = base.per_layer_s * rho / (1 + rho * 0.75)
    swiglu = 0.01 * 4 * base.per_layer_s
    loss = _pair("27b_te_ce_fused_swiglu_block10").saved_s - recompute - swiglu
    return base, slope, head, recompute, swiglu, loss


def test_the_27b_fast_estimates_follow_from_the_committed_figures():
    """The measured 50.2 ms a micro batch split as one layer's recompute at the predictor's forward
    third (12.25 ms), the fused SwiGLU's 1% of the 4 layers (1.8 ms) and the rest on the loss (36.1
    ms); carried onto the calibrated per-stage prediction of the recipe with MTP (2,064.8): the
    published split about 2,220, the 16/18/18/12 split about 2,420 (its stages predicted from the
    same proxies), 1.17x."""
    import bridge_recipes
    from bridge_recipes.bench.predict import pipeline_candidate_estimate, predict

    base, slope, head, recompute, swiglu, loss = _fast_27b_parts()
    assert [round(x * 1000, 2) for x in (recompute, swiglu)] == [12.25, 1.84] and round(loss * 1000, 1) == 36.1
    same_split = pipeline_candidate_estimate(base, base.fixed_s, [2, 2, 2, 2], recompute, 0.99, loss)
    assert round(same_split, -1) == 2220
    name = "qwen35_27b_sft_8gpu_h200_bf16_fast_mock_config"
    # the fast recipe's stages and recompute at the published policy's measured costs; its kernels next
    split = predict(
        bridge_recipes.build(name), 8, slope, recipe="qwen35_27b_sft_8gpu_h200_bf16_mock_config", intercept=head
    )
    assert [round(t * 1000, 1) for t in split.stage_micro_batch_s] == [710.7, 784.2, 784.2, 849.4]
    best = pipeline_candidate_estimate(split, split.fixed_s, [0, 0, 0, 0], recompute, 0.99, loss)
    assert round(best, -1) == 2420 and round(best / base.tokens_per_s_per_gpu, 2) == 1.17
    assert "about 2,420" in bridge_recipes.registry.load(name.replace("_mock", "")).__doc__


def test_the_27b_bf16_moments_split_prediction_follows_from_the_calibration():
    """27b_bf16_moments_fast_split_17_18_18_11's 1.22x: the calibrated predictor at its stages, less the
    fast policy's measured kernel savings, against the published layout's 2,064.8 with MTP."""
    import bridge_recipes
    from bridge_recipes.bench.candidates import full_scale_verdict
    from bridge_recipes.bench.predict import pipeline_candidate_estimate, predict

    c = find("27b_bf16_moments_fast_split_17_18_18_11")
    base, slope, head, recompute, _, loss = _fast_27b_parts()
    cfg = bridge_recipes.build(c.mock_recipe, overrides=list(c.overrides))
    p = predict(cfg, 8, slope, recipe=c.mock_recipe, intercept=head)
    assert [round(t * 1000) for t in p.stage_micro_batch_s] == [747, 784, 784, 813]
    est = pipeline_candidate_estimate(p, p.fixed_s, [0, 0, 0, 0], recompute, 0.99, loss)
    assert round(est, -1) == 2520 and round(est / base.tokens_per_s_per_gpu, 2) == c.predicted_ratio == 1.22
    verdict = full_scale_verdict(c)
    assert verdict["fits"] and verdict["peak_gb"] == 147.5
