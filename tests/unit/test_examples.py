"""The launch examples hand the runner exactly the arguments they were given.

Each shell example runs here with stand-ins for the cluster tools (srun, scontrol) and for the
venv's interpreter and ft_launcher, which record the argument vector they receive; the test
then checks the runner would be started with the recipe and every override as one token each,
a quoted override with a space included.
"""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
ARGS = ["--save-dir", "/ckpt/run 1", "logger.wandb_exp_name=my run", "train.train_iters=500", "optimizer.lr=2e-5"]


def _stub(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def stubs(tmp_path):
    """A bin folder with srun (runs its command once, as node 0), scontrol, and a recorder that
    stands in for python and ft_launcher: it appends its argv as one JSON line to calls.jsonl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    record = bin_dir / "record.py"
    record.write_text(f"import json, sys\nopen({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    _stub(bin_dir / "record", f'exec {sys.executable} {record} "$@"\n')
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    _stub(bin_dir / "scontrol", "echo node0\necho node1\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "record"),
        "FT_LAUNCHER": str(bin_dir / "record"),
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "42",
        "NNODES": "2",
        "NODE_RANK": "0",
        "MASTER_ADDR": "node0",
    }
    return env, calls


def _runner_args(argv: list[str]) -> list[str]:
    i = argv.index("scripts/run_recipe.py")
    return argv[i + 1 :]


@pytest.mark.parametrize("script", ["slurm_multinode.sbatch", "torchrun_multinode.sh", "ft_launcher.sh"])
def test_launcher_passes_each_argument_through_as_one_token(script, stubs):
    env, calls = stubs
    p = subprocess.run(
        ["bash", str(EXAMPLES / script), RECIPE, *ARGS], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    (argv,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert _runner_args(argv) == ["--recipe", RECIPE, *ARGS]


def test_slurm_torchrun_arguments(stubs):
    env, calls = stubs
    subprocess.run(["bash", str(EXAMPLES / "slurm_multinode.sbatch"), RECIPE], cwd=ROOT, env=env, check=True)
    (argv,) = [json.loads(line) for line in calls.read_text().splitlines()]
    launcher = argv[: argv.index("scripts/run_recipe.py")]
    assert launcher[:2] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--node-rank=0", "--nproc-per-node=8", "--rdzv-endpoint=node0:29500"} <= set(launcher)


def test_cli_overrides_example_dry_runs():
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(EXAMPLES / "cli_overrides.sh")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "checks: ok" in p.stdout
    assert re.search(r"^batch +global 512 ", p.stdout, re.M)  # the trailing override won over -gb 256


def test_recorded_runner_command_dry_runs_at_the_launch_world_size(stubs, capsys):
    """The runner command the Slurm launch records passes the runner's dry-run at 2 nodes x 8 GPUs."""
    from bridge_recipes.runner.cli import main

    env, calls = stubs
    subprocess.run(
        ["bash", str(EXAMPLES / "slurm_multinode.sbatch"), RECIPE, "train.train_iters=60"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    (argv,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert main([*_runner_args(argv), "--dry-run", "--world-size", "16"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.search(r"^world size +16 +-> +TP1 PP1 EP8 ETP1 DP16$", out, re.M), out
    assert re.search(r"^train +60 steps\b", out, re.M), out


def test_python_api_example_builds_checks_and_launches_its_config(tmp_path):
    """The example runs as a process; a sitecustomize stands in for the launch and records what
    it was handed."""
    record = tmp_path / "launched.json"
    (tmp_path / "sitecustomize.py").write_text(
        "import json\n"
        "from bridge_recipes.runner import launch\n"
        "def run(cfg, task):\n"
        f"    open({str(record)!r}, 'w').write(json.dumps([task, cfg.train.train_iters, cfg.optimizer.lr,\n"
        "        cfg.logger.log_interval, cfg.checkpoint.save, cfg.checkpoint.load]))\n"
        "launch.run = run\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "python_api.py")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr[-2000:]
    save = "/checkpoints/qwen35_35b_a3b_sft"
    assert json.loads(record.read_text()) == ["sft", 200, 2e-5, 10, save, save]
