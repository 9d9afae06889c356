"""Every parallel layout the recipes use, on two H200s, against the same model on one.

Run on the two-GPU host (``nvidia-h200-x2``; stack staged as in the GPU notes):
    OUT=/path/for/logs python3 -m pytest -q -m gpu lab/tests/gpu/test_h200x2_layouts.py [-k FAMILY]

For each family (lab.evidence.TWO_GPU_FAMILY_LAYOUTS) the scaled model (8 or 4
layers) trains TWO_GPU_FORK_STEP steps on one GPU and saves (the fork; optimizer state fully
reshardable). The one-GPU reference and each two-GPU layout (EP2, PP2 with an even and an uneven
split, VPP2, TP2 with sequence parallelism, CP2 with Gated DeltaNet, ETP2) continue from that
checkpoint to step 10 on the same rows: the same weights, optimizer state and data, so each
continuation must match the reference's step by step (``check_continuation``). Started from
random initialization instead, the layouts would not train the same model (Megatron seeds the
initialization per pipeline, expert and tensor-parallel rank; lab/evidence/two_gpu/README.md).
Resume across layouts: a run at one layout saves at step 5 and is killed after step 7; the run
restarted at another layout (Megatron's distributed checkpoint resharding; the optimizer state
saved fully reshardable where the model-parallel sizes change) must continue from step 6 and agree
with the uninterrupted reference (``check_resume(..., same_layout=False)``). Logs (full, and
``two_gpu_FAMILY_compact.log``: the lines the evidence is read from, ``bench.runs.compact_log``)
and ``two_gpu_FAMILY.json`` go to $OUT. Finished runs are kept in $EVIDENCE_SCRATCH/runs, so a family
that outlasts one command completes over several on the same host: run the same command again.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bridge_recipes import runner_args
from bridge_recipes.bench.runs import compact_log, launch_kept
from lab import ROOT
from lab.evidence import (
    FORK_RUN,
    GPU_FAMILIES,
    LONG_CONTEXT_HALVES,
    LONG_CONTEXT_RECIPE,
    PLAN_TOLERANCE,
    TWO_GPU_FAMILY_LAYOUTS,
    TWO_GPU_FORK_STEP,
    TWO_GPU_RESUME_KILL_AFTER,
    TWO_GPU_RESUME_SAVE,
    TWO_GPU_RESUMES,
    check_continuation,
    check_resume,
    check_training,
    long_context_request,
    two_gpu_profile_overrides,
    two_gpu_request,
    two_gpu_world,
)

pytestmark = pytest.mark.gpu

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
SCRATCH = Path(os.environ.get("EVIDENCE_SCRATCH", "/tmp/evidence_x2"))
CASES = [(family, layout) for family, layouts in TWO_GPU_FAMILY_LAYOUTS.items() for layout in layouts]


def _args(family: str, layout: str | None) -> list[str]:
    args = runner_args(**two_gpu_request(family, layout))
    if GPU_FAMILIES[family].get("vl"):
        from bridge_recipes.vl.offline_vl_processor import build, vision_token_overrides

        args += vision_token_overrides(build(SCRATCH / "vl_processor"))
    return args


def _run(family: str, name: str, layout: str | None, extra: list[str], **kw):
    if GPU_FAMILIES[family].get("vl"):
        pytest.importorskip("qwen_vl_utils", reason="Megatron-Bridge's Qwen-VL collate needs qwen-vl-utils")
    run = _launch(family, name, layout, extra, **kw)
    log = OUT / f"two_gpu_{family}.log"
    (OUT / f"two_gpu_{family}_compact.log").write_text(compact_log(log.read_text()))  # what gets committed
    return run


def _launch(family: str, name: str, layout: str | None, extra: list[str], **kw):
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


def _fork_dir(family: str) -> Path:
    return SCRATCH / f"fork_{family}"


# the optimizer state the layouts load must reshard over TP, PP, CP and EP (runner.checkpoints)
RESHARDABLE = ["checkpoint.dist_ckpt_optim_fully_reshardable=true", "checkpoint.async_save=false"]


def _fork(family: str):
    """One GPU, TWO_GPU_FORK_STEP steps, saved: the state every continuation starts from."""
    kept = SCRATCH / "runs" / f"{family}_{FORK_RUN}.json"
    if not kept.exists():
        shutil.rmtree(_fork_dir(family), ignore_errors=True)
    save = ["--save-dir", str(_fork_dir(family)), "checkpoint.load=null", f"train.exit_interval={TWO_GPU_FORK_STEP}"]
    run = _run(family, FORK_RUN, None, [*save, *RESHARDABLE])
    assert run.returncode == 0 and max(run.losses, default=0) == TWO_GPU_FORK_STEP, run.log[-3000:]
    return run


def _profile_dir(family: str, name: str) -> Path:
    return SCRATCH / "profiles" / f"{family}_{name}"


def _continue(family: str, name: str, layout: str | None):
    """Continue from the fork's checkpoint to step 10 at ``layout``, saving nothing; one step traced."""
    _fork(family)
    load = ["--load-dir", str(_fork_dir(family)), "checkpoint.save=null"]
    profile = two_gpu_profile_overrides(str(_profile_dir(family, name)))
    return _run(family, name, layout, [*load, *RESHARDABLE, *profile])


