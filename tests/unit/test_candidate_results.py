"""The committed side-by-side candidate measurements (results/candidates/) are what their committed
logs give, and the full-scale estimate of the best one follows from them.

Each candidate command ran the candidate and its published policy on the same one-GPU proxy
(4 layers, or 16 where the file says so; the 35B-A3B with the 32 experts of its EP8 shard; 8 micro
batches of 8,192 tokens; mock rows through the mock recipe, or, where the file ends in ``_rows``, the
committed chat rows through the recipe itself) on 1 x H200 on 2026-12-01 (the op-fuser pair on 2026-12-02)."""

import dataclasses
import json
from pathlib import Path

import pytest

from bridge_recipes.bench.candidates import RESULTS, find, measured, parse_stem
from bridge_recipes.bench.harness import comparison, result_fused
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
        "27b_fused_swiglu",
        "27b_te_ce",
        "27b_te_ce_fused_swiglu_block10",
        "27b_te_ce_fused_swiglu_block10_fp8_current",
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached_rows",
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_rows",
        "27b_te_ce_fused_swiglu_block10_fp8_current_rows",
        "35b_bf16_moments_te_ce_block10",
        "35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers",
        "35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion_16_layers",
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers",
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30_16_layers",
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4_16_layers",
        "35b_block30",
        "35b_fp8_current",
        "35b_grad_accum_fusion_16_layers",
        "35b_no_recompute_cpu_adam",
        "35b_router_fusion",
        "35b_te_ce_block20",
        "35b_te_op_fuser",
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
    """The candidate's run carries exactly the candidate's proxy overrides; the other none of them. On
    chat rows both train the recipe itself on the committed rows; else its mock form."""
    candidate, layers, rows = parse_stem(name)
    overrides = find(candidate).proxy_overrides(layers)
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml") for arm in ARMS)
    cand_cmd, ref_cmd = (" ".join(d["command"].split()) for d in (cand, ref))
    assert all(o in cand_cmd.split() for o in overrides)
    assert not any(o in ref_cmd.split() for o in overrides)
    assert all(o in ref_cmd.split() for o in find(candidate).published_overrides)
    assert cand["recipe"] == ref["recipe"] == (find(candidate).recipe if rows else find(candidate).mock_recipe)
    on_rows = "--dataset sft-rows" in cand_cmd and "dataset.path=" in cand_cmd
    assert on_rows == rows and ("--dataset sft-rows" in ref_cmd) == rows
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
    1.20x); the 27B's TE cross entropy alone, 1.13x, missed (1.08x); the fast 35B-A3B policy whole at
    16 layers, 1.31x, missed (1.25x); the 27B's fused SwiGLU alone, 1.01x, met (1.01x). The fast-SwiGLU
    16-layer pair has no prediction at its depth (its 1.41x was for 4 layers). On chat rows: FP8 in its
    FP8-parameter form is a second measurement of a candidate predicted on mock rows; FP8 with BF16
    parameters was predicted for the chat rows, 1.23x, and met (1.227x); with Transformer Engine's FP8
    weight cache on, 1.24x, and met (1.2385x). A later lease (both arms with gradient-accumulation fusion,
    except where the candidate is the fusion): block recompute of 30, 1.052x, beaten (1.109x); FP8 with
    current scaling on the 35B-A3B, 0.92x, missed (0.766x); no recompute with Adam on the host, 0.81x,
    missed (0.738x); the fusion itself at 16 layers, 1.05x, beaten (1.100x). The lease after (both arms
    fused): two rows a micro batch with full recompute at 16 layers, 1.5x, beaten (1.840x). The lease after
    that (both arms fused, 16 layers): two rows with block recompute of 12 of 16, 1.95x, met (1.9625x); four
    rows a micro batch, 1.93x, missed (1.898x). 2026-12-02 (both arms fused, 4 layers): Transformer Engine's
    op-fuser chain for the routed experts, 1.02x, missed (0.935x: slower)."""
    got = {n: measured(*parse_stem(n))["tokens_per_s_ratio"] for n in MEASURED}
    assert got == {
        "27b_fp8_current": 1.0761,
        "27b_fused_swiglu": 1.0126,
        "27b_te_ce": 1.0813,
        "27b_te_ce_fused_swiglu_block10": 1.1196,
        "27b_te_ce_fused_swiglu_block10_fp8_current": 1.2041,
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached_rows": 1.2385,
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_rows": 1.2271,
        "27b_te_ce_fused_swiglu_block10_fp8_current_rows": 1.2117,
        "35b_bf16_moments_te_ce_block10": 1.4006,
        "35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers": 1.2095,
        "35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion_16_layers": 1.2461,
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers": 1.8398,
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30_16_layers": 1.9625,
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4_16_layers": 1.8982,
        "35b_block30": 1.1089,
        "35b_fp8_current": 0.7658,
        "35b_grad_accum_fusion_16_layers": 1.1001,
        "35b_no_recompute_cpu_adam": 0.7381,
        "35b_router_fusion": 1.0524,
        "35b_te_ce_block20": 1.3288,
        "35b_te_op_fuser": 0.9346,
    }
    at_its_depth = {
        parse_stem(n)[0]: find(parse_stem(n)[0]).predicted_ratio
        for n in MEASURED
        if parse_stem(n)[1] == find(parse_stem(n)[0]).proxy_layers and not parse_stem(n)[2]
    }
    assert at_its_depth == pytest.approx(
        {
            "27b_fp8_current": 1.1,
            "27b_fused_swiglu": 1.01,
            "27b_te_ce": 1.13,
            "27b_te_ce_fused_swiglu_block10": 1.18,
            "27b_te_ce_fused_swiglu_block10_fp8_current": 1.22,
            "35b_bf16_moments_te_ce_block10": 1.173,
            "35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion": 1.31,
            "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2": 1.5,
            "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30": 1.95,
            "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4": 1.93,
            "35b_block30": 1.052,
            "35b_fp8_current": 0.92,
            "35b_grad_accum_fusion": 1.05,
            "35b_no_recompute_cpu_adam": 0.81,
            "35b_router_fusion": 1.01,
            "35b_te_ce_block20": 1.109,
            "35b_te_op_fuser": 1.02,
        },
        abs=5e-4,
    )
    bf16_params = "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params"
    assert find(bf16_params).predicted_ratio == round(got[f"{bf16_params}_rows"], 2) == 1.23
    assert find(f"{bf16_params}_cached").predicted_ratio == round(got[f"{bf16_params}_cached_rows"], 2) == 1.24
    saved = _pair("27b_te_ce_fused_swiglu_block10").saved_s
    assert round(saved * 1000, 1) == 50.2
    failed = {"27b_fp8_current", "27b_te_ce_fused_swiglu_block10_fp8_current"}  # FP8 on the mock rows
    for n in MEASURED:
        curves = measured(*parse_stem(n))["loss_curves"]
        assert curves["compared"]
        if n in failed:
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
    recompute = cand["layout"]["recompute"] or {"method": None, "num_layers": 0}
    # block recompute names the layers it recomputes; uniform recomputes every layer (in groups of num_layers)
    recomputed = parse_stem(name)[1] if recompute["method"] == "uniform" else recompute["num_layers"]
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
    passes: about 5,745, 1.23x the published 4,663.1 (the fast recipe's estimate until its whole policy
    ran at 16 layers: below)."""
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


def _router_pass_at_16_layers() -> float:
    """The fused router's saving a router pass from the two 16-layer pairs: each ratio is side by side, and
    their reciprocals differ by the router's share of a published micro batch, over 2 layers x 3 + 14 x 2
    passes."""
    sixteen, whole = (
        _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers"),
        _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion_16_layers"),
    )
    assert whole.layers_not_recomputed == sixteen.layers_not_recomputed == 14
    share = sixteen.candidate_step_s / sixteen.reference_step_s - whole.candidate_step_s / whole.reference_step_s
    return share * sixteen.reference_step_s / sixteen.micro_batches / (2 * 3 + 14 * 2)


def _fast_recipe_estimate(calibrated_saved_s: float = 0.0) -> float:
    """The fast 35B-A3B recipe at full scale: the saving split from the 4- and 16-layer pairs, the fused
    router's passes of its 5 recomputed and 35 kept layers, and ``calibrated_saved_s`` more a micro batch."""
    base = _prediction("results/h200_predict_qwen35_35b_a3b_sft_8gpu.json")
    four, sixteen = (
        _pair("35b_bf16_moments_te_ce_block10"),
        _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers"),
    )
    fixed, per_layer = split_saving(four, sixteen)
    router = (5 * 3 + 35 * 2) * _router_pass_at_16_layers()
    return candidate_estimate(base, 16, sixteen, fixed + router, per_layer, 35, calibrated_saved_s)


