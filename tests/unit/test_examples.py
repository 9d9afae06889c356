"""The examples run: each launch script is executed with its launcher (torchrun, srun,
ft_launcher) replaced by a stub that records its command line, and the runner command it would
start is dry-run at the world size the launcher's flags give; the overrides script and the
Python API example run as they are, with training replaced by a recorder."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"

STUBS = {
    # record the launcher and its arguments, one a line
    "torchrun": '#!/bin/bash\nprintf "%s\\n" "$(basename "$0")" "$@" > "$RECORD"\n',
    # srun: drop its own options, run the task as node 0
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
    "scontrol": "#!/bin/bash\necho node0\necho node1\n",
}
STUBS["ft_launcher"] = STUBS["torchrun"]


@pytest.fixture
def launch(tmp_path):
    """Run an example script with stub launchers; return the recorded launcher command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record"

    def run(script, *args, **env):
        full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record), **env}
        subprocess.run(["bash", str(EXAMPLES / script), *args], cwd=ROOT, env=full_env, check=True)
        return record.read_text().splitlines()

    return run


def _split(argv):
    """A recorded launcher command: its --key=value flags and the runner's arguments."""
    script = argv.index("scripts/run_recipe.py")
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:script])
    return argv[0], flags, argv[script + 1 :]


def _dry_run(runner_args, world_size, capsys):
    assert main([*runner_args, "--dry-run", "--world-size", str(world_size)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_torchrun_example_starts_the_runner_on_every_gpu_of_every_node(launch, capsys):
    argv = launch(
        "torchrun_multinode.sh", RECIPE, "train.train_iters=5", NNODES="2", NODE_RANK="1", MASTER_ADDR="host0"
    )
    launcher, flags, runner = _split(argv)
    assert launcher == "torchrun"
    assert (flags["nnodes"], flags["node-rank"], flags["nproc-per-node"]) == ("2", "1", "8")
    assert (flags["master-addr"], flags["master-port"]) == ("host0", "29500")
    assert runner == ["--recipe", RECIPE, "train.train_iters=5"]
    out = _dry_run(runner, 2 * 8, capsys)
    assert "TP1 PP1 EP8 ETP1 DP16" in out and "train_iters: 5" in out


def test_slurm_example_runs_torchrun_under_srun_per_node(launch, capsys):
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_ID": "42"}
    argv = launch("slurm_multinode.sbatch", RECIPE, "train.train_iters=5", **env)
    launcher, flags, runner = _split(argv)
    assert launcher == "torchrun"
    assert (flags["nnodes"], flags["node-rank"], flags["nproc-per-node"]) == ("2", "0", "8")
    assert (flags["rdzv-endpoint"], flags["rdzv-id"]) == ("node0:29500", "42")
    assert runner == ["--recipe", RECIPE, "train.train_iters=5"]
    assert "TP1 PP1 EP8 ETP1 DP16" in _dry_run(runner, 2 * 8, capsys)


def test_ft_launcher_example_passes_runner_flags_through(launch, capsys, tmp_path):
    argv = launch("ft_launcher.sh", RECIPE, "--save-dir", str(tmp_path / "ckpt"))
    launcher, flags, runner = _split(argv)
    assert launcher == "ft_launcher"
    assert (flags["nnodes"], flags["nproc-per-node"], flags["max-restarts"]) == ("1", "8", "3")
    assert runner == ["--recipe", RECIPE, "--save-dir", str(tmp_path / "ckpt")]
    assert f"save: {tmp_path / 'ckpt'}" in _dry_run(runner, 8, capsys)


def test_overrides_example_dry_runs_and_the_key_value_overrides_win(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/bash\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        ["bash", str(EXAMPLES / "cli_overrides.sh")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "global_batch_size: 512" in out.stdout  # KEY=VALUE wins over -gb 256
    assert "train_iters: 500" in out.stdout and "recompute_num_layers: 2" in out.stdout
    assert "NCCL_DEBUG: WARN" in out.stdout


def test_python_api_example_builds_checks_and_launches_its_config(monkeypatch):
    from bridge_recipes.runner import launch

    launched = []
    monkeypatch.setattr(launch, "run", lambda cfg, task: launched.append((cfg, task)))
    runpy.run_path(str(EXAMPLES / "python_api.py"), run_name="__main__")
    ((cfg, task),) = launched
    assert task == "sft"
    assert (cfg.train.train_iters, cfg.optimizer.lr) == (200, 2e-5)
    assert cfg.checkpoint.save == cfg.checkpoint.load == "/checkpoints/qwen35_35b_a3b_sft"
