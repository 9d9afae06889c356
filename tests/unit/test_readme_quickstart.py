"""The README's quickstart: at most 20 lines, and every command in it runs as printed on a CPU
machine (the install, the venv activation and the GPU launch aside), its /tmp paths moved to a
test folder."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_HERE = ("bash scripts/install.sh", "source ", "torchrun ")  # the install, the venv, the GPU launch


def quickstart() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    assert len(block.strip().splitlines()) <= 20
    lines = [line[4:] for line in block.splitlines() if line.startswith("    ")]
    commands, current = [], ""
    for line in lines:
        current += line.strip()[:-1] + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            commands.append(re.sub(r"\s+#.*$", "", current).strip())
            current = ""
    return [c for c in commands if c and not c.startswith("#")]


def test_the_quickstart_runs_as_printed(tmp_path):
    commands = quickstart()
    assert any(c.startswith("torchrun") for c in commands) and any("--hf-checkpoint" in c for c in commands)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QWEN35_RECIPES_CACHE": str(tmp_path / "cache")}
    for command in commands:
        if command.startswith(NOT_HERE):
            continue
        argv = shlex.split(command.replace("/tmp/qs", str(tmp_path / "qs")))
        assert argv[0] == "python", command
        p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
        assert p.returncode == 0, f"{command}\n{p.stderr[-3000:]}"
    assert (tmp_path / "qs" / "run.yaml").is_file()
