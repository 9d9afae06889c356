"""lab/gpu/needs_memory.py: a queue line that needs more GPU memory than the host has is skipped, saying so."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "lab/gpu/needs_memory.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_a_host_without_the_memory_skips_the_line(monkeypatch):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("needs_memory", ROOT / "lab/gpu/needs_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class Props:
        name, total_memory, major, minor = "NVIDIA H100 80GB HBM3", int(79.18 * 2**30), 9, 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    assert mod.main(["140"]) == 1 and mod.main(["80"]) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mod.main(["80"]) == 1


def test_bad_input_is_named():
    bad = _run("lots")
    assert bad.returncode == 2 and "'lots'" in bad.stderr
    assert _run().returncode == 2