def test_the_whole_fast_policy_at_16_layers_revises_the_routers_share():
    """The whole policy at 16 layers measured 1.246x where 1.31x was predicted: against the same policy
    without the fused router (1.2095x, another lease) the router saved 17.6 ms a micro batch at the first
    pair's published 726.4 ms, 0.52 ms a router pass over 2 layers x 3 + 14 x 2 passes, not the 1.36 ms the
    4-layer pair gave. The fast recipe's estimate with it: about 5,445 tokens/s/GPU, 1.17x the published."""
    import bridge_recipes

    router = _router_pass_at_16_layers()
    assert round(router * (2 * 3 + 14 * 2) * 1000, 1) == 17.6 and round(router * 1000, 2) == 0.52
    assert router < _router_pass_s() / 2
    best = _fast_recipe_estimate()
    assert round(best, -1) == 5450 and round(best / 4663.1, 2) == 1.17
    doc = bridge_recipes.registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config").__doc__
    assert "about 5,445" in doc and "1.17x" in doc and "1.25x (predicted 1.31x)" in doc


def test_the_router_candidates_16_layer_prediction_follows_from_the_measurements():
    """1.31x: the 16-layer pair's 600.6 ms a micro batch less 46.2 ms of router passes (2 layers x 3 + 14
    x 2 at 1.36 ms), against its published 726.4."""
    c = find("35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion")
    pair, per_pass = _pair("35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers"), _router_pass_s()
    candidate = pair.candidate_step_s / pair.micro_batches - (2 * 3 + 14 * 2) * per_pass
    assert round(candidate * 1000, 1) == 554.4 and round((2 * 3 + 14 * 2) * per_pass * 1000, 1) == 46.2
    assert round(pair.reference_step_s / pair.micro_batches / candidate, 2) == c.predicted_ratio == 1.31


def _fast_recipe_is_published_with(candidate: str, extra: tuple[str, ...] = (), recipe: str | None = None):
    """The fast recipe (``recipe``, by default the candidate's published recipe's ``_fast`` form) equals
    that published recipe with the candidate's overrides (and ``extra``) applied, part by part; returns
    the fast config."""
    from bridge_recipes import overrides, registry

    c = find(candidate)
    published = registry.load(c.recipe)()
    for token in (*c.overrides, *extra):
        overrides.apply(published, overrides.parse(token))
    fast = registry.load(recipe or c.recipe.replace("_config", "_fast_config"))()
    for part in ("model", "optimizer", "ddp", "train", "mixed_precision"):
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
    fast policy's 16-layer run); FP8, which it counts as BF16, measured at most 0.4% under the plan. The
    chat rows (one 8,192-token row a micro batch) plan as the mock rows do. Gradient-accumulation fusion's
    placeholder gradients (1.13 GB on the 35B-A3B) are counted where the run had fusion. One exception, on
    the safe side: with 90% of the optimizer on the host and no recompute the plan is 3.9% high (49.70
    GB against 47.82), the one such run measured."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    candidate, layers, _ = parse_stem(name)
    doc = read_result(RESULTS / f"{name}{arm}.yaml")
    overrides = find(candidate).proxy_overrides(layers) if arm == "" else list(find(candidate).published_overrides)
    experts = {"scale_experts": 32} if find(candidate).model == "qwen35_35b_a3b" else {}
    cfg = bridge_recipes.build(doc["recipe"], scale_down=layers, flags={"gb": 8}, overrides=overrides, **experts)
    assert cfg.model.recompute_num_layers == (doc["layout"]["recompute"] or {}).get("num_layers")
    cfg.model.gradient_accumulation_fusion = result_fused(doc)  # as the run had it
    planned = plan_memory(cfg, 1, gpu="h200").peak_allocated_gb
    if name == "35b_no_recompute_cpu_adam" and arm == "":
        assert round(planned, 2) == 49.70 and planned / doc["result"]["peak_allocated_gb"] - 1 == pytest.approx(
            0.039, abs=5e-4
        )
        return
    assert planned == pytest.approx(doc["result"]["peak_allocated_gb"], rel=0.01)


def test_the_fast_recipes_evidence_is_a_reduced_scale_run_that_trained():
    """Its status is functional: the candidate's 16-layer proxy run (the recipe's whole policy at 16 layers
    on one H200) logged 16 finite losses that fell (12.83 -> 3.42), by the same check as every recipe's
    evidence."""
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
    assert verdict["fits"] and verdict["peak_gb"] == 148.5


def test_fp8_on_chat_rows_meets_the_rule_written_before_it_ran():
    """On the committed chat rows (the recipe itself, its learning rate, 30 steps) FP8 passes the loss
    check and its last-step loss is within 1% of BF16's (0.30% below): the rule written before the run
    for FP8 to become the fast 27B recipe's precision. The losses stay far from the mock rows' 0.2."""
    name = "27b_te_ce_fused_swiglu_block10_fp8_current"
    curves = measured(name, 4, rows=True)["loss_curves"]
    assert curves["passed"] and curves["pointwise_failures"] == 0 and curves["correlation"] > 0.9997
    fp8, bf16 = (log_losses((LOGS / f"{name}_rows{arm}.log").read_text()) for arm in ARMS)
    assert len(fp8) == len(bf16) == 30
    last = (fp8[30] - bf16[30]) / bf16[30]
    assert abs(last) < 0.01 and round(last, 4) == -0.003 and min(bf16.values()) > 4.5


def test_27b_te_ce_alone_confirms_the_loss_share_of_the_fast_split():
    """27b_te_ce alone saved 36.5 ms a micro batch (1.08x, where 1.13x was predicted from the 35B-A3B's
    54.2 ms), which is the 36.1 ms the fast 27B estimates attribute to the loss after one layer's recompute
    and the fused SwiGLU's share (two leases; each figure side by side)."""
    *_, loss = _fast_27b_parts()
    alone = _pair("27b_te_ce").saved_s
    assert round(alone * 1000, 1) == 36.5 and round(loss * 1000, 1) == 36.1
    assert abs(alone - loss) / alone < 0.02


# the FP8 fast recipe's layout on top of the candidate's overrides: the predictor's split for FP8 layers
# and the recompute its FP8 weight copies leave room for
FP8_FAST_LAYOUT = (
    "model.num_layers_in_first_pipeline_stage=16",
    "model.num_layers_in_last_pipeline_stage=10",
    "model.recompute_num_layers=14",
)


def test_the_fp8_recipe_keeps_the_first_and_last_layers_in_bf16():
    """What the per-layer FP8 figure rests on: the precision the candidates name keeps one layer at each end
    in BF16, counted by the model's global layer index (so 2 of the 4-layer proxy's layers, 2 of 64 at full
    scale), and the MTP layer's FP8 context has no layer index."""
    import inspect

    from megatron.core import fp8_utils
    from megatron.core.transformer import multi_token_prediction

    import bridge_recipes
    from bridge_recipes.plan.memory import mixed_precision_config

    for name in (
        "27b_te_ce_fused_swiglu_block10_fp8_current",
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params",
    ):
        cfg = bridge_recipes.build(find(name).mock_recipe, overrides=list(find(name).overrides))
        mp = mixed_precision_config(cfg)
        assert (mp.fp8, mp.fp8_recipe, mp.first_last_layers_bf16) == ("hybrid", "tensorwise", True)
        assert (mp.num_layers_at_start_in_bf16, mp.num_layers_at_end_in_bf16) == (1, 1)
    assert "layer_no >= config.num_layers - num_bf16_layers_at_end" in inspect.getsource(fp8_utils)
    assert "get_fp8_context(self.config)" in inspect.getsource(multi_token_prediction)


def test_the_fp8_recipe_keeps_its_parameters_in_bf16():
    """The FP8 fast recipe is the BF16 fast recipe with the cached BF16-parameter candidate's precision. Why
    not the preset as it is: with FP8 parameters, Megatron-Core fills a fine-tuning run's master weights from
    the dequantized FP8 parameters after a model-only checkpoint load (precision-aware Adam with FP32 master
    shards under tensorwise FP8 leaves that copy to Megatron). With BF16 parameters Transformer Engine
    caches an FP8 copy of each weight between micro batches (cast when the first micro batch uses it)
    unless the transpose cache is off; the recipe keeps the cache."""
    import inspect

    from megatron.core.optimizer import distrib_optimizer, optimizer_config
    from transformer_engine.pytorch.module import linear

    import bridge_recipes
    from bridge_recipes.plan.memory import fp8_parameters, mixed_precision_config

    fast = _fast_recipe_is_published_with(
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached",
        FP8_FAST_LAYOUT,
        recipe="qwen35_27b_sft_8gpu_h200_fp8cs_fast_config",
    )
    mp = mixed_precision_config(fast)
    assert mp.fp8 == "hybrid" and not mp.fp8_param_gather and not mp.fp8_param
    assert not fast.model.disable_parameter_transpose_cache and fast.optimizer.use_precision_aware_optimizer
    source = inspect.getsource(distrib_optimizer.DistributedOptimizer._copy_model_params_to_main_params)
    assert "dequantize_fp8_tensor(model_param)" in source
    assert 'self.fp8_recipe is None or self.fp8_recipe == "delayed"' in inspect.getsource(optimizer_config)
    assert 'cache_name = None if (is_first_microbatch is None or self.is_fsdp2) else "weight"' in inspect.getsource(
        linear
    )
    # the preset itself stores FP8 parameters: the candidates measured on 2026-12-01 ran that form
    published = "qwen35_27b_sft_8gpu_h200_bf16_config"
    preset = bridge_recipes.build(published, overrides=["mixed_precision=bf16_with_fp8_current_scaling_mixed"])
    assert mixed_precision_config(preset).fp8_param_gather and fp8_parameters(mixed_precision_config(preset))
    assert not fp8_parameters(mp)


