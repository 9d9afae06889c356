"""Overrides: flags, Hydra grammar, typed values; every bad input is an error naming it."""

import re

import pytest
import torch

from bridge_recipes.config.overrides import OverrideError, apply_all, parse


@pytest.fixture(scope="module")
def build():
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_35b_a3b_sft_8gpu_h200_bf16_config

    return qwen35_35b_a3b_sft_8gpu_h200_bf16_config


def no_flags():
    return {}


def test_flags_map_to_their_fields(build):
    cfg = build()
    apply_all(
        cfg,
        dict(
            tp=2,
            pp=2,
            cp=2,
            vp=2,
            ep=4,
            etp=1,
            gb=256,
            mb=2,
            sl=4096,
            max_steps=7,
            lr=2e-5,
            min_lr=2e-6,
            warmup_iters=3,
            save_dir="/s",
            load_dir="/l",
            pretrained_checkpoint="/p",
            save_interval=9,
        ),
        [],
    )
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (2, 2, 2)
    assert (m.virtual_pipeline_model_parallel_size, m.expert_model_parallel_size, m.expert_tensor_parallel_size) == (
        2,
        4,
        1,
    )
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.train.train_iters) == (256, 2, 7)
    assert m.seq_length == cfg.dataset.seq_length == 4096
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.scheduler.lr_warmup_iters) == (2e-5, 2e-6, 3)
    c = cfg.checkpoint
    assert (c.save, c.load, c.pretrained_checkpoint, c.save_interval) == ("/s", "/l", "/p", 9)


def test_trailing_overrides_win_over_flags(build):
    cfg = build()
    apply_all(cfg, {"gb": 256}, ["train.global_batch_size=512"])
    assert cfg.train.global_batch_size == 512


def test_hydra_grammar(build):
    cfg = build()
    apply_all(
        cfg,
        {},
        [
            "model.recompute_num_layers=2",  # nested key, int
            "optimizer.lr=3e-5",  # float
            "model.sequence_parallel=true",  # bool
            "model.cuda_graph_scope=[attn,moe_router]",  # list
            "checkpoint.pretrained_checkpoint='/ckpt/a b'",  # quoted string
            "checkpoint.save=null",  # null
            "+env_vars.NCCL_DEBUG=WARN",  # add a dict key
            "~env_vars.TORCHINDUCTOR_COMPILE_THREADS",  # delete a dict key
            "++env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8",  # force-set
            "model.params_dtype=float32",  # torch dtype by name
            "optimizer.weight_decay=0",  # int into a float field
        ],
    )
    assert cfg.model.recompute_num_layers == 2 and cfg.optimizer.lr == 3e-5
    assert cfg.model.sequence_parallel is True
    assert list(cfg.model.cuda_graph_scope) == ["attn", "moe_router"]
    assert cfg.checkpoint.pretrained_checkpoint == "/ckpt/a b" and cfg.checkpoint.save is None
    assert cfg.env_vars["NCCL_DEBUG"] == "WARN" and "TORCHINDUCTOR_COMPILE_THREADS" not in cfg.env_vars
    assert cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == 8
    assert cfg.model.params_dtype is torch.float32
    assert cfg.optimizer.weight_decay == 0.0 and isinstance(cfg.optimizer.weight_decay, float)


def test_delete_sets_an_optional_section_to_null(build):
    cfg = build()
    apply_all(cfg, {}, ["~comm_overlap"])
    assert cfg.comm_overlap is None


