"""Qwen3.8-27B: the 27B's architecture in the released form, listed under its own ``qwen38_`` names.

Its published ``config.json`` gives every text and vision field of the Qwen3.5/3.6-27B's, so the catalog
keeps one spec with a third checkpoint, and each 27B recipe is listed once more as ``qwen38_...``: the
same config, recording the Qwen3.8 checkpoint and saving to its own folder."""

import re

import pytest

from bridge_recipes.hf import architecture
from bridge_recipes.hf.files import HfCheckpointError
from bridge_recipes.models.qwen35 import SPECS
from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

LORA = "qwen38_27b_peft_1gpu_h100_fp8base_config"


def test_only_the_27b_sizes_have_qwen38_names_each_an_alias_of_its_qwen35_recipe():
    names = {n: e for n, e in registry.aliases().items() if n.startswith("qwen38_")}
    twins = {n for n, e in registry.discover().items() if e.model in ("qwen35_27b", "qwen35_vl_27b")}
    assert {e.alias_of for e in names.values()} == twins and LORA in names
    assert all(e.family == "qwen3.8" and e.checkpoint.hf_id == "Qwen/Qwen3.8-27B" for e in names.values())
    assert {n for n, s in SPECS.items() if "qwen3.8" in s.checkpoints} == {"qwen35_27b", "qwen35_vl_27b"}


def test_a_qwen38_config_is_its_twins_with_the_qwen38_checkpoint_and_its_own_folder():
    twin, alias = registry.load(LORA.replace("qwen38_", "qwen35_"))(), registry.load(LORA)()
    assert alias.model.hf_model_id == "Qwen/Qwen3.8-27B" and twin.model.hf_model_id is None
    assert "experiments/qwen38_27b_peft_1gpu_h100_fp8base/" in alias.checkpoint.save
    assert alias.checkpoint.save != twin.checkpoint.save
    for field in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length"):
        assert getattr(alias.model, field) == getattr(twin.model, field), field
    assert alias.peft.dim == twin.peft.dim and alias.train.global_batch_size == twin.train.global_batch_size


def test_list_filter_qwen3_8_shows_the_27b_names_and_the_dry_run_names_the_checkpoint(capsys):
    assert main(["--list", "--filter", "qwen3.8"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "_config" in line]
    assert sorted(rows) == sorted(n for n in registry.aliases() if n.startswith("qwen38_"))
    sft = "qwen38_27b_sft_8gpu_h200_bf16_config"
    assert main(["--recipe", sft, "--dry-run", "--world-size", "8", "--show-yaml"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^# model: Qwen/Qwen3\.8-27B \(qwen3\.8\); an alias of qwen35_27b_sft_", out, re.M), out[:2000]
    assert "hf_model_id: Qwen/Qwen3.8-27B" in out


def test_the_converter_takes_qwen38_names_and_refuses_a_size_without_one():
    assert architecture.spec_for_recipe(LORA).name == "qwen35_27b"
    assert architecture.spec_for_recipe("qwen38_27b").name == "qwen35_27b"
    with pytest.raises(HfCheckpointError, match=r"no Qwen3\.8 checkpoint of qwen35_35b_a3b.*qwen35_27b.*qwen3\.8"):
        architecture.spec_for_recipe("qwen38_35b_a3b_sft_config")


def test_the_fp8_folder_is_refused_naming_the_bf16_release():
    from pathlib import Path

    from bridge_recipes.hf.weights_check import bf16_release

    got = bf16_release(Path("/models/models--Qwen--Qwen3.8-27B-FP8/snapshots/abc"), {})
    assert got == "Qwen/Qwen3.8-27B instead of Qwen/Qwen3.8-27B-FP8"
