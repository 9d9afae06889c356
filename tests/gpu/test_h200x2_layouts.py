"""Every parallel layout the recipes use, on two H200s, against the same model on one.

Run on the two-GPU host (``nvidia-h200-x2``; stack staged as in the GPU notes):
    OUT=/path/for/logs python3 -m pytest -q -m gpu tests/gpu/test_h200x2_layouts.py [-k FAMILY]

For each family (bridge_recipes.bench.evidence.TWO_GPU_FAMILY_LAYOUTS) the scaled model (8 or 4 layers) trains
10 steps on one GPU (the reference), then at each two-GPU layout (EP2, PP2 with an even and an
uneven split, VPP2, TP2 with sequence parallelism, CP2 with Gated DeltaNet, ETP2) on the same
rows; each curve must agree with the reference by the policies rule. Resume across layouts:
a run at one layout saves at step 5 and is killed after step 7; the run restarted at another
layout (Megatron's distributed checkpoint resharding; the optimizer state saved fully
reshardable where the model-parallel sizes change) must continue from step 6 and agree with the
uninterrupted reference (``check_resume(..., same_layout=False)``). Logs and
``two_gpu_FAMILY.json`` go to $OUT. Finished runs are kept in $EVIDENCE_SCRATCH/runs, so a family
that outlasts one command completes over several: run the same command again.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.evidence import (
    GPU_FAMILIES,
    RESUME_KILL_AFTER,
    RESUME_SAVE_INTERVAL,
    TWO_GPU_FAMILY_LAYOUTS,
    TWO_GPU_RESUMES,
    check_policies,
    check_resume,
    check_training,
    two_gpu_request,
    two_gpu_world,
)
from bridge_recipes.bench.runs import ROOT, launch_kept

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence_x2"))
NO_SAVE = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]
CASES = [(family, layout) for family, layouts in TWO_GPU_FAMILY_LAYOUTS.items() for layout in layouts]


def _args(family: str, layout: str | None) -> list[str]:
    args = runner_args(**two_gpu_request(family, layout))
    if GPU_FAMILIES[family].get("vl"):
        from bridge_recipes.data.offline_vl_processor import build, vision_token_overrides

        args += vision_token_overrides(build(SCRATCH / "vl_processor"))
    return args


def _run(family: str, name: str, layout: str | None, extra: list[str], **kw):
    if GPU_FAMILIES[family].get("vl"):
        pytest.importorskip("qwen_vl_utils", reason="Megatron-Bridge's Qwen-VL collate needs qwen-vl-utils")
    return launch_kept(
        SCRATCH / "runs" / f"{family}_{name}.json",
        name,
        GPU_FAMILIES[family]["recipe"],
        [*_args(family, layout), *extra],
        OUT / f"two_gpu_{family}.log",
        nproc=two_gpu_world(layout),
        **kw,
    )


def _report(family: str, key: str, data: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"two_gpu_{family}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, key: data}, indent=1, default=str))


def _reference(family: str):
    run = _run(family, "one_gpu", None, NO_SAVE)
    assert run.returncode == 0, run.log[-3000:]
    assert check_training(run.losses).passed
    return run


@pytest.mark.parametrize("family", list(TWO_GPU_FAMILY_LAYOUTS))
def test_one_gpu_reference_trains(family):
    """The reference alone (one GPU): kept for the layout tests, so it can run on one GPU of the
    host while the other is busy."""
    run = _reference(family)
    _report(family, "one_gpu", {"seconds": round(run.seconds), "peak_allocated_gb": run.peak_allocated_gb})


@pytest.mark.parametrize("family,layout", CASES, ids=[f"{f}-{x}" for f, x in CASES])
def test_two_gpu_layout_agrees_with_one_gpu(family, layout):
    ref = _reference(family)
    run = _run(family, layout, layout, NO_SAVE)
    assert run.returncode == 0, run.log[-3000:]
    check = check_policies(ref.losses, run.losses)
    _report(
        family,
        layout,
        {
            "check": check.as_dict(),
            "seconds": round(run.seconds),
            "peak_allocated_gb": run.peak_allocated_gb,
            "losses": run.losses,
            "reference_losses": ref.losses,
        },
    )
    assert check.passed, check.reasons


@pytest.mark.parametrize("saved,resumed", TWO_GPU_RESUMES, ids=[f"{a}-to-{b}" for a, b in TWO_GPU_RESUMES])
def test_resume_at_another_layout(saved, resumed):
    family = "qwen35_35b_a3b"
    ref = _reference(family)
    ckpt = SCRATCH / f"ckpt_{saved}_to_{resumed}"
    save = ["--save-dir", str(ckpt), "--load-dir", str(ckpt), "--save-interval", str(RESUME_SAVE_INTERVAL)]
    save += ["checkpoint.async_save=false"]
    if not {saved, resumed} <= {"dp1", "dp2"}:
        # the default dp_reshardable optimizer state reshards only DP; other changes need the
        # fully reshardable format (the runner refuses them otherwise, bridge_recipes.runner.checkpoints)
        save += ["checkpoint.dist_ckpt_optim_fully_reshardable=true"]
    if not (SCRATCH / "runs" / f"{family}_killed_{saved}_to_{resumed}.json").exists():
        shutil.rmtree(ckpt, ignore_errors=True)
    killed = _run(family, f"killed_{saved}_to_{resumed}", saved, save, kill_after_step=RESUME_KILL_AFTER)
    back = _run(family, f"resumed_{saved}_to_{resumed}", resumed, [*save, "checkpoint.save=null"])
    assert back.returncode == 0, back.log[-3000:]
    check = check_resume(
        ref.losses, killed.losses, back.losses, save_interval=RESUME_SAVE_INTERVAL, same_layout=saved == resumed
    )
    _report(family, f"resume_{saved}_to_{resumed}", check.as_dict())
    shutil.rmtree(ckpt, ignore_errors=True)
    assert check.passed, check.reasons
