"""A result file from the committed H200 log, as the benchmark harness writes it."""

from pathlib import Path

from bridge_recipes.bench import harness
from bridge_recipes.bench.result import read_result
from bridge_recipes.logs.run_log import split_runs
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.scaledown import scale_down

ROOT = Path(__file__).resolve().parents[2]


def test_result_file_from_the_committed_h200_log(tmp_path):
    log = split_runs((ROOT / "lab/evidence/h200_qwen35_35b_a3b_policies.log").read_text())["reference"]
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    scale_down(cfg, num_layers=4, num_experts=32, global_batch_size=4)
    spec = harness.model_spec(cfg)
    assert (spec.num_layers, spec.num_experts, spec.hidden_size) == (4, 32, 2048)
    harness.write(
        tmp_path / "r.yaml",
        recipe="qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
        cfg=cfg,
        log_text=log,
        world_size=1,
        gpu="h200",
        window=(3, 8),
        command="test",
        proxy=True,
    )
    back = read_result(tmp_path / "r.yaml")
    r = back["result"]
    assert back["notes"][0].startswith("proxy run") and r["window"] == [3, 8]
    # that log's runner turned fusion off (no APEX on the host then): the result says so
    assert back["notes"][-1].startswith("gradient-accumulation fusion: off (the runner: (needs APEX")
    assert r["window_tokens"] == 6 * 4 * 8192
    assert 2000 < r["tokens_per_s_per_gpu"] < 60000 and 0 < r["mfu"] < 1
