"""The override key catalogue: generated from the installed Megatron-Bridge and the recipes, it answers a
misspelt field before Megatron is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.config import keys as config_keys
from bridge_recipes.config import keys_generate as config_keys_generate
from bridge_recipes.config.overrides import OverrideError, precheck

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalogue_is_what_the_installed_megatron_bridge_and_the_recipes_give():
    """Fails when Megatron-Bridge adds, renames or drops a config field, or a recipe uses a new config
    class: regenerate with python -m bridge_recipes.config.keys_generate --write."""
    assert config_keys_generate.generate() == json.loads(config_keys.CATALOGUE.read_text())


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("train.trian_iters=5", "Nearest valid keys: train.train_iters"),
        ("train.lr=1e-5", "Did you mean optimizer.lr"),
        ("~peft.dimm", "peft.dim"),
        ("model.not_a_field=3", "No config of section 'model' has a field 'not_a_field'"),
    ],
)
def test_a_field_no_config_of_its_section_has_is_refused(token, said):
    with pytest.raises(OverrideError, match="unknown key") as err:
        precheck([token])
    assert said in str(err.value)


@pytest.mark.parametrize(
    "token", ["train.train_iters=5", "optimizer.lr=1e-5", "+env_vars.X=1", "env_vars.ANY=1", "model.seq_length=512"]
)
def test_fields_that_exist_pass_to_the_full_check(token):
    assert precheck([token])[0].token == token


def test_the_answer_needs_no_megatron_import():
    code = (
        "import sys\n"
        "from bridge_recipes.runner.cli import main\n"
        "rc = main(['--recipe', 'qwen35_27b_peft_1gpu_h200_bf16_lowmem_config', '--dry-run', 'train.trian_iters=5'])\n"
        "assert rc == 2, rc\n"
        "assert not any(m.startswith('megatron') for m in sys.modules), 'megatron was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "unknown key 'train.trian_iters'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train.train_iters=-5"], "train.train_iters=-5 must be an integer >= 1"),
        (["--max-steps", "0"], "train.train_iters=0 (from --max-steps 0) must be an integer >= 1"),
        (["optimizer.adam_beta1=1.5"], "optimizer.adam_beta1=1.5 must be a number in [0, 1)"),
    ],
)
def test_a_value_out_of_range_is_answered_before_the_build(argv, said, capsys, monkeypatch):
    from bridge_recipes.runner import cli

    monkeypatch.setattr(cli, "build", lambda *a, **k: pytest.fail("the config was built"))
    assert cli.main(["--recipe", "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", "--dry-run", *argv]) == 2
    assert said in capsys.readouterr().err