def _time_breakdown(family: str, name: str) -> dict:
    """The traced step of a continued run on rank 0 (bench.trace_summary), or why there is none."""
    from bridge_recipes.bench.trace_summary import TraceError, summarize_file

    trace = _profile_dir(family, name) / "torch_profile" / "rank-0.json.gz"
    try:
        return summarize_file(trace)
    except TraceError as exc:
        return {"missing": str(exc)}


def _reference(family: str):
    run = _continue(family, "one_gpu", None)
    assert run.returncode == 0, run.log[-3000:]
    return run


@pytest.mark.parametrize("family", list(TWO_GPU_FAMILY_LAYOUTS))
def test_one_gpu_reference_trains(family):
    """The fork and the one-GPU continuation (kept for the layout tests, so this can run on one GPU
    of the host while the other is busy): ten steps in all, the loss falling."""
    fork, ref = _fork(family), _reference(family)
    curve = {**fork.losses, **ref.losses}
    check = check_training(curve)
    _report(family, "one_gpu", {"training": check.as_dict(), "peak_allocated_gb": ref.peak_allocated_gb})
    assert check.passed, check.reasons


@pytest.mark.parametrize("family,layout", CASES, ids=[f"{f}-{x}" for f, x in CASES])
def test_two_gpu_layout_agrees_with_one_gpu(family, layout):
    ref = _reference(family)
    run = _continue(family, layout, layout)
    assert run.returncode == 0, run.log[-3000:]
    check = check_continuation(ref.losses, run.losses, fork_step=TWO_GPU_FORK_STEP)
    _report(
        family,
        layout,
        {
            "check": check.as_dict(),
            "seconds": round(run.seconds),
            "peak_allocated_gb": run.peak_allocated_gb,
            "losses": run.losses,
            "reference_losses": ref.losses,
            "time_breakdown": _time_breakdown(family, layout),
            "reference_time_breakdown": _time_breakdown(family, "one_gpu"),
        },
    )
    assert check.passed, check.reasons


def _fork_copy(family: str, dest: Path) -> None:
    """``dest`` starts as the fork's checkpoint: its iteration folder hard-linked (Megatron never
    rewrites a saved iteration), the tracker file copied (it is rewritten at the next save)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    src = _fork_dir(family)
    it = f"iter_{TWO_GPU_FORK_STEP:07d}"
    shutil.copytree(src / it, dest / it, copy_function=os.link)
    shutil.copyfile(src / "latest_checkpointed_iteration.txt", dest / "latest_checkpointed_iteration.txt")


@pytest.mark.parametrize("saved,resumed", TWO_GPU_RESUMES, ids=[f"{a}-to-{b}" for a, b in TWO_GPU_RESUMES])
def test_resume_at_another_layout(saved, resumed):
    """From the fork: continue at ``saved``, save at step 7, killed after step 8; resume at
    ``resumed`` from step 7; every step against the one-GPU continuation from the same fork."""
    family = "qwen35_35b_a3b"
    ref = _reference(family)
    ckpt = SCRATCH / f"ckpt_{saved}_to_{resumed}"
    save = ["--save-dir", str(ckpt), "--load-dir", str(ckpt), "--save-interval", str(TWO_GPU_RESUME_SAVE)]
    if not (SCRATCH / "runs" / f"{family}_killed_{saved}_to_{resumed}.json").exists():
        _fork_copy(family, ckpt)
    killed = _run(
        family, f"killed_{saved}_to_{resumed}", saved, [*save, *RESHARDABLE], kill_after_step=TWO_GPU_RESUME_KILL_AFTER
    )
    back = _run(family, f"resumed_{saved}_to_{resumed}", resumed, [*save, *RESHARDABLE, "checkpoint.save=null"])
    assert back.returncode == 0, back.log[-3000:]
    check = check_resume(
        ref.losses, killed.losses, back.losses, save_interval=TWO_GPU_RESUME_SAVE, same_layout=saved == resumed
    )
    _report(family, f"resume_{saved}_to_{resumed}", check.as_dict())
    shutil.rmtree(ckpt, ignore_errors=True)
    assert check.passed, check.reasons


@pytest.mark.parametrize("half", list(LONG_CONTEXT_HALVES))
def test_long_context_policy_trains_within_its_plan(half):
    """One half of the long-context policy (32,768-token rows) on two GPUs: the loss falls, and
    the peak allocation is the planner's within PLAN_TOLERANCE."""
    import bridge_recipes
    from bridge_recipes.plan.memory import plan_memory

    request = long_context_request(half)
    run = launch_kept(
        SCRATCH / "runs" / f"long_context_{half}.json",
        f"long_context_{half}",
        LONG_CONTEXT_RECIPE,
        [*runner_args(**request), "checkpoint.save=null", "checkpoint.load=null"],
        OUT / "two_gpu_long_context.log",
        nproc=2,
    )
    assert run.returncode == 0, run.log[-3000:]
    planned = plan_memory(bridge_recipes.build(LONG_CONTEXT_RECIPE, **request), 2, gpu="h200").peak_allocated_gb
    check = check_training(run.losses)
    _report(
        "long_context", half, {"training": check.as_dict(), "peak_gb": run.peak_allocated_gb, "planned_gb": planned}
    )
    assert check.passed, check.reasons
    assert abs(run.peak_allocated_gb - planned) <= PLAN_TOLERANCE * run.peak_allocated_gb