@pytest.mark.parametrize(
    "token, message",
    [
        (
            "train.global_batch_sise=4",
            "unknown key 'train.global_batch_sise'.*Nearest valid keys: train.global_batch_size",
        ),
        ("trian.global_batch_size=4", "unknown key 'trian'.*train"),
        ("train.global_batch_size=abc", "train.global_batch_size expects int or null, got str 'abc'"),
        ("model.sequence_parallel=3", "model.sequence_parallel expects bool"),
        ("train.global_batch_size", "malformed override 'train.global_batch_size'"),
        ("train.global_batch_size=[1,", "malformed override"),
        ("+model.brand_new=1", r"unknown key 'model.brand_new'.*'\+' adds keys to dictionaries"),
        ("+env_vars.CUDA_DEVICE_MAX_CONNECTIONS=2", "exists already"),
        ("env_vars.NOT_THERE=1", r"add a new entry with '\+env_vars.NOT_THERE=...'"),
        ("~env_vars.NOT_THERE", "no key 'env_vars.NOT_THERE' to delete"),
        ("model.params_dtype=float33", "torch dtype name"),
        ("train=3", "is a section"),
        ("model.hidden_size=null", "model.hidden_size cannot be null"),
        ("mixed_precision=bf16_with_fp8_curent", "no mixed-precision preset 'bf16_with_fp8_curent'.*bf16_mixed"),
        ("mixed_precision.fp8_parm=true", "unknown key 'mixed_precision.fp8_parm'.*fp8_param"),
    ],
)
def test_bad_overrides_name_the_token(build, token, message):
    cfg = build()
    with pytest.raises(OverrideError, match=message):
        apply_all(cfg, {}, [token])


def test_a_named_mixed_precision_preset_takes_field_overrides(build):
    """A recipe names its precision by a Megatron-Bridge preset (a string); a dotted override below it
    first turns the name into that preset's config, then sets the field, whatever came before."""
    cfg = build()
    assert cfg.mixed_precision == "bf16_mixed"
    apply_all(
        cfg, {}, ["mixed_precision=bf16_with_fp8_current_scaling_mixed", "mixed_precision.fp8_param_gather=false"]
    )
    mp = cfg.mixed_precision
    assert (mp.fp8, mp.fp8_recipe, mp.fp8_param_gather, mp.fp8_param) == ("hybrid", "tensorwise", False, False)
    cfg = build()
    apply_all(cfg, {}, ["mixed_precision.grad_reduce_in_fp32=false"])
    assert cfg.mixed_precision.bf16 and cfg.mixed_precision.grad_reduce_in_fp32 is False
    apply_all(cfg, {}, ["mixed_precision=bf16_mixed"])  # a name again replaces the config
    assert cfg.mixed_precision == "bf16_mixed"


def test_a_failed_override_leaves_the_earlier_ones_visible_and_raises(build):
    cfg = build()
    with pytest.raises(OverrideError):
        apply_all(cfg, {}, ["train.train_iters=5", "train.nope=1"])


def test_parse_kinds():
    assert parse("a.b=1").kind == "set"
    assert parse("+a.b=1").kind == "add"
    assert parse("++a.b=1").kind == "force_add"
    assert parse("~a.b").kind == "delete"


def test_unquoted_non_ascii_value_names_the_quoting_fix():
    with pytest.raises(OverrideError, match=r"quote the value .*: dataset.path='/data/çé'"):
        parse("dataset.path=/data/çé")
    assert parse("dataset.path='/data/çé'").value == "/data/çé"


def test_library_errors_name_keywords_and_the_command_line_names_options(capsys):
    """The library speaks its own keywords (``scale_experts=...``); the runner turns them into its options."""
    import bridge_recipes
    from bridge_recipes.config.overrides import in_cli_terms
    from bridge_recipes.runner.cli import main

    assert (
        in_cli_terms("scale_down=8: no layout; drop scale_experts")
        == "--scale-down 8: no layout; drop --scale-experts"
    )
    assert in_cli_terms("dataset='energon' needs a VL recipe") == "--dataset 'energon' needs a VL recipe"
    kept = "the dataset folder, dataset.path=/rows, model.gpus_per_node=8, the peft adapters"
    assert in_cli_terms(kept) == kept  # prose and dotted keys stay as they are
    with pytest.raises(ValueError) as err:
        bridge_recipes.build("qwen35_27b_sft_8gpu_h200_bf16_config", scale_down=4, scale_experts=8)
    assert "scale_experts=8" in str(err.value) and "--scale-experts" not in str(err.value)
    args = [
        "--recipe",
        "qwen35_27b_sft_8gpu_h200_bf16_config",
        "--dry-run",
        "--scale-down",
        "4",
        "--scale-experts",
        "8",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(r"--scale-experts 8\b.*dense.*drop --scale-experts", err), err