def test_the_bf16_params_prediction_follows_from_the_fp8_parameter_run():
    """1.23x: the FP8-parameter form's 401.1 against 482.9 ms a proxy micro batch, less its optimizer step's
    extra 86.8 ms over 8 micro batches, plus ~1.6 ms of weight casts."""
    pair = _pair("27b_te_ce_fused_swiglu_block10_fp8_current")
    opt = measured("27b_te_ce_fused_swiglu_block10_fp8_current")["optimizer_s_per_step"]
    cand, ref = pair.candidate_step_s / 8, pair.reference_step_s / 8
    assert (round(cand * 1000, 1), round(ref * 1000, 1)) == (401.1, 482.9)
    predicted = ref / (cand - (opt["candidate"] - opt["reference"]) / 8 + 0.0016)
    assert (
        round(predicted, 2) == find("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params").predicted_ratio == 1.23
    )


def _bf16_params_saving_a_layer() -> tuple[float, float]:
    """(seconds a micro batch each FP8 layer saves, the optimizer step's extra seconds a step) of FP8 with
    BF16 parameters on the 27B proxy: its chat-rows ratio against the published policy (1.2271x) less the
    BF16 fast policy's (1.1196x, mock rows; the two published arms ran 469.3 and 469.6 ms a micro batch),
    at the fast pair's published micro batch, over the 3 layers that run FP8 (the first and last of the 4
    stay BF16; the MTP layer runs FP8)."""
    fast, name = _pair("27b_te_ce_fused_swiglu_block10"), "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params"
    fp8 = measured(name, 4, rows=True)
    share = 1 / measured("27b_te_ce_fused_swiglu_block10")["tokens_per_s_ratio"] - 1 / fp8["tokens_per_s_ratio"]
    net = share * fast.reference_step_s / fast.micro_batches
    opt = fp8["optimizer_s_per_step"]
    extra = opt["candidate"] - opt["reference"]
    assert round(net * 1000, 1) == 36.7 and round(extra * 1000, 1) == 0.8
    return (net + extra / fast.micro_batches) / 3, extra


def _forward_backward(name: str) -> tuple[float, float]:
    """(candidate, published) seconds a micro batch of a chat-rows pair, the candidate's optimizer step's
    extra over the published one taken out."""
    opt = measured(name, 4, rows=True)["optimizer_s_per_step"]
    cand, ref = (read_result(RESULTS / f"{name}_rows{arm}.yaml")["result"]["step_time_mean_s"] / 8 for arm in ARMS)
    return cand - (opt["candidate"] - opt["reference"]) / 8, ref


def _weight_cast_s() -> float:
    """Seconds a weight cast of a 27B FP8 layer took: the BF16-parameter pairs on the chat rows with the
    cache off (4 casts a micro batch: 3 FP8 layers, the recomputed one twice) and on (once a step, in the
    first of 8 micro batches: 28 casts a step fewer), each forward and backward with its optimizer step's
    extra over BF16 taken out. The two published arms ran 469.3 and 469.2 ms a micro batch."""

    copies, published = _forward_backward("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params")
    cached, published_too = _forward_backward("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached")
    assert [round(x * 1000, 1) for x in (copies, cached, published, published_too)] == [382.3, 378.8, 469.3, 469.2]
    return (copies - cached) / (28 / 8)


def _fp8_fast_estimate(overrides: tuple[str, ...] = ()) -> tuple[float, float]:
    """(tokens/s/GPU, the with-MTP base's) of the FP8 fast recipe (with ``overrides``): each stage's FP8
    layers (its layers less the model's first and last, plus the MTP layer on the last) at the measured
    saving a layer without its weight casts, less the casts the stage makes a micro batch (with the cache
    one a layer a step; without it one in each forward and recomputed forward of a layer), on the
    calibrated stages of its split and recompute with the BF16 fast policy's kernel savings."""
    import bridge_recipes
    from bridge_recipes.bench.predict import pipeline_candidate_estimate, predict
    from bridge_recipes.layout import stage_layers

    base, slope, head, recompute, _, loss = _fast_27b_parts()
    a_layer, extra = _bf16_params_saving_a_layer()
    cast = _weight_cast_s()
    bare = a_layer + 4 * cast / 3  # the proxy's saving a FP8 layer came with 4 casts over its 3 FP8 layers
    cfg = bridge_recipes.build("qwen35_27b_sft_8gpu_h200_fp8cs_fast_mock_config", overrides=list(overrides))
    stages, rec = stage_layers(cfg), cfg.model.recompute_num_layers
    fp8_layers = [stages[0] - 1, *stages[1:-1], stages[-1] - 1 + cfg.model.mtp_num_layers]
    # block recompute of the first ``rec`` layers of a stage: the model's first layer (BF16) is the first
    # stage's first, its last layer (BF16) is recomputed only where the whole last stage is; MTP is not
    recomputed = [min(rec, stages[0]) - 1, *(min(rec, n) for n in stages[1:-1]), min(rec, stages[-1] - 1)]
    micro = base.micro_batches
    if cfg.model.disable_parameter_transpose_cache:
        casts = [n + r for n, r in zip(fp8_layers, recomputed)]
    else:
        casts = [n / micro for n in fp8_layers]
    saved = [n * bare - k * cast - extra * n / 3 / micro for n, k in zip(fp8_layers, casts)]
    split = predict(cfg, 8, slope, recipe="qwen35_27b_sft_8gpu_h200_bf16_mock_config", intercept=head)
    est = pipeline_candidate_estimate(split, split.fixed_s, [0, 0, 0, 0], recompute, 0.99, loss, saved)
    return est, base.tokens_per_s_per_gpu


