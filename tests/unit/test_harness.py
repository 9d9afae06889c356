"""The benchmark harness on CPU: proxy arguments, FLOPs of the scaled model, a result file from
the committed H200 log."""

import subprocess
import sys
from pathlib import Path

from bridge_recipes.bench import harness
from bridge_recipes.bench.result import read_result
from bridge_recipes.bench.runs import split_runs
from bridge_recipes.runner import registry
from bridge_recipes.scaledown import scale_down

ROOT = Path(__file__).resolve().parents[2]


def test_proxy_keeps_the_per_gpu_expert_count():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config")()
    args = harness.run_args(cfg, steps=20, proxy_layers=4)
    assert args[:4] == ["--scale-down", "4", "--scale-experts", "32"]  # 256 experts / EP8
    assert args[args.index("-gb") + 1] == "8"  # the same micro batches per step for both policies
    assert "--max-steps" in args and "checkpoint.save=null" in args
    dense = registry.load("qwen35_27b_sft_8gpu_h200_bf16_mock_config")()
    assert "--scale-experts" not in harness.run_args(dense, steps=20, proxy_layers=4)


def test_result_file_from_the_committed_h200_log(tmp_path):
    log = split_runs((ROOT / "docs/evidence/h200_qwen35_35b_a3b_policies.log").read_text())["reference"]
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    scale_down(cfg, num_layers=4, num_experts=32, global_batch_size=4)
    spec = harness.model_spec(cfg)
    assert (spec.num_layers, spec.num_experts, spec.hidden_size) == (4, 32, 2048)
    doc = harness.write(tmp_path / "r.yaml", recipe="qwen35_35b_a3b_sft_8gpu_h200_bf16_config", cfg=cfg, log_text=log,
                        world_size=1, gpu="h200", window=(3, 8), command="test", proxy=True)
    back = read_result(tmp_path / "r.yaml")
    r = back["result"]
    assert back["notes"][0].startswith("proxy run") and r["window"] == [3, 8]
    assert r["window_tokens"] == 6 * 4 * 8192
    assert 2000 < r["tokens_per_s_per_gpu"] < 60000 and 0 < r["mfu"] < 1


def test_benchmark_script_rejects_bad_input():
    p = subprocess.run([sys.executable, "scripts/benchmark.py", "--recipe", "nope_config", "--out", "/tmp/x.yaml"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "no recipe named" in p.stderr
    p = subprocess.run([sys.executable, "scripts/benchmark.py", "--recipe", "qwen35_27b_sft_8gpu_h200_bf16_mock_config",
                        "--steps", "10", "--out", "/tmp/x.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "--window ends at step 19" in p.stderr
