"""The benchmark harness on CPU: proxy arguments, FLOPs of the scaled model, a result file from
the committed H200 log."""

import re
import subprocess
import sys
from pathlib import Path

from bridge_recipes.bench import harness
from bridge_recipes.recipes import registry

ROOT = Path(__file__).resolve().parents[2]


def test_proxy_keeps_the_per_gpu_expert_count():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config")()
    args = harness.run_args(cfg, steps=20, proxy_layers=4)
    assert args[:4] == ["--scale-down", "4", "--scale-experts", "32"]  # 256 experts / EP8
    assert args[args.index("-gb") + 1] == "8"  # the same micro batches per step for both policies
    assert "--max-steps" in args and "checkpoint.save=null" in args
    assert "logger.timing_log_level=1" in args  # phase timers: forward-backward vs optimizer
    assert "logger.timing_log_level=1" not in harness.run_args(cfg, steps=20, proxy_layers=None)
    dense = registry.load("qwen35_27b_sft_8gpu_h200_bf16_mock_config")()
    assert "--scale-experts" not in harness.run_args(dense, steps=20, proxy_layers=4)


def test_benchmark_script_rejects_bad_input():
    p = subprocess.run(
        [sys.executable, "scripts/benchmark.py", "--recipe", "nope_config", "--out", "/tmp/x.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "no recipe named" in p.stderr
    p = subprocess.run(
        [
            sys.executable,
            "scripts/benchmark.py",
            "--recipe",
            "qwen35_27b_sft_8gpu_h200_bf16_mock_config",
            "--steps",
            "10",
            "--out",
            "/tmp/x.yaml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and re.search(r"--window\b.*step 19\b.*only 10 steps\b.*--steps", p.stderr), p.stderr


def test_proxy_arguments_build_on_cpu():
    """What benchmark.py passes the runner in proxy mode is accepted by it (scale-down, overrides)."""
    cfg = harness.proxy_config("qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config")
    assert cfg.logger.timing_log_level == 1 and cfg.logger.log_interval == 1
    assert cfg.model.num_layers == 4 and cfg.train.global_batch_size == harness.PROXY_GLOBAL_BATCH


def _doc(recipe, tokens_per_s, rows, row_tokens, phases=None):
    result = {"tokens_per_s_per_gpu": tokens_per_s, **({"phase_time_mean_s": phases} if phases else {})}
    return {"recipe": recipe, "workload": {"global_batch": rows, "row_tokens": row_tokens}, "result": result}


def test_comparison_of_two_results():
    a = _doc("a", 3000.0, 8, 8192, {"forward-backward": 2.0, "optimizer": 0.1})
    b = _doc("b", 1000.0, 8, 16384, {"forward-backward": 6.0, "optimizer": 3.0})
    c = harness.comparison(a, b, proxy=True)
    assert c["tokens_per_s_ratio"] == 3.0
    # per token: a 2.0 s / 65,536, b 6.0 s / 131,072 -> b takes 1.5x a's time per token
    assert c["forward_backward_per_token_ratio"] == 1.5
    assert c["optimizer_s_per_step"] == {"candidate": 0.1, "reference": 3.0}
    assert harness.comparison(_doc("a", 3000.0, 8, 8192), b, proxy=True) == {
        "candidate": "a",
        "reference": "b",
        "tokens_per_s_ratio": 3.0,
        "proxy": True,
    }


def test_loss_curves_in_a_comparison():
    a, b = _doc("a", 3000.0, 8, 8192), _doc("b", 1000.0, 8, 8192)
    ref = {s: 12.0 - 0.5 * s for s in range(1, 11)}
    close = {s: v * 1.001 for s, v in ref.items()}
    agree = harness.comparison(a, b, proxy=True, losses=(close, ref))["loss_curves"]
    assert agree["compared"] and agree["passed"] and agree["pointwise_failures"] == 0
    assert abs(agree["final_loss_difference"] - 0.001) < 1e-9
    far = {s: v * (1.2 if s > 5 else 1.0) for s, v in ref.items()}  # drifts away after step 5
    differ = harness.comparison(a, b, proxy=True, losses=(far, ref))["loss_curves"]
    assert differ["compared"] and not differ["passed"] and "final loss differs" in " ".join(differ["reasons"])
    assert harness.comparison(a, b, proxy=True, losses="the runs differ in model")["loss_curves"] == {
        "compared": False,
        "why": "the runs differ in model",
    }
    short = harness.comparison(a, b, proxy=True, losses=({1: 3.0, 2: 2.0}, {1: 3.0, 2: 2.0}))["loss_curves"]
    assert not short["compared"] and "3 common steps" in short["why"] and "got 2" in short["why"]


def test_model_spec_follows_a_changed_vocabulary_and_mtp():
    """A small-head proxy (vocabulary 32,768, no MTP) counts its own output layer: 6 x 5,120 x 32,768
    training FLOPs a token, not the released 248,320 entries'."""
    import bridge_recipes
    from bridge_recipes.models.flops import model_flops_per_token

    cfg = bridge_recipes.build(
        "qwen35_27b_sft_8gpu_h200_bf16_mock_config",
        scale_down=4,
        flags={"gb": 8},
        overrides=["model.vocab_size=32768", "tokenizer.vocab_size=32768", "model.mtp_num_layers=null"],
    )
    spec = harness.model_spec(cfg)
    assert (spec.vocab_size, spec.mtp_num_layers) == (32768, 0)
    assert model_flops_per_token(spec, 8192).training["lm_head"] == 6 * 5120 * 32768
    full = harness.model_spec(bridge_recipes.build("qwen35_27b_sft_8gpu_h200_bf16_mock_config", scale_down=4))
    assert (full.vocab_size, full.mtp_num_layers) == (248320, 1)


def test_the_fusion_note_reads_the_config_and_the_runners_line():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    assert cfg.model.gradient_accumulation_fusion
    assert harness.fusion_note(cfg, "[run_recipe] gradient_accumulation_fusion: on, ...") == (
        "gradient-accumulation fusion: on"
    )
    line = "[run_recipe] gradient_accumulation_fusion: off (APEX's kernel is not installed and X failed)"
    assert harness.fusion_note(cfg, f"a\n{line}\nb") == (
        "gradient-accumulation fusion: off (the runner: (APEX's kernel is not installed and X failed))"
    )
    cfg.model.gradient_accumulation_fusion = False
    assert harness.fusion_note(cfg, line) == "gradient-accumulation fusion: off (the config)"


def test_a_run_that_asked_for_fusion_and_went_without_writes_nothing(tmp_path, monkeypatch):
    """The benchmark stops, naming why, before it writes a result that would name another policy."""
    import argparse

    import pytest

    from bridge_recipes.bench import benchmark as bench
    from bridge_recipes.bench import runs

    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    log = "[run_recipe] gradient_accumulation_fusion: off (APEX's kernel is not installed and X failed)"
    monkeypatch.setattr(runs, "launch", lambda *a, **k: argparse.Namespace(returncode=0, log=log, losses={}))
    opts = argparse.Namespace(
        proxy_layers=4,
        proxy_gpus=1,
        steps=5,
        window=[3, 5],
        gpu="h200",
        lora_from_random_init=False,
        gpu_memory_gb=None,
    )
    out = tmp_path / "r.yaml"
    request = {"recipe": "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "steps": 5}
    monkeypatch.setattr(bench, "runner_args", lambda **k: ["--recipe", "x"])
    with pytest.raises(RuntimeError, match="asked for gradient-accumulation fusion and ran without it"):
        bench.one("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", opts, out, request, cfg)
    assert not out.exists()


def test_runs_on_rows_report_useful_tokens_and_their_ratio(tmp_path):
    """On SFT rows a result carries the rows' workload (padding share from the manifest) and useful
    tokens/s; two runs on rows give the useful-tokens ratio, and runs on other rows are not compared."""
    from types import SimpleNamespace as NS

    from bridge_recipes.data.packed_rows import PackedSFTRowsConfig
    from bridge_recipes.data.sft_rows import build_sft_rows
    from bridge_recipes.data.synthetic_chat import conversations_jsonl

    (tmp_path / "c.jsonl").write_text(conversations_jsonl(40))
    tok = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
    work = {}
    for packing in ("boundaries", "one_per_row"):
        m = build_sft_rows(
            tmp_path / "c.jsonl", tok, tmp_path / packing, row_tokens=2048, packing=packing, progress=False
        )
        cfg = NS(dataset=PackedSFTRowsConfig(path=str(tmp_path / packing), seq_length=2048))
        work[packing] = harness.rows_workload(cfg)
        assert work[packing]["useful_token_share"] == round(1 - m["padding_share"], 4)
        assert work[packing]["conversations"] == m["conversations"]["used"] == 40
    assert harness.rows_workload(NS(dataset=NS(path="x"))) is None  # not SFT rows
    docs = []
    for packing, tps in (("boundaries", 1000.0), ("one_per_row", 1000.0)):
        d = _doc(packing, tps, 8, 2048)
        d["workload"]["rows"] = work[packing]
        d["result"]["useful_tokens_per_s_per_gpu"] = round(tps * work[packing]["useful_token_share"], 1)
        docs.append(d)
    c = harness.comparison(*docs, proxy=True)
    share = work["boundaries"]["useful_token_share"] / work["one_per_row"]["useful_token_share"]
    assert c["useful_tokens_per_s_ratio"] == round(share, 4) > 2
    assert (c["packing"], c["baseline_packing"], c["conversations"]) == ("boundaries", "one_per_row", 40)


def test_a_result_names_the_gpu_it_ran_on(monkeypatch):
    """Without --gpu the result's GPU is the one the process sees (an H100 is no H200), and a process
    without a known GPU is stopped before it launches, naming --gpu."""
    import pytest

    from bridge_recipes.bench import benchmark as bench
    from bridge_recipes.hardware import gpu_memory

    def seen(name):
        return lambda: gpu_memory.Device(name, 85.0, (9, 0))

    monkeypatch.setattr(gpu_memory, "current_device", seen("NVIDIA H100 80GB HBM3"))
    assert bench.running_gpu() == "H100"
    monkeypatch.setattr(gpu_memory, "current_device", lambda: None)
    with pytest.raises(RuntimeError, match="pass --gpu"):
        bench.running_gpu()
    monkeypatch.setattr(gpu_memory, "current_device", seen("NVIDIA GeForce RTX 4090"))
    with pytest.raises(RuntimeError, match="pass --gpu"):
        bench.running_gpu()
