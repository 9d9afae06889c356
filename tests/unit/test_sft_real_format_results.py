"""The committed SFT real-format evidence (docs/evidence/sft_real_format/) against its own logs:
the 27B's result file is what its log says and passes the training check, the 35B-A3B's log is
the documented NaN stop, and every packed training-step probe recorded finite gradients."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bridge_recipes.bench.evidence import check_training
from bridge_recipes.bench.megatron_log import parse_megatron_log
from bridge_recipes.bench.runs import split_runs

EVIDENCE = Path(__file__).resolve().parents[2] / "docs/evidence/sft_real_format"


@pytest.fixture(scope="module")
def result():
    return json.loads((EVIDENCE / "sft_real_format.json").read_text())


def test_27b_result_is_its_log_and_the_loss_fell(result):
    log = (EVIDENCE / "sft_real_format_qwen35_27b.log").read_text()
    losses = {it.step: it.lm_loss for it in parse_megatron_log(log)}
    recorded = {int(k): v for k, v in result["qwen35_27b"]["losses"].items()}
    assert recorded == losses and sorted(losses) == list(range(1, 11))
    check = check_training(recorded)
    assert check.passed and result["qwen35_27b"]["training"]["passed"]
    validation = [line for line in log.splitlines() if "validation loss at" in line]
    recorded_validation = result["qwen35_27b"]["validation_lines"]
    assert len(validation) == len(recorded_validation) == 3
    assert all(r.strip() in line for r, line in zip(recorded_validation, validation))


def test_35b_log_is_the_nan_stop_in_the_first_step(result):
    log = (EVIDENCE / "sft_real_format_qwen35_35b_a3b.log").read_text()
    assert "qwen35_35b_a3b" not in result
    assert parse_megatron_log(log) == []
    assert "found NaN in local grad norm for bucket #0" in log
    assert "found NaN in local forward loss calculation" not in log
    assert "exit status 1" in log


def test_manifest_used_every_conversation():
    manifest = json.loads((EVIDENCE / "sft_real_format_manifest.json").read_text())
    conv = manifest["conversations"]
    assert conv["skipped_total"] == 0 and conv["used"] == conv["read"] == 540
    assert manifest["packing"] == "boundaries" and manifest["row_tokens"] == 2048


@pytest.mark.parametrize(
    "name,cases",
    [
        ("model", {"recipe", "no_boundaries", "no_recompute", "no_aux_loss", "no_mtp"}),
        ("pipeline", {"pipeline", "pipeline_no_overlap", "pipeline_no_boundaries"}),
    ],
)
def test_packed_training_step_probes_were_finite(name, cases):
    probes = json.loads((EVIDENCE / f"packed_training_step_{name}.json").read_text())
    assert {k.split("/")[1] for k in probes if k.startswith("qwen35_35b_a3b/")} == cases
    assert any(k.startswith("qwen35_27b/") for k in probes)
    for key, probe in probes.items():
        bad = probe.get("nonfinite_grads", probe.get("nonfinite_main_grads"))
        assert bad == 0 and not probe.get("error"), key
        assert len(probe["losses"]) == 4 and all(math.isfinite(x) and x > 0 for x in probe["losses"]), key


def test_35b_one_per_row_result_is_its_log_and_the_loss_fell(result):
    name = "qwen35_35b_a3b_one_per_row"
    log = (EVIDENCE / f"sft_real_format_{name}.log").read_text()
    its = parse_megatron_log(log)
    losses = {it.step: it.lm_loss for it in its}
    assert {int(k): v for k, v in result[name]["losses"].items()} == losses and sorted(losses) == list(range(1, 11))
    assert check_training(losses).passed and result[name]["training"]["passed"]
    assert all(math.isfinite(it.grad_norm) for it in its)
    assert "bridge_recipes.train_step.forward_step" in log  # the step that hands the MTP loss its mask
    validation = [line for line in log.splitlines() if "validation loss at" in line]
    assert len(validation) == len(result[name]["validation_lines"]) == 3
    manifest = json.loads((EVIDENCE / "sft_real_format_manifest_one_per_row.json").read_text())
    assert manifest["packing"] == "one_per_row" and manifest["rows"] == manifest["conversations"]["used"] == 540


def first_grad_norm(log: str) -> float:
    return parse_megatron_log(log)[0].grad_norm


@pytest.fixture(scope="module")
def runner_runs() -> dict[str, str]:
    """The runner probes' log, run by run."""
    return split_runs((EVIDENCE / "packed_training_step_runner.log").read_text())


def test_runner_probes_are_their_log(runner_runs):
    """Through the runner on boundaries rows: with the NaN check off, step 1's gradient norm is NaN
    and the forward loss goes NaN by step 3; with sequential expert GEMMs, 3 finite steps."""
    probes = json.loads((EVIDENCE / "packed_training_step_runner.json").read_text())
    assert set(runner_runs) == {"runner_no_nan_check", "runner_sequential_experts"}
    no_check, sequential = runner_runs["runner_no_nan_check"], runner_runs["runner_sequential_experts"]
    assert math.isnan(first_grad_norm(no_check)) and "found NaN in local forward loss calculation" in no_check
    assert probes["qwen35_35b_a3b/runner_no_nan_check"]["returncode"] == 1
    seq = probes["qwen35_35b_a3b/runner_sequential_experts"]
    assert seq["returncode"] == 0 and not seq["nan_check_fired"]
    assert {int(k): v for k, v in seq["grad_norms"].items()} == {
        it.step: it.grad_norm for it in parse_megatron_log(sequential)
    }


def test_boundaries_gradient_norm_is_several_times_one_per_row(runner_runs):
    """The measurement behind refusing training on boundaries rows by default (docs/sft_data.md):
    the first-step gradient norm on the same conversations, 35B-A3B, THD over one per row."""
    sequential = runner_runs["runner_sequential_experts"]
    one_per_row = (EVIDENCE / "sft_real_format_qwen35_35b_a3b_one_per_row.log").read_text()
    ratio = first_grad_norm(sequential) / first_grad_norm(one_per_row)
    assert round(ratio, 1) == 7.4
    dense_thd = first_grad_norm((EVIDENCE / "sft_real_format_qwen35_27b.log").read_text())
    dense_eos = first_grad_norm((EVIDENCE.parent / "h200_qwen35_27b_sft_rows.log").read_text())
    assert dense_thd > 50 * dense_eos
