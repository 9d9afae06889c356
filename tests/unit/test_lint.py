"""The tree passes ruff's lint and format checks with the settings in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]


def test_ruff_check_passes():
    p = subprocess.run([*RUFF, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_format_check_passes():
    p = subprocess.run([*RUFF, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_passes_over_the_package():
    """The type checker of requirements/cpu.lock over bridge_recipes/, with pyproject.toml's settings."""
    import importlib.util

    if importlib.util.find_spec("mypy") is None:
        import pytest

        pytest.skip("mypy is not installed here: bash scripts/install.sh installs requirements/cpu.lock")
    p = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


# No tracked file may exceed this: logs are trimmed to what a check reads, binaries stay out of git.
MAX_TRACKED_BYTES = 500 * 1024


def tracked_files_over(limit: int, root: Path = ROOT) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return [n for n in names if (root / n).is_file() and (root / n).stat().st_size > limit]


def test_no_tracked_file_is_over_500_kb():
    assert tracked_files_over(MAX_TRACKED_BYTES) == []


def test_the_size_check_sees_a_large_file(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "big.log").write_bytes(b"x" * 2048)
    (tmp_path / "small.log").write_bytes(b"x" * 10)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    assert tracked_files_over(1024, tmp_path) == ["big.log"]


def test_pre_commit_runs_ruff_and_the_size_check():
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "check-added-large-files"} <= set(hooks)
    assert "--maxkb=500" in hooks["check-added-large-files"]["args"]
