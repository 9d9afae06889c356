"""scripts/compare_losses.py on the committed H200 policies log."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compare_script_on_the_committed_h200_log(tmp_path):
    """The 35B-A3B policy runs committed as evidence: recipe policy vs no recompute."""
    out = tmp_path / "c.json"
    p = subprocess.run(
        [
            sys.executable,
            "scripts/compare_losses.py",
            "lab/evidence/h200_qwen35_35b_a3b_policies.log",
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
            "lab/evidence/h200_qwen35_35b_a3b_policies.log",
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
