"""A misspelt recipe or flag and a malformed or unknown override are answered before Megatron is
imported (an import that takes many seconds): exit 2, naming the token, with no Megatron module
loaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
PROBE = """
import json, sys
from bridge_recipes.runner.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
print(json.dumps({"rc": rc, "megatron": sorted(m for m in sys.modules if m.startswith("megatron."))[:3]}))
"""


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--recipe", RECIPE[:-1], "--dry-run"], RECIPE),
        (["--recipe", RECIPE, "--dry-run", "--max-stpes", "3"], "--max-steps"),
        (["--recipe", RECIPE, "--dry-run", "model.hidden_size"], "model.hidden_size"),
        (["--recipe", RECIPE, "--dry-run", "modle.hidden_size=3"], "model"),
        (["--recipe", RECIPE, "--dry-run", "train.lr=[1,"], "train.lr"),
    ],
)
def test_bad_input_is_answered_before_megatron_is_imported(argv, named):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT, env=env)
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result == {"rc": 2, "megatron": []}, p.stderr
    assert named in p.stderr and "Traceback" not in p.stderr


def test_the_sections_come_from_megatron_bridges_source():
    import dataclasses

    from megatron.bridge.training.config import ConfigContainer

    from bridge_recipes.config.overrides import FEATURES, container_fields
    from bridge_recipes.recipe_config import RecipeConfig

    fields = {f.name for f in dataclasses.fields(ConfigContainer) if not f.name.startswith("_")}
    assert set(container_fields()) == fields | {FEATURES}
    # and they are the sections of what a recipe returns
    assert set(container_fields()) == {f.name for f in dataclasses.fields(RecipeConfig) if not f.name.startswith("_")}
