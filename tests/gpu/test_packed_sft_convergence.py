"""SFT through packed rows against one conversation per row, on one H200: the same conversations,
the same conversations a step, the loss curves compared.

    OUT=/path python3 -m pytest -q -m gpu tests/gpu/test_packed_sft_convergence.py

The real-format evidence's conversations (``bridge_recipes.data.synthetic_chat``) are built twice:
as ``boundaries`` rows (the SFT default; about three conversations a 2,048-token row) and as
``one_per_row`` rows. The packed run takes 4 rows a step; the one-per-row run takes as many rows
as the packed rows hold conversations on average, so both see about the same conversations at
each step. The 27B and 35B-A3B SFT recipes, scaled to 4 layers, train 10 steps each way with a
validation pass every 5 steps; the curves are compared by Megatron-Bridge's convergence rules
(``bench.convergence``). Logs and ``packed_sft_convergence.json`` go to $OUT.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.convergence import compare
from bridge_recipes.bench.evidence import EVIDENCE_TRAIN_FLAGS, check_training
from bridge_recipes.bench.runs import ROOT, launch
from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence_packed_sft"))
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
FAMILIES = {
    "qwen35_35b_a3b": ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", 32),
    "qwen35_27b": ("qwen35_27b_sft_8gpu_h200_bf16_config", None),
}
NO_SAVE = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]
PACKED_ROWS_A_STEP = EVIDENCE_TRAIN_FLAGS["gb"]


@pytest.fixture(scope="module")
def rows() -> dict:
    built = {}
    for packing in ("boundaries", "one_per_row"):
        manifest = build_evidence_rows(SCRATCH / packing, TOKENIZER, packing)
        built[packing] = (SCRATCH / packing, manifest)
    return built


def train(name: str, recipe: str, experts, folder: Path, gb: int, extra=()):
    request = {
        "scale_down": 4,
        "scale_experts": experts,
        "dataset": "sft-rows",
        "flags": {**EVIDENCE_TRAIN_FLAGS, "gb": gb, "sl": EVIDENCE_ROW_TOKENS, "mb": 1},
        "overrides": [
            f"dataset.path={folder}",
            "validation.eval_interval=5",
            "validation.eval_iters=1",
            *NO_SAVE,
            *extra,
        ],
    }
    run = launch(name, recipe, runner_args(**request), OUT / f"packed_sft_convergence_{name}.log", timeout_s=900)
    assert run.returncode == 0, run.log[-3000:]
    return run


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_rows_train_like_one_conversation_per_row(rows, family):
    recipe, experts = FAMILIES[family]
    (packed_dir, packed_m), (single_dir, _) = rows["boundaries"], rows["one_per_row"]
    per_row = packed_m["conversations"]["used"] / packed_m["rows"]
    single_gb = round(PACKED_ROWS_A_STEP * per_row)
    packed = train(f"{family}_boundaries", recipe, experts, packed_dir, PACKED_ROWS_A_STEP)
    single = train(f"{family}_one_per_row", recipe, experts, single_dir, single_gb)
    curves = compare(single.losses, packed.losses)
    validation = {
        run.name: [line for line in run.log.splitlines() if "validation loss at" in line] for run in (packed, single)
    }
    report = OUT / "packed_sft_convergence.json"
    old = json.loads(report.read_text()) if report.exists() else {}
    old[family] = {
        "packed_rows_a_step": PACKED_ROWS_A_STEP,
        "one_per_row_rows_a_step": single_gb,
        "conversations_a_packed_row": round(per_row, 3),
        "losses": {"boundaries": packed.losses, "one_per_row": single.losses},
        "grad_norms": {
            "boundaries": {it.step: it.grad_norm for it in packed.iterations},
            "one_per_row": {it.step: it.grad_norm for it in single.iterations},
        },
        "training": check_training(packed.losses).as_dict(),
        "comparison": curves.as_dict(),
        "validation_lines": validation,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(old, indent=1, default=str) + "\n")
    assert check_training(packed.losses).passed
    assert all(validation.values()), validation
    assert curves.passed, curves.reasons
