"""scripts/install.sh: the CPU install is unchanged, --gpu (or a GPU listed by nvidia-smi) adds
requirements/gpu.lock, and the GPU pins agree with pyproject's gpu extra. Run with --dry-run:
the commands are printed, nothing is installed."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            key = re.sub(r"[-_.]+", "-", name).lower()
            assert key not in out, f"{path.name} pins {name} twice"
            out[key] = version
    return out


def _extra(name: str) -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    return {re.sub(r"[-_.]+", "-", d.split("==")[0]).lower(): d.split("==")[1] for d in deps}


@pytest.fixture
def checkout(tmp_path):
    """A copy of the script and locks, so a run that did install would show in tmp_path."""
    for rel in ("scripts/install.sh", "requirements/cpu.lock", "requirements/gpu.lock"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _run(checkout: Path, *args: str, nvidia_smi: str | None = None) -> subprocess.CompletedProcess:
    bin_dir = checkout / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:  # a stand-in nvidia-smi printing this
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{nvidia_smi}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(
        ["bash", str(checkout / "scripts/install.sh"), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
    )


def _pip_files(out: str) -> list[str]:
    return re.findall(r"^\+ .*pip install --no-deps .*-r (\S+)$", out, re.MULTILINE)


def test_help_names_the_options(checkout):
    p = _run(checkout, "--help")
    assert p.returncode == 0 and all(opt in p.stdout for opt in ("--gpu", "--dry-run", "--wheelhouse"))


def test_gpu_dry_run_adds_the_gpu_lock_and_installs_nothing(checkout):
    p = _run(checkout, "--gpu", "--dry-run", "--wheelhouse", str(checkout))
    assert p.returncode == 0, p.stderr
    assert _pip_files(p.stdout) == ["requirements/cpu.lock", "requirements/gpu.lock"]
    gpu_line = next(line for line in p.stdout.splitlines() if "-r requirements/gpu.lock" in line)
    assert f"--find-links {checkout}" in gpu_line  # the wheelhouse serves the GPU wheels too
    assert "torch.cuda.get_device_name" in p.stdout  # the closing check of the GPU stack
    assert not (checkout / ".venv").exists()


def test_cpu_install_is_unchanged(checkout):
    p = _run(checkout, "--dry-run", nvidia_smi="")
    assert p.returncode == 0, p.stderr
    assert _pip_files(p.stdout) == ["requirements/cpu.lock"] and "get_device_name" not in p.stdout
    assert _pip_files(_run(checkout, "--dry-run", "--cpu", nvidia_smi="GPU 0: NVIDIA H200").stdout) == [
        "requirements/cpu.lock"
    ]


def test_a_listed_gpu_turns_the_gpu_install_on(checkout):
    p = _run(checkout, "--dry-run", nvidia_smi="GPU 0: NVIDIA H200 (UUID: GPU-0)")
    assert _pip_files(p.stdout) == ["requirements/cpu.lock", "requirements/gpu.lock"]


def test_bad_option_exits_2(checkout):
    p = _run(checkout, "--gpus")
    assert p.returncode == 2 and "unknown option '--gpus'" in p.stderr


def test_gpu_pins_match_pyproject():
    cpu, gpu = _pins(ROOT / "requirements/cpu.lock"), _pins(ROOT / "requirements/gpu.lock")
    installed = {**cpu, **gpu}  # gpu.lock is installed after cpu.lock
    extra = _extra("gpu")
    assert {"nvidia-resiliency-ext", "tilelang", "qwen-vl-utils"} <= set(extra)
    assert {name: installed.get(name) for name in extra} == extra
    # gpu.lock only adds packages, except the one it must replace for TileLang
    assert {name: (cpu[name], v) for name, v in gpu.items() if name in cpu} == {
        "apache-tvm-ffi": ("0.1.15.post2", "0.1.12")
    }
    # the dependencies pyproject pins are the ones the CPU lock installs
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all(cpu.get(re.sub(r"[-_.]+", "-", d.split("==")[0]).lower()) == d.split("==")[1] for d in deps)


def test_wandb_is_an_extra_outside_the_locks():
    ((name, version),) = _extra("wandb").items()
    assert name == "wandb" and re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert name not in _pins(ROOT / "requirements/cpu.lock") and name not in _pins(ROOT / "requirements/gpu.lock")
