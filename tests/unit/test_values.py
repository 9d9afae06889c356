"""Out-of-range values are refused before launch with a message naming the field and the fix."""

import copy
import re

import pytest

from bridge_recipes.config.overrides import apply_all
from bridge_recipes.config.values import value_problems
from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

MOE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
DENSE = "qwen35_27b_sft_8gpu_h200_bf16_config"


@pytest.fixture(scope="module")
def built():
    return {name: registry.load(name)() for name in (MOE, DENSE)}


def _problems(built, name, flags=None, overrides=(), world=8):
    cfg = copy.deepcopy(built[name])
    apply_all(cfg, flags or {}, list(overrides))
    return value_problems(cfg, world)


BAD = [  # (flags, overrides, text the message must hold)
    ({"tp": 0}, [], "model.tensor_model_parallel_size=0"),
    ({"pp": 0}, [], "model.pipeline_model_parallel_size=0"),
    ({"cp": 0}, [], "model.context_parallel_size=0"),
    ({"ep": 0}, [], "model.expert_model_parallel_size=0"),
    ({"etp": 0}, [], "model.expert_tensor_parallel_size=0"),
    ({"sl": 0}, [], "model.seq_length=0"),
    ({"sl": -1}, [], "dataset.seq_length=-1"),
    ({"gb": 0}, [], "train.global_batch_size=0"),
    ({"gb": -8}, [], "train.global_batch_size=-8"),
    ({"mb": 0}, [], "train.micro_batch_size=0"),
    ({"max_steps": 0}, [], "train.train_iters=0"),
    ({}, ["train.train_iters=" + "9" * 30], "train.train_iters=" + "9" * 30),
    ({"lr": -1.0}, [], "optimizer.lr=-1.0"),
    ({"lr": float("inf")}, [], "optimizer.lr=inf"),
    ({}, ["optimizer.lr=nan"], "optimizer.lr=nan"),
    ({}, ["optimizer.lr=1e400"], "optimizer.lr=inf"),
    ({"lr": 1e-5, "min_lr": 1e-4}, [], "optimizer.min_lr=0.0001 is above optimizer.lr=1e-05"),
    ({"min_lr": -1.0}, [], "optimizer.min_lr=-1.0"),
    ({"warmup_iters": 50}, [], "scheduler.lr_warmup_iters=50 is not shorter than the 50"),
    ({"warmup_iters": -3}, [], "scheduler.lr_warmup_iters=-3"),
    ({}, ["model.moe_router_topk=0"], "model.moe_router_topk=0"),
    ({}, ["model.moe_router_topk=257"], "model.moe_router_topk=257 must be between 1 and the 256 experts"),
    ({}, ["model.hidden_size=-5"], "model.hidden_size=-5"),
    ({}, ["model.num_layers=0"], "model.num_layers=0"),
    ({}, ["~train.global_batch_size"], "train.global_batch_size=None"),
    ({}, ["rng.seed=-1"], "rng.seed=-1"),
    ({"save_interval": 0}, [], "checkpoint.save_interval=0"),
    ({}, ["model.recompute_granularity=selective"], "model.recompute_method=null"),
    # what Megatron-Core, torch's optimizers and Megatron-Core's scheduler refuse only at launch
    ({}, ["train.global_batch_size=" + "9" * 25], "that fits 64 bits"),
    ({}, ["train.global_batch_size=" + "9" * 12, "train.train_iters=" + "9" * 8], "64-bit sample counter"),
    ({}, ["optimizer.adam_beta1=1.5"], "optimizer.adam_beta1=1.5 must be a number in [0, 1)"),
    ({}, ["optimizer.adam_beta2=-0.1"], "optimizer.adam_beta2=-0.1 must be a number in [0, 1)"),
    ({}, ["optimizer.adam_beta2=1.0"], "optimizer.adam_beta2=1.0 must be a number in [0, 1)"),
    ({}, ["optimizer.weight_decay=-1"], "optimizer.weight_decay=-1.0 must be a number >= 0"),
    ({}, ["optimizer.clip_grad=-1"], "optimizer.clip_grad=-1.0 must be a number >= 0"),
    ({}, ["optimizer.adam_eps=-1e-8"], "optimizer.adam_eps=-1e-08 must be a number >= 0"),
    ({}, ["optimizer.initial_loss_scale=0"], "optimizer.initial_loss_scale=0.0 must be a number > 0"),
    ({}, ["optimizer.optimizer=adamw"], "optimizer.optimizer='adamw' must be one of 'adam', 'sgd'"),
    ({}, ["model.moe_token_dispatcher_type=foo"], "model.moe_token_dispatcher_type='foo' must be one of"),
    ({}, ["scheduler.lr_decay_style=foo"], "scheduler.lr_decay_style='foo' must be one of"),
    ({}, ["model.hidden_dropout=2.0"], "model.hidden_dropout=2.0 must be a number in [0, 1]"),
    ({}, ["scheduler.start_weight_decay=0.1", "scheduler.end_weight_decay=0.01"], "scheduler.end_weight_decay"),
    ({}, ["scheduler.lr_warmup_init=1.0"], "scheduler.lr_warmup_init=1 is above optimizer.lr"),
]