def test_the_27b_fp8_fast_estimate_follows_from_the_committed_figures():
    """FP8 with BF16 parameters cast in every forward saved 36.7 ms a proxy micro batch over the BF16 fast
    policy, 12.3 ms for each of its 3 FP8 layers, with an optimizer step 0.8 ms longer; a cast took 1.01
    ms, so 13.6 ms a layer without its casts. On the recipe's 16/19/19/10 split with block recompute of
    14 and the weight cache (146.1 GB planned): about 3,245 tokens/s/GPU, 1.57x the published layout with
    MTP, 1.30x the published 2,499.5. Casting in every forward instead (143.7 GB) costs the middle stages
    33 casts a micro batch: about 3,075. The BF16 fast recipe's 16/18/18/12 with recompute of 10 and the
    cache does not fit (162.7 GB)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    a_layer, _ = _bf16_params_saving_a_layer()
    cast = _weight_cast_s()
    assert round(a_layer * 1000, 1) == 12.3 and round(cast * 1000, 2) == 1.01
    assert round((a_layer + 4 * cast / 3) * 1000, 1) == 13.6
    best, with_mtp = _fp8_fast_estimate()
    assert round(best, -1) == 3250 and round(best / with_mtp, 2) == 1.57 and round(best / 2499.5, 2) == 1.30
    copies = ("model.disable_parameter_transpose_cache=true",)
    assert round(_fp8_fast_estimate(copies)[0], -1) == 3080
    name = "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config"
    bf16_split = ("model.num_layers_in_last_pipeline_stage=12", "model.recompute_num_layers=10")
    for overrides, gb, fits in (((), 146.1, True), (copies, 143.7, True), (bf16_split, 162.7, False)):
        plan = plan_memory(bridge_recipes.build(name, overrides=list(overrides)), 8, gpu="h200")
        assert (round(plan.peak_gb, 1), plan.fits) == (gb, fits)
    # one recompute fewer with the cache does not fit; one more gives up about 2%
    assert not plan_memory(bridge_recipes.build(name, overrides=["model.recompute_num_layers=13"]), 8).fits
    assert round(_fp8_fast_estimate(("model.recompute_num_layers=15",))[0], -1) == 3180
    doc = bridge_recipes.registry.load(name).__doc__
    assert "about 3,245" in doc and "1.57x" in doc and "1.30x the published 2,499.5" in doc


def test_fp8_with_bf16_parameters_on_chat_rows_meets_its_rule():
    """The FP8 fast recipe's first precision (BF16 parameters, weights cast when used), on the committed chat
    rows side by side with the published policy: 1.2271x, where 1.23x was written before the run; the loss
    check passes and the last-step loss is 0.40% below BF16's (the rule: within 1%). Its optimizer step is
    BF16's (0.8 ms apart, where the FP8-parameter form's took 86.8 ms longer). So the recipe became
    functional; its evidence is now the log of its precision with the weight cache, which it took after
    (30 finite losses from 13.45)."""
    from bridge_recipes import registry
    from bridge_recipes.bench.evidence import check_training

    name = "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params"
    curves = measured(name, 4, rows=True)["loss_curves"]
    assert curves["passed"] and curves["pointwise_failures"] == 0 and curves["correlation"] > 0.9997
    fp8, bf16 = (log_losses((LOGS / f"{name}_rows{arm}.log").read_text()) for arm in ARMS)
    last = (fp8[30] - bf16[30]) / bf16[30]
    assert len(fp8) == 30 and abs(last) < 0.01 and round(last, 4) == -0.004
    meta = registry.find("qwen35_27b_sft_8gpu_h200_fp8cs_fast_config").meta
    assert meta.status == "functional" and meta.evidence == f"docs/evidence/candidates/{name}_cached_rows.log"
    check = check_training(log_losses((ROOT / meta.evidence).read_text()))
    assert check.passed and check.figures["steps"] == 30 and round(check.figures["first"], 2) == 13.45


def test_stage_savings_must_name_every_stage():
    from bridge_recipes.bench.predict import PredictionError, pipeline_candidate_estimate

    base, *_ = _fast_27b_parts()
    same = pipeline_candidate_estimate(base, base.fixed_s, [0, 0, 0, 0], 0.0)
    assert pipeline_candidate_estimate(base, base.fixed_s, [0, 0, 0, 0], 0.0, stage_saved_s=[0.0] * 4) == same
    faster = pipeline_candidate_estimate(base, base.fixed_s, [0, 0, 0, 0], 0.0, stage_saved_s=[0, 0, 0, 0.1])
    assert faster > same
    with pytest.raises(PredictionError, match="4 stages, 3 stage savings"):
        pipeline_candidate_estimate(base, base.fixed_s, [0, 0, 0, 0], 0.0, stage_saved_s=[0.0] * 3)


def _fp8_share_readings(micro: float) -> tuple[float, float]:
    """The FP8 share probe's two readings at an 8-layer BF16 micro batch of ``micro`` seconds, from
    27b_fp8_current at 4 layers: its saving going with the 6 FP8 layers (each its 4-layer share, less the
    optimizer's extra for 6 FP8 layers over 8 micro batches), or its net saving spread over every layer."""
    pair = _pair("27b_fp8_current")
    opt = measured("27b_fp8_current")["optimizer_s_per_step"]
    extra = opt["candidate"] - opt["reference"]
    a_layer = (pair.saved_s + extra / pair.micro_batches) / 3
    assert round(pair.saved_s * 1000, 1) == 34.2 and round(extra * 1000, 1) == 85.9
    assert round(a_layer * 1000, 1) == 15.0
    with_layers = micro / (micro - (6 * a_layer - extra * 6 / 3 / 8))
    return with_layers, micro / (micro - 8 * pair.saved_s / 5)


def test_the_fp8_share_probe_predictions_follow_from_the_committed_figures():
    """Written before the 8-layer small-head FP8 pair runs (scripts/gpu/queues/h200_1gpu.txt): 27b_fp8_current
    at 4 layers saved 34.2 ms a micro batch net and its optimizer step took 85.9 ms longer, so each of its 3
    FP8 layers saved 15.0 ms. At 8 layers with the small head (383.5 ms a micro batch, no MTP) 6 layers run
    FP8: 6 x 15.0 less the optimizer's extra for 6 FP8 layers over 8 micro batches, 1.22x. Spread over
    every layer instead (the 4-layer net over its 5), 8 layers save 54.7 ms: 1.17x."""
    from bridge_recipes.bench.predict import proxy_point

    micro = proxy_point(ROOT / "results/h200_proxy_qwen35_27b_small_head_8_layers.yaml").micro_batch_s
    assert round(micro * 1000, 1) == 383.5
    per_fp8_layer, spread = _fp8_share_readings(micro)
    assert (round(per_fp8_layer, 2), round(spread, 2)) == (1.22, 1.17)


def test_the_fp8_share_probe_finds_the_saving_going_with_the_fp8_layers():
    """The 8-layer small-head pair (6 of 8 layers in FP8; 1 x H200, 2026-12-01): 1.2083x. Its BF16 arm ran
    393.8 ms a micro batch, where the committed 8-layer small-head result (another lease) ran 383.5; at this
    lease's micro batch the two readings written before the run give 1.21x (the saving goes with the FP8
    layers) and 1.16x (spread over every layer): the first holds, each FP8 layer saving 14.7 ms (15.0 at 4
    layers). The optimizer step took 164.5 ms longer, 27.4 ms an FP8 layer (28.6 at 4 layers): the cast of
    the FP8 parameters scales with the FP8 layers. The loss check fails on the mock rows, as the 4-layer FP8
    runs did: FP8 runs up to 6.8% above BF16 while the loss falls to 0.03, and ends 0.1% apart."""
    from bridge_recipes.bench.predict import proxy_point

    name = "h200_proxy_qwen35_27b_fp8_small_head_8_layers"
    fp8, bf16 = (ROOT / f"results/{name}{arm}.yaml" for arm in ARMS)
    ratio = json.loads((ROOT / f"results/{name}_ratio.json").read_text())
    losses = tuple(log_losses((ROOT / f"docs/evidence/proxy/{name}{arm}.log").read_text()) for arm in ARMS)
    assert ratio == comparison(read_result(fp8), read_result(bf16), proxy=True, losses=losses)
    assert ratio["tokens_per_s_ratio"] == 1.2083
    micro, fast = proxy_point(bf16).micro_batch_s, proxy_point(fp8).micro_batch_s
    extra = ratio["optimizer_s_per_step"]["candidate"] - ratio["optimizer_s_per_step"]["reference"]
    a_layer = (micro - fast + extra / 8) / 6
    assert round(micro * 1000, 1) == 393.8 and round(extra * 1000, 1) == 164.5
    assert round(a_layer * 1000, 1) == 14.7 and round(extra / 6 * 1000, 1) == 27.4
    with_layers, spread = _fp8_share_readings(micro)
    assert (round(with_layers, 2), round(spread, 2)) == (1.21, 1.16)
    assert abs(ratio["tokens_per_s_ratio"] - with_layers) < 0.005 < abs(ratio["tokens_per_s_ratio"] - spread)
    curves = ratio["loss_curves"]
    assert not curves["passed"] and curves["pointwise_failures"] == 5
    gap = [(losses[0][s] - losses[1][s]) / losses[1][s] for s in sorted(losses[1])]
    assert round(max(gap), 3) == 0.068 and abs(gap[-1]) < 0.002 and round(losses[1][16], 2) == 0.03


def test_the_cached_fp8_weights_prediction_follows_from_the_two_chat_rows_pairs():
    """1.24x, written before it runs: the FP8-parameter and BF16-parameter forms on the same chat rows spent
    377.6 and 382.3 ms a micro batch in the forward and backward (each optimizer step's extra over BF16 taken
    out), 1.18 ms for each of the BF16-parameter form's 4 weight casts a micro batch (3 FP8 layers, the
    recomputed one cast twice). With the cache the weights are cast in the first of the 8 micro batches
    only: 28 casts a step fewer, against the BF16-parameter pair's 469.3 ms published micro batch. At the
    FP8 fast recipe's own layout the cache plans 146.1 GB (the weight-copy form 143.7)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    fp8_params, _ = _forward_backward("27b_te_ce_fused_swiglu_block10_fp8_current")
    bf16_params, published = _forward_backward("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params")
    cast = (bf16_params - fp8_params) / 4
    assert [round(x * 1000, 1) for x in (fp8_params, bf16_params, published)] == [377.6, 382.3, 469.3]
    assert round(cast * 1000, 2) == 1.18
    cached = find("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached")
    assert round(published / (bf16_params - 28 * cast / 8), 2) == cached.predicted_ratio == 1.24
    # the pairs ran on two leases: scaled to each pair's published arm the cast is 1.47 ms, the same 1.24x
    other = read_result(RESULTS / "27b_te_ce_fused_swiglu_block10_fp8_current_rows_against.yaml")
    scaled = (bf16_params - fp8_params * published / (other["result"]["step_time_mean_s"] / 8)) / 4
    assert round(scaled * 1000, 2) == 1.47 and round(published / (bf16_params - 28 * scaled / 8), 2) == 1.24
    name = "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config"
    on = plan_memory(bridge_recipes.build(name, overrides=["model.disable_parameter_transpose_cache=false"]), 8)
    assert on.fits and round(on.peak_gb, 1) == 146.1
    cfg = bridge_recipes.build(cached.mock_recipe, overrides=list(cached.overrides))
    assert not cfg.model.disable_parameter_transpose_cache and not cfg.mixed_precision.fp8_param_gather


def test_the_fp8_fast_recipe_against_the_bf16_fast_recipe_meets_its_prediction():
    """The two fast 27B recipes side by side in one command on the chat rows, both at the proxy's recompute
    of 2 of 4 layers (1 x H200, 2026-12-01): 1.0957x, where 1.10x was written before the run (the FP8
    form's 1.2271x over the BF16 fast policy's 1.1196x, each against the published policy on other runs);
    the loss check passes (last step 0.39% apart) and the FP8 run's peak is the planner's within 0.3%,
    its FP8 weight copies counted (the run predates the recipe's weight cache: its log shows it off)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    name = "h200_proxy_qwen35_27b_fp8cs_fast_vs_bf16_fast_rows"
    fp8, bf16 = (read_result(ROOT / f"results/{name}{arm}.yaml") for arm in ARMS)
    losses = tuple(log_losses((ROOT / f"docs/evidence/proxy/{name}{arm}.log").read_text()) for arm in ARMS)
    ratio = json.loads((ROOT / f"results/{name}_ratio.json").read_text())
    assert ratio == comparison(fp8, bf16, proxy=True, losses=losses)
    predicted = measured("27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params", 4, rows=True)["tokens_per_s_ratio"]
    predicted /= measured("27b_te_ce_fused_swiglu_block10")["tokens_per_s_ratio"]
    assert (
        round(predicted, 2) == round(ratio["tokens_per_s_ratio"], 2) == 1.10 and ratio["tokens_per_s_ratio"] == 1.0957
    )
    assert ratio["loss_curves"]["passed"] and ratio["loss_curves"]["pointwise_failures"] == 0
    assert round(abs(losses[0][30] - losses[1][30]) / losses[1][30], 4) == 0.0039
    for doc in (fp8, bf16):
        assert doc["layout"]["recompute"]["num_layers"] == 2 and "--dataset sft-rows" in " ".join(
            doc["command"].split()
        )
        overrides = ["model.recompute_num_layers=2"]
        cfg = bridge_recipes.build(doc["recipe"], scale_down=4, flags={"gb": 8}, overrides=overrides)
        if doc is fp8:  # as the recipe stood when it ran
            log = (ROOT / f"docs/evidence/proxy/{name}.log").read_text()
            assert "disable_parameter_transpose_cache: True" in log
            cfg.model.disable_parameter_transpose_cache = True
        cfg.model.gradient_accumulation_fusion = result_fused(doc)
        planned = plan_memory(cfg, 1, gpu="h200").peak_allocated_gb
        assert planned == pytest.approx(doc["result"]["peak_allocated_gb"], rel=0.004)


def test_the_cached_fp8_weights_meet_their_prediction_and_the_planners_cache_term():
    """The weight cache on the chat rows (1 x H200, 2026-12-01): 1.2385x, where 1.24x was written before the
    run; the loss check passes (last step 0.52% apart); a cast took 1.01 ms, not the 1.18 the prediction took;
    the planner's cache term, from Transformer Engine's source until this run, planned 101.87 GB against
    101.55 measured. So the FP8 fast recipe keeps the cache (bridge_recipes.qwen.policy.fp8_current_scaling)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    name = "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached"
    ratio = measured(name, 4, rows=True)
    assert (
        ratio["tokens_per_s_ratio"] == 1.2385 and round(ratio["tokens_per_s_ratio"], 2) == find(name).predicted_ratio
    )
    assert ratio["loss_curves"]["passed"] and ratio["loss_curves"]["pointwise_failures"] == 0
    losses = tuple(log_losses((LOGS / f"{name}_rows{arm}.log").read_text()) for arm in ARMS)
    assert round(abs(losses[0][30] - losses[1][30]) / losses[1][30], 4) == 0.0052
    assert round(_weight_cast_s() * 1000, 2) == 1.01
    doc = read_result(RESULTS / f"{name}_rows.yaml")
    cfg = bridge_recipes.build(doc["recipe"], scale_down=4, flags={"gb": 8}, overrides=find(name).proxy_overrides(4))
    assert not cfg.model.disable_parameter_transpose_cache
    cfg.model.gradient_accumulation_fusion = result_fused(doc)
    planned = plan_memory(cfg, 1, gpu="h200").peak_allocated_gb
    assert (round(planned, 2), doc["result"]["peak_allocated_gb"]) == (101.87, 101.55)
    assert not bridge_recipes.build(
        "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config"
    ).model.disable_parameter_transpose_cache


def _gemm_weights_in_log(log: str) -> tuple[int, int]:
    """(parameters, weights whose gradient a GEMM computes) of a run, from the parameters Megatron-Core's DDP
    lists with their main gradients at start-up."""
    import re

    names = set(re.findall(r"\t(module\.\S+) \(param\.main_grad", log))
    gemm = r"\.(linear_fc\d\.weight\d*|linear_qkv\.weight|linear_proj\.weight|in_proj\.weight|out_proj\.weight|"
    gemm += r"output_layer\.weight|eh_proj\.weight)$"
    return len(names), sum(1 for n in names if re.search(gemm, n))


def _fused_estimates() -> tuple[float, float, float]:
    """Gradient-accumulation fusion's saving a micro batch at full scale in the calibration's units (the fusion
    pair's, over the proxy's 1,158 GEMM weights, times the recipe's 2,790), and with it the fast recipe's and
    the published layout's full-scale estimates, tokens/s/GPU."""
    from bridge_recipes.bench.predict import scaled_saving

    base = _prediction("results/h200_predict_qwen35_35b_a3b_sft_8gpu.json")
    fusion = scaled_saving(base, 16, _pair("35b_grad_accum_fusion_16_layers"), 1158, 2790)
    micro = base.step_s / base.micro_batches
    return fusion, _fast_recipe_estimate(fusion), base.tokens_per_s_per_gpu * micro / (micro - fusion)


def test_fusion_beats_its_prediction_and_the_fast_recipe_estimate_takes_it():
    """Gradient-accumulation fusion through Transformer Engine's GEMM (bridge_recipes.te_wgrad), against the
    published 35B-A3B policy without it, at 16 layers (1 x H200, 2026-12-01): 5.489 -> 4.990 s a step,
    1.100x where 1.05x was written before the run (each of the 1,158 GEMM weights' adds taken as ~30 us of
    host time; it saved 62.4 ms a micro batch, 54 us a weight); the loss check passes. The planner counts
    the run's 1,158 GEMM weights as the log lists them, and the recipe's 2,790 at full scale. Carried
    there in the calibration's units, 175 ms a micro batch: the fast recipe about 6,165 tokens/s/GPU, 1.32x
    the published 4,663.1 and 5% short of 6,500; the published layout with fusion about 5,210 (1.12x
    the published figure, inside the calibration's 15%)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import model_dims, parallel_layout, stage_weight_gemms

    name = "35b_grad_accum_fusion_16_layers"
    ratio = measured("35b_grad_accum_fusion", 16)
    assert ratio["tokens_per_s_ratio"] == 1.1001 and find("35b_grad_accum_fusion").predicted_ratio == 1.05
    assert ratio["loss_curves"]["passed"] and ratio["loss_curves"]["pointwise_failures"] == 0
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml") for arm in ARMS)
    assert result_fused(cand) and not result_fused(ref)
    pair = _pair(name)
    assert round(pair.saved_s * 1000, 1) == 62.4
    params, gemm = _gemm_weights_in_log((LOGS / f"{name}.log").read_text())
    assert (params, gemm) == (1289, 1158) and round(pair.saved_s / gemm * 1e6) == 54

    def weights(cfg, world):
        d, par = model_dims(cfg.model), parallel_layout(cfg, world)
        return sum(stage_weight_gemms(d, par, list(range(cfg.model.num_layers)), 0).values())

    proxy = bridge_recipes.build(cand["recipe"], scale_down=16, flags={"gb": 8}, scale_experts=32)
    fast = bridge_recipes.build("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config")
    assert weights(proxy, 1) == gemm and weights(fast, 8) == 2790
    fusion, best, published = _fused_estimates()
    assert round(fusion * 1000) == 175
    assert round(best, -1) == 6160 and round(best / 4663.1, 2) == 1.32 and round(1 - best / 6500, 2) == 0.05
    assert round(published, -1) == 5210 and round(published / 4663.1, 2) == 1.12 and round(best / published, 2) == 1.18
    doc = bridge_recipes.registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_config").__doc__
    assert "about 6,165" in doc and "1.32x" in doc and "5,210" in doc


def test_the_queued_fused_fast_against_fused_published_prediction_follows_from_the_pairs():
    """1.28x, written in the one-GPU queue before the run (docs/performance_candidates.md keeps it): the fast
    policy without fusion at the fusion pair's scale (its published arm over the whole fast policy's 1.2461x),
    less fusion's saving a step, against the published policy with fusion. It ran 1.544x (the lease's host;
    tests/unit/test_proxy_results.py)."""
    fusion = _pair("35b_grad_accum_fusion_16_layers")
    whole = measured("35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion", 16)["tokens_per_s_ratio"]
    fast = fusion.reference_step_s / whole - (fusion.reference_step_s - fusion.candidate_step_s)
    assert round(fast, 3) == 3.906 and round(fusion.candidate_step_s / fast, 2) == 1.28


def _host_step_model() -> tuple[float, float, float, float, dict]:
    """The host's step model from the two unfused 16-layer traces (1 x H200, 2026-12-01): seconds a kernel
    launched and the fixed seconds of a step, the published policy's launches a micro batch with fusion (its
    kernels less the GEMM weights' adds the fused trace lost), the published policy's GPU busy seconds less
    its unfused adds' kernel time, and the published trace's summary."""

    def trace(arm):
        summary = json.loads((ROOT / f"results/h200_trace_qwen35_35b_a3b_{arm}_16_layers.json").read_text())
        result = read_result(ROOT / f"results/h200_proxy_qwen35_35b_a3b_{arm}_16_layers_traced.yaml")
        return summary, result["result"]["step_time_mean_s"]

    (published, published_s), (fast, fast_s), (fused, _) = (trace(a) for a in ("h200_policy", "fast", "fast_fused"))
    per_kernel = (published_s - fast_s) / (published["kernels_per_step"] - fast["kernels_per_step"])
    fixed = published_s - per_kernel * published["kernels_per_step"]
    per_micro = (published["kernels_per_step"] - (fast["kernels_per_step"] - fused["kernels_per_step"])) / 8
    add = [k for k in published["top_kernels"] if "CUDAFunctor_add<float>" in k["name"]][0]
    return per_kernel, fixed, per_micro, (published["busy_ms"] - add["ms"]) / 1000, published


def test_the_two_rows_a_micro_batch_prediction_follows_from_the_traces():
    """35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2's 1.5x, written before it ran: the host's step
    model from the two unfused 16-layer traces (63.9 us a kernel plus 0.71 s), the published policy's launches
    with fusion (9,391 a micro batch), halved by two rows a micro batch, against the GPU's unchanged 3.05 s;
    1.77x if host and GPU overlapped, 1.48x with a fifth of the GPU's time waited for at each MoE layer's copy
    of the experts' token counts, written as 1.5x. At full scale it plans
    110.9 GB, well inside the H200."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    per_kernel, fixed, per_micro, gpu, published = _host_step_model()
    assert round(per_kernel * 1e6, 1) == 63.9 and round(fixed, 2) == 0.71
    assert per_micro == 9391
    host_one, host_two = (n * per_micro * per_kernel + fixed for n in (8, 4))
    # the GPU's busy time less the unfused adds' (10,312 launches of an FP32 add in either trace)
    add = [k for k in published["top_kernels"] if "CUDAFunctor_add<float>" in k["name"]][0]
    assert add["launches"] == 10312
    assert (round(host_one, 2), round(host_two, 2), round(gpu, 2)) == (5.51, 3.11, 3.05)
    overlapped = host_one / max(host_two, gpu)
    exposed = host_one / (host_two + gpu / 5)  # a fifth of the GPU's time waited for at the MoE layers' copies
    c = find("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2")
    assert round(overlapped, 2) == 1.77 and round(exposed, 2) == 1.48 and c.predicted_ratio == round(exposed, 1)
    plan = plan_memory(bridge_recipes.build(c.recipe, overrides=list(c.overrides)), 8, gpu="h200")
    assert plan.fits and round(plan.peak_gb, 1) == 110.9


def _candidate_recipe(
    name: str, recipe: str, ratio: float, predicted: float, correlation: float, planned_gb: float, losses: tuple
) -> tuple[dict, object, object]:
    """What makes a 16-layer candidate a recipe: its measured ratio and the prediction written before it, the
    loss check passed at ``correlation``, the recipe building the published recipe with the candidate's
    overrides, fitting at full scale (``planned_gb``), and its evidence, the candidate's own run, trained
    (16 finite losses, first and last-three minimum ``losses``). Returns the ratio file, the config and the
    plan."""
    from bridge_recipes import registry
    from bridge_recipes.bench.evidence import check_training
    from bridge_recipes.plan.memory import plan_memory

    got = measured(name, 16)
    assert got["tokens_per_s_ratio"] == ratio and find(name).predicted_ratio == predicted
    assert got["loss_curves"]["passed"] and round(got["loss_curves"]["correlation"], 6) == correlation
    cand = read_result(RESULTS / f"{name}_16_layers.yaml")
    cfg = _fast_recipe_is_published_with(name, recipe=recipe)
    assert result_fused(cand) and cand["layout"]["rows_per_microbatch"] == cfg.train.micro_batch_size
    plan = plan_memory(cfg, 8, gpu="h200")
    assert plan.fits and round(plan.peak_gb, 1) == planned_gb
    meta = registry.find(recipe).meta
    check = check_training(log_losses((ROOT / meta.evidence).read_text()))
    assert meta.status == "functional" and check.passed and check.figures["steps"] == 16
    assert (round(check.figures["first"], 2), round(check.figures["last3_min"], 2)) == losses
    return got, cfg, plan


FAST_VS_PUBLISHED_FUSED = "results/h200_proxy_qwen35_35b_a3b_fast_vs_published_fused_16_layers"


def _two_rows_over_fast() -> float:
    """The two-rows candidate over the fast recipe: the fast recipe's step in its fused pair against the
    published policy over the two-rows candidate's step in its pair (the same lease, 2026-12-01)."""
    fast_s = read_result(ROOT / f"{FAST_VS_PUBLISHED_FUSED}.yaml")["result"]["step_time_mean_s"]
    return fast_s / _pair("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers").candidate_step_s


def _direct_pair(stem: str) -> dict:
    """The ratio file of a 35B-A3B recipe measured against another in one command at 16 layers
    (results/h200_proxy_qwen35_35b_a3b_{stem}_16_layers_ratio.json; tests/unit/test_proxy_results.py checks
    it against its two result files)."""
    return json.loads((ROOT / f"results/h200_proxy_qwen35_35b_a3b_{stem}_16_layers_ratio.json").read_text())


def _direct_steps(stem: str) -> tuple[float, float]:
    """The two arms' mean step times of a direct pair, the first recipe's then the second's."""
    return tuple(
        read_result(ROOT / f"results/h200_proxy_qwen35_35b_a3b_{stem}_16_layers{arm}.yaml")["result"][
            "step_time_mean_s"
        ]
        for arm in ARMS
    )


def test_two_rows_a_micro_batch_beat_their_prediction_and_are_the_fast_mt16k_recipe():
    """The two-rows candidate at 16 layers against the published policy, both with gradient-accumulation fusion
    (1 x H200, 2026-12-01, the lease after the fusion pair's): 3.679 against 6.769 s a step, 1.840x where 1.5x
    was written before (the overlapped reading, 1.77x, was nearer: the fast kernels' own fewer launches were
    not counted); the loss curves agree. It fits at full scale (110.9 GB) and becomes
    qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config, whose evidence is this run (16 finite, falling
    losses). The same lease's fast-against-published pair (tests/unit/test_proxy_results.py) made it 1.18x
    the fast recipe, the two published arms 0.6% apart; a later lease measured the two recipes in one
    command, 1.17x. At full scale about 7,215 tokens/s/GPU (the fast recipe's 6,165 x 1.1707), 1.55x the
    published 4,663.1; the 1.84x carried onto the published layout's fused estimate (5,210) reads 9,590."""
    from bridge_recipes import registry

    name, recipe = (
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2",
        "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config",
    )
    ratio, fast, _ = _candidate_recipe(name, recipe, 1.8398, 1.5, 0.999994, 110.9, (12.82, 3.39))
    ref = read_result(RESULTS / f"{name}_16_layers_against.yaml")
    assert result_fused(ref) and ref["layout"]["rows_per_microbatch"] == 1
    two = _pair(f"{name}_16_layers")
    assert (two.candidate_step_s, two.reference_step_s) == (3.6789, 6.7686)
    assert fast.train.micro_batch_size == 2 and (fast.model.recompute_method, fast.model.recompute_num_layers) == (
        "uniform",
        1,
    )

    published_s = read_result(ROOT / f"{FAST_VS_PUBLISHED_FUSED}_against.yaml")["result"]["step_time_mean_s"]
    assert round(published_s / two.reference_step_s - 1, 3) == -0.006
    over_fast = _two_rows_over_fast()
    assert round(over_fast, 2) == 1.18

    direct = _direct_pair("fast_mt16k_vs_fast")
    assert direct["tokens_per_s_ratio"] == 1.1707 and round(direct["tokens_per_s_ratio"], 2) == 1.17
    # written before it ran: the two pairs' 1.18x; met within 1%, the loss curves agreeing
    assert abs(direct["tokens_per_s_ratio"] / round(over_fast, 2) - 1) < 0.01 and direct["loss_curves"]["passed"]
    assert _direct_steps("fast_mt16k_vs_fast") == (3.7308, 4.3675)
    _, fast_estimate, published_estimate = _fused_estimates()
    estimate = fast_estimate * direct["tokens_per_s_ratio"]
    assert round(estimate, -1) == 7220 and round(estimate / 4663.1, 2) == 1.55 and estimate > 6500
    carried = published_estimate * ratio["tokens_per_s_ratio"]
    assert round(carried, -1) == 9590
    doc = registry.load(recipe).__doc__
    assert "about 7,215" in doc and "1.55x" in doc and "9,590" in doc and "1.84x (predicted 1.5x)" in doc
    assert "3.731 against 4.368 s, 1.17x (predicted 1.18x" in doc


def test_the_two_rows_block30_prediction_follows_from_the_two_rows_pair():
    """1.95x, written before it runs: the two-rows candidate's 3.679 s, less a quarter of the launches (the
    recomputed forward of forward, recomputed forward and a backward of two forwards) of 4 of its 16 layers,
    the layers' share of the step from the host model (0.71 s of the published policy's 5.51 fixed), against
    the pair's published 6.769 s. The planner: 141.3 GB at full scale, inside the H200."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    per_kernel, fixed, per_micro, _, _ = _host_step_model()
    host = 8 * per_micro * per_kernel + fixed
    layers_share = 1 - fixed / host
    assert round(host, 2) == 5.51 and round(layers_share, 3) == 0.870
    two = _pair("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers")
    c = find("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30")
    assert c.proxy_overrides(16)[-1] == "model.recompute_num_layers=12"
    kept = 16 - 12
    saved = two.candidate_step_s * layers_share * kept / 16 / 4
    assert round(saved, 3) == 0.200 and round(two.candidate_step_s - saved, 3) == 3.479
    assert round(two.reference_step_s / (two.candidate_step_s - saved), 2) == c.predicted_ratio == 1.95
    plan = plan_memory(bridge_recipes.build(c.recipe, overrides=list(c.overrides)), 8, gpu="h200")
    assert plan.fits and round(plan.peak_gb, 1) == 141.3


def test_the_four_rows_prediction_follows_from_the_two_rows_pair():
    """1.93x, written before it runs: the host's model at four rows a micro batch (2 x 9,391 launches a step:
    1.91 s) scaled by the two-rows pair's measured step over the model's two-row host time (3.679 / 3.11)
    puts the host under the GPU's 3.05 s; the step is then the GPU's plus a fifth of the host's time, against
    the pair's published 6.769 s. The planner: 139.7 GB at full scale; the proxy's 8 rows make 2 micro
    batches."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    per_kernel, fixed, per_micro, gpu, _ = _host_step_model()
    host_two, host_four = (n * per_micro * per_kernel + fixed for n in (4, 2))
    assert (round(host_two, 2), round(host_four, 2), round(gpu, 2)) == (3.11, 1.91, 3.05)
    two = _pair("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers")
    host = two.candidate_step_s * host_four / host_two
    assert round(host, 2) == 2.26 and host < gpu
    step = gpu + host / 5
    c = find("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4")
    assert round(step, 2) == 3.51 and round(two.reference_step_s / step, 2) == c.predicted_ratio == 1.93
    cfg = bridge_recipes.build(c.recipe, overrides=list(c.overrides))
    plan = plan_memory(cfg, 8, gpu="h200")
    assert plan.fits and round(plan.peak_gb, 1) == 139.7
    proxy = bridge_recipes.build(c.mock_recipe, scale_down=16, flags={"gb": 8}, overrides=c.proxy_overrides(16))
    assert proxy.train.global_batch_size // proxy.train.micro_batch_size == 2


