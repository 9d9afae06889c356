"""Recipe env_vars reach the training interpreter before Transformer Engine is imported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.runner import environment

ROOT = Path(__file__).resolve().parents[2]


def test_user_values_win():
    assert environment.missing({"A": 1, "B": "x"}, {"A": "7"}) == {"B": "x"}


def test_no_reexec_when_the_marker_is_set(monkeypatch):
    monkeypatch.setenv(environment.MARKER, "123")
    monkeypatch.delenv("SOME_RECIPE_VAR", raising=False)
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail("re-executed twice"))
    environment.reexec_with({"SOME_RECIPE_VAR": 1})


def test_no_reexec_when_nothing_is_missing(monkeypatch):
    monkeypatch.delenv(environment.MARKER, raising=False)
    monkeypatch.setenv("SOME_RECIPE_VAR", "1")
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail("re-executed needlessly"))
    environment.reexec_with({"SOME_RECIPE_VAR": 2})


@pytest.mark.parametrize("entry", [["scripts/run_recipe.py"], ["-m", "bridge_recipes.runner"]])
def test_child_sees_recipe_env_at_start_and_te_was_not_imported_before(entry):
    """NVTE_DEBUG is read by Transformer Engine when it is imported (like the fused-MLP gate,
    which cannot be imported on a machine without a GPU)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NVTE_DEBUG", environment.MARKER)}
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = "7"  # a user value: must survive
    env["PYTHONPATH"] = str(ROOT)
    cmd = [
        sys.executable,
        *entry,
        "--recipe",
        "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config",
        "--show-env",
        "+env_vars.NVTE_DEBUG=0",
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("[run_recipe] re-executing with") == 1
    report = json.loads(out.stdout[out.stdout.index("{") :])
    assert report["reexecuted_from_pid"] is not None
    assert report["transformer_engine_imported_at_start"] is False
    seen = report["recipe_env_at_start"]
    assert seen["NVTE_DEBUG"] == "0"
    assert seen["CUDA_DEVICE_MAX_CONNECTIONS"] == "7"
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
