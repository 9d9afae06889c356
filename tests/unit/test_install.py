"""scripts/install.sh: the CPU install is unchanged, --gpu (or a GPU listed by nvidia-smi) adds
requirements/gpu.lock, Transformer Engine's PyTorch extension is compiled against the venv with the
NVIDIA wheels' headers, a failed step says how to resume, and the GPU pins agree with pyproject's
gpu extra. Run with --dry-run (the commands are printed, nothing is installed) or with a stand-in
interpreter."""

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
    for rel in ("scripts/install.sh", "requirements/cpu.lock", "requirements/gpu.lock", "requirements/light.txt"):
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


STACK_LOCK = ".venv/install/cpu-stack.lock"  # requirements/cpu.lock without transformer_engine_torch


def _pip_files(out: str) -> list[str]:
    return re.findall(r"^\+ .*pip install --no-deps .*-r (\S+)$", out, re.MULTILINE)


def test_help_names_the_options(checkout):
    p = _run(checkout, "--help")
    assert p.returncode == 0 and all(opt in p.stdout for opt in ("--gpu", "--dry-run", "--wheelhouse"))


def test_gpu_dry_run_adds_the_gpu_lock_and_installs_nothing(checkout):
    p = _run(checkout, "--gpu", "--dry-run", "--wheelhouse", str(checkout))
    assert p.returncode == 0, p.stderr
    assert _pip_files(p.stdout) == [STACK_LOCK, "requirements/gpu.lock"]
    gpu_line = next(line for line in p.stdout.splitlines() if "-r requirements/gpu.lock" in line)
    assert f"--find-links {checkout}" in gpu_line  # the wheelhouse serves the GPU wheels too
    assert "torch.cuda.get_device_name" in p.stdout  # the closing check of the GPU stack
    assert not (checkout / ".venv").exists()


def test_cpu_install_is_unchanged(checkout):
    p = _run(checkout, "--dry-run", nvidia_smi="")
    assert p.returncode == 0, p.stderr
    assert _pip_files(p.stdout) == [STACK_LOCK] and "get_device_name" not in p.stdout
    assert _pip_files(_run(checkout, "--dry-run", "--cpu", nvidia_smi="GPU 0: NVIDIA H200").stdout) == [STACK_LOCK]


def test_a_listed_gpu_turns_the_gpu_install_on(checkout):
    p = _run(checkout, "--dry-run", nvidia_smi="GPU 0: NVIDIA H200 (UUID: GPU-0)")
    assert _pip_files(p.stdout) == [STACK_LOCK, "requirements/gpu.lock"]


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


# A stand-in interpreter: `-m venv .venv` makes .venv/bin/python (this script) and the venv's
# nvidia/nccl headers folder; pip succeeds, except that no prebuilt Transformer Engine wheel is found
# and its compile records CUDA_HOME and CPATH, then fails as a compile does.
STAND_IN = """#!/bin/bash
case "$*" in
  *"-m venv"*) mkdir -p .venv/bin .venv/lib/python3.12/site-packages/nvidia/nccl/include
               cp "$0" .venv/bin/python ;;
  *only-binary*) exit 1 ;;
  *no-build-isolation*transformer_engine_torch*)
    echo "CUDA_HOME=$CUDA_HOME" > compile_env.txt; echo "CPATH=$CPATH" >> compile_env.txt
    echo "fatal error: some_header.h: No such file or directory"; exit 1 ;;
esac
exit 0
"""


def test_the_compile_gets_the_toolkit_and_wheel_headers_and_a_failure_says_how_to_resume(checkout):
    python = checkout / "stand_in_python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    toolkit = checkout / "cuda"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "bin/nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin/nvcc").chmod(0o755)
    (toolkit / "include/cuda_runtime.h").write_text("")
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CUDA_HOME": str(toolkit)}
    env.pop("CPATH", None)
    p = subprocess.run(
        ["bash", "scripts/install.sh", "--cpu", "--python", str(python)],
        capture_output=True, text=True, env=env, cwd=checkout,
    )  # fmt: skip
    assert p.returncode != 0
    recorded = dict(line.split("=", 1) for line in (checkout / "compile_env.txt").read_text().splitlines())
    assert recorded["CUDA_HOME"] == str(toolkit)
    assert str(checkout / ".venv/lib/python3.12/site-packages/nvidia/nccl/include") in recorded["CPATH"].split(":")
    # where it stopped, the compiler's own last lines, and how to go on
    assert "step 3/4" in p.stderr and "some_header.h" in p.stderr
    assert "same command" in p.stderr and "rm -rf .venv" in p.stderr
    assert "transformer_engine_torch" not in (checkout / STACK_LOCK).read_text()


def test_no_cuda_toolkit_exits_2_naming_what_to_install(checkout, tmp_path):
    python = checkout / "stand_in_python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no_toolkit")}
    env.pop("CUDA_PATH", None)
    if Path("/usr/local/cuda/bin/nvcc").exists() or shutil.which("nvcc", path=env["PATH"]):
        pytest.skip("this machine has a CUDA toolkit where install.sh looks for one")
    p = subprocess.run(
        ["bash", "scripts/install.sh", "--cpu", "--python", str(python)],
        capture_output=True, text=True, env=env, cwd=checkout,
    )  # fmt: skip
    assert p.returncode == 2 and "CUDA_HOME" in p.stderr and "--wheelhouse" in p.stderr


def test_the_light_install_takes_its_names_at_the_locks_pins_and_compiles_nothing(checkout):
    p = _run(checkout, "--light", "--dry-run", nvidia_smi="GPU 0: NVIDIA H200")
    assert p.returncode == 0, p.stderr
    assert _pip_files(p.stdout) == [".venv/install/light.lock"]  # no stack, no GPU lock, no compile
    assert "transformer_engine_torch" not in p.stdout and not (checkout / ".venv").exists()
    lines = (ROOT / "requirements/light.txt").read_text().splitlines()
    names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    pins = _pins(ROOT / "requirements/cpu.lock")
    assert [n for n in names if re.sub(r"[-_.]+", "-", n).lower() not in pins] == []
    assert not any(n.lower().startswith(("torch", "megatron", "transformer-engine")) for n in names)


def test_commands_that_need_the_training_stack_say_so_in_the_light_install(monkeypatch, capsys):
    import importlib.util

    from bridge_recipes.hf import cli as convert
    from bridge_recipes.runner import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name.startswith("megatron") else real(name, *a)
    )
    assert cli.main(["--recipe", "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", "--dry-run"]) == 2
    assert convert.main(["toy", "--out", "/nonexistent/toy"]) == 2
    err = capsys.readouterr().err
    assert err.count("needs the training stack") == 2 and "bash scripts/install.sh" in err
