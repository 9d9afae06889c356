"""Bad input, family by family: outputs never land on inputs, checks run before the work they
guard, nothing wrong is accepted silently, messages point at the right thing, and nothing is
left behind (exit 2 and no traceback for the command lines)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
CHATML = ROOT / "tests/fixtures/chatml_tokenizer.json"
TEMPLATE = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
GOOD = {
    "messages": [
        {"role": "user", "content": "what is the capital of france, and why is it there?"},
        {"role": "assistant", "content": "paris; the river seine made it a crossing and a port long ago."},
    ]
}


def test_a_nan_step_time_gives_no_prediction(tmp_path):
    from lab.predict import PredictionError, proxy_point

    committed = (ROOT / "lab/results/h200_proxy_qwen35_35b_a3b_h200_policy.yaml").read_text()
    path = tmp_path / "proxy.yaml"
    path.write_text(committed)
    assert proxy_point(path).layers == 4  # the committed proxy reads
    lines = [
        "  step_time_mean_s: .nan" if line.startswith("  step_time_mean_s:") else line
        for line in committed.splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PredictionError, match="step_time_mean_s nan"):
        proxy_point(path)
