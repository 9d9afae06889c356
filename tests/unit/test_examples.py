"""The launch examples are valid and use the runner."""

import py_compile
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".sh", ".sbatch")))
def test_shell_examples_parse(script):
    subprocess.run(["bash", "-n", str(EXAMPLES / script)], check=True)


def test_slurm_example_runs_torchrun_under_srun_per_node():
    text = (EXAMPLES / "slurm_multinode.sbatch").read_text()
    for piece in (
        "srun",
        "torchrun",
        "--nnodes=$SLURM_JOB_NUM_NODES",
        "--node-rank=\\$SLURM_NODEID",
        "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT",
        "scripts/run_recipe.py --recipe $RECIPE",
    ):
        assert piece in text, piece


def test_python_example_compiles(tmp_path):
    py_compile.compile(str(EXAMPLES / "python_api.py"), cfile=str(tmp_path / "x.pyc"), doraise=True)
