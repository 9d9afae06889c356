"""``python -m lab.memory_page`` checks its output path before doing work, never writes over a file it
did not write, and fails with a message (exit 2), not a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _page(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab.memory_page", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("where", ["folder", "missing"])
def test_out_must_be_a_writable_file(tmp_path, where):
    out = tmp_path if where == "folder" else tmp_path / "no" / "plan.md"
    p = _page("--out", out)
    assert p.returncode == 2 and ("is a folder" in p.stderr or "does not exist" in p.stderr)
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("check", [False, True])
def test_a_file_it_did_not_write_is_left_alone(tmp_path, check):
    user = tmp_path / "notes.md"
    user.write_bytes(bytes(range(256)) * 4)
    p = _page("--out", user, *(["--check"] if check else []))
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert user.read_bytes() == bytes(range(256)) * 4