def test_block30_met_its_prediction_against_the_published_policy():
    """The two-rows policy with block recompute of 12 of its 16 layers against the published policy, both fused
    (1 x H200, 2026-12-01, the lease after the two-rows pair's): 3.287 against 6.450 s a step, 1.9625x where
    1.95x was written before; the loss curves agree; it fits at full scale (141.3 GB, the planner within 0.2%
    of its proxy's peak: 86.52 planned, 86.67 GB allocated). Against the two-rows recipe directly, in one
    command, it gained nothing (test_four_rows_lead_the_direct_pairs_and_are_the_fast_mt32k_recipe), so it is
    no recipe."""
    import bridge_recipes
    from bridge_recipes import registry
    from bridge_recipes.plan.memory import plan_memory

    name = "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30"
    got = measured(name, 16)
    assert got["tokens_per_s_ratio"] == 1.9625 and find(name).predicted_ratio == 1.95
    assert got["loss_curves"]["passed"] and round(got["loss_curves"]["correlation"], 6) == 0.999997
    pair = _pair(f"{name}_16_layers")
    assert (pair.candidate_step_s, pair.reference_step_s, pair.layers_not_recomputed) == (3.2868, 6.4504, 4)
    c = find(name)
    plan = plan_memory(bridge_recipes.build(c.recipe, overrides=list(c.overrides)), 8, gpu="h200")
    assert plan.fits and round(plan.peak_gb, 1) == 141.3
    assert not [n for n in registry.entries() if "_fast_mt16k_block30" in n]


