"""The committed evidence rows are rebuilt byte for byte by lab/gpu/make_synthetic_rows.py."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = str(ROOT / "tests/fixtures/eos_joined_rows")


def test_committed_evidence_rows_are_reproducible(tmp_path):
    """The rows the 27B H200 run trained on are rebuilt bit for bit by the committed script."""
    import json
    import subprocess
    import sys

    root = ROOT
    p = subprocess.run(
        [sys.executable, "lab/gpu/make_synthetic_rows.py", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    committed = json.load(open(f"{ROWS}/manifest.json"))
    assert json.loads(p.stdout.strip().splitlines()[-1])["rows_sha256"] == committed["rows_sha256"]
