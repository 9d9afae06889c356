"""SFT through packed rows against one conversation per row, on one H200: the same conversations at
every step, the loss curves compared.

    OUT=/path python3 -m pytest -q -m gpu lab/tests/gpu/test_packed_sft_convergence.py -k qwen35_27b

The aligned conversations (``synthetic_chat.build_aligned_rows``: the evidence's real-format kinds,
each 640 tokens) are built twice by the default builder: as ``boundaries`` rows (the SFT default),
where every 2,048-token row holds exactly three consecutive conversations, and as ``one_per_row``
rows. The packed run takes 4 rows per step and the one-per-row run 12, so step k of both trains on
conversations 12k .. 12k+11 (checked before training), and one validation batch is the same 12
conversations too. The 27B and 35B-A3B SFT recipes, scaled to 4 layers, train 10 steps each way
with a validation pass every 5 steps, under one gentle schedule (``COMPARISON_FLAGS``); the curves
are compared by Megatron-Bridge's convergence rules (``bench.convergence``).

The two runs optimise the same objective. The recipes compute a per-token loss
(``calculate_per_token_loss``): Megatron-Core sums each micro batch's token losses and divides the
step's gradient, and the reported ``lm loss``, by the supervised tokens of the whole global batch,
so a token weighs the same whether its micro batch holds three conversations or one (with a mean
per micro batch it would not: a token would weigh 1/(4 x its row's supervised tokens) packed and
1/(12 x its conversation's) alone). The MTP loss is summed the same way. The MoE load-balancing
loss is not: it is computed per micro batch over every token routed, padding included (1,408
padding tokens beside each conversation alone, 128 beside three packed), so it differs between the
two data paths; the 35B-A3B runs both turn it off (``FAMILIES``' overrides), leaving one objective.

The same test trains the packed rows once more two per packed sequence (``dataset.rows_per_sample``
2, one 4,096-token sequence per micro batch, half the micro batches): the same rows every step from
the same initial weights (the runner keeps the warm-up from moving the random state), compared
with the packed run by the same rules (``micro_batch`` in the result).

Each family writes its own ``packed_sft_convergence_{family}.json`` to $OUT (so the two families
can run as two processes at once), beside the logs ``packed_sft_convergence_{family}_{packing}.log``.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.convergence import compare
from bridge_recipes.bench.runs import launch
from bridge_recipes.data.synthetic_chat import (
    ALIGNED_PER_ROW,
    EVIDENCE_ROW_TOKENS,
    aligned_row_problems,
    build_aligned_rows,
)
from bridge_recipes.logs.megatron_log import validation_losses
from lab import ROOT
from lab.evidence import EVIDENCE_TRAIN_FLAGS, check_training

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence_packed_sft"))
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
PACKINGS = ("boundaries", "one_per_row")
# The MoE load-balancing loss off in both runs: it is per micro batch and counts padding tokens,
# so it would differ between the two data paths (see the module docstring).
NO_AUX_LOSS = ["model.moe_aux_loss_coeff=0.0", "model.moe_router_load_balancing_type=none"]
# family: (recipe, routed experts at 4 layers, overrides both runs get)
FAMILIES = {
    "qwen35_35b_a3b": ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", 32, NO_AUX_LOSS),
    "qwen35_27b": ("qwen35_27b_sft_8gpu_h200_bf16_config", None, []),
}
NO_SAVE = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]
# A gentle schedule both runs share: at the evidence's lr 3e-4 with one warm-up step the 27B's loss
# spikes early, and a spike amplifies rounding differences between two data paths into different
# curves; lr 1e-4 warming up over 2 steps compares the data paths instead.
COMPARISON_FLAGS = {**EVIDENCE_TRAIN_FLAGS, "lr": 1e-4, "min_lr": 1e-5, "warmup_iters": 2, "max_steps": 10}
PACKED_ROWS_PER_STEP = COMPARISON_FLAGS["gb"]
# The packed rows two per sequence: half the samples per step, each twice the length
JOINED, JOINED_ROWS = "boundaries_joined", 2
ROWS_PER_STEP = {
    "boundaries": PACKED_ROWS_PER_STEP,
    "one_per_row": PACKED_ROWS_PER_STEP * ALIGNED_PER_ROW,
    JOINED: PACKED_ROWS_PER_STEP,
}
SAMPLES_PER_STEP = {**ROWS_PER_STEP, JOINED: PACKED_ROWS_PER_STEP // JOINED_ROWS}
JOINED_OVERRIDES = [f"dataset.rows_per_sample={JOINED_ROWS}", f"model.seq_length={EVIDENCE_ROW_TOKENS * JOINED_ROWS}"]


def log_name(family: str, packing: str) -> str:
    return f"packed_sft_convergence_{family}_{packing}.log"


def train(family: str, packing: str, folder: Path):
    """One run of ``family`` on the ``packing`` rows in ``folder``; ``packing`` also names its log."""
    recipe, experts, extra = FAMILIES[family]
    request = {
        "scale_down": 4,
        "scale_experts": experts,
        "dataset": "sft-rows",
        "flags": {**COMPARISON_FLAGS, "gb": SAMPLES_PER_STEP[packing], "sl": EVIDENCE_ROW_TOKENS, "mb": 1},
        "overrides": [
            f"dataset.path={folder}",
            "validation.eval_interval=5",
            "validation.eval_iters=1",
            *NO_SAVE,
            *extra,
            *(JOINED_OVERRIDES if packing == JOINED else []),
        ],
    }
    log = OUT / log_name(family, packing)
    log.unlink(missing_ok=True)  # the log is this run's alone
    run = launch(f"{family}_{packing}", recipe, runner_args(**request), log, timeout_s=900)
    assert run.returncode == 0, run.log[-3000:]
    return run


def record(run, family: str, packing: str) -> dict:
    return {
        "log": log_name(family, packing),
        "rows_a_step": ROWS_PER_STEP[packing],
        "losses": run.losses,
        "grad_norms": {it.step: it.grad_norm for it in run.iterations},
        "validation_losses": validation_losses(run.log),
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_rows_train_like_one_conversation_per_row(family):
    import torch

    folders = {p: SCRATCH / family / p for p in PACKINGS}  # a family's own: families run at once
    for packing, folder in folders.items():
        build_aligned_rows(folder, TOKENIZER, packing)
    assert aligned_row_problems(folders["boundaries"], folders["one_per_row"]) == []
    runs = {packing: train(family, packing, folder) for packing, folder in folders.items()}
    joined = train(family, JOINED, folders["boundaries"])
    joined_curves = compare(runs["boundaries"].losses, joined.losses)
    curves = compare(runs["one_per_row"].losses, runs["boundaries"].losses)
    training = check_training(runs["boundaries"].losses)
    result = {
        "family": family,
        "recipe": FAMILIES[family][0],
        "measured": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0),
        "flags": COMPARISON_FLAGS,
        "overrides": FAMILIES[family][2],
        "conversations_a_packed_row": ALIGNED_PER_ROW,
        **{packing: record(run, family, packing) for packing, run in runs.items()},
        "training": training.as_dict(),
        "comparison": curves.as_dict(),
        # the packed rows two per packed sequence against one: the same rows every step
        "micro_batch": {
            "rows_a_sequence": JOINED_ROWS,
            **record(joined, family, JOINED),
            "comparison": joined_curves.as_dict(),
        },
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"packed_sft_convergence_{family}.json").write_text(json.dumps(result, indent=1) + "\n")
    assert training.passed, training.reasons
    assert all(result[p]["validation_losses"] for p in PACKINGS), result
    assert curves.passed, curves.reasons
    assert result["micro_batch"]["validation_losses"], result["micro_batch"]
    assert joined_curves.passed, joined_curves.reasons