# Two direct pairs of 2026-12-01's eighth lease (1 x H200, 16 layers, one command each) and the ratio written
# before each ran: block30 over four rows, block30 over two rows (the third, two rows over the fast recipe, is
# judged in the two-rows recipe's test); four rows over two rows is the next lease's (2026-12-02).
DIRECT_PREDICTIONS = {"fast_mt16k_block30_vs_mbs4": 1.03, "fast_mt16k_block30_vs_fast_mt16k": 1.06}
FOUR_OVER_TWO = "fast_mt32k_vs_fast_mt16k"
FOUR_OVER_TWO_PREDICTED = 1.09


def test_four_rows_lead_the_direct_pairs_and_are_the_fast_mt32k_recipe():
    """The eighth lease's direct pairs, each one command at 16 layers. Block30 against four rows: 0.9134, where
    1.03 was written before (from each one's ratio against the published arm of its own pair): four rows lead,
    3.351 against 3.669 s. Block30 against two rows: 0.9962, where 1.06 was written before: keeping 4 of 16
    layers' activations gained nothing measurable, so the 1.9625x above was its published arm's slow host.
    Four rows a micro batch (1.8982x against the published policy in one command, loss check passed, 139.7 GB
    planned at full scale, the planner within 0.5% of the proxy's 99.90 GB) becomes
    qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config, whose evidence is its candidate run. The two pairs
    made four rows 0.9962 / 0.9134 = 1.0907x two rows, written before the direct pair of the next lease (1 x
    H200, 2026-12-02) as 1.09x; it measured 1.0216 (3.391 against 3.464 s), missed: the block30 arm ran
    3.669 and 3.820 s in its two pairs, 4% apart, so the quotient carried that lease's drift. Four rows still
    lead, by less than a single pair's ~4%. At full scale about 7,370 tokens/s/GPU: the two-rows recipe's
    7,215 times 1.0216, 1.58x the published 4,663.1; the two pairs' quotient read 7,870 and the 1.90x carried
    onto the published layout's fused estimate (5,210) reads 9,890. Under full recompute only the layer being
    rebuilt holds its experts' token copies (1.88 GB balanced): the 10.5 GB of allocation the plan leaves
    holds the hottest rank receiving about 6.6x its balanced share."""
    from bridge_recipes import registry
    from bridge_recipes.plan import memory as mem

    name, recipe = (
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4",
        "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt32k_config",
    )
    pairs = {stem: _direct_pair(stem) for stem in DIRECT_PREDICTIONS}
    over_four, over_two = (pair["tokens_per_s_ratio"] for pair in pairs.values())
    assert (over_four, over_two) == (0.9134, 0.9962)
    for stem, predicted in DIRECT_PREDICTIONS.items():
        assert pairs[stem]["tokens_per_s_ratio"] < predicted - 0.05, stem  # both missed, by 6% or more
        assert pairs[stem]["loss_curves"]["passed"], stem
    assert _direct_steps("fast_mt16k_block30_vs_mbs4") == (3.6687, 3.3508)
    # the prediction's basis: each one's ratio against the published arm of its own pair
    block30 = measured("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30", 16)["tokens_per_s_ratio"]
    assert (
        round(block30 / measured(name, 16)["tokens_per_s_ratio"], 2)
        == DIRECT_PREDICTIONS["fast_mt16k_block30_vs_mbs4"]
    )
    four_rows = read_result(
        ROOT / "results/h200_proxy_qwen35_35b_a3b_fast_mt16k_block30_vs_mbs4_16_layers_against.yaml"
    )
    assert four_rows["layout"]["rows_per_microbatch"] == 4 and "train.micro_batch_size=4" in four_rows["command"]

    ratio, cfg, plan = _candidate_recipe(name, recipe, 1.8982, 1.93, 0.999997, 139.7, (12.82, 3.41))
    assert (cfg.train.micro_batch_size, cfg.model.recompute_method, cfg.model.recompute_num_layers) == (
        4,
        "uniform",
        1,
    )
    two_rows = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config")()
    two_rows.train.micro_batch_size = 4
    for part in ("model", "optimizer", "ddp", "train", "mixed_precision"):
        assert repr(getattr(cfg, part)) == repr(getattr(two_rows, part)), part

    # the token copies of the one layer being rebuilt, against the allocation the planner leaves
    d, par = mem.model_dims(cfg.model), mem.parallel_layout(cfg, 8)
    routed = mem.routed_tokens(d, mem.micro_batch_tokens(cfg, par))
    per_layer = mem.BF16 * mem.routed_activation_elems(d, par, routed) / 1e9
    left = (plan.gpu_memory_gb - mem.FRAMEWORK_CONSTANT_GB) / (1 + mem.FRAMEWORK_FRACTION) - plan.peak_allocated_gb
    assert mem.mtp_recomputed(cfg.model) and round(per_layer, 2) == 1.88 and round(left, 1) == 10.5
    assert round(1 + left / per_layer, 1) == 6.6 and 1 + left / per_layer < cfg.model.moe_router_topk

    _, fast_estimate, published_estimate = _fused_estimates()
    two_rows_estimate = fast_estimate * _direct_pair("fast_mt16k_vs_fast")["tokens_per_s_ratio"]
    quotient = over_two / over_four
    assert round(quotient, 4) == 1.0907 and round(quotient, 2) == FOUR_OVER_TWO_PREDICTED
    direct = _direct_pair(FOUR_OVER_TWO)
    assert direct["tokens_per_s_ratio"] == 1.0216 and _direct_steps(FOUR_OVER_TWO) == (3.391, 3.4643)
    assert direct["loss_curves"]["passed"] and round(direct["loss_curves"]["correlation"], 6) == 0.999997
    assert 1 < direct["tokens_per_s_ratio"] < FOUR_OVER_TWO_PREDICTED - 0.05  # ahead, and missed by over 5%
    block30_arms = [_direct_steps(stem)[0] for stem in DIRECT_PREDICTIONS]
    assert block30_arms == [3.6687, 3.8196] and round(block30_arms[1] / block30_arms[0] - 1, 2) == 0.04
    assert round(two_rows_estimate * quotient, -1) == 7870
    estimate = two_rows_estimate * direct["tokens_per_s_ratio"]
    assert round(estimate, -1) == 7370 and round(estimate / 4663.1, 2) == 1.58 and estimate > 6500
    assert round(published_estimate * ratio["tokens_per_s_ratio"], -1) == 9890
    doc = registry.load(recipe).__doc__
    assert "about 7,370" in doc and "1.58x" in doc and "7,870" in doc and "9,890" in doc
    assert "1.90x (predicted 1.93x)" in doc and "3.391 against 3.464 s, 1.02x (predicted 1.09x" in doc
    assert "99.42 planned, 99.90 GB allocated" in doc and "about 6.6x its balanced share" in doc
    assert "3.351 against 3.669 s, 1.095x" in doc


