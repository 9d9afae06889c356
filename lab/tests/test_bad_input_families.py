"""The predictor refuses a proxy result with a step time that is not a number."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
