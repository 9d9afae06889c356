"""LoRA from random base weights, for benchmarks only: refused where a run would keep or load
anything, and in the training process it adds the adapters to the random model without loading a
checkpoint. (The full-size dry runs with it: test_lora_vs_peft.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import bridge_recipes
from bridge_recipes.features import random_lora
from bridge_recipes.runner import cli, launch

NO_CHECKPOINTS = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]


def test_the_option_is_refused_where_a_run_keeps_or_loads_anything(tmp_path, capsys):
    recipe = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
    assert cli.main(["--recipe", recipe, "--dry-run", random_lora.OPTION]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.save=null" in err and "checkpoint.load=null" in err
    weights = ["checkpoint.pretrained_checkpoint=" + str(tmp_path)]
    assert cli.main(["--recipe", recipe, "--dry-run", random_lora.OPTION, *NO_CHECKPOINTS, *weights]) == 2
    assert "checkpoint.pretrained_checkpoint" in capsys.readouterr().err
    sft = "qwen35_27b_sft_8gpu_h200_bf16_config"
    assert cli.main(["--recipe", sft, "--dry-run", "--world-size", "8", random_lora.OPTION, *NO_CHECKPOINTS]) == 2
    assert "peft" in capsys.readouterr().err
    cfg = bridge_recipes.build(recipe, overrides=NO_CHECKPOINTS)
    assert random_lora.problems(cfg) == []
    assert random_lora.OPTION in random_lora.problems(cfg, export_hf=str(tmp_path))[0]


def test_in_the_training_process_adapters_go_on_random_weights_and_nothing_loads(monkeypatch, capsys):
    """Each place Megatron-Bridge refuses LoRA without weights: the config check passes on the stand-in
    folder, setup neither requires nor loads a checkpoint, and its pre-wrap hook only adds the adapters."""
    import megatron.bridge.training.setup as setup

    # restored after the test: install() replaces it in the (one-run) training process
    monkeypatch.setattr(setup, "_create_peft_pre_wrap_hook", setup._create_peft_pre_wrap_hook)
    calls = []
    monkeypatch.setattr(
        setup, "_apply_peft_transformation", lambda peft, base_model: calls.append((peft, base_model)) or base_model
    )

    def no_loading(**kwargs):
        raise AssertionError("a checkpoint was loaded")

    monkeypatch.setattr(setup, "_load_checkpoint_from_path", no_loading)
    recipe = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
    cfg = bridge_recipes.build(recipe, overrides=NO_CHECKPOINTS)
    assert launch.entry_point_name(cfg, "peft") == "finetune"  # a real run needs the weights
    assert not random_lora.wanted(cfg) and random_lora.launch_change(cfg) is None
    cfg = bridge_recipes.build(recipe, overrides=[*NO_CHECKPOINTS, f"{random_lora.KEY}=true"])
    assert launch.entry_point_name(cfg, "peft") == "pretrain"

    monkeypatch.setitem(random_lora._state, "stand_in", None)
    assert random_lora.wanted(cfg) and cfg.checkpoint.pretrained_checkpoint is None
    change = random_lora.launch_change(cfg)  # made, and said, before the launch prints what runs
    stand_in = Path(cfg.checkpoint.pretrained_checkpoint)
    assert stand_in.is_dir() and not any(stand_in.iterdir()) and str(stand_in) in change
    assert random_lora.problems(cfg) == []  # the stand-in is no starting weights
    line = random_lora.install(cfg)
    assert random_lora.OPTION in line and str(stand_in) in line
    cfg.checkpoint.finalize()  # Megatron-Bridge's check that the named folder exists
    model = [object()]
    assert setup._create_peft_pre_wrap_hook(cfg, SimpleNamespace())(model) is model
    assert calls == [(cfg.peft, model)]
    # with checkpoint.load null, setup loads nothing after the model is built either
    assert setup._should_load_checkpoint(cfg, SimpleNamespace(checkpointing_context={})) is False
    stand_in.rmdir()


def test_the_option_is_the_feature_and_a_saved_config_keeps_it(tmp_path, capsys):
    recipe = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
    saved = tmp_path / "run.yaml"
    argv = ["--recipe", recipe, "--dry-run", random_lora.OPTION, *NO_CHECKPOINTS, "--save-config", str(saved)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert random_lora.NOTE in out and "enabled: true" in saved.read_text().split("random_lora:", 1)[1][:200]
    cfg = bridge_recipes.build(recipe, config_file=str(saved))
    assert cfg.features.random_lora.enabled and launch.entry_point_name(cfg, "peft") == "pretrain"
