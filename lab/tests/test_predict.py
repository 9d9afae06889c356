"""The full-scale predictor (lab.predict, python -m lab.benchmark --predict): the
slope-and-intercept arithmetic on proxy result files, the pipeline bubble, the error band, the
calibration against the published figure, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lab import benchmark as bench
from lab.predict import (
    PredictionError,
    comm_to_reach_s,
    predict,
    proxy_point,
    with_exposed_comm,
)

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "lab/results/h200_proxy_qwen35_35b_a3b_h200_policy.yaml"  # 4 layers
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"


def deeper(tmp_path, layers: int, step_s: float, cv: float = 0.0, name: str = "deep.yaml") -> Path:
    """The committed proxy result as if measured at another depth (a stand-in for a GPU run)."""
    doc = yaml.safe_load(PROXY.read_text())
    doc["command"] = doc["command"].replace("--scale-down 4", f"--scale-down {layers}")
    doc["result"]["step_time_mean_s"] = step_s
    doc["result"]["step_time_cv_percent"] = cv
    out = tmp_path / name
    out.write_text(yaml.safe_dump(doc))
    return out


def test_slope_and_intercept_extrapolate_to_the_recipe(tmp_path):
    import bridge_recipes

    shallow = proxy_point(deeper(tmp_path, 4, 2.6, name="a.yaml"))
    deep = proxy_point(deeper(tmp_path, 8, 4.0, name="b.yaml"))
    cfg = bridge_recipes.build(RECIPE)
    p = predict(cfg, 8, [deep, shallow], recipe=RECIPE, published=4663.1)
    # 8 micro batches per proxy step: 0.325 and 0.5 s; 43.75 ms per layer, 150 ms fixed
    assert p.per_layer_s == pytest.approx((0.5 - 0.325) / 4) and p.fixed_s == pytest.approx(0.325 - 4 * 0.04375)
    # 128 rows / DP8 = 16 micro batches of 40 layers, no pipeline: 16 x (40 x 43.75 + 150) ms
    assert p.micro_batches == 16 and p.bubble_micro_batches == 0
    assert p.step_s == pytest.approx(16 * (40 * 0.04375 + 0.15))
    assert p.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / 8 / p.step_s)
    assert p.low == p.high == pytest.approx(p.tokens_per_s_per_gpu)  # no spread measured, no band
    assert p.calibration["within"] is (abs(p.tokens_per_s_per_gpu / 4663.1 - 1) <= 0.15)
    assert "no expert-parallel all-to-all measured" in p.notes[0]
    with_comm = predict(cfg, 8, [deep, shallow], recipe=RECIPE, ep_comm_s=0.005)
    assert with_comm.step_s == pytest.approx(16 * (40 * (0.04375 + 0.005) + 0.15)) and not with_comm.notes


def test_the_band_widens_with_the_extrapolation(tmp_path):
    import bridge_recipes

    a = proxy_point(deeper(tmp_path, 4, 2.6, cv=5.0, name="a.yaml"))
    near = proxy_point(deeper(tmp_path, 8, 4.0, cv=5.0, name="b.yaml"))
    far = proxy_point(deeper(tmp_path, 16, 6.8, cv=5.0, name="c.yaml"))
    cfg = bridge_recipes.build(RECIPE)
    narrow, wide = predict(cfg, 8, [a, far], recipe=RECIPE), predict(cfg, 8, [a, near], recipe=RECIPE)
    assert narrow.low < narrow.tokens_per_s_per_gpu < narrow.high
    assert (wide.high - wide.low) > (narrow.high - narrow.low)


def test_pipeline_recipes_pay_the_bubble_on_the_slowest_stage(tmp_path):
    import bridge_recipes

    name = "qwen35_27b_sft_8gpu_h200_bf16_config"  # PP4 DP2, 16 layers per stage
    doc = yaml.safe_load((ROOT / "lab/results/h200_proxy_qwen35_27b_h200_policy.yaml").read_text())
    points = []
    for layers, step in ((4, 3.0), (8, 5.0)):
        d = dict(doc, command=doc["command"].replace("--scale-down 4", f"--scale-down {layers}"))
        d["result"] = dict(doc["result"], step_time_mean_s=step, step_time_cv_percent=0.0)
        d["layout"] = dict(doc["layout"], recompute=dict(doc["layout"]["recompute"], num_layers=3 * layers // 4))
        (tmp_path / f"{layers}.yaml").write_text(yaml.safe_dump(d))
        points.append(proxy_point(tmp_path / f"{layers}.yaml"))
    from bridge_recipes.plan.layout import stage_layers

    cfg = bridge_recipes.build(name)
    p = predict(cfg, 8, points, recipe=name)
    micro = cfg.train.global_batch_size // (cfg.train.micro_batch_size * 2)
    slope, fixed = (5.0 - 3.0) / 8 / 4, 3.0 / 8 - 4 * (5.0 - 3.0) / 8 / 4
    *inner, last = stage_layers(cfg)  # the recipe's split: the last stage also holds the head

    def layer(n: int) -> float:  # block recompute of 12 of the stage's n layers, the proxies' 3 of 4
        return slope * (1 + min(12, n) / n / 3) / (1 + 0.75 / 3)

    slowest = max(max(n * layer(n) for n in inner), last * layer(last) + fixed)
    assert p.bubble_micro_batches == 3 and p.step_s == pytest.approx((micro + 3) * slowest)


def test_refusals_name_the_problem(tmp_path):
    import bridge_recipes

    a = proxy_point(deeper(tmp_path, 4, 2.6, name="a.yaml"))
    cfg = bridge_recipes.build(RECIPE)
    with pytest.raises(PredictionError, match="both proxy results have 4 layers"):
        predict(cfg, 8, [a, a], recipe=RECIPE)
    with pytest.raises(PredictionError, match="not qwen35_27b"):
        predict(cfg, 8, [a, proxy_point(deeper(tmp_path, 8, 4.0))], recipe="qwen35_27b_sft_8gpu_h200_bf16_config")
    tp = bridge_recipes.build("qwen35_35b_a3b_sft_8gpu_h100_bf16_config")  # slime's TP2 PP2 CP2 EP4
    with pytest.raises(PredictionError, match="TP2 CP2"):
        predict(tp, 8, [a, proxy_point(deeper(tmp_path, 8, 4.0))], recipe="qwen35_35b_a3b_sft_8gpu_h100_bf16_config")
    with pytest.raises(PredictionError, match="no such file"):
        proxy_point(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("recipe: x\n")
    with pytest.raises(PredictionError, match="not a benchmark result file"):
        proxy_point(tmp_path / "bad.yaml")


def test_benchmark_predict_prints_and_writes_the_prediction(tmp_path, capsys):
    a, b = deeper(tmp_path, 4, 2.6, name="a.yaml"), deeper(tmp_path, 8, 4.0, name="b.yaml")
    out = tmp_path / "p.json"
    assert bench.main(["--predict", RECIPE, "--proxy-results", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s/GPU" in printed and "published 4,663.1" in printed
    assert json.loads(out.read_text())["micro_batches"] == 16
    with pytest.raises(SystemExit) as exc:
        bench.main(["--predict", RECIPE])
    assert exc.value.code == 2 and "--proxy-results" in capsys.readouterr().err


def test_an_intercept_proxy_gives_the_fixed_cost_when_the_slope_proxies_shrank_the_head(tmp_path):
    import bridge_recipes

    slope_a = proxy_point(deeper(tmp_path, 4, 1.6, name="a.yaml"))  # small head: 0.2 s per micro batch
    slope_b = proxy_point(deeper(tmp_path, 8, 2.4, name="b.yaml"))  # 0.3 s: 25 ms per layer
    real_head = proxy_point(deeper(tmp_path, 4, 2.6, name="c.yaml"))  # 0.325 s with the real head
    cfg = bridge_recipes.build(RECIPE)
    p = predict(cfg, 8, [slope_a, slope_b], recipe=RECIPE, intercept=real_head)
    assert p.per_layer_s == pytest.approx(0.025) and p.fixed_s == pytest.approx(0.325 - 4 * 0.025)
    assert p.step_s == pytest.approx(16 * (40 * 0.025 + 0.225))


def test_committed_35b_calibration_is_what_the_two_committed_depths_give(tmp_path):
    """lab/results/h200_predict_qwen35_35b_a3b_sft_8gpu.json is what --predict gives from the 35B-A3B EP8
    shard's proxies at 4 and 16 layers."""
    deep = ROOT / "lab/results/h200_proxy_qwen35_35b_a3b_h200_policy_16_layers.yaml"
    committed = json.loads((ROOT / "lab/results/h200_predict_qwen35_35b_a3b_sft_8gpu.json").read_text())
    out = tmp_path / "p.json"
    argv = ["--predict", committed["recipe"], "--proxy-results", str(PROXY), str(deep), "--out", str(out)]
    assert bench.main(argv) == 0
    assert json.loads(out.read_text()) == committed
    assert (proxy_point(PROXY).layers, proxy_point(deep).layers) == (4, 16)


