"""docs/lora.md: every command in it runs as printed on a CPU machine (the GPU launch aside), its /tmp
paths moved to a test folder, with the exit status the page gives, and what it says the commands
print is what they print."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[tuple[str, int]]:
    """(command, expected exit status) of the page's indented blocks; '# exits N' after a command
    gives its status, 0 otherwise."""
    lines = [line[4:] for line in (ROOT / "docs" / "lora.md").read_text().splitlines() if line.startswith("    ")]
    out, current = [], ""
    for line in lines:
        current += line.strip()[:-1] + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            status = re.search(r"#\s*exits (\d+)", current)
            out.append((re.sub(r"\s+#.*$", "", current).strip(), int(status.group(1)) if status else 0))
            current = ""
    return [(c, s) for c, s in out if c]


def test_the_lora_page_runs_as_printed(tmp_path):
    found = commands()
    assert any(c.startswith("torchrun") for c, _ in found) and any("--gpu-memory-gb" in c for c, _ in found)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QWEN35_RECIPES_CACHE": str(tmp_path / "cache")}
    outputs = {}
    for command, status in found:
        if command.startswith("torchrun "):
            continue
        argv = shlex.split(command.replace("/tmp/lora", str(tmp_path / "lora")))
        assert argv[0] == "python", command
        p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
        assert p.returncode == status, f"{command}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        outputs[command] = p.stdout
    assert (tmp_path / "lora" / "run.yaml").is_file()
    listed = next(out for c, out in outputs.items() if "--list" in c)
    assert "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config" in listed and "_h200_" not in listed
    capped = next(out for c, out in outputs.items() if "--gpu-memory-gb 48" in c)
    assert "DOES NOT FIT" in capped
    assert re.search(r"\bfit 48\.0 GB:.*\bqwen35_35b_a3b_peft_1gpu_l40s_fp8base_config\b", capped), capped
