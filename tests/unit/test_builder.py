"""bridge_recipes.build: the library's entry point, and the run_recipe.py arguments of a request."""

import re
import warnings

import pytest

import bridge_recipes
from bridge_recipes.config.overrides import FLAG_KEYS, OverrideError, flag_option, flag_values
from bridge_recipes.recipes.registry import UnknownRecipe
from bridge_recipes.runner.arguments import build_parser, build_request

SFT_35B = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
REQUEST = {
    "scale_down": 4,
    "scale_experts": 32,
    "dataset": "sft-rows",
    "flags": {"gb": 4, "max_steps": 10, "lr": 3e-4, "save_dir": "/ckpt", "save_interval": 5},
    "overrides": ["logger.log_interval=1", "model.recompute_granularity=null", "model.recompute_method=null"],
}


def test_build_applies_scale_down_dataset_flags_then_overrides():
    changes = []
    cfg = bridge_recipes.build(SFT_35B, **REQUEST, report=changes.append)
    m = cfg.model
    assert (m.num_layers, m.num_moe_experts, m.expert_model_parallel_size) == (4, 32, 1)
    assert any(re.search(r"^scale-down\b.*\bmodel\.num_layers\b.*\b40 -> 4$", c) for c in changes)
    assert type(cfg.dataset).__name__ == "PackedSFTRowsConfig" and cfg.dataset.seq_length == m.seq_length
    assert (cfg.train.global_batch_size, cfg.train.train_iters, cfg.optimizer.lr) == (4, 10, 3e-4)
    assert (cfg.checkpoint.save, cfg.checkpoint.save_interval) == ("/ckpt", 5)
    assert cfg.logger.log_interval == 1 and m.recompute_granularity is None


def test_runner_arguments_parse_back_to_the_same_request():
    """What runner_args writes, run_recipe.py's parser reads back as the same build request."""
    args = bridge_recipes.runner_args(**REQUEST)
    assert args[:4] == ["--scale-down", "4", "--scale-experts", "32"]
    assert args[args.index("--lr") + 1] == "0.0003" and args[-3:] == REQUEST["overrides"]
    parsed = build_request(build_parser().parse_intermixed_args(["--recipe", SFT_35B, *args]))
    given = {k: v for k, v in parsed.pop("flags").items() if v is not None}
    assert given == REQUEST["flags"]
    assert parsed == {k: v for k, v in REQUEST.items() if k != "flags"}


def test_the_cli_builds_what_build_builds(capsys):
    from bridge_recipes.runner.cli import build

    argv = ["--recipe", SFT_35B, *bridge_recipes.runner_args(**REQUEST)]
    _, via_cli = build(build_parser().parse_intermixed_args(argv))
    out = capsys.readouterr().out
    assert re.search(r"^\[run_recipe\] scale-down\b.*\bmodel\.num_layers\b.*\b40 -> 4$", out, re.M)
    yaml = []
    for cfg in (via_cli, bridge_recipes.build(SFT_35B, **REQUEST)):
        cfg.print_yaml()
        yaml.append(capsys.readouterr().out)
    assert yaml[0] == yaml[1] and "num_layers: 4" in yaml[0]


def test_flags_have_an_explicit_type():
    assert {dest: f.type for dest, f in FLAG_KEYS.items() if f.type is not int} == {
        "lr": float,
        "min_lr": float,
        "save_dir": str,
        "load_dir": str,
        "pretrained_checkpoint": str,
        "wandb_project": str,
        "wandb_exp_name": str,
    }
    assert flag_values({"lr": "3e-4", "gb": "8", "save_dir": 7, "tp": None}) == {"lr": 3e-4, "gb": 8, "save_dir": "7"}
    parser = build_parser()
    for dest, flag in FLAG_KEYS.items():
        action = next(a for a in parser._actions if a.dest == dest)
        assert action.type is flag.type and action.option_strings == [flag_option(dest)], dest


def test_bad_flags_and_names_are_errors_naming_them():
    with pytest.raises(OverrideError, match="unknown flag 'max_step'.*Nearest: max_steps"):
        bridge_recipes.build(SFT_35B, flags={"max_step": 3})
    with pytest.raises(OverrideError, match="flag gb=2.5: expected int"):
        flag_values({"gb": 2.5})
    with pytest.raises(OverrideError, match="flag lr='fast': expected float"):
        flag_values({"lr": "fast"})
    with pytest.raises(UnknownRecipe, match="Did you mean"):
        bridge_recipes.build(SFT_35B.replace("h200", "h20"))


def test_peft_lora_switches_an_sft_recipe_to_common_lora_and_keeps_its_layout():
    from bridge_recipes.recipes.base import LORA_TARGETS

    sft = bridge_recipes.build(SFT_35B)
    cfg = bridge_recipes.build(SFT_35B, peft="lora", overrides=["peft.dim=16"])
    assert sft.peft is None
    assert sorted(cfg.peft.target_modules) == sorted(LORA_TARGETS)
    assert (cfg.peft.dim, cfg.peft.alpha, cfg.optimizer.lr) == (16, 32, 1e-4)  # the override wins
    assert cfg.model.expert_model_parallel_size == sft.model.expert_model_parallel_size == 8
    with pytest.raises(ValueError, match=r"peft='dora'.*\blora\b"):
        bridge_recipes.build(SFT_35B, peft="dora")


def test_peft_flag_round_trips_through_the_runner_arguments_and_dry_runs(capsys):
    from bridge_recipes.runner.cli import main

    args = bridge_recipes.runner_args(peft="lora")
    assert args == ["--peft", "lora"]
    assert build_request(build_parser().parse_intermixed_args(["--recipe", SFT_35B, *args]))["peft"] == "lora"
    assert main(["--recipe", SFT_35B, *args, "--dry-run", "--world-size", "8"]) == 0
    out = capsys.readouterr()
    assert re.search(r"^peft\s+LoRA rank 32\b", out.out, re.M) and "no pretrained weights" in out.err
    assert main(["--recipe", SFT_35B, "--peft", "qlora", "--dry-run"]) == 2
    assert re.search(r"--peft 'qlora'.*\blora$", capsys.readouterr().err, re.M)  # the value, then the choices


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), True),  # the recipe turns it on in the DDP config only
        (("ddp.overlap_param_gather=false",), False),  # the one named sets both
        (("optimizer.overlap_param_gather=true", "ddp.overlap_param_gather=false"), True),  # both named: either on
    ],
)
def test_the_ddp_and_optimizer_settings_agree_after_the_overrides(overrides, expected):
    from bridge_recipes.runner.problems import megatron_validation

    cfg = bridge_recipes.build(SFT_35B, scale_down=4, overrides=list(overrides))
    assert (cfg.ddp.overlap_param_gather, cfg.optimizer.overlap_param_gather) == (expected, expected)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert megatron_validation(cfg, 1) is None
    assert not [w for w in caught if "not in sync" in str(w.message)]


def test_an_override_of_the_distributed_optimizer_in_one_section_holds_in_both():
    cfg = bridge_recipes.build(SFT_35B, scale_down=4, overrides=["optimizer.use_distributed_optimizer=false"])
    assert (cfg.ddp.use_distributed_optimizer, cfg.optimizer.use_distributed_optimizer) == (False, False)