def test_four_rows_missed_through_the_published_arm():
    """Four rows a micro batch against the published policy (1 x H200, 2026-12-01, the block30 pair's lease):
    3.167 against 6.012 s, 1.898x where 1.93x was written before. The candidate's step beat the 3.51 s the
    prediction expected; the miss is in the published arm, 6.012 s against the 6.769 s the prediction took
    from the lease before: the published step is the host's, and a faster host shortens it more than a step
    near the GPU's 3.05 s. Against that 6.769 s the four-rows step reads 2.14x. In the same lease the block30
    pair's published arm ran 6.450 s, 7% slower than this pair's: within a lease the host varies as much as
    the two candidates differ, so their ranking (1.96x over 1.90x) is not settled by these pairs; the direct
    pair of the lease after settles it for four rows."""
    name = "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4"
    ratio = measured(name, 16)
    assert ratio["tokens_per_s_ratio"] == 1.8982 and find(name).predicted_ratio == 1.93
    assert ratio["loss_curves"]["passed"] and ratio["loss_curves"]["pointwise_failures"] == 0
    four = _pair(f"{name}_16_layers")
    two = _pair("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_16_layers")
    block30 = _pair("35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30_16_layers")
    assert (four.candidate_step_s, four.reference_step_s) == (3.1671, 6.0117)
    assert four.candidate_step_s < 3.51 < two.reference_step_s / find(name).predicted_ratio + 0.01
    assert round(two.reference_step_s / four.candidate_step_s, 2) == 2.14
    assert round(block30.reference_step_s / four.reference_step_s - 1, 2) == 0.07
    assert four.candidate_step_s < block30.candidate_step_s
    assert four.reference_step_s / four.candidate_step_s < block30.reference_step_s / block30.candidate_step_s


