"""VL fine-tuning from image conversations on one H200: a dataset of coloured shapes built with
scripts/build_vl_dataset.py, the VL SFT recipe scaled to the imported VL toy trained on it, the
export scored on held-out images.

    OUT=/path/for/logs python3 -m pytest -q -m gpu -p no:cacheprovider lab/tests/gpu/test_vl_finetune.py

The stages are those of ``lab.vl_evidence`` (toy, dataset, training with
validation, held-out loss of the toy and of the export through transformers); its ``failures``
are the gates. $OUT receives vl_finetune.log, vl_finetune_run.log and vl_finetune_summary.json.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or Path(__file__).resolve().parents[2] / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/vl_evidence"))


@pytest.fixture(scope="module")
def summary():
    pytest.importorskip("qwen_vl_utils", reason="Megatron-Bridge's Qwen-VL collate needs qwen-vl-utils")
    from lab.vl_evidence import run

    return run(OUT, SCRATCH)


def test_the_dataset_holds_every_record_form_and_a_validation_split(summary):
    data = summary.get("dataset") or {}
    assert data and data["conversations"]["skipped_total"] == 0, summary["errors"]
    assert data["splits"]["train"]["samples"] and data["splits"]["val"]["samples"]


def test_the_vl_recipe_trains_validates_and_its_export_answers_held_out_images_better(summary):
    from lab.vl_evidence import failures

    assert failures(summary) == [], summary
