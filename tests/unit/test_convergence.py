"""The loss-curve comparison (Megatron-Bridge validate_convergence rules) and its script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.bench.convergence import compare, pointwise_tolerance
from bridge_recipes.logs.run_log import split_runs

ROOT = Path(__file__).resolve().parents[2]
REF = {s: 12.0 * 0.7**s for s in range(1, 21)}


def test_identical_curves_pass():
    r = compare(REF, dict(REF))
    assert r.passed and r.correlation == pytest.approx(1.0) and r.pointwise_failures == 0
    assert r.steps[0] == 5  # the first 20% of 20 steps are skipped


def test_tolerance_bands():
    assert (pointwise_tolerance(3.0), pointwise_tolerance(1.0), pointwise_tolerance(0.1)) == (0.10, 0.05, 0.02)


def test_final_loss_difference_over_3_percent_fails():
    cand = dict(REF)
    cand[20] = REF[20] * 1.05
    r = compare(REF, cand)
    assert not r.passed and any("final loss" in x for x in r.reasons)


def test_pointwise_failures_over_10_percent_fail():
    cand = {s: v * (1.3 if s % 3 == 0 else 1.0) for s, v in REF.items()}
    r = compare(REF, cand)
    assert r.pointwise_failures >= 4 and not r.passed


def test_uncorrelated_curves_fail():
    cand = {s: REF[21 - s] for s in REF}
    r = compare(REF, cand)
    assert r.correlation < 0 and not r.passed


def test_non_finite_loss_is_an_error():
    with pytest.raises(ValueError, match="not finite"):
        compare(REF, {**REF, 7: float("nan")})


def test_split_runs():
    text = "===== run a: cmd\n iteration 1/ 2 |\n===== run b: cmd\nx\n"
    runs = split_runs(text)
    assert list(runs) == ["a", "b"] and runs["b"].endswith("x\n")


def _log(steps, total, scale=1.0, name=None):
    head = f"===== run {name}: cmd\n" if name else ""
    return head + "".join(
        f" [2026-01-01 00:00:00] iteration {s}/ {total} | elapsed time per iteration (ms): 100.0 | "
        f"global batch size: 8 | lm loss: {12.0 * 0.9**s * scale:.6E} |\n"
        for s in steps
    )


def _compare(tmp_path, *texts, extra=()):
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"{i}.log")
        paths[-1].write_text(text)
    return subprocess.run(
        [sys.executable, "scripts/compare_losses.py", *map(str, paths), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


WHOLE = _log(range(1, 21), 20)
BROKEN = [  # (logs, extra arguments, text the refusal holds)
    ([WHOLE, _log(range(1, 4), 20, 1.001)], [], "stopped at step 3 of 20"),
    ([_log(range(1, 4), 20), WHOLE], [], "stopped at step 3 of 20"),
    ([WHOLE, _log([*range(1, 11), *range(5, 21)], 20)], [], "more than once"),
    (
        [_log(range(1, 21), 20, name="a") + _log(range(1, 21), 20, 1.5, name="a")],
        ["--reference", "a", "--candidate", "a"],
        "more than one run named a",
    ),
    (
        [_log(range(1, 21), 20, name="a") + _log(range(1, 21), 20, name="b")],
        ["--reference", "a", "--candidate", "a"],
        "both name a",
    ),
]


@pytest.mark.parametrize("logs,extra,text", BROKEN, ids=[b[2] for b in BROKEN])
def test_compare_script_refuses_runs_that_cannot_be_compared(tmp_path, logs, extra, text):
    p = _compare(tmp_path, *logs, extra=extra)
    assert p.returncode == 2 and text in p.stderr and "Traceback" not in p.stderr


def test_compare_script_passes_two_whole_runs(tmp_path):
    """The refusals above are of the broken runs: the same two runs whole are compared."""
    p = _compare(tmp_path, WHOLE, _log(range(1, 21), 20, 1.001))
    assert p.returncode == 0 and json.loads(p.stdout)["passed"]
    p = _compare(
        tmp_path,
        _log(range(1, 21), 20, name="a") + _log(range(1, 21), 20, 1.5, name="b"),
        extra=["--reference", "a", "--candidate", "b"],
    )
    assert p.returncode == 1  # compared, and they differ


def _compare_two(tmp_path, ref: str, cand: str) -> subprocess.CompletedProcess:
    import os

    (tmp_path / "ref.txt").write_text(ref)
    (tmp_path / "cand.txt").write_text(cand)
    cmd = [sys.executable, "scripts/compare_losses.py", str(tmp_path / "ref.txt"), str(tmp_path / "cand.txt")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def test_compare_script_reads_plain_step_loss_text(tmp_path):
    ref = "step loss\n" + "".join(f"{s} {v}\n" for s, v in REF.items())
    cand = "# candidate\n" + "".join(f"{s},{v * 1.001}\n" for s, v in REF.items())
    p = _compare_two(tmp_path, ref, cand)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["passed"] is True
    far = "".join(f"{s}\t{REF[21 - s]}\n" for s in REF)  # the curve reversed: they disagree
    assert _compare_two(tmp_path, ref, far).returncode == 1


def test_compare_script_names_a_line_that_is_neither_format(tmp_path):
    p = _compare_two(tmp_path, "1 2.0\n2 1.9\nloss went down\n", "1 2.0\n2 1.9\n3 1.8\n")
    assert p.returncode == 2 and "line 3" in p.stderr and "STEP LOSS" in p.stderr


def test_help_documents_the_formats():
    p = subprocess.run(
        [sys.executable, "scripts/compare_losses.py", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert all(s in p.stdout for s in ("lm loss", "STEP LOSS", "===== run"))