def test_the_35b_calibration_from_one_host_is_what_its_two_arms_give(tmp_path):
    """lab/results/h200_predict_qwen35_35b_a3b_sft_8gpu_one_host.json is what --predict gives from two
    published-policy arms measured on one host; the all-to-all that would close its gap to the published
    figure is what comm_to_reach_s computes from it."""
    results = ROOT / "lab/results/candidates"
    four, sixteen = (
        results / "35b_router_fusion_against.yaml",
        results / "35b_bf16_moments_te_ce_fused_swiglu_block5_16_layers_against.yaml",
    )
    committed = json.loads((ROOT / "lab/results/h200_predict_qwen35_35b_a3b_sft_8gpu_one_host.json").read_text())
    out = tmp_path / "p.json"
    argv = ["--predict", committed["recipe"], "--proxy-results", str(four), str(sixteen), "--out", str(out)]
    assert bench.main(argv) == 0
    assert json.loads(out.read_text()) == committed
    published_step = 16 * 8192 / committed["published"]
    gap = (published_step - committed["step_s"]) / committed["micro_batches"] / 40
    assert comm_to_reach_s(committed["tokens_per_s_per_gpu"], committed["published"], 40, 8192) == pytest.approx(gap)


def test_exposed_comm_and_the_comm_that_reaches_a_target_are_inverses():
    """A row of 8,192 tokens at 8,192 tokens/s/GPU takes 1 s; 10 layers of 0.01 s of all-to-all make it
    1.1 s; in a frame where the estimate's steps are 0.5 of it, 0.6 s. Bad figures are refused by name."""
    assert with_exposed_comm(8192.0, 0.01, 10, 8192) == pytest.approx(8192 / 1.1)
    assert with_exposed_comm(8192.0, 0.01, 10, 8192, frame=0.5) == pytest.approx(8192 / 0.6)
    assert with_exposed_comm(8192.0, 0.0, 10, 8192) == 8192.0
    for frame in (1.0, 0.87):
        c = comm_to_reach_s(7000.0, 6500.0, 40, 8192, frame)
        assert with_exposed_comm(7000.0, c, 40, 8192, frame) == pytest.approx(6500.0)
    assert comm_to_reach_s(6000.0, 6500.0, 40, 8192) < 0
    with pytest.raises(PredictionError, match="not negative"):
        with_exposed_comm(8192.0, -0.01, 10, 8192)
    with pytest.raises(PredictionError, match="target 0"):
        comm_to_reach_s(8192.0, 0, 10, 8192)


