"""SFT on real-format chat data on one H200: reasoning and tool-call conversations rendered with
the checkpoint-style chat template, packed with their boundaries, a validation split.

    OUT=/path/for/logs python3 -m pytest -q -m gpu lab/tests/gpu/test_sft_real_format.py

The rows are built by the row builder's library from generated OpenAI-style conversations
(system, user, assistant with ``reasoning_content``, assistant tool calls with ``content: null``,
``tool`` results, a per-conversation ``tools`` list) with the committed fixture tokenizer and
its Qwen3.5-style template, in ``boundaries`` mode, 2,048-token rows, a 10% validation split.
The 27B and 35B-A3B SFT policies, scaled to 4 layers, train 10 steps on them (and the 35B-A3B
also on the same conversations built one per padded row, ``--packing one_per_row``) with a
validation pass every 5 steps: the loss must fall (``bench.evidence.check_training``) and a validation loss
must be reported. Logs and ``sft_real_format.json`` go to $OUT.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.runs import launch_kept
from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows
from lab import ROOT
from lab.evidence import EVIDENCE_TRAIN_FLAGS, check_training

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence_sft"))
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = EVIDENCE_ROW_TOKENS
FAMILIES = {
    "qwen35_27b": {"recipe": "qwen35_27b_sft_8gpu_h200_bf16_config", "scale_experts": None},
    "qwen35_35b_a3b": {"recipe": "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "scale_experts": 32},
}
# The same conversations one per padded row (no boundaries needed): the 35B-A3B on the standard
# path, the mode offered where boundaries rows cannot go.
ONE_PER_ROW = {"qwen35_35b_a3b_one_per_row": "qwen35_35b_a3b", "qwen35_27b_one_per_row": "qwen35_27b"}


def build_rows(packing: str) -> Path:
    out = SCRATCH / ("rows" if packing == "boundaries" else f"rows_{packing}")
    manifest = build_evidence_rows(out, TOKENIZER, packing)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "sft_real_format_manifest" + ("" if packing == "boundaries" else f"_{packing}")
    (OUT / f"{name}.json").write_text(json.dumps(manifest, indent=1, default=str))
    assert manifest["conversations"]["skipped_total"] == 0, manifest["conversations"]
    return out


@pytest.fixture(scope="module")
def rows() -> Path:
    return build_rows("boundaries")


@pytest.fixture(scope="module")
def rows_one_per_row() -> Path:
    return build_rows("one_per_row")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_trains_with_boundaries_and_reports_validation_loss(rows, family):
    train_and_report(rows, family, FAMILIES[family])


@pytest.mark.parametrize("name", list(ONE_PER_ROW))
def test_35b_trains_one_conversation_per_row_and_reports_validation_loss(rows_one_per_row, name):
    train_and_report(rows_one_per_row, name, FAMILIES[ONE_PER_ROW[name]])


def train_and_report(rows: Path, family: str, spec: dict, extra: tuple[str, ...] = ()) -> None:
    request = {
        "scale_down": 4,
        "scale_experts": spec["scale_experts"],
        "dataset": "sft-rows",
        "flags": {**EVIDENCE_TRAIN_FLAGS, "sl": ROW, "mb": 1},
        "overrides": [
            f"dataset.path={rows}",
            "validation.eval_interval=5",
            "validation.eval_iters=1",
            *NO_SAVE,
            *extra,
        ],
    }
    run = launch_kept(
        SCRATCH / "runs" / f"{family}.json",
        family,
        spec["recipe"],
        runner_args(**request),
        OUT / f"sft_real_format_{family}.log",
    )
    assert run.returncode == 0, run.log[-3000:]
    check = check_training(run.losses)
    validation = [line for line in run.log.splitlines() if "validation loss at" in line]
    report = OUT / "sft_real_format.json"
    old = json.loads(report.read_text()) if report.exists() else {}
    old[family] = {"training": check.as_dict(), "validation_lines": validation, "losses": run.losses}
    report.write_text(json.dumps(old, indent=1, default=str))
    assert check.passed, check.reasons
    assert validation, "no validation loss was reported"


NO_SAVE = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]
