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


# A function reads as one unit: at most this many lines from its def line to its last line.
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``path:line name`` -> lines, for each function or method under ``root`` (nested ones too) longer
    than ``limit`` lines, its def line to its last line (decorators aside)."""
    import ast

    out = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"] = lines
    return out


def test_no_product_function_is_over_80_lines():
    assert (ROOT / "bridge_recipes/data/sft_rows.py").is_file()
    for tree in ("bridge_recipes", "perf_recipes", "scripts"):
        assert long_functions(ROOT / tree) == {}, "split the function into named steps"


def test_the_length_check_counts_def_line_to_last_line(tmp_path):
    root = tmp_path / "bridge_recipes"
    (root / "bench").mkdir(parents=True)
    lines = [f"x{i} = {i}" for i in range(79)]
    fits = "\n".join(["@decorator", "def fits():", *(f"    {x}" for x in lines)])  # 80 lines from def
    over = "\n".join(["class C:", "    async def over(self):", *(f"        {x}" for x in [*lines, "pass"])])
    (root / "m.py").write_text(f"{fits}\n\n\n{over}\n")
    (root / "bench" / "b.py").write_text("\n".join(["def nested():", *(f"    {x}" for x in [*lines, "y = 1"])]))
    assert long_functions(root) == {"bridge_recipes/m.py:85 over": 81, "bridge_recipes/bench/b.py:1 nested": 81}