def test_the_mtp_layer_and_its_head_pass_are_part_of_the_flops_per_token():
    """The 35B-A3B's MTP layer and its second output-layer pass are counted in the training FLOPs per token,
    so a run without MTP (the published workload) does less work per token."""
    from bridge_recipes.models.flops import model_flops_per_token

    f = model_flops_per_token("qwen35_35b_a3b", 8192).forward
    total, mtp = sum(f.values()), sum(v for k, v in f.items() if k.startswith("mtp"))
    assert 0 < f["mtp_lm_head"] < mtp < total


def test_ep_comm_from_the_two_gpu_trace(tmp_path, capsys):
    """--ep-comm-trace: the EP2 run's traced all-to-all over its 8 layers x 4 micro batches per GPU
    (global batch 8 over DP2), scaled to EP8 by the share of tokens leaving a GPU (7/8 against 1/2)."""
    from lab.predict import two_gpu_ep_comm_s

    doc = {"ep2": {"time_breakdown": {"categories_ms": {"nccl all-to-all / send-recv": 64.0, "gemm": 900.0}}}}
    trace = tmp_path / "two_gpu_qwen35_35b_a3b.json"
    trace.write_text(json.dumps(doc))
    assert two_gpu_ep_comm_s(trace, 8) == pytest.approx(0.064 / (8 * 4) * (7 / 8) / (1 / 2))
    assert two_gpu_ep_comm_s(trace, 2) == pytest.approx(0.002)
    deep = ROOT / "lab/results/h200_proxy_qwen35_35b_a3b_h200_policy_16_layers.yaml"
    args = ["--predict", RECIPE.replace("_config", "_mock_config"), "--proxy-results", str(PROXY), str(deep)]
    assert bench.main([*args, "--ep-comm-trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "3.50 ms per layer per micro batch" in out and "no expert-parallel all-to-all" not in out
    # a run whose trace was not taken is refused, naming why
    trace.write_text(json.dumps({"ep2": {"time_breakdown": {"missing": "the trace has no GPU kernel events"}}}))
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--ep-comm-trace", str(trace)])
    assert (
        exc.value.code == 2
        and "the EP2 run has no trace: the trace has no GPU kernel events" in capsys.readouterr().err
    )


SMALL_HEAD = [ROOT / f"lab/results/h200_proxy_qwen35_27b_small_head_{n}_layers.yaml" for n in (4, 8)]
REAL_HEAD = ROOT / "lab/results/candidates/27b_te_ce_fused_swiglu_block10_against.yaml"
R27 = "qwen35_27b_sft_8gpu_h200_bf16_mock_config"


@pytest.mark.parametrize(
    ("flag", "committed"),
    [
        ("--without-mtp", "h200_predict_qwen35_27b_sft_8gpu.json"),
        (None, "h200_predict_qwen35_27b_sft_8gpu_with_mtp.json"),
    ],
)
def test_committed_27b_predictions_are_what_the_committed_proxies_give(tmp_path, flag, committed):
    """The 27B PP4 predictions are what --predict gives from the small-head slope proxies and the real-head
    intercept; with MTP trained the last stage is the slowest."""
    doc = json.loads((ROOT / "lab" / "results" / committed).read_text())
    out = tmp_path / "p.json"
    argv = ["--predict", R27, "--proxy-results", *map(str, SMALL_HEAD), "--intercept-result", str(REAL_HEAD)]
    assert bench.main([*argv, *([flag] if flag else []), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == doc
    if flag is None:
        assert max(doc["stage_micro_batch_s"]) == doc["stage_micro_batch_s"][-1]


def test_without_mtp_takes_out_mtps_flop_share_of_the_head_cost():
    """165.4 ms: of the 269.9 ms the real head and MTP add over the small head, MTP's share of their
    training FLOPs per token (10.48 G of 6.62 G for the larger vocabulary plus 10.48 G)."""
    from lab.predict import mtp_share_s

    small, big = (proxy_point(p) for p in SMALL_HEAD)
    real = proxy_point(REAL_HEAD)
    assert (small.mtp_num_layers, real.mtp_num_layers) == (0, 1)
    assert small.head_flops == 6 * 5120 * 32768 and real.head_flops == 6 * 5120 * 248320
    slope = (big.micro_batch_s - small.micro_batch_s) / 4
    fixed_small, fixed_real = small.micro_batch_s - 4 * slope, real.micro_batch_s - 4 * slope
    assert round((fixed_real - fixed_small) * 1000, 1) == 269.9 and round(real.mtp_flops / 1e9, 2) == 10.48
    assert round(mtp_share_s(small, real, fixed_small, fixed_real) * 1000, 1) == 165.4
    with pytest.raises(PredictionError, match="slope proxies without MTP"):
        mtp_share_s(real, real, fixed_small, fixed_real)


def test_block_recompute_is_counted_per_stage():
    """Block recompute of 12 layers is 12 of 16, 17 or 14 by stage; the proxies recompute 3 of 4. A
    stage's layer costs (1 + f / 3) / (1 + 0.75 / 3) of the proxy's slope."""
    import bridge_recipes
    from lab.predict import recompute_fraction

    assert recompute_fraction("full", "block", 12, 17) == pytest.approx(12 / 17)
    assert recompute_fraction("full", "block", 12, 10) == 1.0
    assert recompute_fraction("full", "uniform", 1, 40) == 1.0 and recompute_fraction(None, None, None, 4) == 0.0
    points = [proxy_point(p) for p in SMALL_HEAD]
    assert [p.recompute_fraction for p in points] == [0.75, 0.75]
    cfg = bridge_recipes.build(R27)
    p = predict(cfg, 8, points, recipe=R27)
    middle = p.stage_micro_batch_s[1]
    assert middle == pytest.approx(17 * p.per_layer_s * (1 + 12 / 17 / 3) / (1 + 0.75 / 3))
    fewer = bridge_recipes.build(R27, overrides=["model.recompute_num_layers=10"])
    assert predict(fewer, 8, points, recipe=R27).stage_micro_batch_s[1] < middle


def test_proxies_recomputing_different_shares_are_refused(tmp_path):
    doc = yaml.safe_load(SMALL_HEAD[1].read_text())
    doc["layout"]["recompute"]["num_layers"] = 8
    other = tmp_path / "all.yaml"
    other.write_text(yaml.safe_dump(doc))
    import bridge_recipes

    with pytest.raises(PredictionError, match="recompute different shares"):
        predict(bridge_recipes.build(R27), 8, [proxy_point(SMALL_HEAD[0]), proxy_point(other)], recipe=R27)
    with pytest.raises(PredictionError, match="without_mtp needs intercept_result"):
        predict(bridge_recipes.build(R27), 8, [proxy_point(p) for p in SMALL_HEAD], recipe=R27, without_mtp=True)


@pytest.mark.parametrize("layers", [4, 8])
def test_small_head_results_count_their_own_head(layers):
    """The 27B's slope proxies (each checked against its log with the other proxy
    results, tests/unit/test_results_consistency.py): their FLOPs count the small head they ran with
    (vocabulary 32,768, no MTP)."""
    from bridge_recipes.bench.result import read_result

    doc = read_result(ROOT / f"lab/results/h200_proxy_qwen35_27b_small_head_{layers}_layers.yaml")
    r = doc["result"]
    assert f"--scale-down {layers} " in doc["command"] and "model.vocab_size=32768" in doc["command"]
    assert r["flops_per_token"]["breakdown"]["lm_head"] == 6 * 5120 * 32768
    assert r["flops_per_token"]["mtp_num_layers"] == 0


NO_MTP = ROOT / "lab/results/h200_proxy_qwen35_27b_no_mtp_4_layers.yaml"
WITH_MTP_SAME_SESSION = ROOT / "lab/results/candidates/27b_fused_swiglu_against.yaml"


def test_the_27b_prediction_with_a_measured_intercept_without_mtp(tmp_path):
    """The real head without MTP, the same command as a run with MTP plus model.mtp_num_layers=null, runs
    faster; taken as the intercept it gives the committed prediction, with nothing apportioned."""
    from bridge_recipes.bench.result import read_result

    without, with_mtp = (read_result(p) for p in (NO_MTP, WITH_MTP_SAME_SESSION))
    assert without["command"].split() == [*with_mtp["command"].split(), "model.mtp_num_layers=null"]
    a, b = proxy_point(NO_MTP), proxy_point(WITH_MTP_SAME_SESSION)
    assert (a.mtp_num_layers, b.mtp_num_layers) == (0, 1) and a.micro_batch_s < b.micro_batch_s
    out = tmp_path / "p.json"
    argv = ["--predict", R27, "--proxy-results", *map(str, SMALL_HEAD)]
    assert bench.main([*argv, "--intercept-result", str(NO_MTP), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc == json.loads((ROOT / "lab/results/h200_predict_qwen35_27b_sft_8gpu_measured_no_mtp.json").read_text())
    assert doc["notes"] == []


# --- a candidate's estimate, on synthetic costs -------------------------------------------------


def _base(micro_batches: int = 16, per_layer_s: float = 0.04, fixed_s: float = 0.2, layers: int = 40):
    from lab.predict import Prediction

    micro = fixed_s + layers * per_layer_s
    rate = 1000.0 / micro  # tokens/s/GPU scale: only ratios matter below
    return Prediction(
        recipe="r", gpus=8, tokens_per_s_per_gpu=rate, low=rate, high=rate, step_s=micro_batches * micro,
        per_layer_s=per_layer_s, fixed_s=fixed_s, micro_batches=micro_batches, bubble_micro_batches=0.0,
        stage_micro_batch_s=[micro],
    )  # fmt: skip


def test_split_saving_solves_the_fixed_and_per_layer_parts():
    from lab.predict import SideBySide, split_saving

    # a: saves 0.1 fixed + 2 layers x 0.03; b: the same fixed change + 4 layers x 0.03 (8 micro batches)
    a = SideBySide(
        reference_step_s=8 * 1.0, candidate_step_s=8 * (1.0 - 0.16), layers_not_recomputed=2, micro_batches=8
    )
    b = SideBySide(
        reference_step_s=8 * 1.0, candidate_step_s=8 * (1.0 - 0.22), layers_not_recomputed=4, micro_batches=8
    )
    fixed, per_layer = split_saving(a, b)
    assert fixed == pytest.approx(0.1) and per_layer == pytest.approx(0.03)
    with pytest.raises(PredictionError, match="nothing separates"):
        split_saving(a, a)


def test_a_candidate_estimate_takes_the_saving_in_the_calibrations_units():
    from lab.predict import SideBySide, candidate_estimate, proxy_day

    base = _base()
    # a pair whose host ran the published policy exactly as calibrated at 4 layers: day 1
    on_time = SideBySide(8 * (0.2 + 4 * 0.04), 8 * 0.3, layers_not_recomputed=0, micro_batches=8)
    slow = SideBySide(2 * on_time.reference_step_s, 2 * on_time.candidate_step_s, 0, 8)
    assert proxy_day(base, 4, on_time) == pytest.approx(1.0) and proxy_day(base, 4, slow) == pytest.approx(2.0)
    micro = base.step_s / base.micro_batches
    saved = candidate_estimate(base, 4, on_time, fixed_saved_s=0.1, per_layer_saved_s=0.01, layers_not_recomputed=10)
    assert saved == pytest.approx(base.tokens_per_s_per_gpu * micro / (micro - 0.1 - 10 * 0.01))
    # the same seconds measured on a host twice as slow count half
    assert candidate_estimate(base, 4, slow, 0.2, 0.02, 10) == pytest.approx(saved)
    assert candidate_estimate(base, 4, on_time, 0.0, 0.0, 0) == pytest.approx(base.tokens_per_s_per_gpu)


def test_a_saving_per_kernel_scales_with_the_recipes_count():
    from lab.predict import SideBySide, scaled_saving

    base = _base()
    pair = SideBySide(8 * (0.2 + 4 * 0.04), 8 * (0.2 + 4 * 0.04 - 0.01), 0, 8)  # 10 ms per micro batch, day 1
    assert scaled_saving(base, 4, pair, proxy_count=100, full_count=1000) == pytest.approx(0.1)


def test_a_pipeline_candidate_is_paced_by_its_slowest_stage():
    from dataclasses import replace

    from lab.predict import pipeline_candidate_estimate

    base = replace(_base(micro_batches=8), bubble_micro_batches=3.0, stage_micro_batch_s=[1.0, 1.0, 1.0, 1.5])
    same = pipeline_candidate_estimate(base, fixed_s=0.5, layers_no_longer_recomputed=[0, 0, 0, 0], recompute_s=0.1)
    assert same == pytest.approx(base.tokens_per_s_per_gpu * base.step_s / (11 * 1.5))
    # the last stage's loss made 0.5 s cheaper: every stage is now 1.0 s
    faster = pipeline_candidate_estimate(base, 0.5, [0, 0, 0, 0], 0.1, fixed_saved_s=0.5)
    assert faster == pytest.approx(same * 1.5)
    with pytest.raises(PredictionError, match="stages"):
        pipeline_candidate_estimate(base, 0.5, [0, 0], 0.1)