@pytest.mark.parametrize("flags,overrides,text", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_value_is_named(built, flags, overrides, text):
    problems = _problems(built, MOE, flags, overrides)
    assert any(text in p for p in problems), problems


def test_every_recipe_passes_as_built():
    for name in registry.discover():
        entry = registry.find(name)
        assert value_problems(registry.load(name)(), entry.meta.gpus) == [], name


def test_dense_model_ignores_top_k(built):
    assert _problems(built, DENSE, {}, ["model.moe_router_topk=0"]) == []


@pytest.mark.parametrize("world", [0, -2])
def test_world_size_must_be_positive(built, world):
    assert any("world size" in p for p in _problems(built, MOE, world=world))


@pytest.mark.parametrize(
    "argv,text",
    [
        (["-tp", "0"], "model.tensor_model_parallel_size=0"),
        (["--lr", "nan"], "optimizer.lr=nan"),
        (["--scale-experts", "8"], "--scale-experts needs --scale-down"),
        (["--scale-down", "-4"], "--scale-down -4"),
        (["--scale-down", "400"], "--scale-down 400"),
        (["--scale-down", "6"], "--scale-down 6"),
        (["--scale-down", "4", "--scale-experts", "0"], "--scale-experts 0"),
    ],
)
def test_runner_refuses_before_launch(capsys, argv, text):
    assert main(["--recipe", MOE, "--dry-run", "--world-size", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


def test_scale_experts_on_dense_model(capsys):
    assert main(["--recipe", DENSE, "--dry-run", "--scale-down", "4", "--scale-experts", "8"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--scale-experts 8\b.*dense", err), err


def test_bad_world_size_variable(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert main(["--recipe", MOE, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "WORLD_SIZE='abc'" in err and "not an integer" in err and "--world-size N" in err


def _dry_run(capsys, *argv):
    code = main(["--recipe", MOE, "--dry-run", "--world-size", "8", *argv])
    return code, capsys.readouterr().err


def test_save_folder_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "ckpt"
    target.write_text("mine")
    code, err = _dry_run(capsys, "--save-dir", str(target))
    assert code == 2 and f"checkpoint.save={target} is a file" in err
    assert target.read_text() == "mine"


def test_save_folder_under_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, err = _dry_run(capsys, "--save-dir", str(tmp_path / "f" / "run"))
    assert code == 2 and "cannot be created" in err


def test_pretrained_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.safetensors").write_bytes(b"\0" * 8)
    code, err = _dry_run(capsys, "--pretrained-checkpoint", str(tmp_path / "weights"))
    assert code == 2 and str(tmp_path / "weights") in err and "Megatron checkpoint" in err, err


@pytest.mark.parametrize(
    "text",
    ["model: [unclosed\n", "model:\n  - 1\n  - 2\n", "- a list\n", "\xff\xfe binary"],
    ids=["yaml", "list", "top", "bin"],
)
def test_corrupt_checkpoint_metadata(tmp_path, capsys, text):
    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000005").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("5")
    (ckpt / "iter_0000005" / "run_config.yaml").write_bytes(text.encode("latin-1"))
    code, err = _dry_run(capsys, "--load-dir", str(ckpt), "--save-dir", str(ckpt))
    assert code == 2 and "run_config.yaml" in err and "Traceback" not in err


def test_energon_path_must_exist(tmp_path, capsys):
    code = main(
        [
            "--recipe",
            "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config",
            "--dry-run",
            "--world-size",
            "16",
            "--dataset",
            "energon",
            f"dataset.path={tmp_path / 'missing'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"dataset.path {tmp_path / 'missing'}: no such folder" in err, err
    assert "scripts/build_vl_dataset.py" in err  # the builder of what an energon dataset path holds


@pytest.mark.parametrize(
    "override, message",
    [
        ("peft.dim=0", "peft.dim=0 must be an integer >= 1"),
        ("peft.alpha=0", "peft.alpha=0 must be a number > 0"),
        ("peft.dropout=1.0", "peft.dropout=1.0 must be a number in [0, 1)"),
        ("peft.target_modules=[]", "peft.target_modules is empty"),
        ("peft.target_modules=[linear_qvk]", "names 'linear_qvk', which no linear of these models is called"),
    ],
)
def test_lora_settings_out_of_range_are_refused(override, message):
    import bridge_recipes
    from bridge_recipes.config.values import value_problems

    cfg = bridge_recipes.build("qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", overrides=[override])
    assert any(message in p for p in value_problems(cfg, 1)), value_problems(cfg, 1)
    fine = bridge_recipes.build(
        "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", overrides=["peft.target_modules=['*.linear_qkv']"]
    )
    assert value_problems(fine, 1) == []