def test_the_op_fuser_chain_ran_and_is_slower_on_hopper():
    """Transformer Engine's op-fuser chain for the routed experts against the published policy at 4 layers
    (1 x H200, 2026-12-02, both arms fused): Megatron-Core took the option (the candidate's log lists it on,
    the published one's does not), the peak memory is the same, and the step took 21 ms more a micro batch
    where about 6 ms less was written before (1.02x): 0.935x, so it is no recipe."""
    name = "35b_te_op_fuser"
    cand_log, ref_log = ((LOGS / f"{name}{arm}.log").read_text() for arm in ARMS)
    assert "use_transformer_engine_op_fuser: True" in cand_log
    assert "use_transformer_engine_op_fuser: True" not in ref_log
    cand, ref = (read_result(RESULTS / f"{name}{arm}.yaml")["result"] for arm in ARMS)
    assert cand["peak_allocated_gb"] == ref["peak_allocated_gb"] == 60.776
    pair = _pair(name)
    assert (pair.candidate_step_s, pair.reference_step_s) == (2.5678, 2.4)
    assert round((pair.candidate_step_s - pair.reference_step_s) / 8 * 1000) == 21
    assert measured(name)["tokens_per_s_ratio"] == 0.9346 < 1 < find(name).predicted_ratio


def test_the_four_rows_estimate_meets_the_target_only_if_the_ep8_all_to_all_stays_under_7_ms():
    """The fast recipes' full-scale estimates have no expert-parallel all-to-all, like the calibration they
    scale. Moved to the one-host calibration's frame (its step 0.872 of the committed one's), and given the
    all-to-all that closes that calibration's gap to the published 4,663.1 (5.8 ms a MoE layer a row), the
    four-rows recipe reads about 6,820 tokens/s/GPU and the two-rows one about 6,700. The four-rows recipe
    stays at 6,500 or above while the exposed all-to-all is under 7.3 ms a layer a row (the two-rows one:
    6.7). The two-GPU suite's bound (2026-11-30: EP2 0.247 s a step over half the one-GPU step, 7.7 ms a
    layer a row) gives 6,410; scaled to EP8 by the share of tokens leaving a GPU (13.5 ms), 5,420. Which
    holds only the two-GPU trace or the 8-GPU run can tell."""
    from bridge_recipes.bench.evidence import TWO_GPU_LAYERS, TWO_GPU_LAYOUTS, TWO_GPU_TRAIN_FLAGS, two_gpu_results
    from bridge_recipes.bench.predict import comm_to_reach_s, ep_comm_scale, with_exposed_comm

    committed, one_host = (
        json.loads((ROOT / f"results/h200_predict_qwen35_35b_a3b_sft_8gpu{s}.json").read_text())
        for s in ("", "_one_host")
    )
    frame = one_host["step_s"] / committed["step_s"]
    gap = comm_to_reach_s(one_host["tokens_per_s_per_gpu"], 4663.1, 40, 8192)
    assert round(frame, 3) == 0.872 and round(gap * 1000, 1) == 5.8

    log = (ROOT / "docs/evidence/two_gpu/h200x2_qwen35_35b_a3b_layouts.log").read_text()
    one_gpu, ep2 = (r["step_s"] for r in two_gpu_results("qwen35_35b_a3b", log)[:2])
    measured_ep = TWO_GPU_LAYOUTS["ep2"]["flags"]["ep"]
    micro_batches = TWO_GPU_TRAIN_FLAGS["gb"] // measured_ep  # EP2 over two GPUs is DP2, one row a micro batch
    ep2_bound = (ep2 - one_gpu / measured_ep) / (TWO_GPU_LAYERS["qwen35_35b_a3b"] * micro_batches)
    ep8_bound = ep2_bound * ep_comm_scale(measured_ep, 8)
    assert ep_comm_scale(measured_ep, 8) == 1.75
    assert round(ep2 - one_gpu / 2, 3) == 0.247 and round(ep2_bound * 1000, 1) == 7.7
    assert round(ep8_bound * 1000, 1) == 13.5

    _, fast_estimate, _ = _fused_estimates()
    two_rows = fast_estimate * _direct_pair("fast_mt16k_vs_fast")["tokens_per_s_ratio"]
    four_rows = two_rows * _direct_pair(FOUR_OVER_TWO)["tokens_per_s_ratio"]
    readings = {
        name: [round(with_exposed_comm(rate, c, 40, 8192, frame), -1) for c in (gap, ep2_bound, ep8_bound)]
        for name, rate in (("four rows", four_rows), ("two rows", two_rows))
    }
    assert readings == {"four rows": [6820, 6410, 5420], "two rows": [6700, 6300, 5350]}
    break_even = [comm_to_reach_s(rate, 6500, 40, 8192, frame) for rate in (four_rows, two_rows)]
    assert [round(c * 1000, 1) for c in break_even] == [7.3, 6.7]
    assert gap < break_even[1] < break_even[0] < ep2_bound < ep8_bound
