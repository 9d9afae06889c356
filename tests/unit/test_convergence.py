"""The loss-curve comparison (Megatron-Bridge validate_convergence rules) and its script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.bench.convergence import compare, pointwise_tolerance
from bridge_recipes.bench.runs import split_runs

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


def test_compare_script_on_the_committed_h200_log(tmp_path):
    """The 35B-A3B policy runs committed as evidence: recipe policy vs no recompute."""
    out = tmp_path / "c.json"
    p = subprocess.run(
        [
            sys.executable,
            "scripts/compare_losses.py",
            "docs/evidence/h200_qwen35_35b_a3b_policies.log",
            "--reference",
            "reference",
            "--candidate",
            "no_recompute",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["correlation"] > 0.999 and len(doc["reference_losses"]) == 8


def test_compare_script_exit_2_on_unknown_run():
    p = subprocess.run(
        [
            sys.executable,
            "scripts/compare_losses.py",
            "docs/evidence/h200_qwen35_35b_a3b_policies.log",
            "--reference",
            "nope",
            "--candidate",
            "no_recompute",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "reference" in p.stderr


def test_split_runs():
    text = "===== run a: cmd\n iteration 1/ 2 |\n===== run b: cmd\nx\n"
    runs = split_runs(text)
    assert list(runs) == ["a", "b"] and runs["b"].endswith("x\n")


def _compare(tmp_path, ref: str, cand: str) -> subprocess.CompletedProcess:
    import os

    (tmp_path / "ref.txt").write_text(ref)
    (tmp_path / "cand.txt").write_text(cand)
    cmd = [sys.executable, "scripts/compare_losses.py", str(tmp_path / "ref.txt"), str(tmp_path / "cand.txt")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def test_compare_script_reads_plain_step_loss_text(tmp_path):
    ref = "step loss\n" + "".join(f"{s} {v}\n" for s, v in REF.items())
    cand = "# candidate\n" + "".join(f"{s},{v * 1.001}\n" for s, v in REF.items())
    p = _compare(tmp_path, ref, cand)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["passed"] is True
    far = "".join(f"{s}\t{REF[21 - s]}\n" for s in REF)  # the curve reversed: they disagree
    assert _compare(tmp_path, ref, far).returncode == 1


def test_compare_script_names_a_line_that_is_neither_format(tmp_path):
    p = _compare(tmp_path, "1 2.0\n2 1.9\nloss went down\n", "1 2.0\n2 1.9\n3 1.8\n")
    assert p.returncode == 2 and "line 3" in p.stderr and "STEP LOSS" in p.stderr


def test_help_documents_the_formats():
    p = subprocess.run(
        [sys.executable, "scripts/compare_losses.py", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert all(s in p.stdout for s in ("lm loss", "STEP LOSS", "===== run"))
