"""The evidence checks (lab.evidence): synthetic curves that must pass and fail,
then the logs committed under lab/evidence/, which must pass the same checks the GPU suite
applies to live runs."""

from pathlib import Path

import pytest

from bridge_recipes.logs.run_log import log_losses, split_runs
from lab.evidence import RESUME_SAVE_INTERVAL, check_policies, check_resume, check_training

EVIDENCE = Path(__file__).resolve().parents[2] / "lab" / "evidence"
CURVE = {s: 12.0 * 0.7 ** (s - 1) for s in range(1, 11)}


def test_training_needs_ten_finite_falling_steps():
    assert check_training(CURVE).passed
    assert "need 10" in check_training({s: CURVE[s] for s in range(1, 9)}).reasons[0]
    assert "did not fall" in check_training({s: 12.0 for s in range(1, 11)}).reasons[0]
    assert "not finite" in check_training({**CURVE, 4: float("nan")}).reasons[0]


def test_resume_from_the_checkpoint_passes():
    killed = {s: CURVE[s] for s in range(1, 8)}
    resumed = {s: CURVE[s] * (1 + 1e-3 * (s > 6)) for s in range(6, 11)}
    check = check_resume(CURVE, killed, resumed, save_interval=5)
    assert check.passed, check.reasons
    assert check.figures["steps_lost"] == 2


@pytest.mark.parametrize(
    "resumed, reason",
    [
        ({s: CURVE[s] for s in range(1, 11)}, "began at step 1"),  # a fresh start, not a resume
        ({**{s: CURVE[s] for s in range(6, 11)}, 6: CURVE[6] * 1.001}, "restored state differs"),
        ({s: CURVE[s] for s in range(6, 9)}, "ended at step 8"),
        ({s: CURVE[s] * 1.05 for s in range(6, 11)}, "differ from the uninterrupted run"),
    ],
)
def test_resume_failures_are_named(resumed, reason):
    killed = {s: CURVE[s] for s in range(1, 8)}
    check = check_resume(CURVE, killed, resumed, save_interval=5)
    assert not check.passed and any(reason in r for r in check.reasons), check.reasons


def test_a_kill_before_the_checkpoint_proves_nothing():
    check = check_resume(CURVE, {1: CURVE[1], 2: CURVE[2]}, {s: CURVE[s] for s in range(6, 11)}, save_interval=5)
    assert any("before its checkpoint" in r for r in check.reasons)


def _curve(name: str, run: str | None = None) -> dict[int, float]:
    text = (EVIDENCE / name).read_text()
    return log_losses(split_runs(text)[run] if run else text)


def test_committed_35b_a3b_evidence_passes():
    reference = _curve("h200_qwen35_35b_a3b_reference_pyspy.log")
    assert check_training(reference).passed
    policies = check_policies(reference, _curve("h200_qwen35_35b_a3b_no_recompute.log", "no_recompute"))
    assert policies.passed, policies.reasons
    killed = _curve("h200_qwen35_35b_a3b_kill_resume.log", "killed")
    resumed = _curve("h200_qwen35_35b_a3b_kill_resume.log", "resumed")
    check = check_resume(reference, killed, resumed, save_interval=RESUME_SAVE_INTERVAL)
    assert check.passed, check.reasons
    assert max(killed) == 7 and check.figures["steps_lost"] == 2


def test_committed_first_resume_attempt_fails_the_check():
    """That attempt's kill missed the worker (torchrun starts it in its own session) and the
    restart was refused by a checkpoint check; both were fixed, and the check sees the failure."""
    log = "h200_qwen35_35b_a3b_kill_resume_first_attempt.log"
    check = check_resume(
        _curve("h200_qwen35_35b_a3b_reference_pyspy.log"),
        _curve(log, "killed"),
        _curve(log, "resumed"),
        save_interval=RESUME_SAVE_INTERVAL,
    )
    assert not check.passed


def test_committed_27b_evidence_passes():
    reference = _curve("h200_qwen35_27b_policies.log", "reference")
    assert check_training(reference).passed
    check = check_policies(reference, _curve("h200_qwen35_27b_policies.log", "no_recompute"))
    assert check.passed, check.reasons


def test_committed_vl_evidence_passes():
    log = "h200_qwen35_vl_35b_a3b_suite.log"
    reference = _curve(log, "reference")
    assert check_training(reference).passed
    check = check_policies(reference, _curve(log, "no_recompute"))
    assert check.passed, check.reasons
    check = check_resume(reference, _curve(log, "killed"), _curve(log, "resumed"), save_interval=RESUME_SAVE_INTERVAL)
    assert check.passed, check.reasons
    assert check.figures["first_step_after_restart"] == 6 and check.figures["steps_lost"] == 2


def test_committed_result_files_are_what_the_logs_give(tmp_path):
    """lab/results/h200_*_evidence.json are rebuilt from the committed logs, figure for figure."""
    import json
    import subprocess
    import sys

    root = EVIDENCE.parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "lab.evidence_results", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    names = sorted(p.name for p in tmp_path.glob("h200_*_evidence.json"))
    assert names == [
        "h200_qwen35_27b_evidence.json",
        "h200_qwen35_35b_a3b_evidence.json",
        "h200_qwen35_vl_35b_a3b_evidence.json",
    ]
    for name in names:
        assert json.loads((tmp_path / name).read_text()) == json.loads((root / "lab" / "results" / name).read_text())


def test_checkpoint_size_estimate():
    """The GPU suite's families, built as the runner builds them: what their resume arm needs on disk."""
    from lab.evidence import GPU_FAMILIES, checkpoint_gb, run_checkpoint_gb

    assert checkpoint_gb(1_000_000_000) == 14.0  # 2 (BF16 weight) + 4 (FP32 main) + 8 (Adam moments)
    need = {name: run_checkpoint_gb(f["recipe"], **f["request"]) for name, f in GPU_FAMILIES.items()}
    assert round(need["qwen35_35b_a3b"], 1) == 23.8 and round(need["qwen35_vl_35b_a3b"], 1) == 37.1
    assert need["qwen35_27b"] > 60  # why the 27B family has no resume arm on a 64 GB host


def test_policies_that_cannot_be_compared_fail_with_the_reason():
    """A run that diverged to NaN, or logged too few steps, fails the check (it does not raise)."""
    diverged = {**CURVE, 8: float("nan")}
    check = check_policies(CURVE, diverged)
    assert not check.passed and "not finite at steps [8]" in check.reasons[0]
    check = check_policies(CURVE, {1: CURVE[1], 2: CURVE[2]})
    assert not check.passed and "at least 3 common steps" in check.reasons[0]


def test_continuation_must_start_after_the_fork_and_follow_the_reference():
    from lab.evidence import check_continuation

    ref = {6: 1.0, 7: 0.5, 8: 0.3, 9: 0.2, 10: 0.1}
    assert check_continuation(ref, {s: v * 1.005 for s, v in ref.items()}, fork_step=5).passed
    from_scratch = {s: v for s, v in ref.items()} | {1: 12.0}
    assert "began at step 1" in check_continuation(ref, from_scratch, fork_step=5).reasons[0]
    short = {s: v for s, v in ref.items() if s < 9}
    assert "ended at step 8" in check_continuation(ref, short, fork_step=5).reasons[0]
    drifted = {**ref, 9: 0.25}
    assert not check_continuation(ref, drifted, fork_step=5).passed
    assert check_continuation(ref, {}, fork_step=5).reasons == ["the continued run logged no step"]
