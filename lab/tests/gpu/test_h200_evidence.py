"""Evidence on one H200: scaled-down recipes train through the runner, resume exactly after a
hard kill, and agree across two execution policies on the same data.

Run on the GPU host (stack staged as in the GPU notes):
    OUT=/path/for/logs python3 -m pytest -q -m gpu lab/tests/gpu/test_h200_evidence.py

Each family trains its 8-GPU recipe scaled down to one GPU (``--scale-down 4``: 4 layers,
policy kept) for a few steps at the recipe's row length, with a larger learning rate so the loss
moves in so few steps. Logs and a JSON summary per family go to $OUT.

The checks and their tolerances are those of ``lab.evidence`` (one definition,
also applied on CPU to the logs committed under lab/evidence/).

The resume arm saves synchronously: an asynchronous save of the scaled 35B-A3B checkpoint
(~22 GB) takes ~40 s on the host, longer than the rest of the run, so a kill at step 7 would
find no finished checkpoint. What is tested is the restart, not the save mode. It runs where
the host's disk holds one checkpoint (``bench.evidence.checkpoint_gb``): the 35B-A3B text
(23.8 GB) and VL (37.1 GB) families. The resumed run loads it and saves none: Megatron-Bridge
saves again at the last step, and two VL checkpoints do not fit the 64 GB test host. The
4-layer 27B's 62.9 GB (its 248K-vocabulary embedding and head are 2.5 B of 4.5 B parameters)
does not fit even once and is skipped with that reason.

Device time: every training process spends ~40 s importing the stack and, with cold kernel
caches, ~3 minutes in its first step (Triton autotuning of the FLA kernels, torch.compile,
TileLang); with the caches of lab/gpu/host_env.sh warm, a whole 10-step process takes
~100 s. A run that finished is kept in $EVIDENCE_SCRATCH/runs and reused by a later command of
the same lease with the same arguments, so a family whose runs outlast one 10-minute command
(the 35B-A3B family with cold caches) completes over two: run the same pytest command again.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.runs import Run, launch_kept
from lab import ROOT
from lab.evidence import (
    GPU_FAMILIES,
    RESUME_KILL_AFTER,
    RESUME_SAVE_INTERVAL,
    check_policies,
    check_resume,
    check_training,
    run_checkpoint_gb,
)

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence"))
NO_RECOMPUTE = ["model.recompute_granularity=null", "model.recompute_method=null", "model.recompute_num_layers=null"]
# each family's run_recipe.py arguments, from its bridge_recipes.build keywords
FAMILIES = {name: {**family, "args": runner_args(**family["request"])} for name, family in GPU_FAMILIES.items()}


def _no_save(args):
    return [*args, "checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]


def _report(family: str, data: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"evidence_{family}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **data}, indent=1, default=str))


def _no_room_for_checkpoint(family: str, spec: dict) -> str | None:
    """Why the resume arm cannot run here (the checkpoint would not fit the scratch disk), or None."""
    need = run_checkpoint_gb(spec["recipe"], **spec["request"])
    SCRATCH.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(SCRATCH).free / 1e9
    if (SCRATCH / family).exists():  # a checkpoint of an earlier command of this lease counts as room
        free += sum(f.stat().st_size for f in (SCRATCH / family).rglob("*") if f.is_file()) / 1e9
    return None if free > 1.1 * need else f"{family}: checkpoint {need:.1f} GB, {free:.1f} GB free in {SCRATCH}"


def _run(family: str, name: str, recipe: str, args: list[str], log: Path, **kw) -> Run:
    return launch_kept(SCRATCH / "runs" / f"{family}_{name}.json", name, recipe, args, log, **kw)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    name = request.param
    spec = dict(FAMILIES[name])
    log = OUT / f"{name}.log"
    if spec.get("vl"):
        pytest.importorskip("qwen_vl_utils", reason="Megatron-Bridge's Qwen-VL collate needs qwen-vl-utils")
        from bridge_recipes.vl.offline_vl_processor import build, vision_token_overrides

        tokens = vision_token_overrides(build(SCRATCH / "vl_processor"))
        spec["args"] = [*spec["args"], *tokens]
        spec["request"] = {**spec["request"], "overrides": [*spec["request"].get("overrides", ()), *tokens]}
    runs = {"reference": _run(name, "reference", spec["recipe"], _no_save(spec["args"]), log)}
    runs["no_recompute"] = _run(name, "no_recompute", spec["recipe"], _no_save(spec["args"] + NO_RECOMPUTE), log)
    spec["no_resume_reason"] = _no_room_for_checkpoint(name, spec)
    if not spec["no_resume_reason"]:
        ckpt = SCRATCH / name
        if not (SCRATCH / "runs" / f"{name}_killed.json").exists():
            shutil.rmtree(ckpt, ignore_errors=True)  # a fresh kill needs an empty save folder
        args = [
            *spec["args"],
            "--save-dir",
            str(ckpt),
            "--load-dir",
            str(ckpt),
            "--save-interval",
            str(RESUME_SAVE_INTERVAL),
            "checkpoint.async_save=false",
        ]
        runs["killed"] = _run(name, "killed", spec["recipe"], args, log, kill_after_step=RESUME_KILL_AFTER)
        # the same command again, less its saves: Megatron-Bridge saves at the last step, and a
        # second checkpoint beside the first does not fit the disk for the VL family (2 x 37.1 GB)
        runs["resumed"] = _run(name, "resumed", spec["recipe"], [*args, "checkpoint.save=null"], log)
        if runs["resumed"].returncode == 0:
            shutil.rmtree(ckpt, ignore_errors=True)
    _report(
        name,
        {
            "recipe": spec["recipe"],
            "args": spec["args"],
            "runs": {
                k: {
                    "returncode": r.returncode,
                    "killed_at_step": r.killed_at_step,
                    "seconds": round(r.seconds),
                    "losses": r.losses,
                    "peak_allocated_gb": r.peak_allocated_gb,
                }
                for k, r in runs.items()
            },
        },
    )
    return name, spec, runs


def test_trains_and_loss_falls(family):
    name, spec, runs = family
    ref = runs["reference"]
    assert ref.returncode == 0, ref.log[-3000:]
    check = check_training(ref.losses)
    _report(name, {"training": check.as_dict()})
    assert check.passed, check.reasons


def test_policies_agree_on_the_loss_curve(family):
    name, spec, runs = family
    alt = runs["no_recompute"]
    assert alt.returncode == 0, alt.log[-3000:]
    check = check_policies(runs["reference"].losses, alt.losses)
    _report(
        name, {"policy_comparison": {"reference": "recipe policy", "candidate": "no recompute", **check.as_dict()}}
    )
    assert check.passed, check.reasons


def test_resumes_after_a_hard_kill_with_the_same_losses(family):
    name, spec, runs = family
    if spec["no_resume_reason"]:
        pytest.skip(spec["no_resume_reason"])
    killed, resumed = runs["killed"], runs["resumed"]
    assert killed.killed_at_step == RESUME_KILL_AFTER and killed.returncode != 0
    assert resumed.returncode == 0, resumed.log[-3000:]
    assert "loading" in resumed.log.lower()
    check = check_resume(runs["reference"].losses, killed.losses, resumed.losses, save_interval=RESUME_SAVE_INTERVAL)
    _report(name, {"resume": check.as_dict()})
    assert check.passed, check.reasons
